// A handler fn returns what is not a verdict.
use intake_core::{Payload, handler_fn};

async fn count(Payload(payload): Payload) -> usize {
    payload.len()
}

fn main() {
    let _handler = handler_fn(count);
}
