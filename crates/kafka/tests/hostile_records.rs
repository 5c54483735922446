//! Records that producers in other languages write freely, consumed from
//! Apache Kafka on 127.0.0.1:9092: none may panic the source, hang it or
//! stall its partition. Skipped with a printed reason when no broker
//! listens, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use std::ffi::c_char;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;

use intake_core::backend::testkit::Backend;
use intake_core::backend::testkit::harness::{Ledger, numbered};
use intake_kafka::rdkafka::ClientConfig;
use intake_kafka::rdkafka::bindings;
use intake_kafka::rdkafka::message::{BorrowedHeaders, OwnedHeaders};
use intake_kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use support::consumer::TestConsumer;
use support::{KafkaBackend, unique};

const PATIENCE: Duration = Duration::from_secs(30);

/// Headers whose names are raw bytes: rdkafka's own `insert` takes `&str`,
/// so the test writes them through librdkafka's C API, as a Go, C or Java
/// producer would.
fn headers_with_raw_names(headers: &[(&[u8], &[u8])]) -> OwnedHeaders {
    let headers: Vec<(&[u8], Option<&[u8]>)> = headers
        .iter()
        .map(|(name, value)| (*name, Some(*value)))
        .collect();
    raw_headers(&headers)
}

/// Headers with raw names and values, a value of `None` being a null one.
fn raw_headers(headers: &[(&[u8], Option<&[u8]>)]) -> OwnedHeaders {
    let owned = OwnedHeaders::new();
    // `BorrowedHeaders` is rdkafka's view of the very `rd_kafka_headers_t`
    // that `owned` owns; the pointer stays valid while `owned` lives.
    let native = owned.as_borrowed() as *const BorrowedHeaders as *mut bindings::rd_kafka_headers_t;
    for (name, value) in headers {
        let (value_ptr, value_len) = match value {
            Some(value) => (
                value.as_ptr().cast(),
                isize::try_from(value.len()).expect("a short value"),
            ),
            None => (std::ptr::null(), 0),
        };
        // SAFETY: `native` is a live, writable header list; librdkafka
        // copies name and value (of the lengths given) before returning.
        let error = unsafe {
            bindings::rd_kafka_header_add(
                native,
                name.as_ptr().cast::<c_char>(),
                isize::try_from(name.len()).expect("a short name"),
                value_ptr,
                value_len,
            )
        };
        assert_eq!(
            error,
            bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        );
    }
    owned
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_name_that_is_not_utf8_is_read_lossily_and_never_stops_the_partition() {
    support::init_tracing();
    let test = "a_header_name_that_is_not_utf8_is_read_lossily_and_never_stops_the_partition";
    let Some(kafka) = KafkaBackend::real(test) else {
        return;
    };
    let topic = kafka.create_source(1).await.expect("topic");
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka.brokers())
        .create()
        .expect("producer");
    producer
        .send(
            FutureRecord::<[u8], [u8]>::to(&topic)
                .payload(b"0")
                .headers(headers_with_raw_names(&[
                    (b"\xff\xfeorigin", b"\x00\x01binary"),
                    (b"tenant", b"acme"),
                ])),
            PATIENCE,
        )
        .await
        .expect("the broker accepts any header name");
    // A record after it on the same partition: the partition keeps flowing.
    kafka
        .produce(&topic, numbered(1, 1))
        .await
        .expect("produce");

    let mut source = kafka
        .source(&topic, &unique("g"))
        .build()
        .await
        .expect("source");
    let taken = support::take(&mut source, 2, 16, PATIENCE).await;
    assert_eq!(
        taken.messages.len(),
        2,
        "both records arrive within {PATIENCE:?} (the polling thread panicked on the header \
         name before)"
    );
    let hostile = &taken.messages[0];
    let names: Vec<&str> = hostile
        .headers()
        .iter()
        .map(|header| &*header.name)
        .collect();
    assert_eq!(names, ["\u{fffd}\u{fffd}origin", "tenant"]);
    assert_eq!(
        hostile
            .headers()
            .get("\u{fffd}\u{fffd}origin")
            .map(|v| v.as_ref()),
        Some(&b"\x00\x01binary"[..]),
        "the value keeps its raw bytes"
    );
    assert_eq!(hostile.headers().get_str("tenant"), Some("acme"));
    intake_core::backend::Source::close(&mut source)
        .await
        .expect("close");
}

