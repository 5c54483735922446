//! A destination topic that goes missing for a while, on Apache Kafka at
//! 127.0.0.1:9092 (review 2026-12-04, R23): the inputs whose outputs meet
//! the gap are retried after a backoff until the topic is back, not
//! dead-lettered. The handler stack is the one the docs recommend: a
//! dead-letter layer over a retry layer (default exponential backoff, 10
//! retries) over the publish layer.
//!
//! The shared broker creates topics on first use
//! (`auto.create.topics.enable=true`), so the publisher asks it not to
//! (`allow.auto.create.topics=false`, what a producer without the right to
//! create topics gets anyway), and gives up on a topic it cannot find after
//! 100 ms (`topic.metadata.propagation.max.ms`) rather than 30 s, so the
//! gap is seen at once.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use intake_core::backend::testkit::TestMessage;
use intake_core::publish::{Output, PublishLayer};
use intake_core::retry::RetryLayer;
use intake_core::{Consumer, DeadLetterLayer, Exponential, Payload, handler_fn};
use intake_kafka::KafkaPublisher;
use tower::ServiceBuilder;

use support::{KafkaBackend, unique};

const COUNT: usize = 300;

/// The destination is deleted while the relay runs and created again a few
/// seconds later: nothing is dead-lettered, the inputs that met the gap are
/// retried, and every input is committed; the ids handled after the topic
/// came back are in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_deleted_mid_run_is_waited_for_not_dead_lettered() {
    support::init_tracing();
    let Some(backend) = KafkaBackend::real("a destination deleted mid-run") else {
        return;
    };
    let input = unique("intake-missing-in");
    let output = unique("intake-missing-out");
    let group = unique("intake-missing-group");
    backend.create_topic(&input, 1).await.expect("input topic");
    backend
        .create_topic(&output, 1)
        .await
        .expect("output topic");
    let inputs: Vec<TestMessage> = (0..COUNT)
        .map(|id| TestMessage::new(format!("k{id}"), id.to_string()))
        .collect();
    backend.produce_to(&input, &inputs).await.expect("produce");

    let source = backend
        .source(&input, &group)
        .min_commit_interval(Duration::from_millis(20))
        .build()
        .await
        .expect("source");
    let acker = source.acker();
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let dead_letter_topic = sink.topic_for(&input);
    let publisher = KafkaPublisher::builder(
        backend
            .settings()
            .set("allow.auto.create.topics", "false")
            .set("topic.metadata.propagation.max.ms", "100")
            .set("topic.metadata.refresh.interval.ms", "500"),
    )
    .delivery_timeout(Duration::from_secs(3))
    .build()
    .expect("publisher");
    let handled = Arc::new(AtomicUsize::new(0));
    let destination: Arc<str> = output.as_str().into();
    let handler = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(sink))
        .layer(RetryLayer::new(Exponential::default()))
        .layer(PublishLayer::new(publisher))
        .service(handler_fn({
            let handled = Arc::clone(&handled);
            move |Payload(payload): Payload| {
                let destination = Arc::clone(&destination);
                let handled = Arc::clone(&handled);
                async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    handled.fetch_add(1, Ordering::Relaxed);
                    Output::new(destination, payload)
                }
            }
        }));
    let consumer = Consumer::builder()
        .max_in_flight(4)
        .build(source, acker, handler)
        .expect("consumer");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(consumer.run(shutdown.clone()));

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while handled.load(Ordering::Relaxed) < 40 {
        assert!(tokio::time::Instant::now() < deadline, "nothing handled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    backend.delete_topic(&output).await.expect("delete");
    tracing::info!("destination deleted");
    tokio::time::sleep(Duration::from_secs(4)).await;
    // KRaft deletes asynchronously: create again once the name is free.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while let Err(error) = backend.create_topic(&output, 1).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the topic could not be created again: {error}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tracing::info!("destination created again");

    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let offsets = backend.offsets(&input, &group).await.expect("offsets");
        if offsets
            .iter()
            .all(|(_, committed, high)| *committed == Some(*high))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not every input committed within 60 s: {offsets:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    shutdown.cancel();
    let report = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the run ends")
        .expect("task")
        .expect("run");
    assert_eq!(report.dead_lettered, 0, "{report:?}");
    assert!(
        handled.load(Ordering::Relaxed) > COUNT,
        "no input was retried: {report:?}"
    );
    let letters = backend
        .read_all(&dead_letter_topic)
        .await
        .unwrap_or_default();
    assert!(letters.is_empty(), "{} dead letters", letters.len());
    let arrived: Vec<String> = backend
        .read_all(&output)
        .await
        .expect("the destination")
        .iter()
        .map(|record| String::from_utf8_lossy(&record.payload).into_owned())
        .collect();
    assert!(
        arrived.contains(&(COUNT - 1).to_string()),
        "the last id is not in the destination created again: {} records",
        arrived.len()
    );
}
