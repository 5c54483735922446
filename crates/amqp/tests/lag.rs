//! Broker-side lag of a queue: its depth from a passive `queue.declare`,
//! checked against what `rabbitmqctl` reports.
//!
//! Each test skips with a printed reason when no broker listens on
//! 127.0.0.1:5672, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use std::time::Duration;

use intake_amqp::{AmqpLagProbe, AmqpSource};
use intake_core::PartitionKey;
use intake_core::backend::Source;
use intake_core::backend::testkit::assert_unreachable_lag_probe;
use intake_core::lag::{LagError, LagProbe};
use support::steps::{ack_through, receive, settle_at};
use support::{AmqpBackend, unique};

#[tokio::test]
async fn the_lag_is_the_queue_depth_the_broker_reports() {
    let Some(backend) = AmqpBackend::connect_or_skip("lag_is_queue_depth").await else {
        return;
    };
    let queue = backend.classic_queue("lag").await.unwrap();
    backend.publish_numbered(&queue, 10).await.unwrap();
    let mut source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .build()
        .await
        .unwrap();
    let probe = source.lag_probe().expect("a queue source has a probe");
    settle_at(&backend, &queue, 10).await;
    let before = probe.lag().await.unwrap();
    assert_eq!(before.len(), 1);
    assert_eq!(before[0].partition, PartitionKey::new(queue.as_str(), 0));
    assert_eq!(before[0].messages, Some(10));
    assert_eq!(before[0].oldest_age, None);

    // Take four, acknowledge three, close: the fourth goes back to the
    // queue, and the probe counts what the group has not acknowledged.
    let mut acker = source.acker();
    let taken = receive(&mut source, 4, 4).await;
    ack_through(&mut acker, &taken.messages[2]).await.unwrap();
    source.close().await.unwrap();
    settle_at(&backend, &queue, 7).await;
    let after = probe.lag().await.unwrap();
    assert_eq!(after[0].messages, Some(7));
    assert_eq!(
        after[0].messages,
        Some(backend.messages_in(&queue).await.unwrap())
    );
    backend.cleanup().await;
}

#[tokio::test]
async fn a_missing_queue_is_refused_and_the_probe_recovers() {
    let Some(backend) = AmqpBackend::connect_or_skip("lag_missing_queue").await else {
        return;
    };
    let missing = unique("never-declared");
    let probe = AmqpLagProbe::new(backend.url(), &missing).unwrap();
    let error = probe.lag().await.unwrap_err();
    assert!(matches!(error, LagError::Refused(_)), "{error:?}");
    assert!(!error.is_transient());

    // The 404 closed the channel only: the same probe answers for a queue
    // that exists.
    let queue = backend.classic_queue("lag").await.unwrap();
    backend.publish_numbered(&queue, 2).await.unwrap();
    settle_at(&backend, &queue, 2).await;
    let probe = AmqpLagProbe::new(backend.url(), &queue).unwrap();
    assert_eq!(probe.lag().await.unwrap()[0].messages, Some(2));
    backend.cleanup().await;
}

#[tokio::test]
async fn an_unreachable_broker_is_a_transient_error_within_the_timeout() {
    let port = intake_core::backend::testkit::closed_port().expect("a free local port");
    let url = format!("amqp://guest:hunter2@127.0.0.1:{port}/%2f");
    let probe = AmqpLagProbe::new(&url, "orders")
        .unwrap()
        .timeout(Duration::from_secs(2));
    assert_unreachable_lag_probe(&probe, Some("hunter2")).await;
}
