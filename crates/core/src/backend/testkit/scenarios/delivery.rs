//! Delivery: every message reaches a handler, retries come back, the
//! commit never passes unfinished work, broadcast reaches every instance.

use super::handlers::recording;
use crate::backend::testkit::Backend;
use crate::backend::testkit::harness::{Ledger, Running, id_of, numbered, unique_group};
use crate::consumer::{Consumer, DeliveryOrder};
use crate::error::HandlerError;
use crate::message::Message;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Every produced message reaches a handler, and afterwards nothing is left
/// unacknowledged.
pub async fn delivers_every_message<B: Backend>(backend: &B) {
    let partitions = if backend.capabilities().partitions {
        4
    } else {
        1
    };
    let source = backend
        .create_source(partitions)
        .await
        .expect("create the source");
    let group = unique_group("delivers");
    backend
        .produce(&source, numbered(0, 500))
        .await
        .expect("produce");
    let ledger = Ledger::default();
    let consumer = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder().ordering(DeliveryOrder::Key),
        64,
        recording(&ledger),
    )
    .await
    .expect("connect");
    ledger.wait_for_all(500, "all 500 messages").await;
    let report = consumer.stop().await;
    assert!(report.succeeded >= 500, "{} handled", report.succeeded);
    assert_eq!(
        backend
            .unacknowledged(&source, &group)
            .await
            .expect("inspect"),
        0,
        "{}: everything handled is acknowledged after a graceful shutdown",
        backend.name()
    );
}

/// Handlers finish out of order and one never finishes: the committed
/// position stays before it, so the next consumer receives it again.
pub async fn commit_never_passes_an_unfinished_message<B: Backend>(backend: &B) {
    let source = backend.create_source(1).await.expect("create the source");
    let group = unique_group("ordered-commit");
    backend
        .produce(&source, numbered(0, 100))
        .await
        .expect("produce");
    let ledger = Ledger::default();
    let stuck_started = CancellationToken::new();
    let handler = {
        let ledger = ledger.clone();
        let stuck_started = stuck_started.clone();
        tower::service_fn(move |message: Message| {
            let ledger = ledger.clone();
            let stuck_started = stuck_started.clone();
            async move {
                let id = id_of(&message)?;
                if id == 40 {
                    stuck_started.cancel();
                    std::future::pending::<()>().await;
                }
                // Later ids finish first.
                tokio::time::sleep(Duration::from_millis((100 - id) % 7)).await;
                ledger.record(id);
                Ok::<_, HandlerError>(())
            }
        })
    };
    let first = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder()
            .ordering(DeliveryOrder::Unordered)
            .shutdown_deadline(Duration::from_millis(200)),
        32,
        handler,
    )
    .await
    .expect("connect");
    ledger
        .wait_until("every message but the stuck one", || {
            ledger.distinct() == 99
        })
        .await;
    let report = first.stop().await;
    assert!(
        report
            .unfinished
            .iter()
            .any(|unfinished| unfinished.started),
        "the stuck message is reported unfinished"
    );
    assert!(
        backend
            .unacknowledged(&source, &group)
            .await
            .expect("inspect")
            >= 1,
        "{}: the stuck message was not acknowledged",
        backend.name()
    );

    let second_ledger = Ledger::default();
    let second = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder().ordering(DeliveryOrder::Unordered),
        32,
        recording(&second_ledger),
    )
    .await
    .expect("connect");
    second_ledger
        .wait_until("the stuck message to be delivered again", || {
            second_ledger.count(40) >= 1
        })
        .await;
    second.stop().await;
}

/// A retryable failure is delivered again with a higher attempt number and
/// then succeeds.
pub async fn retries_then_succeeds<B: Backend>(backend: &B) {
    let source = backend.create_source(1).await.expect("create the source");
    let group = unique_group("retry");
    backend
        .produce(&source, numbered(0, 20))
        .await
        .expect("produce");
    let ledger = Ledger::default();
    let attempts_seen = Arc::new(AtomicUsize::new(0));
    let handler = {
        let ledger = ledger.clone();
        let attempts_seen = attempts_seen.clone();
        tower::service_fn(move |message: Message| {
            let ledger = ledger.clone();
            let attempts_seen = attempts_seen.clone();
            async move {
                let id = id_of(&message)?;
                let attempt = message.metadata().attempt();
                if id % 5 == 0 && attempt == 1 {
                    return Err(HandlerError::retryable(
                        "first attempts of every fifth id fail",
                    ));
                }
                if id % 5 == 0 {
                    attempts_seen.fetch_max(attempt as usize, Ordering::Relaxed);
                }
                ledger.record(id);
                Ok(())
            }
        })
    };
    let consumer = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder()
            .ordering(DeliveryOrder::Partition)
            .backoff(crate::backoff::Constant::new(Duration::from_millis(10)).retry_forever()),
        16,
        handler,
    )
    .await
    .expect("connect");
    ledger
        .wait_for_all(20, "all 20 messages, retried ones included")
        .await;
    consumer.stop().await;
    assert!(
        attempts_seen.load(Ordering::Relaxed) >= 2,
        "{}: a retried message carries its attempt number",
        backend.name()
    );
    assert_eq!(
        backend
            .unacknowledged(&source, &group)
            .await
            .expect("inspect"),
        0
    );
}

/// A broadcast consumer's instances each receive every message produced
/// after they started. Skipped where the backend has no broadcast mode.
pub async fn broadcast_delivers_to_every_instance<B: Backend>(backend: &B) {
    let source = backend.create_source(1).await.expect("create the source");
    let settings = crate::backend::testkit::ConnectSettings { max_in_flight: 16 };
    let mut instances = Vec::new();
    let mut ledgers = Vec::new();
    for _ in 0..2 {
        let Some(connected) = backend.connect_broadcast(&source, settings).await else {
            eprintln!("skipped: {} has no broadcast mode", backend.name());
            return;
        };
        let (source, acker) = connected.expect("connect a broadcast instance");
        let ledger = Ledger::default();
        instances.push(
            Running::run(source, acker, Consumer::builder(), 16, recording(&ledger))
                .expect("start a broadcast instance"),
        );
        ledgers.push(ledger);
    }
    // An instance receives what is produced once it has started, which the
    // broker does not announce: probe until every instance has received one.
    const PROBE: u64 = 1_000_000;
    let deadline = tokio::time::Instant::now() + crate::backend::testkit::harness::PATIENCE;
    let mut probe = PROBE;
    while ledgers.iter().any(|ledger| ledger.distinct() == 0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}: a broadcast instance received nothing within {:?}",
            backend.name(),
            crate::backend::testkit::harness::PATIENCE
        );
        backend
            .produce(&source, numbered(probe, 1))
            .await
            .expect("produce a probe");
        probe += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    backend
        .produce(&source, numbered(0, 100))
        .await
        .expect("produce");
    for (number, ledger) in ledgers.iter().enumerate() {
        ledger
            .wait_until(&format!("instance {number} to receive all 100"), || {
                ledger.missing(100).is_empty()
            })
            .await;
    }
    for instance in instances {
        instance.stop().await;
    }
}
