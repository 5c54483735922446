// A `State<T>` whose `T` the handler's state does not provide.
use std::sync::Arc;

use intake_core::handler::{State, handler_fn_with_state};
use intake_core::Payload;

#[derive(Clone)]
struct Services {
    _region: Arc<str>,
}

struct Ledger;

async fn bill(State(_ledger): State<Arc<Ledger>>, Payload(_payload): Payload) {}

fn main() {
    let services = Services { _region: "eu".into() };
    let _handler = handler_fn_with_state(services, bill);
}
