//! Records that producers in other languages write freely, consumed from
//! Apache Kafka on 127.0.0.1:9092: none may panic the source, hang it or
//! stall its partition. Skipped with a printed reason when no broker
//! listens, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use std::ffi::c_char;
use std::time::Duration;

use intake_core::testkit::Backend;
use intake_core::testkit::harness::{Ledger, numbered};
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
    let owned = OwnedHeaders::new();
    // `BorrowedHeaders` is rdkafka's view of the very `rd_kafka_headers_t`
    // that `owned` owns; the pointer stays valid while `owned` lives.
    let native = owned.as_borrowed() as *const BorrowedHeaders as *mut bindings::rd_kafka_headers_t;
    for (name, value) in headers {
        // SAFETY: `native` is a live, writable header list; librdkafka
        // copies name and value (of the lengths given) before returning.
        let error = unsafe {
            bindings::rd_kafka_header_add(
                native,
                name.as_ptr().cast::<c_char>(),
                isize::try_from(name.len()).expect("a short name"),
                value.as_ptr().cast(),
                isize::try_from(value.len()).expect("a short value"),
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
    intake_core::Source::close(&mut source)
        .await
        .expect("close");
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
