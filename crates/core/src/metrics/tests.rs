use std::time::Duration;

use prometheus::Registry;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

use super::*;
use crate::acker::{AckBatch, AckError};
use crate::backoff::Constant;
use crate::catch_panic::CatchPanicLayer;
use crate::dead_letter::{DeadLetterLayer, FailurePolicy};
use crate::error::HandlerError;
use crate::layer_testing::{RecordingSink, Scripted, Step, message};
use crate::message::Message;
use crate::message::{Metadata, PartitionKey, Position};
use crate::observer::PartitionProgress;
use crate::observer::{ConsumerObserver, PartitionSnapshot};
use crate::retry::RetryLayer;

#[path = "../../tests/support/prometheus_sample.rs"]
mod prometheus_sample;

use prometheus_sample::sample;

const ORDERS: &[(&str, &str)] = &[("source", "orders"), ("handler", "billing")];

fn failed(class: &'static str) -> [(&'static str, &'static str); 3] {
    [
        ("source", "orders"),
        ("handler", "billing"),
        ("class", class),
    ]
}

#[tokio::test(start_paused = true)]
async fn outcomes_latency_and_in_flight_are_counted_per_source_and_handler() {
    let registry = Registry::new();
    let metrics = Metrics::register(&registry).expect("fresh registry");
    let handler = Scripted::new([
        Step::Succeed,
        Step::Retryable("db down"),
        Step::Permanent("bad"),
        Step::Ignore,
    ]);
    let service = metrics.layer("billing").layer(handler);
    for _ in 0..4 {
        let _ = service.clone().oneshot(message("order")).await;
    }
    let value = |name| sample(&registry, name, ORDERS);
    assert_eq!(value("intake_messages_consumed_total"), Some(4.0));
    assert_eq!(value("intake_messages_succeeded_total"), Some(1.0));
    assert_eq!(value("intake_handler_duration_seconds"), Some(4.0));
    assert_eq!(value("intake_handler_in_flight"), Some(0.0));
    for class in ["retryable", "permanent", "ignore"] {
        let count = sample(&registry, "intake_messages_failed_total", &failed(class));
        assert_eq!(count, Some(1.0), "{class}");
    }
    let interrupted = sample(
        &registry,
        "intake_messages_failed_total",
        &failed("interrupted"),
    );
    assert_eq!(interrupted, Some(0.0));
}

#[tokio::test(start_paused = true)]
async fn retries_and_the_panics_they_hide_are_counted_through_the_retry_observer() {
    let registry = Registry::new();
    let metrics = Metrics::register(&registry).expect("fresh registry");
    let measured = metrics.layer("billing");
    let handler = Scripted::new([Step::Panic("flaky"), Step::Retryable("db down")]);
    ServiceBuilder::new()
        .layer(measured.clone())
        .layer(
            RetryLayer::new(Constant::new(Duration::from_millis(1)).max_retries(5))
                .observe(measured),
        )
        .layer(CatchPanicLayer::new())
        .service(handler)
        .oneshot(message("order"))
        .await
        .expect("third attempt succeeds");
    let value = |name| sample(&registry, name, ORDERS);
    assert_eq!(value("intake_messages_consumed_total"), Some(1.0));
    assert_eq!(value("intake_messages_succeeded_total"), Some(1.0));
    assert_eq!(value("intake_messages_retried_total"), Some(2.0));
    assert_eq!(value("intake_handler_panics_total"), Some(1.0));
}

