//! Parallelism beyond partitions: 4 partitions, 10,000 keys, `Key` ordering,
//! `max_in_flight` 256, a handler that sleeps 10 ms. With perfect overlap the
//! throughput is 256 / (mean handler time); this prints the measured
//! fraction of it (target: at least 0.85).

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use intake::consumer::{Consumer, DeliveryOrder};
use intake::handler::{Meta, handler_fn};
use intake::memory::{MemoryBroker, Record};
use tokio_util::sync::CancellationToken;

const MESSAGES: u64 = 20_000;
const KEYS: u64 = 10_000;
const MAX_IN_FLIGHT: usize = 256;
const HANDLER_SLEEP: Duration = Duration::from_millis(10);

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 4).expect("topic");
    broker
        .send_batch(
            "orders",
            (0..MESSAGES)
                .map(|id| Record::new(id.to_string()).with_key(format!("customer-{}", id % KEYS))),
        )
        .expect("prefill");

    let handled = Arc::new(AtomicU64::new(0));
    let handler_nanos = Arc::new(AtomicU64::new(0));
    let done = CancellationToken::new();
    let handler = {
        let (handled, handler_nanos, done) = (handled.clone(), handler_nanos.clone(), done.clone());
        handler_fn(move |Meta(meta): Meta| {
            let (handled, handler_nanos, done) =
                (handled.clone(), handler_nanos.clone(), done.clone());
            async move {
                let started = Instant::now();
                tokio::time::sleep(HANDLER_SLEEP).await;
                black_box(meta.position());
                handler_nanos
                    .fetch_add(started.elapsed().as_nanos() as u64, AtomicOrdering::Relaxed);
                if handled.fetch_add(1, AtomicOrdering::Relaxed) + 1 == MESSAGES {
                    done.cancel();
                }
            }
        })
    };
    let (source, acker) = broker.consumer("orders", "bench").expect("join");
    let consumer = Consumer::builder()
        .max_in_flight(MAX_IN_FLIGHT)
        .ordering(DeliveryOrder::Key)
        .build(source, acker, handler)
        .expect("valid settings");
    let started = Instant::now();
    let report = runtime.block_on(consumer.run(done)).expect("run");
    let elapsed = started.elapsed();
    assert!(report.succeeded >= MESSAGES);

    let mean_handler = Duration::from_nanos(handler_nanos.load(AtomicOrdering::Relaxed) / MESSAGES);
    let ideal = MAX_IN_FLIGHT as f64 / mean_handler.as_secs_f64();
    let measured = MESSAGES as f64 / elapsed.as_secs_f64();
    println!(
        "parallelism: {MESSAGES} messages over 4 partitions and {KEYS} keys, max_in_flight {MAX_IN_FLIGHT}: \
         {measured:.0} msg/s; mean handler {mean_handler:?}; ideal {ideal:.0} msg/s; ratio {:.3}",
        measured / ideal
    );
}
