// The last argument is no extractor at all.
use intake_core::{Key, handler_fn};

fn main() {
    let _handler = handler_fn(async |Key(_key): Key, _body: String| {});
}
