//! Records with no value, and records with timestamps no clock reads, from
//! Apache Kafka on 127.0.0.1:9092 (review L10): a record whose value is
//! null is a tombstone, told apart from an empty value, with its key and
//! headers; a timestamp far in the future or before 1970 never panics the
//! polling thread. Skipped with a printed reason when no broker listens,
//! unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use std::time::{Duration, UNIX_EPOCH};

use intake_core::backend::Source;
use intake_core::{FromMessage, Json};
use intake_kafka::rdkafka::ClientConfig;
use intake_kafka::rdkafka::message::{Header, OwnedHeaders};
use intake_kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use support::{KafkaBackend, unique};

const PATIENCE: Duration = Duration::from_secs(30);

fn producer(kafka: &KafkaBackend) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", kafka.brokers())
        .create()
        .expect("producer")
}

/// A null value (a compacted topic's "delete this key") arrives as a
/// tombstone with its key and headers; an empty value arrives as an empty
/// payload, not a tombstone. `Json<T>` refuses the tombstone with an error
/// that names it; `Option<Json<T>>` takes it as `None`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_null_value_arrives_as_a_tombstone_with_its_key_and_headers() {
    support::init_tracing();
    let test = "a_null_value_arrives_as_a_tombstone_with_its_key_and_headers";
    let Some(kafka) = KafkaBackend::real(test) else {
        return;
    };
    let topic = unique("intake-null");
    kafka.create_topic(&topic, 1).await.expect("topic");
    let producer = producer(&kafka);
    let headers = || {
        OwnedHeaders::new().insert(Header {
            key: "tenant",
            value: Some("acme"),
        })
    };
    for record in [
        FutureRecord::<[u8], [u8]>::to(&topic)
            .key(b"deleted")
            .headers(headers()),
        FutureRecord::<[u8], [u8]>::to(&topic)
            .key(b"empty")
            .payload(b"")
            .headers(headers()),
        FutureRecord::<[u8], [u8]>::to(&topic)
            .key(b"seven")
            .payload(b"7"),
    ] {
        producer.send(record, PATIENCE).await.expect("produced");
    }

    let mut source = kafka
        .source(&topic, &unique("g"))
        .build()
        .await
        .expect("source");
    let taken = support::take(&mut source, 3, 16, PATIENCE).await;
    assert_eq!(taken.messages.len(), 3, "every record arrives");
    let [deleted, empty, seven] = [0, 1, 2].map(|index| taken.messages[index].clone());

    assert!(
        deleted.is_tombstone(),
        "a null value is a tombstone: {deleted:?}"
    );
    assert!(deleted.payload().is_empty());
    assert_eq!(deleted.key().map(|key| key.as_ref()), Some(&b"deleted"[..]));
    assert_eq!(deleted.headers().get_str("tenant"), Some("acme"));
    assert_eq!(deleted.byte_size(), "deleted".len() + "tenant".len() + 4);

    assert!(
        !empty.is_tombstone(),
        "an empty value is a value: {empty:?}"
    );
    assert!(empty.payload().is_empty());
    assert_eq!(empty.key().map(|key| key.as_ref()), Some(&b"empty"[..]));
    assert_eq!(empty.headers().get_str("tenant"), Some("acme"));
    assert!(!seven.is_tombstone());

    let refused =
        Json::<u64>::from_message(deleted.clone()).expect_err("Json<T> refuses a tombstone");
    assert!(refused.is_permanent(), "{refused:?}");
    let said = support::error_chain(&refused);
    assert!(said.contains("tombstone"), "the error names it: {said}");
    assert!(
        matches!(Option::<Json<u64>>::from_message(deleted), Ok(None)),
        "Option<Json<T>> takes a tombstone as None"
    );
    assert!(matches!(
        Option::<Json<u64>>::from_message(seven),
        Ok(Some(Json(7)))
    ));
    assert!(
        Option::<Json<u64>>::from_message(empty).is_err(),
        "an empty value is not a tombstone: it fails to decode"
    );
    source.close().await.expect("close");
}

/// Create times a producer may set that no clock reads: the largest
/// timestamp Kafka stores (`i64::MAX` ms, some 292 million years on),
/// one just below, and negative ones. The topic accepts any create time
/// (Kafka 4's default refuses those more than an hour ahead). Every record
/// the broker accepts arrives, and its timestamp is the instant it names
/// when the platform's clock type holds it, none otherwise (never a panic
/// of the polling thread); a negative one is no timestamp.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_with_timestamps_no_clock_reads_arrive() {
    support::init_tracing();
    let test = "records_with_timestamps_no_clock_reads_arrive";
    let Some(kafka) = KafkaBackend::real(test) else {
        return;
    };
    let topic = unique("intake-timestamps");
    let any = i64::MAX.to_string();
    kafka
        .create_topic_with(
            &topic,
            1,
            &[
                ("message.timestamp.after.max.ms", any.as_str()),
                ("message.timestamp.before.max.ms", any.as_str()),
            ],
        )
        .await
        .expect("topic");
    let producer = producer(&kafka);
    let mut accepted = Vec::new();
    for timestamp in [i64::MAX, i64::MAX - 1, 253_402_300_800_000, -5, i64::MIN] {
        let payload = timestamp.to_string();
        let sent = producer
            .send(
                FutureRecord::<[u8], [u8]>::to(&topic)
                    .payload(payload.as_bytes())
                    .timestamp(timestamp),
                PATIENCE,
            )
            .await;
        match sent {
            Ok(_) => accepted.push(timestamp),
            Err((error, _)) => eprintln!("create time {timestamp} refused: {error}"),
        }
    }
    assert!(
        accepted.contains(&i64::MAX),
        "the topic takes i64::MAX: {accepted:?}"
    );
    eprintln!("create times the broker took: {accepted:?}");

    let mut source = kafka
        .source(&topic, &unique("g"))
        .build()
        .await
        .expect("source");
    let taken = support::take(&mut source, accepted.len(), 16, PATIENCE).await;
    assert_eq!(
        taken.messages.len(),
        accepted.len(),
        "every accepted record arrives (the polling thread lives)"
    );
    for (message, timestamp) in taken.messages.iter().zip(&accepted) {
        assert_eq!(message.payload().as_ref(), timestamp.to_string().as_bytes());
        let expected = u64::try_from(*timestamp)
            .ok()
            .and_then(|millis| UNIX_EPOCH.checked_add(Duration::from_millis(millis)));
        assert_eq!(
            message.metadata().timestamp(),
            expected,
            "create time {timestamp}"
        );
    }
    source.close().await.expect("close");
}
