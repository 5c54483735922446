//! The Kafka dead-letter producer's durability (review 2026-12-04, part 4:
//! L4, L5), against rdkafka's in-process mock cluster: the producer is
//! idempotent (librdkafka's own retries of a write never write a letter
//! twice), which also means `acks=all`.
//!
//! The mock checks sequence numbers for transactional producers only, so a
//! retried write's second copy cannot be shown refused here; what the mock
//! shows is the wire: an idempotent producer asks the broker for a producer
//! id (`InitProducerId`) before it writes, and stamps every batch with it.

use std::time::Duration;

use intake_core::backend::DeadLetterSink as _;
use intake_core::{DeadLetter, Message, Metadata, Position};
use intake_kafka::rdkafka::bindings;
use intake_kafka::rdkafka::producer::{FutureProducer, Producer as _};
use intake_kafka::{KafkaDeadLetterSink, KafkaSettings};

/// librdkafka's ApiKeys (`rdkafka_protocol.h`).
const PRODUCE: i16 = 0;
const INIT_PRODUCER_ID: i16 = 22;

/// A mock cluster of one broker, owned by the returned producer.
fn mock_cluster() -> (
    FutureProducer,
    *mut bindings::rd_kafka_mock_cluster_t,
    String,
) {
    let owner: FutureProducer = intake_kafka::rdkafka::ClientConfig::new()
        .set("test.mock.num.brokers", "1")
        .create()
        .expect("a mock cluster starts in process");
    // SAFETY: the handle belongs to `owner`'s client; the tests use it only
    // while `owner` lives.
    let mock = unsafe { bindings::rd_kafka_handle_mock_cluster(owner.client().native_ptr()) };
    assert!(!mock.is_null(), "the producer owns a mock cluster");
    let brokers = owner
        .client()
        .mock_cluster()
        .expect("mock cluster")
        .bootstrap_servers();
    (owner, mock, brokers)
}

/// The ApiKeys of the requests the mock cluster received since tracking
/// started.
fn requests(mock: *mut bindings::rd_kafka_mock_cluster_t) -> Vec<i16> {
    let mut count = 0usize;
    // SAFETY: `mock` is live (its owner outlives every call); the array and
    // each element are freed once read, as librdkafka asks.
    unsafe {
        let array = bindings::rd_kafka_mock_get_requests(mock, &mut count);
        if array.is_null() {
            return Vec::new();
        }
        let keys = (0..count)
            .map(|index| bindings::rd_kafka_mock_request_api_key(*array.add(index)))
            .collect();
        bindings::rd_kafka_mock_request_destroy_array(array, count);
        keys
    }
}

fn letter(topic: &str) -> DeadLetter {
    let message = Message::new(
        "poison",
        Metadata::new(topic.into(), 0, Position::Offset(7)),
    )
    .with_key("k");
    DeadLetter::new(message, "malformed", 1)
}

/// L4: the dead-letter producer is idempotent: before its first write it
/// asks the broker for a producer id, so a write librdkafka retries (a
/// response lost to a timeout or a broken connection) carries the same
/// sequence number and the broker keeps one copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dead_letter_producer_is_idempotent() {
    let (owner, mock, brokers) = mock_cluster();
    owner
        .client()
        .mock_cluster()
        .expect("mock cluster")
        .create_topic("orders.billing.dlq", 1, 1)
        .expect("the dead-letter topic");
    // SAFETY: `mock` is live while `owner` is.
    unsafe { bindings::rd_kafka_mock_start_request_tracking(mock) };
    let sink = KafkaDeadLetterSink::builder(KafkaSettings::new(&brokers), "billing")
        .create_missing_topics(false)
        .delivery_timeout(Duration::from_secs(20))
        .build()
        .await
        .expect("sink");
    sink.write(&letter("orders"))
        .await
        .expect("the letter is written");
    let seen = requests(mock);
    assert!(
        seen.contains(&PRODUCE),
        "the mock saw no produce request: {seen:?}"
    );
    assert!(
        seen.contains(&INIT_PRODUCER_ID),
        "the dead-letter producer never asked for a producer id, so it is not idempotent: a retried write is written twice (requests seen: {seen:?})"
    );
    drop(sink);
    drop(owner);
}
