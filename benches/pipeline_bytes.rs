//! Consume raw bytes (no decode) with `handler_fn` and `Payload`, ordered
//! commits on. See `support/mod.rs`.

mod support;

use std::hint::black_box;

use intake::handler::{Payload, handler_fn};
use support::{CountingAllocator, ORDER_JSON};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn main() {
    support::main("pipeline_bytes", ORDER_JSON, || {
        handler_fn(|Payload(payload): Payload| async move {
            black_box(payload.len());
        })
    });
}
