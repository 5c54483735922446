//! The Kafka source, acker and dead-letter sink against rdkafka's
//! in-process mock cluster (the fast tier: no broker to install).

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use intake_core::testkit::{Backend, TestMessage};
use intake_core::{
    AckBatch, AckError, Acker, DeadLetter, DeadLetterSink, Headers, PartitionAck, PartitionKey,
    Position, Source, SourceError,
};
use intake_kafka::dead_letter::header;
use intake_kafka::{ConnectError, KafkaDeadLetterSink, KafkaSettings, KafkaSource};
use support::driver::Driver;
use support::{KafkaBackend, unique};

const PATIENCE: Duration = Duration::from_secs(60);

fn numbered(count: usize) -> Vec<TestMessage> {
    (0..count)
        .map(|n| TestMessage::new(format!("key-{}", n % 7), format!("m{n}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivers_every_message_with_its_offset_key_headers_and_timestamp() {
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(1).await.expect("topic");
    let mut headers = Headers::new();
    headers.insert("trace-id", Bytes::from_static(b"abc"));
    let mut first = TestMessage::new("k", "hello");
    first.headers = headers;
    kafka
        .produce(&topic, vec![first, TestMessage::new("k", "world")])
        .await
        .expect("produce");

    let source = kafka
        .source(&topic, &unique("g"))
        .build()
        .await
        .expect("source");
    let mut driver = Driver::new(source, false);
    assert_eq!(driver.receive_until(2, PATIENCE).await, 2);

    let first = &driver.received[0];
    assert_eq!(first.payload().as_ref(), b"hello");
    assert_eq!(first.key().map(|k| k.as_ref()), Some(&b"k"[..]));
    assert_eq!(first.headers().get_str("trace-id"), Some("abc"));
    assert_eq!(&**first.metadata().source(), topic.as_str());
    assert_eq!(first.metadata().position(), Position::Offset(0));
    assert!(first.metadata().timestamp().is_some());
    assert_eq!(first.metadata().attempt(), 1);
    assert_eq!(
        driver.received[1].metadata().position(),
        Position::Offset(1)
    );
    assert!(
        driver
            .assigned
            .contains(&PartitionKey::new(topic.as_str(), 0))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_committed_offset_is_the_acked_watermark_plus_one() {
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(1).await.expect("topic");
    let group = unique("g");
    kafka.produce(&topic, numbered(10)).await.expect("produce");
    let source = kafka.source(&topic, &group).build().await.expect("source");
    let mut driver = Driver::new(source, false);
    assert_eq!(driver.receive_until(10, PATIENCE).await, 10);

    let mut ack = PartitionAck::new(PartitionKey::new(topic.as_str(), 0));
    ack.watermark = Some(Position::Offset(3));
    let batch = AckBatch {
        partitions: vec![ack],
        sync: true,
    };
    driver.acker.ack(&batch).await.expect("sync commit");

    let offsets = kafka.offsets(&topic, &group).await.expect("offsets");
    assert_eq!(offsets, vec![(0, Some(4), 10)]);
    assert_eq!(kafka.unacknowledged(&topic, &group).await.expect("lag"), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_buffer_pauses_fetching_and_loses_nothing() {
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(1).await.expect("topic");
    kafka.produce(&topic, numbered(300)).await.expect("produce");
    let source = kafka
        .source(&topic, &unique("g"))
        .buffer(8)
        .build()
        .await
        .expect("source");
    let mut driver = Driver::new(source, true);
    // Take a few, then leave the source alone long enough for its thread to
    // fill the buffer and pause.
    driver.receive_until(3, PATIENCE).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(driver.receive_until(300, PATIENCE).await, 300);
    let offsets: Vec<Position> = driver
        .received
        .iter()
        .map(|message| message.metadata().position())
        .collect();
    let expected: Vec<Position> = (0..300).map(Position::Offset).collect();
    assert_eq!(offsets, expected, "every offset once, in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_takes_no_more_than_asked() {
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(1).await.expect("topic");
    kafka.produce(&topic, numbered(20)).await.expect("produce");
    let mut source = kafka
        .source(&topic, &unique("g"))
        .build()
        .await
        .expect("source");
    let mut buffer = Vec::new();
    let mut taken = 0;
    while taken < 20 {
        buffer.clear();
        tokio::time::timeout(PATIENCE, source.next(&mut buffer, 3))
            .await
            .expect("an event in time")
            .expect("no error");
        assert!(buffer.len() <= 3);
        taken += buffer.len();
    }
    assert_eq!(taken, 20);
}

async fn two_consumers_share_partitions_without_loss_or_duplicates(strategy: &str) {
    support::init_tracing();
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(4).await.expect("topic");
    let group = unique("g");
    kafka.produce(&topic, numbered(100)).await.expect("produce");

    let settings = |kafka: &KafkaBackend| {
        KafkaSource::builder(
            kafka
                .settings()
                .set("partition.assignment.strategy", strategy),
        )
        .group(&group)
        .topic(&topic)
        .revoke_timeout(Duration::from_secs(20))
    };
    let first = settings(&kafka).build().await.expect("first source");
    let mut first = Driver::new(first, true);
    assert_eq!(first.receive_until(100, PATIENCE).await, 100);
    assert_eq!(first.assigned.len(), 4);

    // A second consumer joins: the first must be polled to hand over.
    let second = settings(&kafka).build().await.expect("second source");
    let mut second = Driver::new(second, true);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let first_task = {
        let stop = stop.clone();
        tokio::spawn(async move {
            first.run_until_stopped(&stop).await;
            first
        })
    };
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while second.assigned.is_empty() && tokio::time::Instant::now() < deadline {
        second.run_for(Duration::from_millis(500)).await;
    }
    kafka
        .produce(&topic, numbered(100))
        .await
        .expect("produce more");
    // Both keep consuming until the group has committed everything.
    while tokio::time::Instant::now() < deadline {
        second.run_for(Duration::from_secs(1)).await;
        if kafka.unacknowledged(&topic, &group).await.expect("lag") == 0 {
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    let first = first_task.await.expect("first driver");
    let assigned = first.assigned.len() + second.assigned.len();
    let first = first.finish().await;
    let second = second.finish().await;

    assert!(
        first.revocations >= 1,
        "the first consumer gave partitions up"
    );
    assert!(
        !second.assigned.is_empty(),
        "the second consumer got partitions"
    );
    assert_eq!(assigned, 4, "every partition owned once");
    let mut seen: Vec<String> = first.payloads();
    seen.extend(second.payloads());
    assert_eq!(seen.len(), 200, "nothing lost, nothing delivered twice");
    let distinct: BTreeSet<(String, i64)> = first
        .received
        .iter()
        .chain(&second.received)
        .map(|m| {
            let Position::Offset(offset) = m.metadata().position() else {
                unreachable!("kafka positions are offsets")
            };
            (format!("{}", m.metadata().partition_key()), offset)
        })
        .collect();
    assert_eq!(distinct.len(), 200);
    assert_eq!(kafka.unacknowledged(&topic, &group).await.expect("lag"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eager_rebalance_hands_partitions_over_at_their_commit() {
    two_consumers_share_partitions_without_loss_or_duplicates("range").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooperative_rebalance_hands_partitions_over_at_their_commit() {
    two_consumers_share_partitions_without_loss_or_duplicates("cooperative-sticky").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_dropped_without_close_leaves_its_uncommitted_messages_to_the_group() {
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(2).await.expect("topic");
    let group = unique("g");
    kafka.produce(&topic, numbered(40)).await.expect("produce");

    let crashed = kafka.source(&topic, &group).build().await.expect("source");
    let mut crashed = Driver::new(crashed, false);
    assert_eq!(crashed.receive_until(40, PATIENCE).await, 40);
    drop(crashed);

    let survivor = kafka.source(&topic, &group).build().await.expect("source");
    let mut survivor = Driver::new(survivor, true);
    assert_eq!(survivor.receive_until(40, PATIENCE).await, 40);
    survivor.finish().await;
    assert_eq!(kafka.unacknowledged(&topic, &group).await.expect("lag"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_source_commits_nothing_more_and_refuses_late_acks() {
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(1).await.expect("topic");
    let group = unique("g");
    kafka.produce(&topic, numbered(5)).await.expect("produce");
    let source = kafka.source(&topic, &group).build().await.expect("source");
    let mut driver = Driver::new(source, false);
    assert_eq!(driver.receive_until(5, PATIENCE).await, 5);
    driver.source.close().await.expect("close");

    let mut ack = PartitionAck::new(PartitionKey::new(topic.as_str(), 0));
    ack.watermark = Some(Position::Offset(4));
    let late = driver
        .acker
        .ack(&AckBatch {
            partitions: vec![ack],
            sync: true,
        })
        .await;
    assert!(matches!(late, Err(AckError::NotAssigned(_))), "{late:?}");
    assert_eq!(
        kafka.offsets(&topic, &group).await.expect("offsets"),
        vec![(0, None, 5)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcast_sources_each_get_every_message_from_the_end() {
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(1).await.expect("topic");
    kafka.produce(&topic, numbered(5)).await.expect("history");
    let build = || {
        KafkaSource::builder(kafka.settings())
            .group("dashboard")
            .topic(&topic)
            .broadcast()
            .build()
    };
    let mut first = Driver::new(build().await.expect("first"), true);
    let mut second = Driver::new(build().await.expect("second"), true);
    assert_ne!(first.source.group_id(), second.source.group_id());
    // Wait for both assignments before producing: broadcast starts at the end.
    first.run_for(Duration::from_secs(2)).await;
    second.run_for(Duration::from_secs(2)).await;
    assert!(!first.assigned.is_empty() && !second.assigned.is_empty());
    kafka.produce(&topic, numbered(10)).await.expect("produce");
    assert_eq!(first.receive_until(10, PATIENCE).await, 10);
    assert_eq!(second.receive_until(10, PATIENCE).await, 10);
    first.run_for(Duration::from_millis(500)).await;
    assert_eq!(
        first.received.len(),
        10,
        "history before the start is skipped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_carries_its_origin_and_is_confirmed_by_the_broker() {
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(1).await.expect("topic");
    let group = unique("g");
    let mut headers = Headers::new();
    headers.insert("tenant", Bytes::from_static(b"acme"));
    let mut poison = TestMessage::new("order-7", "{not json");
    poison.headers = headers;
    kafka.produce(&topic, vec![poison]).await.expect("produce");
    let source = kafka.source(&topic, &group).build().await.expect("source");
    let mut driver = Driver::new(source, false);
    assert_eq!(driver.receive_until(1, PATIENCE).await, 1);

    let dlq = format!("{topic}.{group}.dlq");
    kafka.create_topic(&dlq, 1).await.expect("dlq topic");
    let sink = KafkaDeadLetterSink::builder(kafka.settings(), &group)
        .build()
        .expect("sink");
    let letter = DeadLetter::new(driver.received[0].clone(), "expected value at line 1", 3);
    sink.write(&letter)
        .await
        .expect("the broker accepted the dead letter");

    let records = kafka.read_all(&dlq).await.expect("read dlq");
    assert_eq!(records.len(), 1);
    let record = &records[0];
    assert_eq!(record.payload.as_ref(), b"{not json");
    assert_eq!(record.key.as_deref(), Some(&b"order-7"[..]));
    assert_eq!(record.header("tenant"), Some("acme"));
    assert_eq!(record.header(header::TOPIC), Some(topic.as_str()));
    assert_eq!(record.header(header::PARTITION), Some("0"));
    assert_eq!(record.header(header::OFFSET), Some("0"));
    assert_eq!(record.header(header::KEY), Some("order-7"));
    assert_eq!(record.header(header::GROUP), Some(group.as_str()));
    assert_eq!(
        record.header(header::ERROR),
        Some("expected value at line 1")
    );
    assert_eq!(record.header(header::ATTEMPTS), Some("3"));
    assert!(
        record
            .header(header::FAILED_AT)
            .is_some_and(|at| at.parse::<u64>().is_ok())
    );

    let records = kafka.dead_letters(&topic, &group).await.expect("records");
    assert_eq!(records[0].position, "0");
    assert_eq!(records[0].attempts, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_topic_is_a_typed_error() {
    let kafka = KafkaBackend::mock();
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
        Err(ConnectError::UnknownTopic { topic, .. }) => assert_eq!(topic, missing),
        other => panic!("expected UnknownTopic, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_broker_is_a_typed_error_within_the_connect_timeout() {
    // Port 1 on loopback: nothing listens there.
    let built = tokio::time::timeout(
        PATIENCE,
        KafkaSource::builder(KafkaSettings::new("127.0.0.1:1"))
            .group("g")
            .topic("t")
            .connect_timeout(Duration::from_secs(2))
            .build(),
    )
    .await
    .expect("build returns within its connect timeout");
    let error = built.expect_err("nothing listens on port 1");
    assert!(
        matches!(error, ConnectError::Unreachable { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("bootstrap.servers"));
    assert!(SourceError::from(error).is_transient());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_setting_is_a_typed_error_naming_it() {
    let error =
        KafkaSource::builder(KafkaSettings::new("127.0.0.1:1").set("fetch.wait.max.ms", "soon"))
            .group("g")
            .topic("t")
            .build()
            .await
            .expect_err("librdkafka refuses the value");
    match error {
        ConnectError::Config { setting, .. } => assert_eq!(setting, "fetch.wait.max.ms"),
        other => panic!("expected Config, got {other:?}"),
    }
}
