// A sync fn is not a handler fn.
use intake_core::{Payload, handler_fn};

fn handle(Payload(_payload): Payload) {}

fn main() {
    let _handler = handler_fn(handle);
}
