//! The layers composed as users write them, run by the consumer runtime on
//! the memory broker: what ends up committed, dead-lettered and counted.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_core::batch::{BatchLayer, BatchSettings};
use intake_core::catch_panic::CatchPanicLayer;
use intake_core::consumer::{Consumer, DeliveryOrder, RunReport};
use intake_core::dead_letter::{
    DeadLetter, DeadLetterError, DeadLetterLayer, DeadLetterSink, FailurePolicy,
};
use intake_core::memory::{MemoryBroker, MemorySource, Record};
#[cfg(feature = "metrics")]
use intake_core::metrics::Metrics;
use intake_core::retry::RetryLayer;
#[cfg(feature = "metrics")]
use intake_core::trace::TraceLayer;
use intake_core::{Constant, Disabled, HandlerError, Json, Message, handler_fn};
#[cfg(feature = "metrics")]
use prometheus::Registry;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceBuilder, service_fn};

#[cfg(feature = "metrics")]
#[path = "support/prometheus_sample.rs"]
mod prometheus_sample;

#[cfg(feature = "metrics")]
use prometheus_sample::sample;

const GROUP: &str = "billing";

/// A broker with `topic` of one partition holding `payloads`, in order.
fn broker_with(topic: &str, payloads: &[&'static str]) -> MemoryBroker {
    let broker = MemoryBroker::new();
    broker.create_topic(topic, 1).expect("topic");
    for payload in payloads {
        broker
            .send(topic, Record::new(*payload).with_key("customer-1"))
            .expect("send");
    }
    broker
}

fn committed(broker: &MemoryBroker, topic: &str) -> Option<i64> {
    broker.committed(topic, GROUP).expect("group")[0]
}

/// Runs `handler` on `topic` until `done` holds (bounded: ten seconds, then
/// the test fails), then shuts the consumer down and returns its report.
async fn run_until<H>(
    broker: &MemoryBroker,
    topic: &str,
    consumer: intake_core::ConsumerBuilder,
    handler: H,
    done: impl Fn() -> bool,
) -> RunReport
where
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    let (source, acker): (MemorySource, _) = broker.consumer(topic, GROUP).expect("consumer");
    let consumer = consumer
        .commit_interval(Duration::from_millis(5))
        .build(source, acker, handler)
        .expect("valid settings");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(consumer.run(shutdown.clone()));
    let mut waited = Duration::ZERO;
    while !done() {
        assert!(
            waited < Duration::from_secs(10),
            "the consumer did not get there"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
        waited += Duration::from_millis(5);
    }
    shutdown.cancel();
    run.await.expect("no panic").expect("clean run")
}

fn quick_consumer() -> intake_core::ConsumerBuilder {
    Consumer::builder().backoff(Constant::new(Duration::from_millis(2)).retry_forever())
}

#[tokio::test]
async fn a_panicking_handler_is_dead_lettered_and_the_consumer_keeps_consuming() {
    let topic = "panics";
    let broker = broker_with(topic, &["a", "boom", "b", "c"]);
    let handled = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&handled);
    let handler = handler_fn(move |message: Message| {
        let seen = Arc::clone(&seen);
        async move {
            let payload = String::from_utf8_lossy(message.payload()).into_owned();
            assert_ne!(payload, "boom", "a bug in the handler");
            if let Ok(mut seen) = seen.lock() {
                seen.push(payload);
            }
            Ok::<(), HandlerError>(())
        }
    });
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(
            broker.dead_letter_sink(topic, GROUP).expect("sink"),
        ))
        .layer(RetryLayer::new(
            Constant::new(Duration::from_millis(1)).max_retries(2),
        ))
        .layer(CatchPanicLayer::new())
        .service(handler);
    run_until(&broker, topic, quick_consumer(), stack, || {
        committed(&broker, topic) == Some(4)
    })
    .await;

    assert_eq!(
        handled.lock().map(|h| h.clone()).unwrap_or_default(),
        ["a", "b", "c"]
    );
    let letters = broker.dead_letters(topic, GROUP).expect("group");
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].message.payload(), "boom");
    assert_eq!(letters[0].attempts, 3);
    assert!(
        letters[0].error.contains("a bug in the handler"),
        "{}",
        letters[0].error
    );
}

