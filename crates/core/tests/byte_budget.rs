//! The in-flight byte budget on the memory broker: a backlog of large
//! messages never has the runtime hold more bytes than
//! `max_in_flight_bytes`, whatever `max_in_flight` allows, and a message
//! larger than the whole budget still gets through. Each handler awaits, so
//! that deliveries pile up in the runtime as far as the budgets let them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use intake_core::consumer::{Consumer, DeliveryOrder};
use intake_core::memory::{MemoryBroker, Record};
use intake_core::{HandlerError, Message, RunReport};
use tokio_util::sync::CancellationToken;

const KIB: usize = 1024;

/// Consumes everything in `topic` with `max_in_flight` 1,024 and the given
/// byte budget; each handler waits 1 ms (paused clock) and counts.
async fn consume(broker: &MemoryBroker, topic: &str, total: u64, budget: usize) -> RunReport {
    let (source, acker) = broker.consumer(topic, "g").expect("join the group");
    let handled = Arc::new(AtomicU64::new(0));
    let counter = handled.clone();
    let handler = tower::service_fn(move |_message: Message| {
        let counter = counter.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            counter.fetch_add(1, Ordering::Relaxed);
            Ok::<_, HandlerError>(())
        }
    });
    let consumer = Consumer::builder()
        .max_in_flight(1024)
        .max_in_flight_bytes(budget)
        .ordering(DeliveryOrder::Unordered)
        .build(source, acker, handler)
        .expect("valid settings");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(consumer.run(shutdown.clone()));
    while handled.load(Ordering::Relaxed) < total || broker.lag(topic, "g").unwrap_or(1) > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    shutdown.cancel();
    run.await.expect("join").expect("a clean run")
}

#[tokio::test(start_paused = true)]
async fn the_runtime_never_holds_more_bytes_than_its_budget() {
    let broker = MemoryBroker::new();
    broker.create_topic("large", 4).expect("topic");
    for id in 0..400u64 {
        broker
            .send(
                "large",
                Record::new(Bytes::from(vec![b'x'; 100 * KIB])).with_key(id.to_string()),
            )
            .expect("send");
    }
    let budget = 1024 * KIB;
    let report = consume(&broker, "large", 400, budget).await;
    assert_eq!(report.succeeded, 400);
    assert!(
        report.peak_in_flight_bytes <= budget as u64,
        "held {} bytes at once, budget {budget}",
        report.peak_in_flight_bytes
    );
    assert!(
        report.peak_in_flight_bytes >= (budget - 100 * KIB) as u64,
        "the budget was used, not just one message at a time: {}",
        report.peak_in_flight_bytes
    );
}

#[tokio::test(start_paused = true)]
async fn a_message_larger_than_the_budget_still_gets_through_alone() {
    let broker = MemoryBroker::new();
    broker.create_topic("huge", 1).expect("topic");
    broker
        .send("huge", Record::new(Bytes::from(vec![b'y'; 2048 * KIB])))
        .expect("send");
    for _ in 0..3 {
        broker
            .send("huge", Record::new(Bytes::from(vec![b'z'; 10 * KIB])))
            .expect("send");
    }
    let report = consume(&broker, "huge", 4, 1024 * KIB).await;
    assert_eq!(report.succeeded, 4);
    assert_eq!(
        report.peak_in_flight_bytes,
        (2048 * KIB) as u64,
        "held alone: nothing else beside it"
    );
}