#[tokio::test(start_paused = true)]
async fn a_final_panic_is_counted_by_the_layer() {
    let registry = Registry::new();
    let metrics = Metrics::register(&registry).expect("fresh registry");
    let _ = ServiceBuilder::new()
        .layer(metrics.layer("billing"))
        .layer(CatchPanicLayer::new())
        .service(Scripted::new([Step::Panic("bug")]))
        .oneshot(message("order"))
        .await;
    let value = |name| sample(&registry, name, ORDERS);
    assert_eq!(value("intake_handler_panics_total"), Some(1.0));
    assert_eq!(
        sample(
            &registry,
            "intake_messages_failed_total",
            &failed("retryable")
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn a_parked_message_counts_as_parked_not_as_a_failure() {
    let registry = Registry::new();
    let metrics = Metrics::register(&registry).expect("fresh registry");
    let broker = crate::memory::MemoryBroker::new();
    broker.create_topic("orders", 1).expect("topic");
    let outcome = ServiceBuilder::new()
        .layer(metrics.layer("billing"))
        .layer(crate::parking::ParkingLayer::new(
            broker.parking("orders", "billing").expect("parking"),
        ))
        .service(tower::service_fn(|_: Message| async {
            Err::<(), _>(HandlerError::retry_later(
                "rate limited",
                Duration::from_secs(60),
            ))
        }))
        .oneshot(message("order"))
        .await;
    assert!(
        outcome.is_err(),
        "parked is an outcome the runtime acknowledges"
    );
    let value = |name| sample(&registry, name, ORDERS);
    assert_eq!(value("intake_messages_parked_total"), Some(1.0));
    let count = |class| sample(&registry, "intake_messages_failed_total", &failed(class));
    for class in ["retryable", "permanent", "ignore"] {
        assert_eq!(count(class), Some(0.0), "{class}");
    }
}

#[tokio::test(start_paused = true)]
async fn dead_lettered_and_discarded_messages_count_with_their_original_class() {
    let registry = Registry::new();
    let metrics = Metrics::register(&registry).expect("fresh registry");
    let measured = metrics.layer("billing");
    let _ = ServiceBuilder::new()
        .layer(measured.clone())
        .layer(DeadLetterLayer::new(RecordingSink::default()))
        .service(Scripted::new([Step::Permanent("bad")]))
        .oneshot(message("order"))
        .await;
    let _ = ServiceBuilder::new()
        .layer(measured)
        .layer(DeadLetterLayer::with_policy(FailurePolicy::discard()))
        .service(Scripted::new([Step::Retryable("stale")]))
        .oneshot(message("order"))
        .await;
    let value = |name| sample(&registry, name, ORDERS);
    assert_eq!(value("intake_messages_dead_lettered_total"), Some(1.0));
    assert_eq!(value("intake_messages_discarded_total"), Some(1.0));
    let count = |class| sample(&registry, "intake_messages_failed_total", &failed(class));
    assert_eq!(count("permanent"), Some(1.0));
    assert_eq!(count("retryable"), Some(1.0));
    assert_eq!(count("ignore"), Some(0.0));
}

#[tokio::test(start_paused = true)]
async fn dead_letters_that_could_not_be_written_are_counted_by_what_happened_instead() {
    let registry = Registry::new();
    let metrics = Metrics::register(&registry).expect("fresh registry");
    let measured = metrics.layer("billing");
    let run = |policy: FailurePolicy| {
        ServiceBuilder::new()
            .layer(measured.clone())
            .layer(DeadLetterLayer::with_policy(policy))
            .service(Scripted::new([Step::Permanent("bad")]))
            .oneshot(message("order"))
    };
    // The letter fails, its reference is written.
    let reference_only = RecordingSink::default();
    reference_only.fail_writes(1);
    let policy = FailurePolicy::dead_letter(reference_only).write_backoff(crate::Disabled);
    let _ = run(policy).await;
    // Nothing is written: left for redelivery, then discarded by a fallback.
    for fallback in [None, Some(FailurePolicy::discard())] {
        let down = RecordingSink::default();
        down.fail_writes(usize::MAX);
        let mut policy = FailurePolicy::dead_letter(down).write_backoff(crate::Disabled);
        if let Some(fallback) = fallback {
            policy = policy.or_else(fallback);
        }
        let _ = run(policy).await;
    }
    for fallback in ["reference", "redelivered", "discarded"] {
        let labels = [
            ("source", "orders"),
            ("handler", "billing"),
            ("fallback", fallback),
        ];
        assert_eq!(
            sample(&registry, "intake_dead_letter_fallbacks_total", &labels),
            Some(1.0),
            "{fallback}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_in_flight_gauge_follows_running_and_abandoned_messages() {
    let registry = Registry::new();
    let metrics = Metrics::register(&registry).expect("fresh registry");
    let service = metrics
        .layer("billing")
        .layer(Scripted::new([Step::Slow(Duration::from_secs(5))]));
    let in_flight = || sample(&registry, "intake_handler_in_flight", ORDERS);

    let running = tokio::spawn(service.clone().oneshot(message("order")));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(in_flight(), Some(1.0));
    running.abort();
    let _ = running.await;
    assert_eq!(
        in_flight(),
        Some(0.0),
        "an abandoned message leaves the gauge"
    );
    assert_eq!(
        sample(&registry, "intake_handler_duration_seconds", ORDERS),
        Some(0.0),
        "an abandoned message has no outcome"
    );
}

#[tokio::test]
async fn each_source_gets_its_own_series() {
    let registry = Registry::new();
    let metrics = Metrics::register(&registry).expect("fresh registry");
    let mut service = metrics.layer("billing").layer(Scripted::default());
    let refunds = Message::new(
        "refund",
        Metadata::new("refunds".into(), 3, Position::Offset(1)),
    );
    for message in [message("a"), refunds, message("b")] {
        service
            .ready()
            .await
            .expect("ready")
            .call(message)
            .await
            .expect("success");
    }
    let consumed = |source| {
        sample(
            &registry,
            "intake_messages_consumed_total",
            &[("source", source), ("handler", "billing")],
        )
    };
    assert_eq!(consumed("orders"), Some(2.0));
    assert_eq!(consumed("refunds"), Some(1.0));
}

fn snapshot(partition: u32, uncommitted: usize, age: Option<Duration>) -> PartitionSnapshot {
    PartitionSnapshot {
        stats: PartitionProgress {
            partition: PartitionKey::new("orders", partition),
            watermark: Some(Position::Offset(10)),
            newest: Some(Position::Offset(10 + uncommitted as i64)),
            uncommitted,
            in_flight: uncommitted,
            oldest_unfinished: Some(Position::Offset(11)),
        },
        oldest_unfinished_age: age,
        paused: false,
    }
}

#[test]
fn partition_gauges_follow_the_runtime_and_vanish_on_revoke() {
    let registry = Registry::new();
    let metrics = Metrics::register(&registry).expect("fresh registry");
    metrics.on_partitions(&[
        snapshot(0, 5, Some(Duration::from_millis(1500))),
        snapshot(1, 0, None),
    ]);
    metrics.on_in_flight(5);
    let gauge = |name, partition| {
        sample(
            &registry,
            name,
            &[("source", "orders"), ("partition", partition)],
        )
    };
    assert_eq!(
        gauge("intake_partition_commit_lag_messages", "0"),
        Some(5.0)
    );
    assert_eq!(
        gauge("intake_partition_oldest_unfinished_age_seconds", "0"),
        Some(1.5)
    );
    assert_eq!(gauge("intake_partition_in_flight_messages", "0"), Some(5.0));
    assert_eq!(
        gauge("intake_partition_oldest_unfinished_age_seconds", "1"),
        Some(0.0)
    );
    assert_eq!(
        sample(&registry, "intake_consumer_in_flight_messages", &[]),
        Some(5.0)
    );

    metrics.on_partitions(&[snapshot(0, 2, Some(Duration::from_secs(3)))]);
    assert_eq!(
        gauge("intake_partition_commit_lag_messages", "0"),
        Some(2.0)
    );

    metrics.on_revoked(&PartitionKey::new("orders", 0));
    assert_eq!(gauge("intake_partition_commit_lag_messages", "0"), None);
    assert_eq!(
        gauge("intake_partition_oldest_unfinished_age_seconds", "0"),
        None
    );
    assert_eq!(
        gauge("intake_partition_commit_lag_messages", "1"),
        Some(0.0)
    );

    // A revoked partition that comes back gets its series again.
    metrics.on_partitions(&[snapshot(0, 1, None)]);
    assert_eq!(
        gauge("intake_partition_commit_lag_messages", "0"),
        Some(1.0)
    );
}

#[test]
fn acknowledgement_round_trips_are_counted_by_result() {
    let registry = Registry::new();
    let metrics = Metrics::register(&registry).expect("fresh registry");
    let batch = AckBatch::default();
    metrics.on_ack(&batch, Ok(()), Duration::from_millis(2));
    let lost = AckError::Disconnected("connection reset".into());
    metrics.on_ack(&batch, Err(&lost), Duration::from_millis(30));
    assert_eq!(
        sample(
            &registry,
            "intake_ack_round_trips_total",
            &[("result", "ok")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &registry,
            "intake_ack_round_trips_total",
            &[("result", "error")]
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(&registry, "intake_ack_duration_seconds", &[]),
        Some(2.0)
    );
}

#[test]
fn panics_probe_timeouts_and_source_errors_of_the_runtime_are_counted() {
    let registry = Registry::new();
    let metrics = Metrics::register(&registry).expect("fresh registry");
    metrics.on_panic(&PartitionKey::new("orders", 3));
    metrics.on_panic(&PartitionKey::new("orders", 1));
    assert_eq!(
        sample(
            &registry,
            "intake_consumer_panics_total",
            &[("source", "orders")]
        ),
        Some(2.0)
    );
    metrics.on_probe_timeout();
    assert_eq!(
        sample(&registry, "intake_consumer_probe_timeouts_total", &[]),
        Some(1.0)
    );
    let failover = crate::source::SourceError::Transient("READONLY".into());
    metrics.on_source_error(&failover, Some(Duration::from_millis(100)));
    metrics.on_source_error(&failover, Some(Duration::from_millis(200)));
    metrics.on_source_error(&crate::source::SourceError::Config("bad".into()), None);
    let errors = |outcome| {
        sample(
            &registry,
            "intake_source_errors_total",
            &[("outcome", outcome)],
        )
    };
    assert_eq!(errors("retried"), Some(2.0));
    assert_eq!(errors("stopped"), Some(1.0));
}

#[test]
fn a_second_registration_in_one_registry_is_refused_with_advice() {
    let registry = Registry::new();
    let _first = Metrics::register(&registry).expect("fresh registry");
    let error = Metrics::register(&registry).expect_err("names are taken");
    assert!(error.to_string().contains("clone it"), "{error}");
    Metrics::builder()
        .prefix("billing")
        .const_label("group", "billing-v2")
        .register(&registry)
        .expect("a second prefix is fine");
}