#[tokio::test]
async fn a_failing_dead_letter_sink_leaves_the_message_unacknowledged_until_it_recovers() {
    let topic = "sink-down";
    let broker = broker_with(topic, &["poison", "fine"]);
    let faults = broker.faults(topic, GROUP).expect("faults");
    faults.fail_next_dead_letter_writes(u32::MAX);
    let poison_calls = Arc::new(AtomicUsize::new(0));
    let calls = Arc::clone(&poison_calls);
    let handler = service_fn(move |message: Message| {
        let poison = message.payload() == "poison";
        if poison {
            calls.fetch_add(1, Ordering::SeqCst);
        }
        async move {
            match poison {
                true => Err(HandlerError::permanent("unknown customer")),
                false => Ok(()),
            }
        }
    });
    let policy = FailurePolicy::dead_letter(broker.dead_letter_sink(topic, GROUP).expect("sink"))
        .write_backoff(Disabled);
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::with_policy(policy))
        .service(handler);

    let (source, acker) = broker.consumer(topic, GROUP).expect("consumer");
    let consumer = quick_consumer()
        .commit_interval(Duration::from_millis(5))
        .build(source, acker, stack)
        .expect("valid");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(consumer.run(shutdown.clone()));

    // The sink keeps failing: the message is tried again and again, and
    // nothing of the partition is committed past it.
    let mut waited = 0;
    while poison_calls.load(Ordering::SeqCst) < 5 {
        assert!(waited < 2_000, "the message was not retried");
        tokio::time::sleep(Duration::from_millis(5)).await;
        waited += 1;
    }
    assert_eq!(committed(&broker, topic), None);
    assert!(broker.dead_letters(topic, GROUP).expect("group").is_empty());

    // The sink recovers: the message is dead-lettered, then acknowledged.
    faults.clear();
    let mut waited = 0;
    while committed(&broker, topic) != Some(2) {
        assert!(waited < 2_000, "the message was not dead-lettered");
        tokio::time::sleep(Duration::from_millis(5)).await;
        waited += 1;
    }
    shutdown.cancel();
    run.await.expect("no panic").expect("clean run");
    let letters = broker.dead_letters(topic, GROUP).expect("group");
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].message.payload(), "poison");
}

/// The memory broker's dead-letter topic behind a size limit, as a Kafka
/// topic's `max.message.bytes` would be.
struct SizeLimited<S> {
    inner: S,
    limit: usize,
}

#[async_trait::async_trait]
impl<S: DeadLetterSink> DeadLetterSink for SizeLimited<S> {
    async fn write(&self, letter: &DeadLetter) -> Result<(), DeadLetterError> {
        let size = letter.message.payload().len();
        if size > self.limit {
            return Err(DeadLetterError::rejected(format!(
                "{size} bytes is over the topic's {} bytes",
                self.limit
            )));
        }
        self.inner.write(letter).await
    }
}

#[tokio::test]
async fn a_letter_too_large_for_its_destination_is_dead_lettered_as_a_reference_not_retried_forever()
 {
    // Before, the write was retried, the message redelivered, and the write
    // failed the same way, forever: the partition never moved past it.
    let topic = "too-large";
    let broker = MemoryBroker::new();
    broker.create_topic(topic, 1).expect("topic");
    let large: &'static str = Box::leak("x".repeat(64 * 1024).into_boxed_str());
    for payload in ["fine", large, "fine"] {
        broker.send(topic, Record::new(payload)).expect("send");
    }
    let handler = service_fn(|message: Message| async move {
        match message.payload().len() > 1024 {
            true => Err(HandlerError::permanent("unknown customer")),
            false => Ok(()),
        }
    });
    let sink = SizeLimited {
        inner: broker.dead_letter_sink(topic, GROUP).expect("sink"),
        limit: 1024,
    };
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(sink))
        .service(handler);
    let report = run_until(&broker, topic, quick_consumer(), stack, || {
        committed(&broker, topic) == Some(3)
    })
    .await;
    assert_eq!(report.succeeded, 2);
    let letters = broker.dead_letters(topic, GROUP).expect("group");
    assert_eq!(letters.len(), 1);
    let reference = letters[0].reference.as_ref().expect("a reference letter");
    assert_eq!(reference.payload_bytes, 64 * 1024);
    assert_eq!(
        letters[0].message.metadata().position(),
        intake_core::Position::Offset(1)
    );
}

