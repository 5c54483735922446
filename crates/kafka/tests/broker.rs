//! The Kafka adapter under the intake runtime against Apache Kafka on
//! 127.0.0.1:9092 (`.ci/services/kafka.sh`). Skipped with a printed reason
//! when no broker listens, unless `INTAKE_REQUIRE_BROKERS=1`.
//!
//! Every wait is on a condition (all ids seen, partitions settled), bounded
//! by `PATIENCE`; no test sleeps a fixed time and hopes.

mod support;

use std::time::Duration;

use bytes::Bytes;
use intake_core::testkit::harness::{Ledger, numbered};
use intake_core::testkit::{Backend, TestMessage};
use intake_core::{DeadLetter, DeadLetterSink, Headers, Ordering, SourceError};
use intake_kafka::dead_letter::header;
use intake_kafka::{ConnectError, KafkaDeadLetterSink};
use support::consumer::{TestConsumer, eventually, settled};
use support::{KafkaBackend, unique};

const PATIENCE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_third_consumer_joining_and_leaving_loses_nothing() {
    third_consumer_joins_and_leaves("a_third_consumer_joining_and_leaving_loses_nothing", &[])
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooperative_rebalances_lose_nothing() {
    third_consumer_joins_and_leaves(
        "cooperative_rebalances_lose_nothing",
        &[("partition.assignment.strategy", "cooperative-sticky")],
    )
    .await;
}

/// KIP-848's consumer group protocol (`group.protocol=consumer`, served by
/// Kafka 4): the broker assigns, incrementally; the session and heartbeat
/// settings are the broker's, so the client may not set them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_group_protocol_of_kip_848_loses_nothing() {
    third_consumer_joins_and_leaves(
        "the_consumer_group_protocol_of_kip_848_loses_nothing",
        &[
            ("group.protocol", "consumer"),
            ("session.timeout.ms", ""),
            ("heartbeat.interval.ms", ""),
        ],
    )
    .await;
}

