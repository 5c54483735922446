//! A retry in backoff when a graceful stop begins: if its next attempt
//! falls within the drain, it runs there, so a stop does not leave a hole
//! that holds back the commit of everything after it (on Kafka, a
//! partition's later work would be delivered again to the next owner).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use intake_core::backend::testkit::wait_until_committed;
use intake_core::consumer::{Consumer, DeliveryOrder};
use intake_core::memory::{MemoryBroker, Record};
use intake_core::{Constant, HandlerError, Message, RetryLayer};
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;

/// Ten orders; the first attempt at order 3 fails, and the stop begins
/// while its retry waits `backoff`. Returns the run's report and whether
/// everything ended up committed.
async fn stop_during_a_retry(backoff: Duration, drain: Duration) -> (intake_core::RunReport, bool) {
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 1).expect("topic");
    for id in 0..10 {
        broker
            .send("orders", Record::new(id.to_string()))
            .expect("send");
    }
    let failed_once = CancellationToken::new();
    let attempts = Arc::new(AtomicU32::new(0));
    let handler = tower::service_fn({
        let (failed_once, attempts) = (failed_once.clone(), attempts.clone());
        move |message: Message| {
            let (failed_once, attempts) = (failed_once.clone(), attempts.clone());
            async move {
                if message.payload().as_ref() == b"3"
                    && attempts.fetch_add(1, Ordering::SeqCst) == 0
                {
                    failed_once.cancel();
                    return Err(HandlerError::retryable("the database blinked"));
                }
                Ok(())
            }
        }
    });
    let handler = ServiceBuilder::new()
        .layer(RetryLayer::new(Constant::new(backoff)))
        .service(handler);
    let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
    let stop = CancellationToken::new();
    let run = tokio::spawn(
        Consumer::builder()
            .ordering(DeliveryOrder::Unordered)
            .commit_interval(Duration::from_millis(10))
            .shutdown_deadline(drain)
            .build(source, acker, handler)
            .expect("settings")
            .run(stop.clone()),
    );
    failed_once.cancelled().await;
    // Let the others finish, then stop while order 3 waits for its retry.
    tokio::time::sleep(Duration::from_millis(50)).await;
    stop.cancel();
    let report = run.await.expect("join").expect("run");
    let committed = wait_until_committed(&broker, "orders", "billing", Duration::ZERO)
        .await
        .is_ok();
    (report, committed)
}

#[tokio::test]
async fn a_retry_due_within_the_drain_runs_in_it_and_everything_is_committed() {
    let (report, committed) =
        stop_during_a_retry(Duration::from_millis(300), Duration::from_secs(5)).await;
    assert_eq!(report.interrupted, 0, "{report:?}");
    assert_eq!(report.succeeded, 10);
    assert!(
        committed,
        "the stop left no hole in the commits: {report:?}"
    );
}

#[tokio::test]
async fn a_retry_due_after_the_drain_is_interrupted_at_once() {
    let started = tokio::time::Instant::now();
    let (report, committed) =
        stop_during_a_retry(Duration::from_secs(60), Duration::from_secs(5)).await;
    assert_eq!(report.interrupted, 1, "{report:?}");
    assert!(!committed, "order 3 is left for the next consumer");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the stop did not wait for a retry it could not run"
    );
}
