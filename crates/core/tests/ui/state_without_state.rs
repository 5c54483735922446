// A `State<T>` argument in a handler made without a state.
use intake_core::handler::State;
use intake_core::{Payload, handler_fn};

#[derive(Clone)]
struct Pool;

async fn store(State(_pool): State<Pool>, Payload(_payload): Payload) {}

fn main() {
    let _handler = handler_fn(store);
}
