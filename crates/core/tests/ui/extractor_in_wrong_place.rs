// The payload extractor is not the last argument.
use intake_core::{Key, Payload, handler_fn};

async fn handle(Payload(_payload): Payload, Key(_key): Key) {}

fn main() {
    let _handler = handler_fn(handle);
}