/// A source told to ignore headers delivers a record with headers without
/// them (and everything else as usual); one that is not keeps them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_that_ignores_headers_delivers_records_without_them() {
    support::init_tracing();
    let test = "a_source_that_ignores_headers_delivers_records_without_them";
    let Some(kafka) = KafkaBackend::real(test) else {
        return;
    };
    let topic = kafka.create_source(1).await.expect("topic");
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka.brokers())
        .create()
        .expect("producer");
    producer
        .send(
            FutureRecord::<[u8], [u8]>::to(&topic)
                .key(b"k")
                .payload(b"with headers")
                .headers(headers_with_raw_names(&[(b"tenant", b"acme")])),
            PATIENCE,
        )
        .await
        .expect("produce");

    for ignore in [true, false] {
        let mut builder = kafka.source(&topic, &unique("g"));
        if ignore {
            builder = builder.ignore_headers();
        }
        let mut source = builder.build().await.expect("source");
        let taken = support::take(&mut source, 1, 16, PATIENCE).await;
        let message = taken.messages.first().expect("the record arrives");
        assert_eq!(message.payload().as_ref(), b"with headers");
        assert_eq!(message.key().map(|key| key.as_ref()), Some(&b"k"[..]));
        assert_eq!(
            message.headers().get_str("tenant"),
            (!ignore).then_some("acme"),
            "ignore_headers: {ignore}"
        );
        intake_core::backend::Source::close(&mut source)
            .await
            .expect("close");
    }
}

/// Each codec Kafka producers use, zstd (the default of many) among them:
/// a batch the consumer cannot decompress would stall its partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_in_every_compression_codec_are_consumed() {
    support::init_tracing();
    let test = "batches_in_every_compression_codec_are_consumed";
    let Some(kafka) = KafkaBackend::real(test) else {
        return;
    };
    let topic = kafka.create_source(1).await.expect("topic");
    let mut first = 0;
    for codec in ["gzip", "snappy", "lz4", "zstd"] {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", kafka.brokers())
            .set("compression.type", codec)
            .set("linger.ms", "20")
            .create()
            .unwrap_or_else(|error| panic!("a {codec} producer: {error}"));
        let sends = (first..first + 50).map(|id| {
            let payload = format!("{id}");
            let producer = &producer;
            let topic = &topic;
            async move {
                producer
                    .send(
                        FutureRecord::<[u8], [u8]>::to(topic).payload(payload.as_bytes()),
                        PATIENCE,
                    )
                    .await
            }
        });
        for delivered in futures_util::future::join_all(sends).await {
            delivered.unwrap_or_else(|(error, _)| panic!("{codec} batch: {error}"));
        }
        first += 50;
    }
    let ledger = Ledger::default();
    let group = unique("g");
    let consumer = TestConsumer::recording(
        kafka.source(&topic, &group).build().await.expect("source"),
        &ledger,
    );
    ledger
        .wait_for_all(first, "every record, whatever its batch's codec")
        .await;
    consumer.stop().await;
    assert_eq!(kafka.unacknowledged(&topic, &group).await.expect("lag"), 0);
}

/// A record as a hostile producer may write it.
#[derive(Debug, Clone)]
struct AnyRecord {
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// Create time in ms since the epoch; negative ones included.
    timestamp: i64,
}