#[derive(Debug, Deserialize)]
struct Order {
    #[allow(dead_code)]
    id: u64,
}

#[tokio::test]
async fn a_payload_that_does_not_decode_is_dead_lettered_without_a_retry() {
    let topic = "decode";
    let broker = broker_with(topic, &[r#"{"id":1}"#, "{not json", r#"{"id":3}"#]);
    let attempts = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&attempts);
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(
            broker.dead_letter_sink(topic, GROUP).expect("sink"),
        ))
        .layer(RetryLayer::new(
            Constant::new(Duration::from_millis(1)).max_retries(5),
        ))
        .map_request(move |message: Message| {
            counted.fetch_add(1, Ordering::SeqCst);
            message
        })
        .service(handler_fn(|Json(_order): Json<Order>| async {}));
    run_until(&broker, topic, quick_consumer(), stack, || {
        committed(&broker, topic) == Some(3)
    })
    .await;
    assert_eq!(attempts.load(Ordering::SeqCst), 3, "no retry");
    let letters = broker.dead_letters(topic, GROUP).expect("group");
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].message.payload(), "{not json");
    assert_eq!(letters[0].attempts, 1);
}

#[tokio::test]
async fn a_retry_sleeping_at_shutdown_leaves_the_message_for_redelivery() {
    let topic = "shutdown";
    let broker = broker_with(topic, &["slow to recover"]);
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let handler = service_fn(move |_message: Message| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Err::<(), _>(HandlerError::retryable("database down")) }
    });
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(
            broker.dead_letter_sink(topic, GROUP).expect("sink"),
        ))
        .layer(RetryLayer::new(Constant::new(Duration::from_secs(3600))))
        .service(handler);
    let report = run_until(&broker, topic, quick_consumer(), stack, || {
        calls.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(report.interrupted, 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(committed(&broker, topic), None, "not acknowledged");
    assert!(
        broker.dead_letters(topic, GROUP).expect("group").is_empty(),
        "not dead-lettered"
    );

    // The next consumer of the group gets it again.
    let redelivered = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&redelivered);
    let handler = service_fn(move |_message: Message| {
        seen.fetch_add(1, Ordering::SeqCst);
        async { Ok::<(), HandlerError>(()) }
    });
    run_until(&broker, topic, quick_consumer(), handler, || {
        committed(&broker, topic) == Some(1)
    })
    .await;
    assert_eq!(redelivered.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn block_holds_the_partition_until_the_failing_message_succeeds() {
    let topic = "block";
    let broker = broker_with(topic, &["first", "second", "third"]);
    let order = Arc::new(Mutex::new(Vec::new()));
    let failures_left = Arc::new(AtomicUsize::new(3));
    let (seen, left) = (Arc::clone(&order), Arc::clone(&failures_left));
    let handler = service_fn(move |message: Message| {
        let payload = String::from_utf8_lossy(message.payload()).into_owned();
        let fail = payload == "first"
            && left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if !fail && let Ok(mut seen) = seen.lock() {
            seen.push(payload);
        }
        async move {
            match fail {
                true => Err(HandlerError::permanent("constraint violated")),
                false => Ok(()),
            }
        }
    });
    let block = FailurePolicy::block(Constant::new(Duration::from_millis(2))).expect("valid");
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::with_policy(block))
        .service(handler);
    run_until(
        &broker,
        topic,
        quick_consumer().ordering(DeliveryOrder::Partition),
        stack,
        || committed(&broker, topic) == Some(3),
    )
    .await;
    assert_eq!(
        order.lock().map(|o| o.clone()).unwrap_or_default(),
        ["first", "second", "third"]
    );
    assert!(broker.dead_letters(topic, GROUP).expect("group").is_empty());
}

#[tokio::test]
async fn a_batch_with_partial_failure_commits_the_successes_and_routes_the_failures() {
    let topic = "batch";
    let payloads = ["ok-0", "bad-1", "ok-2", "ok-3", "bad-4", "ok-5"];
    let broker = broker_with(topic, &payloads);
    let inserted = Arc::new(Mutex::new(Vec::new()));
    let rows = Arc::clone(&inserted);
    let insert = service_fn(move |batch: Vec<Message>| {
        let rows = Arc::clone(&rows);
        async move {
            let outcomes = batch
                .iter()
                .map(|message| {
                    let payload = String::from_utf8_lossy(message.payload()).into_owned();
                    if payload.starts_with("bad") {
                        return Err(HandlerError::permanent(format!("row {payload} rejected")));
                    }
                    if let Ok(mut rows) = rows.lock() {
                        rows.push(payload);
                    }
                    Ok(())
                })
                .collect::<Vec<_>>();
            Ok::<_, HandlerError>(outcomes)
        }
    });
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(
            broker.dead_letter_sink(topic, GROUP).expect("sink"),
        ))
        .layer(
            BatchLayer::new(BatchSettings {
                max_size: 6,
                max_wait: Duration::from_millis(20),
                parallelism: 1,
            })
            .expect("valid"),
        )
        .service(insert);
    run_until(
        &broker,
        topic,
        quick_consumer().ordering(DeliveryOrder::Unordered),
        stack,
        || committed(&broker, topic) == Some(6),
    )
    .await;
    let mut rows = inserted.lock().map(|r| r.clone()).unwrap_or_default();
    rows.sort();
    assert_eq!(rows, ["ok-0", "ok-2", "ok-3", "ok-5"], "each success once");
    let mut letters: Vec<_> = broker
        .dead_letters(topic, GROUP)
        .expect("group")
        .iter()
        .map(|letter| String::from_utf8_lossy(letter.message.payload()).into_owned())
        .collect();
    letters.sort();
    assert_eq!(letters, ["bad-1", "bad-4"]);
}

#[cfg(feature = "metrics")]
#[tokio::test]
async fn metrics_after_a_run_count_every_outcome_and_the_partition_state() {
    let topic = "metered";
    let broker = broker_with(topic, &["ok", "flaky", "bad", "ok"]);
    let registry = Registry::new();
    let metrics = Metrics::register(&registry).expect("fresh registry");
    let measured = metrics.layer("billing");
    let flaky_failed = Arc::new(AtomicUsize::new(0));
    let flaky = Arc::clone(&flaky_failed);
    let handler = service_fn(move |message: Message| {
        let outcome = match &message.payload()[..] {
            b"bad" => Err(HandlerError::permanent("rejected")),
            b"flaky" if flaky.fetch_add(1, Ordering::SeqCst) < 2 => {
                Err(HandlerError::retryable("timeout"))
            }
            _ => Ok(()),
        };
        async move { outcome }
    });
    let stack = ServiceBuilder::new()
        .layer(measured.clone())
        .layer(TraceLayer::new("billing"))
        .layer(DeadLetterLayer::new(
            broker.dead_letter_sink(topic, GROUP).expect("sink"),
        ))
        .layer(
            RetryLayer::new(Constant::new(Duration::from_millis(1)).max_retries(3))
                .observe(measured),
        )
        .layer(CatchPanicLayer::new())
        .service(handler);
    run_until(
        &broker,
        topic,
        quick_consumer().observer(Arc::new(metrics.clone())),
        stack,
        || committed(&broker, topic) == Some(4),
    )
    .await;

    let labels = [("source", topic), ("handler", "billing")];
    let value = |name| sample(&registry, name, &labels);
    assert_eq!(value("intake_messages_consumed_total"), Some(4.0));
    assert_eq!(value("intake_messages_succeeded_total"), Some(3.0));
    assert_eq!(value("intake_messages_retried_total"), Some(2.0));
    assert_eq!(value("intake_messages_dead_lettered_total"), Some(1.0));
    assert_eq!(value("intake_handler_in_flight"), Some(0.0));
    let permanent = sample(
        &registry,
        "intake_messages_failed_total",
        &[
            ("source", topic),
            ("handler", "billing"),
            ("class", "permanent"),
        ],
    );
    assert_eq!(permanent, Some(1.0));
    let partition = [("source", topic), ("partition", "0")];
    assert_eq!(
        sample(
            &registry,
            "intake_partition_commit_lag_messages",
            &partition
        ),
        Some(0.0)
    );
    assert!(
        sample(
            &registry,
            "intake_ack_round_trips_total",
            &[("result", "ok")]
        ) >= Some(1.0)
    );
}
