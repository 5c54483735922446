//! The Kafka adapter under the intake runtime against Apache Kafka on
//! 127.0.0.1:9092 (`.ci/services/kafka.sh`). Skipped with a printed reason
//! when no broker listens, unless `INTAKE_REQUIRE_BROKERS=1`.
//!
//! Every wait is on a condition (all ids seen, partitions settled), bounded
//! by `PATIENCE`; no test sleeps a fixed time and hopes.

mod support;

use std::time::Duration;

use bytes::Bytes;
use intake_core::backend::testkit::harness::{Ledger, numbered};
use intake_core::backend::testkit::{Backend, TestMessage};
use intake_core::dead_letter::{Broker, envelope};
use intake_core::{
    DeadLetter, DeliveryOrder, ErrorClass, Message, Metadata, Position,
    backend::{DeadLetterSink, SourceError},
};
use intake_kafka::{Error, GroupProtocol, KafkaDeadLetterSink};
use support::consumer::{TestConsumer, eventually, settled};
use support::{KafkaBackend, ReadRecord, unique};

const PATIENCE: Duration = Duration::from_secs(60);

support::per_group_protocol!(
    /// Eager range assignment under the classic protocol; under KIP-848's
    /// (`group.protocol=consumer`, served by Kafka 4) the broker assigns,
    /// incrementally, and keeps the session and heartbeat timings.
    a_third_consumer_joining_and_leaving_loses_nothing => third_consumer_joins_and_leaves_under
);

