//! Two routes under one shared budget allocate nothing per message: the
//! allocations of a run of 2N messages minus those of a run of N (start-up
//! costs cancel out) stay far below N.
//!
//! A test binary of its own, because it replaces the global allocator with
//! one that counts the allocations of the thread under test (the runtime is
//! a current-thread one on that thread).

#[path = "support/counting_allocator.rs"]
mod counting_allocator;

use std::time::Duration;

use counting_allocator::allocations_during;
use intake_core::app::App;
use intake_core::consumer::{Consumer, DeliveryOrder, SharedBudget};
use intake_core::memory::{MemoryBroker, Record};
use intake_core::{Payload, handler_fn};
use tokio_util::sync::CancellationToken;

/// Runs two routes of `per_route` messages each to the end; returns the
/// allocations of the run (the broker is filled before counting).
fn allocations_for(per_route: usize) -> usize {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let broker = MemoryBroker::new();
    for topic in ["orders", "payments"] {
        broker.create_topic(topic, 4).expect("topic");
        broker
            .send_batch(topic, (0..per_route).map(|id| Record::new(id.to_string())))
            .expect("send");
    }
    let route = |topic: &str| {
        let (source, acker) = broker.consumer(topic, "app").expect("consumer");
        Consumer::builder()
            .max_in_flight(48)
            .ordering(DeliveryOrder::Unordered)
            // Commits by count (a quarter of max_in_flight), not by time:
            // what the run allocates per tick would scale with how long a
            // loaded machine takes, not with the messages.
            .commit_interval(Duration::from_secs(3_600))
            .build(
                source,
                acker,
                handler_fn(|Payload(payload): Payload| async move {
                    std::hint::black_box(payload.len());
                }),
            )
            .expect("settings")
    };
    let app = App::new()
        // Below the two routes' caps together: the routes wait on each other.
        .shared_budget(SharedBudget::new(64, 1 << 20).expect("budget"))
        .route("orders", route("orders"))
        .route("payments", route("payments"));
    let stop = CancellationToken::new();
    let (report, allocations) = allocations_during(|| {
        runtime.block_on(async {
            let running = tokio::spawn(app.run_until(stop.clone()));
            while broker.lag("orders", "app").unwrap_or(1)
                + broker.lag("payments", "app").unwrap_or(1)
                > 0
            {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            stop.cancel();
            running.await.expect("join").expect("app")
        })
    });
    for route in &report.routes {
        let run = route.report().expect("a report");
        assert_eq!(run.succeeded, per_route as u64, "{}", route.name);
    }
    allocations
}

#[test]
fn two_routes_under_a_shared_budget_allocate_nothing_per_message() {
    const N: usize = 20_000;
    let small = allocations_for(N);
    let large = allocations_for(2 * N);
    let per_message = large.saturating_sub(small) as f64 / (2 * N) as f64;
    eprintln!("{per_message:.4} allocations per message (A(N)={small}, A(2N)={large})");
    // What remains grows with the run's length (the test's polling loop,
    // timer wheel levels), not with the messages.
    assert!(
        per_message < 0.001,
        "{per_message:.4} allocations per message (A(N)={small}, A(2N)={large})"
    );
}
