//! Consume + decode `{"id":1000000,"quantity":37}` into `Order` with
//! `handler_fn` and `Json<T>`, ordered commits on. See `support/mod.rs`.

mod support;

use std::hint::black_box;

use intake::decode::Json;
use intake::handler::handler_fn;
use support::{CountingAllocator, ORDER_JSON, Order};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn main() {
    support::main("pipeline_json", ORDER_JSON, || {
        handler_fn(|Json(order): Json<Order>| async move {
            black_box((order.id, order.quantity));
        })
    });
}
