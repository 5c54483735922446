// `Json<T>` of a type that serde cannot deserialize.
use intake_core::{Json, handler_fn};

struct Order {
    _id: u64,
}

async fn reserve(Json(_order): Json<Order>) {}

fn main() {
    let _handler = handler_fn(reserve);
}
