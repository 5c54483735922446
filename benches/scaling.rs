//! How the cost per message grows with the consumer's shape: one dimension
//! at a time away from the peer benchmark's shape, a no-op raw-bytes handler
//! or one that awaits once before finishing. `benches/scaling.sh` runs it
//! under callgrind for every setting and prints the table in BENCHMARKS.md.
//!
//! The shape comes from the environment (so one binary serves every row):
//! `INTAKE_BENCH_PARTITIONS` (4), `INTAKE_BENCH_KEYS` (none; with keys the
//! ordering is `Key`), `INTAKE_BENCH_IN_FLIGHT` (256) and
//! `INTAKE_BENCH_HANDLER` (`noop` or `await`).

mod support;

use std::hint::black_box;

use intake::consumer::DeliveryOrder;
use intake::handler::{Payload, handler_fn};
use support::{CountingAllocator, ORDER_JSON, Shape};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn setting<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
}

fn main() {
    let defaults = Shape::default();
    let keys = setting::<u64>("INTAKE_BENCH_KEYS");
    let shape = Shape {
        partitions: setting("INTAKE_BENCH_PARTITIONS").unwrap_or(defaults.partitions),
        keys,
        max_in_flight: setting("INTAKE_BENCH_IN_FLIGHT").unwrap_or(defaults.max_in_flight),
        ordering: if keys.is_some() {
            DeliveryOrder::Key
        } else {
            defaults.ordering
        },
    };
    let awaits = std::env::var("INTAKE_BENCH_HANDLER").is_ok_and(|handler| handler == "await");
    let name = format!("scaling {shape:?} awaits={awaits}");
    support::main_shaped(&name, ORDER_JSON, shape, || {
        handler_fn(move |Payload(payload): Payload| async move {
            if awaits {
                // Pending once, woken at once: the handler leaves the fast
                // path and is polled again through its slot's waker.
                tokio::task::yield_now().await;
            }
            black_box(payload.len());
        })
    });
}
