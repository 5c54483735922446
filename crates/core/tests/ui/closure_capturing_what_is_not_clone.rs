// A closure that captures what is not `Clone`: the fn is cloned for each
// message.
use intake_core::{Payload, handler_fn};

struct Pool;

fn main() {
    let pool = Pool;
    let _handler = handler_fn(async move |Payload(_payload): Payload| {
        let _pool = &pool;
    });
}