/// Two consumers share a topic; a third joins and later leaves; messages
/// keep arriving throughout. `settings` are set on every member (an empty
/// value removes the fixture's own).
async fn third_consumer_joins_and_leaves(test: &str, settings: &[(&str, &str)]) {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real(test) else {
        return;
    };
    let kafka = kafka.with_settings(settings);
    let topic = kafka.create_source(4).await.expect("topic");
    let group = unique("g");
    kafka
        .produce(&topic, numbered(0, 200))
        .await
        .expect("produce");
    let ledger = Ledger::default();
    // A little work per message keeps deliveries in flight across each
    // rebalance, so revocations have something to drain.
    let start = |source| {
        TestConsumer::working(source, &ledger, Duration::from_millis(1), Ordering::Key, 16)
    };

    let first = start(kafka.source(&topic, &group).build().await.expect("first"));
    let second = start(kafka.source(&topic, &group).build().await.expect("second"));
    ledger.wait_for_all(200, "the first 200 messages").await;
    settled(&[&first, &second], 4, PATIENCE).await;

    let third = start(kafka.source(&topic, &group).build().await.expect("third"));
    settled(&[&first, &second, &third], 4, PATIENCE).await;
    kafka
        .produce(&topic, numbered(200, 200))
        .await
        .expect("produce while three");
    ledger.wait_for_all(400, "400 messages among three").await;

    third.stop().await;
    settled(&[&first, &second], 4, PATIENCE).await;
    kafka
        .produce(&topic, numbered(400, 200))
        .await
        .expect("produce after the third left");
    ledger
        .wait_for_all(600, "all 600 after the third left")
        .await;

    let revocations = first.revocations() + second.revocations();
    first.stop().await;
    second.stop().await;
    assert!(revocations >= 1, "the rebalances revoked partitions");
    assert_eq!(kafka.unacknowledged(&topic, &group).await.expect("lag"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_dropped_mid_run_leaves_its_uncommitted_messages_to_the_others() {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real(
        "a_consumer_dropped_mid_run_leaves_its_uncommitted_messages_to_the_others",
    ) else {
        return;
    };
    let topic = kafka.create_source(4).await.expect("topic");
    let group = unique("g");
    // Its handlers never finish: nothing it takes is ever committed.
    let crashing = TestConsumer::working(
        kafka
            .source(&topic, &group)
            .build()
            .await
            .expect("crashing"),
        &Ledger::default(),
        Duration::from_secs(3600),
        Ordering::Unordered,
        256,
    );
    let ledger = Ledger::default();
    let survivor = TestConsumer::recording(
        kafka
            .source(&topic, &group)
            .build()
            .await
            .expect("survivor"),
        &ledger,
    );
    settled(&[&crashing, &survivor], 4, PATIENCE).await;
    kafka
        .produce(&topic, numbered(0, 300))
        .await
        .expect("produce");
    eventually("the survivor to finish its share", PATIENCE, || async {
        ledger.distinct() > 0 && kafka.unacknowledged(&topic, &group).await.expect("lag") < 300
    })
    .await;
    crashing.crash().await;

    ledger
        .wait_for_all(300, "every message, the crashed consumer's included")
        .await;
    survivor.stop().await;
    assert_eq!(kafka.unacknowledged(&topic, &group).await.expect("lag"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_messages_land_in_the_dead_letter_topic_with_their_origin() {
    let Some(kafka) = KafkaBackend::real("poison_messages_land_in_the_dead_letter_topic") else {
        return;
    };
    let topic = kafka.create_source(2).await.expect("topic");
    let group = unique("g");
    let mut headers = Headers::new();
    headers.insert("tenant", Bytes::from_static(b"acme"));
    let mut poison = TestMessage::new("order-9", "{not json");
    poison.headers = headers;
    kafka.produce(&topic, vec![poison]).await.expect("produce");
    let mut source = kafka.source(&topic, &group).build().await.expect("source");
    let original = support::next_message(&mut source, PATIENCE).await;

    let dlq = format!("{topic}.{group}.dlq");
    kafka.create_topic(&dlq, 1).await.expect("dlq topic");
    let sink = KafkaDeadLetterSink::builder(kafka.settings(), &group)
        .build()
        .expect("sink");
    sink.write(&DeadLetter::new(original.clone(), "expected value", 5))
        .await
        .expect("accepted by the broker");

    let records = kafka.read_all(&dlq).await.expect("read the dlq");
    assert_eq!(records.len(), 1);
    let record = &records[0];
    assert_eq!(record.payload.as_ref(), b"{not json");
    assert_eq!(record.header("tenant"), Some("acme"));
    assert_eq!(record.header(header::TOPIC), Some(topic.as_str()));
    assert_eq!(
        record.header(header::PARTITION),
        Some(original.metadata().partition().to_string().as_str())
    );
    assert_eq!(record.header(header::OFFSET), Some("0"));
    assert_eq!(record.header(header::KEY), Some("order-9"));
    assert_eq!(record.header(header::GROUP), Some(group.as_str()));
    assert_eq!(record.header(header::ERROR), Some("expected value"));
    assert_eq!(record.header(header::ATTEMPTS), Some("5"));
    intake_core::Source::close(&mut source)
        .await
        .expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_dead_letter_topic_is_created_on_first_use() {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real("a_missing_dead_letter_topic_is_created_on_first_use")
    else {
        return;
    };
    let topic = kafka.create_source(1).await.expect("topic");
    let group = unique("g");
    kafka
        .produce(&topic, vec![TestMessage::new("k", "poison")])
        .await
        .expect("produce");
    let mut source = kafka.source(&topic, &group).build().await.expect("source");
    let original = support::next_message(&mut source, PATIENCE).await;

    let sink = KafkaDeadLetterSink::builder(kafka.settings(), &group)
        .build()
        .expect("sink");
    for attempts in [1, 2] {
        sink.write(&DeadLetter::new(original.clone(), "bad", attempts))
            .await
            .expect("the topic was created and the broker accepted the letter");
    }
    let records = kafka
        .read_all(&sink.topic_for(&topic))
        .await
        .expect("read the dlq");
    assert_eq!(records.len(), 2);
    intake_core::Source::close(&mut source)
        .await
        .expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_topic_is_a_typed_error_within_the_connect_timeout() {
    let Some(kafka) = KafkaBackend::real("an_unknown_topic_is_a_typed_error") else {
        return;
    };
    let missing = unique("missing");
    let built = tokio::time::timeout(
        PATIENCE,
        kafka
            .source(&missing, &unique("g"))
            .connect_timeout(Duration::from_secs(5))
            .build(),
    )
    .await
    .expect("build returns within its connect timeout");
    match built {
        Err(error @ ConnectError::UnknownTopic { .. }) => {
            assert!(matches!(
                SourceError::from(error),
                SourceError::NotFound { .. }
            ));
        }
        other => panic!("expected UnknownTopic, got {other:?}"),
    }
}

/// A topic deleted under a running consumer and created again a while later
/// (a deploy that sets topics up, an operator recreating one): once Kafka
/// says it no longer exists, the source reports it missing as a transient
/// condition and waits, and consumes the new topic from its start once it
/// exists, instead of stopping the consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_deleted_and_created_again_is_waited_for_not_fatal() {
    support::init_tracing();
    let Some(kafka) =
        KafkaBackend::real("a_topic_deleted_and_created_again_is_waited_for_not_fatal")
    else {
        return;
    };
    // librdkafka waits this long (30 s by default) before it believes a
    // topic is gone.
    let kafka = kafka.with_settings(&[("topic.metadata.propagation.max.ms", "2000")]);
    let topic = kafka.create_source(1).await.expect("topic");
    let group = unique("g");
    kafka
        .produce(&topic, numbered(0, 10))
        .await
        .expect("produce");
    let ledger = Ledger::default();
    let consumer = TestConsumer::recording(
        kafka.source(&topic, &group).build().await.expect("source"),
        &ledger,
    );
    ledger.wait_for_all(10, "the first topic's records").await;
    eventually("the partition to be assigned", PATIENCE, || async {
        consumer.assigned() == 1
    })
    .await;

    kafka.delete_topic(&topic).await.expect("delete");
    eventually(
        "the group to drop the deleted topic's partition",
        PATIENCE,
        || async { consumer.assigned() == 0 },
    )
    .await;
    eventually("the topic to be created again", PATIENCE, || async {
        kafka.create_topic(&topic, 1).await.is_ok()
    })
    .await;
    kafka
        .produce(&topic, numbered(10, 10))
        .await
        .expect("produce to the new topic");
    ledger
        .wait_for_all(20, "the new topic's records, consumed by the same consumer")
        .await;
    // `stop` fails the test if the consumer had stopped with an error.
    consumer.stop().await;
}
