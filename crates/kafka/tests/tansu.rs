//! The Kafka adapter against a real Kafka-protocol broker: tansu on
//! 127.0.0.1:9092 (`.ci/services/kafka.sh`). Skipped with a printed reason
//! when no broker listens, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use intake_core::testkit::{Backend, TestMessage};
use intake_core::{DeadLetter, DeadLetterSink, Headers, Position, SourceError};
use intake_kafka::dead_letter::header;
use intake_kafka::{ConnectError, KafkaDeadLetterSink};
use support::driver::Driver;
use support::{KafkaBackend, unique};

const PATIENCE: Duration = Duration::from_secs(90);

fn batch(from: usize, count: usize) -> Vec<TestMessage> {
    (from..from + count)
        .map(|n| TestMessage::new(format!("key-{}", n % 13), format!("m{n}")))
        .collect()
}

/// Every (partition, offset) the drivers saw.
fn positions<'a>(drivers: impl IntoIterator<Item = &'a Driver>) -> BTreeSet<(u32, i64)> {
    drivers
        .into_iter()
        .flat_map(|driver| &driver.received)
        .map(|message| {
            let Position::Offset(offset) = message.metadata().position() else {
                unreachable!("kafka positions are offsets")
            };
            (message.metadata().partition(), offset)
        })
        .collect()
}

/// Every (partition, offset) below the high watermarks.
async fn produced(kafka: &KafkaBackend, topic: &str, group: &str) -> BTreeSet<(u32, i64)> {
    kafka
        .offsets(topic, group)
        .await
        .expect("offsets")
        .into_iter()
        .flat_map(|(partition, _, high)| (0..high).map(move |offset| (partition as u32, offset)))
        .collect()
}

fn spawn_for(mut driver: Driver, duration: Duration) -> tokio::task::JoinHandle<Driver> {
    tokio::spawn(async move {
        driver.run_for(duration).await;
        driver
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_third_consumer_joining_and_leaving_loses_nothing() {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real("a_third_consumer_joining_and_leaving_loses_nothing")
    else {
        return;
    };
    let topic = kafka.create_source(4).await.expect("topic");
    let group = unique("g");
    kafka.produce(&topic, batch(0, 200)).await.expect("produce");

    let first = Driver::new(
        kafka.source(&topic, &group).build().await.expect("first"),
        true,
    );
    let second = Driver::new(
        kafka.source(&topic, &group).build().await.expect("second"),
        true,
    );
    let first = spawn_for(first, Duration::from_secs(30));
    let second = spawn_for(second, Duration::from_secs(30));

    tokio::time::sleep(Duration::from_secs(6)).await;
    let third = Driver::new(
        kafka.source(&topic, &group).build().await.expect("third"),
        true,
    );
    let third = spawn_for(third, Duration::from_secs(10));
    tokio::time::sleep(Duration::from_secs(4)).await;
    kafka
        .produce(&topic, batch(200, 200))
        .await
        .expect("produce while three");
    let third = third.await.expect("third driver").finish().await;
    kafka
        .produce(&topic, batch(400, 200))
        .await
        .expect("produce after the third left");

    let first = first.await.expect("first driver").finish().await;
    let second = second.await.expect("second driver").finish().await;

    let seen = positions([&first, &second, &third]);
    let expected = produced(&kafka, &topic, &group).await;
    assert_eq!(expected.len(), 600);
    let missing: Vec<_> = expected.difference(&seen).take(10).collect();
    assert!(missing.is_empty(), "never processed: {missing:?}");
    assert!(first.revocations + second.revocations >= 1);
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

    // The crashing consumer never commits.
    let mut crashing = Driver::new(
        kafka
            .source(&topic, &group)
            .build()
            .await
            .expect("crashing"),
        false,
    );
    crashing.run_for(Duration::from_secs(3)).await;
    let survivor = Driver::new(
        kafka
            .source(&topic, &group)
            .build()
            .await
            .expect("survivor"),
        true,
    );
    let survivor = spawn_for(survivor, Duration::from_secs(25));
    kafka.produce(&topic, batch(0, 300)).await.expect("produce");
    crashing.run_for(Duration::from_secs(5)).await;
    assert!(
        !crashing.received.is_empty(),
        "the crashing consumer took work"
    );
    drop(crashing);

    let survivor = survivor.await.expect("survivor driver").finish().await;
    let seen = positions([&survivor]);
    let expected = produced(&kafka, &topic, &group).await;
    let missing: Vec<_> = expected.difference(&seen).take(10).collect();
    assert!(
        missing.is_empty(),
        "never processed by the survivor: {missing:?}"
    );
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
    let mut driver = Driver::new(
        kafka.source(&topic, &group).build().await.expect("source"),
        false,
    );
    assert_eq!(driver.receive_until(1, PATIENCE).await, 1);

    let dlq = format!("{topic}.{group}.dlq");
    kafka.create_topic(&dlq, 1).await.expect("dlq topic");
    let sink = KafkaDeadLetterSink::builder(kafka.settings(), &group)
        .build()
        .expect("sink");
    let original = driver.received[0].clone();
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
    driver.finish().await;
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