async fn third_consumer_joins_and_leaves_under(test: &str, protocol: GroupProtocol) {
    third_consumer_joins_and_leaves(test, protocol, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooperative_rebalances_lose_nothing() {
    third_consumer_joins_and_leaves(
        "cooperative_rebalances_lose_nothing",
        GroupProtocol::Classic,
        &[("partition.assignment.strategy", "cooperative-sticky")],
    )
    .await;
}

/// Two consumers share a topic; a third joins and later leaves; messages
/// keep arriving throughout. Every member joins with `protocol` and
/// `settings` (an empty value removes the fixture's own).
async fn third_consumer_joins_and_leaves(
    test: &str,
    protocol: GroupProtocol,
    settings: &[(&str, &str)],
) {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real(test) else {
        return;
    };
    let kafka = kafka.with_protocol(protocol).with_settings(settings);
    let topic = kafka.create_source(4).await.expect("topic");
    let group = kafka.new_group("g").await;
    kafka
        .produce(&topic, numbered(0, 200))
        .await
        .expect("produce");
    let ledger = Ledger::default();
    // A little work per message keeps deliveries in flight across each
    // rebalance, so revocations have something to drain.
    let start = |source| {
        TestConsumer::working(
            source,
            &ledger,
            Duration::from_millis(1),
            DeliveryOrder::Key,
            16,
        )
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

support::per_group_protocol!(
    /// A rolling restart: each of two members in turn is stopped gracefully
    /// and started again, with messages in flight. Every message is
    /// handled, and none twice: each handover is drained and committed
    /// before the partition moves (`docs/CONTRACT.md` §3).
    a_rolling_restart_hands_every_partition_over_without_loss_or_repeats => rolling_restart
);

async fn rolling_restart(test: &str, protocol: GroupProtocol) {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real(test) else {
        return;
    };
    let kafka = kafka.with_protocol(protocol);
    let topic = kafka.create_source(4).await.expect("topic");
    let group = kafka.new_group("g").await;
    let ledger = Ledger::default();
    let start = |source| {
        TestConsumer::working(
            source,
            &ledger,
            Duration::from_millis(1),
            DeliveryOrder::Key,
            16,
        )
    };
    let mut members = vec![
        start(kafka.source(&topic, &group).build().await.expect("first")),
        start(kafka.source(&topic, &group).build().await.expect("second")),
    ];
    kafka
        .produce(&topic, numbered(0, 200))
        .await
        .expect("produce");
    ledger.wait_for_all(200, "the first 200 messages").await;
    let mut produced = 200;
    for round in 0..2 {
        // Produced just before the member stops: some are in flight when it
        // drains, the rest wait for the partitions' next owner.
        kafka
            .produce(&topic, numbered(produced, 300))
            .await
            .expect("produce during the restart");
        produced += 300;
        members.remove(0).stop().await;
        let restarted = kafka
            .source(&topic, &group)
            .build()
            .await
            .expect("restarted");
        members.push(start(restarted));
        let running: Vec<&TestConsumer> = members.iter().collect();
        settled(&running, 4, PATIENCE).await;
        ledger
            .wait_for_all(produced, &format!("every message after restart {round}"))
            .await;
    }
    for member in members {
        member.stop().await;
    }
    assert_eq!(kafka.unacknowledged(&topic, &group).await.expect("lag"), 0);
    let repeated: Vec<(u64, u32)> = (0..produced)
        .map(|id| (id, ledger.count(id)))
        .filter(|(_, count)| *count > 1)
        .collect();
    assert!(
        repeated.is_empty(),
        "handled more than once across graceful handovers under {protocol}: {repeated:?}"
    );
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
        DeliveryOrder::Unordered,
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

/// Produces `poison` to a new topic, consumes it, and writes it with the
/// group's sink as a dead letter that failed with `error` after 5 attempts;
/// returns the topic, the message as consumed and the dead-letter record.
async fn dead_letter_one(
    kafka: &KafkaBackend,
    poison: TestMessage,
    error: &str,
) -> (String, Message, ReadRecord) {
    let topic = kafka.create_source(2).await.expect("topic");
    let group = unique("g");
    kafka.produce(&topic, vec![poison]).await.expect("produce");
    let mut source = kafka.source(&topic, &group).build().await.expect("source");
    let original = support::next_message(&mut source, PATIENCE).await;
    let sink = source.dead_letter_sink().build().await.expect("sink");
    sink.write(&DeadLetter::new(original.clone(), error, 5).with_class(ErrorClass::Retryable))
        .await
        .expect("accepted by the broker");
    let mut records = kafka
        .read_all(&sink.topic_for(&topic))
        .await
        .expect("read the dlq");
    assert_eq!(records.len(), 1);
    intake_core::backend::Source::close(&mut source)
        .await
        .expect("close");
    (topic, original, records.remove(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_read_back_from_the_dead_letter_topic_is_what_was_consumed() {
    let Some(kafka) = KafkaBackend::real("a_poison_message_read_back_from_the_dead_letter_topic")
    else {
        return;
    };
    let mut poison = TestMessage::new("order-9", "{not json");
    poison.headers = [("tenant", "acme"), ("trace", "t-1")]
        .into_iter()
        .map(|(name, value)| (name, Bytes::from_static(value.as_bytes())))
        .collect();
    let written = std::time::SystemTime::now();
    let (topic, original, record) = dead_letter_one(&kafka, poison, "expected value").await;

    // The envelope's names, as any Kafka tool shows them.
    assert_eq!(record.header(envelope::ORIGIN_BROKER), Some("kafka"));
    assert_eq!(record.header(envelope::ORIGIN_SOURCE), Some(topic.as_str()));
    assert_eq!(record.header(envelope::ORIGIN_POSITION), Some("0"));
    assert_eq!(record.header(envelope::ERROR_CLASS), Some("retryable"));
    assert_eq!(record.header(envelope::ATTEMPTS), Some("5"));

    let letter = record.dead_letter().expect("the record is a dead letter");
    assert_eq!(letter.message.payload(), original.payload());
    assert_eq!(letter.message.key(), original.key());
    assert_eq!(letter.message.headers(), original.headers());
    let (read, consumed) = (letter.message.metadata(), original.metadata());
    assert_eq!(
        (read.source(), read.partition(), read.position()),
        (consumed.source(), consumed.partition(), consumed.position())
    );
    let origin = letter.origin.as_ref().expect("origin");
    assert_eq!(origin.broker, Broker::Kafka);
    assert!(origin.group.is_some());
    assert_eq!(letter.error, "expected value");
    assert_eq!(letter.class, ErrorClass::Retryable);
    assert_eq!(letter.attempts, 5);
    assert_eq!(letter.first_failed_at, letter.failed_at);
    assert!(letter.failed_at >= written - Duration::from_millis(1));
    assert!(letter.failed_at <= std::time::SystemTime::now());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_carries_the_key_once_as_its_record_key() {
    // Before, the key was also written as an `intake.origin.key` header: a
    // large key took twice its size out of the record's limit.
    let Some(kafka) = KafkaBackend::real("a_dead_letter_carries_the_key_once") else {
        return;
    };
    let (_, _, record) =
        dead_letter_one(&kafka, TestMessage::new("order-9", "{not json"), "bad").await;
    assert_eq!(record.key.as_deref(), Some(&b"order-9"[..]));
    assert!(
        record
            .headers
            .iter()
            .all(|(_, value)| value.as_ref() != b"order-9"),
        "the key appears among the headers too: {:?}",
        record.headers
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_header_named_like_an_origin_field_does_not_change_the_origin() {
    // Before, the producer's header came first and a reader taking the
    // first value of `intake.origin.topic` read the producer's.
    let Some(kafka) = KafkaBackend::real("a_producer_header_named_like_an_origin_field") else {
        return;
    };
    let mut poison = TestMessage::new("order-9", "{not json");
    poison.headers = [
        (envelope::ORIGIN_SOURCE, "spoofed"),
        (envelope::ORIGIN_POSITION, "999"),
        (envelope::VERSION, "7"),
    ]
    .into_iter()
    .map(|(name, value)| (name, Bytes::from_static(value.as_bytes())))
    .collect();
    let (topic, original, record) = dead_letter_one(&kafka, poison, "bad").await;
    let named = |name: &str| {
        record
            .headers
            .iter()
            .filter(|(header, _)| header == name)
            .count()
    };
    assert_eq!(named(envelope::ORIGIN_SOURCE), 1, "{:?}", record.headers);
    assert_eq!(record.header(envelope::ORIGIN_SOURCE), Some(topic.as_str()));
    let letter = record.dead_letter().expect("a dead letter");
    assert_eq!(&**letter.message.metadata().source(), topic);
    assert_eq!(letter.message.metadata().position(), Position::Offset(0));
    assert_eq!(
        letter.message.headers(),
        original.headers(),
        "the producer's headers come back under their own names"
    );
}

/// A letter of `payload_bytes` written by a sink with `sink_settings` to a
/// dead-letter topic with `topic_config`: the write's outcome, and that of
/// the letter's reference.
async fn write_large_letter(
    kafka: &KafkaBackend,
    payload_bytes: usize,
    sink_settings: &[(&str, &str)],
    topic_config: &[(&str, &str)],
) -> (
    Result<(), intake_core::backend::DeadLetterError>,
    Result<(), intake_core::backend::DeadLetterError>,
) {
    let topic = kafka.create_source(1).await.expect("topic");
    let group = unique("g");
    let settings = sink_settings
        .iter()
        .fold(kafka.settings(), |settings, (key, value)| {
            settings.set(*key, *value)
        });
    let sink = KafkaDeadLetterSink::builder(settings, &group)
        .consumed_topics([&topic])
        .build()
        .await
        .expect("sink");
    kafka
        .create_topic_with(&sink.topic_for(&topic), 1, topic_config)
        .await
        .expect("dlq topic");
    let message = Message::new(
        vec![b'x'; payload_bytes],
        Metadata::new(topic.as_str().into(), 0, Position::Offset(0)),
    )
    .with_key("k");
    let letter = DeadLetter::new(message, "bad", 1);
    let written = tokio::time::timeout(PATIENCE, sink.write(&letter))
        .await
        .expect("the write ends");
    let reference = tokio::time::timeout(PATIENCE, sink.write(&letter.to_reference()))
        .await
        .expect("the write ends");
    (written, reference)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_letter_over_the_producers_message_max_bytes_is_rejected_not_retried() {
    // Before, it failed as any write does: retried on the write backoff,
    // the same way each time, before the layer fell back to the reference.
    let Some(kafka) = KafkaBackend::real("a_letter_over_the_producers_message_max_bytes") else {
        return;
    };
    let (written, reference) =
        write_large_letter(&kafka, 20_000, &[("message.max.bytes", "10000")], &[]).await;
    let refused = written.expect_err("larger than the producer sends");
    assert!(refused.is_rejected(), "{refused:?}");
    reference.expect("the reference letter fits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_letter_over_the_topics_max_message_bytes_is_rejected_not_retried() {
    let Some(kafka) = KafkaBackend::real("a_letter_over_the_topics_max_message_bytes") else {
        return;
    };
    let (written, reference) =
        write_large_letter(&kafka, 20_000, &[], &[("max.message.bytes", "4096")]).await;
    let refused = written.expect_err("larger than the topic takes");
    assert!(refused.is_rejected(), "{refused:?}");
    reference.expect("the reference letter fits");
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

    let sink = source.dead_letter_sink().build().await.expect("sink");
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
    intake_core::backend::Source::close(&mut source)
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
        Err(error @ Error::UnknownTopic { .. }) => {
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
///
/// The old topic's records finish only after it is deleted, so every commit
/// of their offset fails and the revocation's final commit has one to send.
/// librdkafka retries a commit the broker refused with "unknown topic or
/// partition" (twice, `retry.backoff.ms` apart, here long enough for the
/// topic to be created again meanwhile): such a commit must not be sent,
/// or the old offset lands on the new topic and its first records are
/// skipped.
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
    let kafka = kafka.with_settings(&[
        ("topic.metadata.propagation.max.ms", "2000"),
        ("retry.backoff.ms", "400"),
        ("retry.backoff.max.ms", "400"),
    ]);
    let topic = kafka.create_source(1).await.expect("topic");
    let group = unique("g");
    kafka
        .produce(&topic, numbered(0, 10))
        .await
        .expect("produce");
    let ledger = Ledger::default();
    let (open, gate) = tokio::sync::watch::channel(false);
    let consumer = TestConsumer::gated(
        kafka.source(&topic, &group).build().await.expect("source"),
        &ledger,
        gate,
    );
    ledger.wait_for_all(10, "the first topic's records").await;
    eventually("the partition to be assigned", PATIENCE, || async {
        consumer.assigned() == 1
    })
    .await;

    kafka.delete_topic(&topic).await.expect("delete");
    open.send_replace(true);
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

/// Parking (issue 18): `KafkaParking` parks in tiered retry topics and its
/// mover brings each message back, to its partition of the group's return
/// topic, once due.
/// "Not before due" is checked on every record that comes back, by its
/// timestamp (set by the mover's producer when it moves it); "in time"
/// only by a generous bound.
mod parking {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};
    use std::time::{Instant, SystemTime, UNIX_EPOCH};

    use intake_core::backend::testkit::harness::{Running, id_of};
    use intake_core::parking::{
        DUE, ORIGIN, ORIGIN_PARTITION, ORIGIN_POSITION, PARK_ID, Parked, Parking, ParkingLayer,
    };
    use intake_core::{Consumer, HandlerError, Headers};
    use intake_kafka::KafkaParking;
    use intake_kafka::parking::LEGACY_ORIGIN_PARTITION;
    use intake_kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
    use intake_kafka::rdkafka::message::{Header, Headers as _, OwnedHeaders};
    use intake_kafka::rdkafka::producer::{FutureProducer, FutureRecord};
    use intake_kafka::rdkafka::{ClientConfig, Message as _, Offset, TopicPartitionList};
    use tower::ServiceBuilder;

    use super::*;

    /// How long a parked message may take to come back: its delay, the
    /// mover group's first join (the broker delays it 1.5 s) and slack.
    const BACK_WITHIN: Duration = Duration::from_secs(20);

    fn unix_millis(time: SystemTime) -> i64 {
        time.duration_since(UNIX_EPOCH)
            .map(|since| since.as_millis() as i64)
            .unwrap_or(0)
    }

    /// A message as the source hands it out, with the headers the parking
    /// layer puts on the copy it parks (due in `delay`).
    fn consumed(topic: &str, partition: u32, id: u64, delay: Duration) -> (Message, i64) {
        let due = unix_millis(SystemTime::now() + delay);
        let mut headers = Headers::default();
        headers.insert("trace", format!("t-{id}"));
        headers.set(DUE, due.to_string());
        headers.set(PARK_ID, format!("park-{id}"));
        headers.set(ORIGIN, topic.to_owned());
        headers.set(ORIGIN_PARTITION, partition.to_string());
        headers.set(ORIGIN_POSITION, id.to_string());
        let message = Message::new(
            id.to_string(),
            Metadata::new(topic.into(), partition, Position::Offset(id as i64)),
        )
        .with_key(format!("key-{id}"))
        .with_headers(headers);
        (message, due)
    }

    /// A record read back, with its timestamp (milliseconds).
    #[derive(Debug)]
    struct Returned {
        partition: i32,
        key: Option<Vec<u8>>,
        payload: Vec<u8>,
        headers: Vec<(String, Vec<u8>)>,
        timestamp: i64,
    }

    impl Returned {
        fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .rev()
                .find(|(key, _)| key == name)
                .and_then(|(_, value)| std::str::from_utf8(value).ok())
        }
    }

    /// Reads `topic` from its start until `want` records came, or
    /// `patience` passed (then returns what came).
    async fn read_back(
        brokers: &str,
        topic: &str,
        want: usize,
        patience: Duration,
    ) -> Vec<Returned> {
        let brokers = brokers.to_owned();
        let topic = topic.to_owned();
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &brokers)
                .set("group.id", unique("intake-reader"))
                .set("enable.auto.commit", "false")
                .create()
                .expect("reader settings are valid");
            let metadata = consumer
                .fetch_metadata(Some(&topic), Duration::from_secs(10))
                .expect("metadata");
            let mut list = TopicPartitionList::new();
            for found in metadata
                .topics()
                .iter()
                .filter(|found| found.name() == topic)
            {
                for partition in found.partitions() {
                    list.add_partition_offset(&topic, partition.id(), Offset::Beginning)
                        .expect("partition");
                }
            }
            consumer.assign(&list).expect("assign");
            let deadline = Instant::now() + patience;
            let mut records = Vec::new();
            while records.len() < want && Instant::now() < deadline {
                let Some(Ok(message)) = consumer.poll(Duration::from_millis(100)) else {
                    continue;
                };
                let headers = message
                    .headers()
                    .map(|headers| {
                        headers
                            .iter()
                            .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                            .collect()
                    })
                    .unwrap_or_default();
                records.push(Returned {
                    partition: message.partition(),
                    key: message.key().map(<[u8]>::to_vec),
                    payload: message.payload().unwrap_or_default().to_vec(),
                    headers,
                    timestamp: message.timestamp().to_millis().unwrap_or(0),
                });
            }
            records
        })
        .await
        .expect("the reader ran")
    }

    /// A parking of `group` for `topic`, which parks: a source of the group
    /// was built to read its return topic.
    async fn parking_for(kafka: &KafkaBackend, topic: &str, group: &str) -> KafkaParking {
        let parking = KafkaParking::builder(kafka.settings(), group)
            .topics([topic])
            .delivery_timeout(Duration::from_secs(10))
            .build()
            .await
            .expect("parking");
        support::read_returns(kafka, &parking, topic, group).await;
        parking
    }

    /// A parking whose mover already moved one message (id `WARM_UP`, due
    /// at once) back to partition 0 of `topic`: it has joined its group and
    /// holds the 1 s retry topic, so a message parked now that came back
    /// early would show it (a mover still joining could not be early).
    async fn warmed_up(kafka: &KafkaBackend, topic: &str, group: &str) -> KafkaParking {
        let parking = parking_for(kafka, topic, group).await;
        let (message, _) = consumed(topic, 0, WARM_UP, Duration::ZERO);
        parking
            .park(&message, Duration::ZERO)
            .await
            .expect("parked");
        eventually("the warm-up message to be moved back", PATIENCE, || async {
            parking.moved() == 1
        })
        .await;
        parking
    }

    /// The warm-up message's id.
    const WARM_UP: u64 = 1001;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_parked_message_comes_back_to_its_own_partition_after_its_due_time() {
        support::init_tracing();
        let Some(kafka) = KafkaBackend::real("a_parked_message_comes_back_to_its_own_partition")
        else {
            return;
        };
        let topic = kafka.create_source(3).await.expect("topic");
        let group = unique("g");
        let parking = warmed_up(&kafka, &topic, &group).await;
        let delay = Duration::from_secs(1);
        let (message, due) = consumed(&topic, 2, 7, delay);

        let parked = parking.park(&message, delay).await.expect("parked");
        assert_eq!(parked, Parked::Moved);
        let retry_topic = parking.topic_for(&topic, delay);
        assert_eq!(retry_topic, format!("{topic}.{group}.retry.1s"));
        let in_retry = kafka.read_all(&retry_topic).await.expect("retry topic");
        let in_retry = in_retry
            .iter()
            .find(|record| record.payload == "7")
            .expect("confirmed before park returned");
        assert_eq!(in_retry.partition, 2, "the origin partition's number");
        assert_eq!(in_retry.header(ORIGIN_PARTITION), Some("2"));
        let offsets = kafka.offsets(&retry_topic, "-").await.expect("offsets");
        assert_eq!(offsets.len(), 3, "as many partitions as the origin");

        let back = read_back(
            kafka.brokers(),
            &parking.return_topic(&topic),
            2,
            BACK_WITHIN,
        )
        .await;
        let back = back
            .iter()
            .find(|record| record.payload == b"7")
            .unwrap_or_else(|| panic!("7 did not come back within {BACK_WITHIN:?}: {back:?}"));
        assert!(
            back.timestamp >= due,
            "moved back {} ms before its due time",
            due - back.timestamp
        );
        assert_eq!(back.partition, 2);
        assert_eq!(back.key.as_deref(), Some(&b"key-7"[..]));
        assert_eq!(back.payload, b"7");
        let sent: Vec<(String, Vec<u8>)> = message
            .headers()
            .iter()
            .map(|header| (header.name.to_string(), header.value.to_vec()))
            .collect();
        assert_eq!(
            back.headers, sent,
            "the headers it was parked with, in order"
        );
        assert_eq!(
            parking.return_topic(&topic),
            format!("{topic}.{group}.returned")
        );
        let origin = kafka.read_all(&topic).await.expect("origin");
        assert!(
            origin.is_empty(),
            "another group of the origin saw {origin:?}"
        );
        eventually("the mover to count its move", PATIENCE, || async {
            parking.moved() == 2
        })
        .await;
        parking
            .shutdown(Duration::from_secs(15))
            .await
            .expect("the mover stops");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn malformed_records_in_a_retry_topic_go_back_at_once_and_stall_nothing() {
        support::init_tracing();
        let Some(kafka) = KafkaBackend::real("malformed_records_in_a_retry_topic_go_back_at_once")
        else {
            return;
        };
        let topic = kafka.create_source(3).await.expect("topic");
        let group = unique("g");
        let parking = warmed_up(&kafka, &topic, &group).await;
        let delay = Duration::from_secs(1);
        let retry_topic = parking.topic_for(&topic, delay);
        // Hostile records behind a parked one in the same partition, then
        // a well-formed one behind them.
        let (first, _) = consumed(&topic, 0, 1, delay);
        parking.park(&first, delay).await.expect("parked");
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", kafka.brokers())
            .create()
            .expect("producer");
        for (id, headers) in [
            (2, vec![(LEGACY_ORIGIN_PARTITION, "not-a-partition")]),
            (3, vec![(DUE, "soon"), (LEGACY_ORIGIN_PARTITION, "77")]),
            (4, vec![(DUE, "-1"), (ORIGIN_PARTITION, "-3")]),
        ] {
            let headers = headers
                .iter()
                .fold(OwnedHeaders::new(), |all, (key, value)| {
                    all.insert(Header {
                        key,
                        value: Some(value.as_bytes()),
                    })
                });
            let payload = id.to_string();
            producer
                .send(
                    FutureRecord::<str, str>::to(&retry_topic)
                        .partition(0)
                        .key("hostile")
                        .payload(&payload)
                        .headers(headers),
                    Duration::from_secs(10),
                )
                .await
                .expect("hostile record written");
        }
        let (last, last_due) = consumed(&topic, 1, 5, delay);
        parking.park(&last, delay).await.expect("parked");

        let back = read_back(
            kafka.brokers(),
            &parking.return_topic(&topic),
            6,
            BACK_WITHIN,
        )
        .await;
        let mut ids: Vec<&[u8]> = back.iter().map(|record| &record.payload[..]).collect();
        ids.sort();
        assert_eq!(
            ids,
            [&b"1"[..], b"1001", b"2", b"3", b"4", b"5"],
            "{back:?}"
        );
        let well_formed = back
            .iter()
            .find(|record| record.payload == b"5")
            .expect("5");
        assert_eq!(well_formed.partition, 1);
        assert!(well_formed.timestamp >= last_due);
        for hostile in back
            .iter()
            .filter(|record| record.key.as_deref() == Some(b"hostile"))
        {
            assert_eq!(hostile.header(LEGACY_ORIGIN_PARTITION), None, "{hostile:?}");
        }
        parking
            .shutdown(Duration::from_secs(15))
            .await
            .expect("the mover stops");
    }

    /// A record whose due time lies far beyond its tier (a delay above the
    /// largest tier, a hostile header) holds its partition no longer than
    /// the next tier: then it goes to the tail, and the record behind it
    /// comes back on time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_record_due_long_after_its_tier_goes_to_the_tail_and_holds_up_nothing() {
        support::init_tracing();
        let Some(kafka) = KafkaBackend::real("a_record_due_long_after_its_tier_goes_to_the_tail")
        else {
            return;
        };
        let topic = kafka.create_source(1).await.expect("topic");
        let group = unique("g");
        let tier = Duration::from_millis(200);
        let parking = KafkaParking::builder(kafka.settings(), &group)
            .topics([&topic])
            .tiers([tier, Duration::from_millis(400)])
            .delivery_timeout(Duration::from_secs(10))
            .build()
            .await
            .expect("parking");
        support::read_returns(&kafka, &parking, &topic, &group).await;
        // Due in a day, yet in the 200 ms tier, ahead of one due in 200 ms.
        let (far, _) = consumed(&topic, 0, 1, Duration::from_secs(86_400));
        parking.park(&far, tier).await.expect("parked");
        let (near, near_due) = consumed(&topic, 0, 2, tier);
        parking.park(&near, tier).await.expect("parked");

        let back = read_back(
            kafka.brokers(),
            &parking.return_topic(&topic),
            1,
            BACK_WITHIN,
        )
        .await;
        assert_eq!(
            back.len(),
            1,
            "the near one came back within {BACK_WITHIN:?}"
        );
        assert_eq!(back[0].payload, b"2");
        assert!(back[0].timestamp >= near_due);
        eventually("the far one to go to the tail twice", PATIENCE, || async {
            parking.requeued() >= 2
        })
        .await;
        let back = read_back(
            kafka.brokers(),
            &parking.return_topic(&topic),
            2,
            Duration::from_secs(1),
        )
        .await;
        assert_eq!(back.len(), 1, "the far one is not back: {back:?}");
        parking
            .shutdown(Duration::from_secs(15))
            .await
            .expect("the mover stops");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn parked_messages_come_back_after_the_parking_that_parked_them_is_gone() {
        support::init_tracing();
        let Some(kafka) = KafkaBackend::real("parked_messages_come_back_after_the_parking_is_gone")
        else {
            return;
        };
        let topic = kafka.create_source(3).await.expect("topic");
        let group = unique("g");
        let delay = Duration::from_secs(3);
        let parking = parking_for(&kafka, &topic, &group).await;
        let mut dues = BTreeMap::new();
        for id in 0..12u64 {
            let (message, due) = consumed(&topic, (id % 3) as u32, id, delay);
            parking.park(&message, delay).await.expect("parked");
            dues.insert(id, due);
        }
        // Gone before anything is due: its mover held at most, committed
        // nothing.
        drop(parking);
        let earliest = dues.values().min().copied().unwrap_or_default();
        let dropped_before_due = unix_millis(SystemTime::now()) < earliest;

        let successor = parking_for(&kafka, &topic, &group).await;
        let back = read_back(
            kafka.brokers(),
            &successor.return_topic(&topic),
            12,
            BACK_WITHIN,
        )
        .await;
        let mut came: BTreeMap<u64, usize> = BTreeMap::new();
        for record in &back {
            let id: u64 = std::str::from_utf8(&record.payload)
                .expect("utf-8")
                .parse()
                .expect("an id");
            *came.entry(id).or_default() += 1;
            assert!(record.timestamp >= dues[&id], "{id} came back early");
            assert_eq!(record.partition, (id % 3) as i32, "{id}");
        }
        assert_eq!(
            came.keys().copied().collect::<Vec<_>>(),
            (0..12).collect::<Vec<_>>(),
            "every parked message came back (dropped before due: {dropped_before_due})"
        );
        successor
            .shutdown(Duration::from_secs(15))
            .await
            .expect("the mover stops");
    }

    /// The runtime with the parking layer: ids 0, 5 and 10 ask for 1 s on
    /// their first attempt; each is parked (counted in the report), comes
    /// back, and is handled after its delay; every other id runs at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_runtime_parks_retry_later_failures_and_handles_them_after_their_delay() {
        support::init_tracing();
        let Some(kafka) = KafkaBackend::real("the_runtime_parks_retry_later_failures") else {
            return;
        };
        let topic = kafka.create_source(2).await.expect("topic");
        let group = unique("g");
        // Distinct keys: no message waits behind a parked one of its key.
        kafka
            .produce(&topic, numbered(0, 14))
            .await
            .expect("produce");
        // First: it creates the return topic the source reads.
        let parking = warmed_up(&kafka, &topic, &group).await;
        let source = kafka
            .source(&topic, &group)
            .parking(&parking)
            .build()
            .await
            .expect("source");
        let acker = source.acker();
        let delay = Duration::from_secs(1);

        let ledger = Ledger::default();
        let first_seen: Arc<Mutex<BTreeMap<u64, Instant>>> = Arc::default();
        let waited: Arc<Mutex<BTreeMap<u64, Duration>>> = Arc::default();
        let handler = {
            let (ledger, first_seen, waited) = (ledger.clone(), first_seen.clone(), waited.clone());
            tower::service_fn(move |message: Message| {
                let (ledger, first_seen, waited) =
                    (ledger.clone(), first_seen.clone(), waited.clone());
                async move {
                    let id = id_of(&message)?;
                    let now = Instant::now();
                    let (first, since) = {
                        let mut seen = first_seen.lock().expect("lock");
                        match seen.get(&id) {
                            Some(at) => (false, now.duration_since(*at)),
                            None => {
                                seen.insert(id, now);
                                (true, Duration::ZERO)
                            }
                        }
                    };
                    if id % 5 == 0 && first {
                        return Err(HandlerError::retry_later("not yet", delay));
                    }
                    if id % 5 == 0 {
                        waited.lock().expect("lock").insert(id, since);
                    }
                    ledger.record(id);
                    Ok::<(), HandlerError>(())
                }
            })
        };
        let handler = ServiceBuilder::new()
            .layer(ParkingLayer::new(parking.clone()))
            .service(handler);
        let running = Running::run(
            source,
            acker,
            Consumer::builder().ordering(DeliveryOrder::Key),
            64,
            handler,
        )
        .expect("consumer");
        ledger
            .wait_for_all(14, "every id, the parked ones after their delay")
            .await;
        let report = running.stop().await;
        assert_eq!(report.parked, 3, "{report:?}");
        let waited = waited.lock().expect("lock").clone();
        assert_eq!(waited.keys().copied().collect::<Vec<_>>(), [0, 5, 10]);
        for (id, waited) in waited {
            assert!(waited >= delay, "{id} handled again after {waited:?}");
        }
        for id in 0..14 {
            assert_eq!(ledger.count(id), 1, "{id} succeeded once");
        }
        assert!(parking.moved() >= 4, "the warm-up and the 3 parked");
        // Another group reading the origin gets exactly the originals.
        let origin = kafka.read_all(&topic).await.expect("origin");
        assert_eq!(origin.len(), 14);
        assert!(origin.iter().all(|record| record.header(PARK_ID).is_none()));
        parking
            .shutdown(Duration::from_secs(15))
            .await
            .expect("the mover stops");
    }

    /// A returned copy that fails for good is a dead letter of its origin:
    /// it goes to `{origin}.{group}.dlq`, where operators and
    /// `intake dlq --source ORIGIN` look, and names the origin as its
    /// source, not the return topic it was consumed from.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_returned_copy_that_fails_for_good_is_a_dead_letter_of_its_origin() {
        use intake_core::dead_letter::store::{DeadLetterStore as _, Filter};

        support::init_tracing();
        let Some(kafka) = KafkaBackend::real("a_returned_copy_that_fails_for_good") else {
            return;
        };
        let topic = kafka.create_source(1).await.expect("topic");
        let group = unique("g");
        kafka
            .produce(&topic, numbered(0, 1))
            .await
            .expect("produce");
        let parking = warmed_up(&kafka, &topic, &group).await;
        let returned = parking.return_topic(&topic);
        let source = kafka
            .source(&topic, &group)
            .parking(&parking)
            .build()
            .await
            .expect("source");
        let acker = source.acker();
        let sink = source.dead_letter_sink().build().await.expect("sink");
        let handler = tower::service_fn(|message: Message| async move {
            let id = id_of(&message)?;
            match (id, message.headers().get(PARK_ID)) {
                (WARM_UP, _) => Ok(()),
                (_, None) => Err(HandlerError::retry_later("not yet", Duration::from_secs(1))),
                (_, Some(_)) => Err(HandlerError::permanent("still wrong")),
            }
        });
        let handler = ServiceBuilder::new()
            .layer(intake_core::DeadLetterLayer::new(sink.clone()))
            .layer(ParkingLayer::new(parking.clone()))
            .service(handler);
        let running = Running::run(
            source,
            acker,
            Consumer::builder().ordering(DeliveryOrder::Key),
            64,
            handler,
        )
        .expect("consumer");
        let store = intake_kafka::KafkaDeadLetters::builder(kafka.settings())
            .dead_letters_of(&topic, &group)
            .build()
            .expect("the origin's dead letters")
            .store(
                intake_kafka::KafkaPublisher::builder(kafka.settings())
                    .build()
                    .expect("publisher"),
            );
        let filter = Filter::all();
        eventually(
            "the returned copy in the origin's dead letters",
            PATIENCE,
            || async { store.count(&filter).await.is_ok_and(|count| count > 0) },
        )
        .await;
        let report = running.stop().await;
        assert_eq!(report.parked, 1, "{report:?}");
        assert_eq!(store.count(&filter).await.expect("count"), 1);
        let page = store.list(&filter, 10, None).await.expect("list");
        let letter = page.letters[0].letter.as_ref().expect("a letter");
        let metadata = letter.message.metadata();
        assert_eq!(&**metadata.source(), topic, "the origin, not {returned}");
        assert_eq!(metadata.partition(), 0);
        assert!(
            matches!(metadata.position(), Position::Offset(_)),
            "{metadata:?}"
        );
        assert_eq!(letter.class, ErrorClass::Permanent);
        assert_eq!(
            letter
                .origin
                .as_ref()
                .and_then(|origin| origin.group.as_deref()),
            Some(group.as_str())
        );
        assert_eq!(sink.topic_for(&topic), format!("{topic}.{group}.dlq"));
        let misplaced = kafka
            .read_all(&sink.topic_for(&returned))
            .await
            .unwrap_or_default();
        assert!(misplaced.is_empty(), "{misplaced:?}");
        parking
            .shutdown(Duration::from_secs(15))
            .await
            .expect("the mover stops");
    }
}