fn any_record() -> impl Strategy<Value = AnyRecord> {
    use proptest::collection::vec;
    use proptest::option::of;
    use proptest::prelude::*;
    let bytes = |max| vec(any::<u8>(), 0..max);
    (
        of(bytes(64)),
        of(bytes(2048)),
        vec((bytes(24), of(bytes(64))), 0..12),
        prop_oneof![Just(-1i64), -10_000i64..0, 0i64..4_102_444_800_000],
    )
        .prop_map(|(key, payload, headers, timestamp)| AnyRecord {
            key,
            payload,
            headers,
            timestamp,
        })
}

/// What the source must make of a header name: librdkafka keeps names as C
/// strings (cut at the first NUL), intake reads them lossily.
fn expected_name(raw: &[u8]) -> String {
    let cut = raw.iter().position(|byte| *byte == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..cut]).into_owned()
}

/// Arbitrary records (null and empty keys and values, any header bytes,
/// null header values, negative and far timestamps) through the broker and
/// the source's conversion: every record the broker accepted arrives as a
/// message with its bytes, nothing panics, nothing stalls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arbitrary_records_arrive_as_messages_with_their_bytes() {
    support::init_tracing();
    let test = "arbitrary_records_arrive_as_messages_with_their_bytes";
    let Some(kafka) = KafkaBackend::real(test) else {
        return;
    };
    let mut runner = TestRunner::deterministic();
    let records: Vec<AnyRecord> = (0..300)
        .map(|_| {
            any_record()
                .new_tree(&mut runner)
                .expect("a record")
                .current()
        })
        .collect();
    let topic = kafka.create_source(1).await.expect("topic");
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka.brokers())
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    let mut accepted = Vec::new();
    for record in &records {
        let headers: Vec<(&[u8], Option<&[u8]>)> = record
            .headers
            .iter()
            .map(|(name, value)| (name.as_slice(), value.as_deref()))
            .collect();
        let mut sent = FutureRecord::<[u8], [u8]>::to(&topic)
            .partition(0)
            .timestamp(record.timestamp)
            .headers(raw_headers(&headers));
        if let Some(key) = &record.key {
            sent = sent.key(key.as_slice());
        }
        if let Some(payload) = &record.payload {
            sent = sent.payload(payload.as_slice());
        }
        // The broker may refuse a record (a timestamp it will not store):
        // only what it accepted must come back.
        match producer.send(sent, PATIENCE).await {
            Ok(_) => accepted.push(record.clone()),
            Err((error, _)) => tracing::info!(%error, ?record.timestamp, "refused by the broker"),
        }
    }
    assert!(
        accepted.len() > records.len() / 2,
        "most records are stored"
    );

    let mut source = kafka
        .source(&topic, &unique("g"))
        .build()
        .await
        .expect("source");
    let taken = support::take(&mut source, accepted.len(), 64, Duration::from_secs(60)).await;
    assert_eq!(
        taken.messages.len(),
        accepted.len(),
        "every accepted record arrives"
    );
    for (message, record) in taken.messages.iter().zip(&accepted) {
        assert_eq!(
            message.payload().as_ref(),
            record.payload.as_deref().unwrap_or_default()
        );
        assert_eq!(
            message.is_tombstone(),
            record.payload.is_none(),
            "a null value is a tombstone, an empty one is not"
        );
        assert_eq!(
            message.key().map(Bytes::as_ref),
            record.key.as_deref(),
            "a null key stays absent, an empty one empty"
        );
        let names: Vec<String> = message
            .headers()
            .iter()
            .map(|header| header.name.to_string())
            .collect();
        let expected: Vec<String> = record
            .headers
            .iter()
            .map(|(name, _)| expected_name(name))
            .collect();
        assert_eq!(names, expected);
        for (header, (_, value)) in message.headers().iter().zip(&record.headers) {
            assert_eq!(header.value.as_ref(), value.as_deref().unwrap_or_default());
        }
        if record.timestamp >= 0 {
            assert_eq!(
                message.metadata().timestamp(),
                Some(UNIX_EPOCH + Duration::from_millis(record.timestamp as u64))
            );
        }
    }
    intake_core::backend::Source::close(&mut source)
        .await
        .expect("close");
}
