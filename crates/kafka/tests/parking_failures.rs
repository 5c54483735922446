//! The failure paths of Kafka parking, its dead letters and their replay
//! (review 2026-12-04: R1, R4, R6, R7, R8, R13, R18, R25), against Apache
//! Kafka on 127.0.0.1:9092 (`.ci/services/kafka.sh`). Skipped with a
//! printed reason when no broker listens, unless `INTAKE_REQUIRE_BROKERS=1`.
//!
//! Every wait is on a condition, bounded; no test asserts how long
//! anything took.

mod support;

use std::collections::BTreeMap;
use std::ffi::c_char;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use intake_core::backend::RevocationOutcome;
use intake_core::backend::testkit::Backend;
use intake_core::backend::testkit::harness::{Running, id_of, numbered};
use intake_core::dead_letter::store::{
    DeadLetterStore as _, Filter, Replay, Selection, StoreError,
};
use intake_core::parking::{
    DUE, ORIGIN, ORIGIN_PARTITION, ORIGIN_POSITION, PARK_ID, PARKS, Parking, ParkingLayer,
};
use intake_core::publish::{Output, Publisher as _};
use intake_core::{
    Consumer, DeadLetter, DeliveryOrder, ErrorClass, HandlerError, Headers, Message, Metadata,
    PartitionKey, Position,
    backend::{DeadLetterSink as _, Source as _, SourceEvent},
};
use intake_kafka::parking::ParkingError;
use intake_kafka::rdkafka::bindings;
use intake_kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
use intake_kafka::rdkafka::message::{BorrowedHeaders, OwnedHeaders};
use intake_kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use intake_kafka::rdkafka::{ClientConfig, Message as _, Offset, TopicPartitionList};
use intake_kafka::{
    GroupProtocol, KafkaDeadLetterSink, KafkaDeadLetters, KafkaParking, KafkaPublisher,
    KafkaSettings, KafkaSource,
};
use support::consumer::eventually;
use support::{KafkaBackend, unique};
use tower::ServiceBuilder;

const PATIENCE: Duration = Duration::from_secs(60);

/// How long a parked message may take to come back: its delay, the mover
/// group's first join (the broker delays it 1.5 s) and slack.
const BACK_WITHIN: Duration = Duration::from_secs(30);

/// The header of records parked by earlier versions: the origin partition.
const LEGACY_ORIGIN_PARTITION: &str = "intake.park.partition";

fn unix_millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(|since| since.as_millis() as u64)
        .unwrap_or(0)
}

/// Headers with raw names and values, as a producer in Go, C or Java
/// writes them (rdkafka's own `insert` takes the name as `&str`).
fn raw_headers(headers: &[(&[u8], &[u8])]) -> OwnedHeaders {
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

fn producer(kafka: &KafkaBackend) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", kafka.brokers())
        .set("message.timeout.ms", "30000")
        .create()
        .expect("producer")
}

/// Produces one record to `partition` of `topic`, as a producer that is not
/// intake would; returns its offset.
async fn produce_record(
    kafka: &KafkaBackend,
    topic: &str,
    partition: i32,
    key: &str,
    payload: &str,
    headers: &[(&[u8], &[u8])],
) -> i64 {
    let delivery = producer(kafka)
        .send(
            FutureRecord::<str, str>::to(topic)
                .partition(partition)
                .key(key)
                .payload(payload)
                .headers(raw_headers(headers)),
            Duration::from_secs(30),
        )
        .await
        .expect("the broker takes the record");
    delivery.offset
}

/// A record read back.
#[derive(Debug, Clone)]
struct Record {
    partition: i32,
    payload: String,
    /// Names read lossily (a name that is not UTF-8 is shown with U+FFFD).
    headers: Vec<(String, Vec<u8>)>,
}

impl Record {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .rev()
            .find(|(key, _)| key == name)
            .and_then(|(_, value)| std::str::from_utf8(value).ok())
    }
}

/// Reads `topic` from its start until `want` records came or `patience`
/// passed (then returns what came). Header names are read through
/// librdkafka's C API, lossily.
async fn read_back(
    kafka: &KafkaBackend,
    topic: &str,
    want: usize,
    patience: Duration,
) -> Vec<Record> {
    let brokers = kafka.brokers().to_owned();
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", unique("intake-reader"))
            .set("enable.auto.commit", "false")
            .create()
            .expect("reader settings are valid");
        let deadline = std::time::Instant::now() + patience;
        // The topic may be created a moment after the reader starts.
        let partitions = loop {
            let metadata = consumer
                .fetch_metadata(Some(&topic), Duration::from_secs(10))
                .expect("metadata");
            let partitions: Vec<i32> = metadata
                .topics()
                .iter()
                .filter(|found| found.name() == topic && found.error().is_none())
                .flat_map(|found| found.partitions().iter().map(|p| p.id()))
                .collect();
            if !partitions.is_empty() || std::time::Instant::now() >= deadline {
                break partitions;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let mut list = TopicPartitionList::new();
        for partition in partitions {
            list.add_partition_offset(&topic, partition, Offset::Beginning)
                .expect("partition");
        }
        consumer.assign(&list).expect("assign");
        let mut records = Vec::new();
        while records.len() < want && std::time::Instant::now() < deadline {
            let Some(Ok(message)) = consumer.poll(Duration::from_millis(100)) else {
                continue;
            };
            // Names through the C API: rdkafka's iterator panics on a name
            // that is not UTF-8.
            let headers = lossy_headers(&message);
            records.push(Record {
                partition: message.partition(),
                payload: String::from_utf8_lossy(message.payload().unwrap_or_default())
                    .into_owned(),
                headers,
            });
        }
        records
    })
    .await
    .expect("the reader ran")
}

fn lossy_headers(
    message: &intake_kafka::rdkafka::message::BorrowedMessage<'_>,
) -> Vec<(String, Vec<u8>)> {
    let mut native: *mut bindings::rd_kafka_headers_t = std::ptr::null_mut();
    // SAFETY: the message is live; its header list stays owned by it.
    let found = unsafe { bindings::rd_kafka_message_headers(message.ptr(), &mut native) };
    if found != bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || native.is_null() {
        return Vec::new();
    }
    // SAFETY: `native` is the message's header list.
    let count = unsafe { bindings::rd_kafka_header_cnt(native) };
    (0..count)
        .filter_map(|index| {
            let mut name: *const c_char = std::ptr::null();
            let mut value: *const std::ffi::c_void = std::ptr::null();
            let mut size = 0usize;
            // SAFETY: `index` is below the count; both pointers are owned
            // by the list and copied before the message is released.
            let got = unsafe {
                bindings::rd_kafka_header_get_all(native, index, &mut name, &mut value, &mut size)
            };
            if got != bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
                return None;
            }
            // SAFETY: as above.
            let name = unsafe { std::ffi::CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned();
            let value = if value.is_null() {
                Vec::new()
            } else {
                // SAFETY: as above.
                unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) }.to_vec()
            };
            Some((name, value))
        })
        .collect()
}

/// A key that librdkafka's `murmur2_random` (Java's partitioner) puts in
/// another partition than `not` of a topic of `partitions` partitions: the
/// key is produced to a scratch topic of that many partitions, by key.
async fn key_not_in(kafka: &KafkaBackend, partitions: u32, not: i32) -> String {
    let scratch = kafka
        .create_source(partitions)
        .await
        .expect("scratch topic");
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka.brokers())
        .set("partitioner", "murmur2_random")
        .create()
        .expect("producer");
    for attempt in 0..64 {
        let key = format!("key-{attempt}");
        let delivery = producer
            .send(
                FutureRecord::<str, str>::to(&scratch)
                    .key(&key)
                    .payload("probe"),
                Duration::from_secs(30),
            )
            .await
            .expect("probe written");
        if delivery.partition != not {
            return key;
        }
    }
    panic!("no key out of 64 went anywhere but partition {not}");
}

/// A message as the source hands it out, with the headers the parking
/// layer puts on the copy it parks (due in `delay`), its first park.
fn consumed(topic: &str, partition: u32, id: u64, delay: Duration) -> Message {
    let due = unix_millis(SystemTime::now() + delay);
    let mut headers = Headers::default();
    headers.insert("trace", format!("t-{id}"));
    headers.set(DUE, due.to_string());
    headers.set(PARK_ID, format!("park-{id}"));
    headers.set(ORIGIN, topic.to_owned());
    headers.set(ORIGIN_PARTITION, partition.to_string());
    headers.set(ORIGIN_POSITION, id.to_string());
    Message::new(
        id.to_string(),
        Metadata::new(topic.into(), partition, Position::Offset(id as i64)),
    )
    .with_key(format!("key-{id}"))
    .with_headers(headers)
}

async fn parking_for(kafka: &KafkaBackend, topic: &str, group: &str) -> KafkaParking {
    KafkaParking::builder(kafka.settings(), group)
        .topics([topic])
        .delivery_timeout(Duration::from_secs(10))
        .build()
        .await
        .expect("parking")
}

/// What a raw source (no runtime) delivered, polled in a task of its own
/// until stopped; revocations are completed at once.
struct Polled {
    payloads: Arc<Mutex<Vec<(String, i32, String)>>>,
    assigned: Arc<Mutex<Vec<PartitionKey>>>,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Polled {
    fn start(mut source: KafkaSource) -> Self {
        let payloads: Arc<Mutex<Vec<(String, i32, String)>>> = Arc::default();
        let assigned: Arc<Mutex<Vec<PartitionKey>>> = Arc::default();
        let stop = tokio_util::sync::CancellationToken::new();
        let task = {
            let (payloads, assigned, stop) = (payloads.clone(), assigned.clone(), stop.clone());
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                loop {
                    let next = tokio::select! {
                        () = stop.cancelled() => break,
                        next = source.next(&mut buffer, 64) => next,
                    };
                    match next {
                        Ok(SourceEvent::Delivered) => {
                            let mut seen = payloads.lock().expect("lock");
                            for message in buffer.drain(..) {
                                let metadata = message.metadata();
                                seen.push((
                                    metadata.source().to_string(),
                                    metadata.partition() as i32,
                                    String::from_utf8_lossy(message.payload()).into_owned(),
                                ));
                            }
                        }
                        Ok(SourceEvent::Assigned(partitions)) => {
                            assigned.lock().expect("lock").extend(partitions);
                        }
                        Ok(SourceEvent::Revoked(revocation)) => {
                            assigned
                                .lock()
                                .expect("lock")
                                .retain(|partition| !revocation.partitions().contains(partition));
                            revocation.complete(RevocationOutcome::default());
                        }
                        Ok(_) => {}
                        Err(error) => panic!("the source failed: {error}"),
                    }
                }
                let _ = tokio::time::timeout(Duration::from_secs(10), source.close()).await;
            })
        };
        Self {
            payloads,
            assigned,
            stop,
            task,
        }
    }

    fn payloads(&self) -> Vec<(String, i32, String)> {
        self.payloads.lock().expect("lock").clone()
    }

    fn assigned(&self) -> Vec<PartitionKey> {
        self.assigned.lock().expect("lock").clone()
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// R1: with `auto.offset.reset=latest` in the source's settings, a copy
/// that reached the return topic while no member had a position (the mover
/// moves overdue copies before the source joins) must still be read: its
/// original was acknowledged when it was parked. Here the source names the
/// return topic by hand, as the parking's docs said before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_returned_before_any_member_has_a_position_is_read_under_latest() {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real("a_copy_returned_before_any_member_has_a_position") else {
        return;
    };
    let topic = kafka.create_source(2).await.expect("topic");
    let group = unique("g");
    let parking = parking_for(&kafka, &topic, &group).await;
    let returned = parking.return_topic(&topic);
    let source = |settings: KafkaSettings| {
        KafkaSource::builder(settings)
            .group(&group)
            .topics([topic.clone(), returned.clone()])
    };
    copy_before_any_position_is_read(&kafka, &topic, &returned, source).await;
    parking
        .shutdown(Duration::from_secs(15))
        .await
        .expect("the mover stops");
}

/// R1 under KIP-848's consumer group protocol: the reset is the client's,
/// per partition, whichever protocol assigns it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_returned_before_any_member_has_a_position_is_read_under_kip_848() {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real("a_copy_returned_before_any_member_under_kip_848") else {
        return;
    };
    let kafka = kafka
        .with_protocol(GroupProtocol::Consumer)
        .with_settings(&[("group.remote.assignor", "range")]);
    let topic = kafka.create_source(2).await.expect("topic");
    let group = kafka.new_group("g").await;
    let parking = parking_for(&kafka, &topic, &group).await;
    let returned = parking.return_topic(&topic);
    let source = |settings: KafkaSettings| {
        KafkaSource::builder(settings)
            .group(&group)
            .topic(&topic)
            .parking(&parking)
    };
    copy_before_any_position_is_read(&kafka, &topic, &returned, source).await;
    parking
        .shutdown(Duration::from_secs(15))
        .await
        .expect("the mover stops");
}

/// R1 through the source's parking, with a return topic of another
/// template: subscribed by `.parking(..)`, read from its start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_with_its_parking_reads_its_return_topic_from_the_start_under_latest() {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real("a_source_with_its_parking_reads_its_return_topic") else {
        return;
    };
    let topic = kafka.create_source(2).await.expect("topic");
    let group = unique("g");
    let parking = KafkaParking::builder(kafka.settings(), &group)
        .topics([&topic])
        .return_topic_template("{group}.{topic}.back")
        .delivery_timeout(Duration::from_secs(10))
        .build()
        .await
        .expect("parking");
    let returned = parking.return_topic(&topic);
    assert_eq!(returned, format!("{group}.{topic}.back"));
    let source = |settings: KafkaSettings| {
        KafkaSource::builder(settings)
            .group(&group)
            .topic(&topic)
            .parking(&parking)
    };
    copy_before_any_position_is_read(&kafka, &topic, &returned, source).await;
    parking
        .shutdown(Duration::from_secs(15))
        .await
        .expect("the mover stops");
}

/// Writes a copy to partition 1 of `returned` while no member has a
/// position there, starts the source `source` makes of settings with
/// `auto.offset.reset=latest`, writes records after it until one arrives,
/// then asserts the copy arrived too. Twice: the second member starts after
/// the first stopped without committing (a restart), with a new copy
/// written in between.
async fn copy_before_any_position_is_read(
    kafka: &KafkaBackend,
    topic: &str,
    returned: &str,
    source: impl Fn(KafkaSettings) -> intake_kafka::KafkaSourceBuilder,
) {
    for round in 0..2 {
        let copy = format!("424{round}");
        // The mover's part, played by hand: a copy due already.
        produce_record(
            kafka,
            returned,
            1,
            "k7",
            &copy,
            &[
                (DUE.as_bytes(), b"0"),
                (PARK_ID.as_bytes(), copy.as_bytes()),
                (ORIGIN.as_bytes(), topic.as_bytes()),
                (ORIGIN_PARTITION.as_bytes(), b"1"),
                (ORIGIN_POSITION.as_bytes(), b"0"),
            ],
        )
        .await;
        let settings = kafka.settings().set("auto.offset.reset", "latest");
        let member = source(settings)
            .connect_timeout(Duration::from_secs(10))
            .close_timeout(Duration::from_secs(5))
            .build()
            .await
            .expect("source");
        let polled = Polled::start(member);
        // Records written after the member started, until one arrives: by
        // then the member has its positions, so whatever it skipped is
        // skipped.
        let sentinel = format!("sentinel-{round}-");
        let mut written = 0;
        eventually(
            "a record written after the member started to arrive",
            PATIENCE,
            || {
                written += 1;
                let (polled, sentinel) = (&polled, &sentinel);
                async move {
                    if polled
                        .payloads()
                        .iter()
                        .any(|(_, _, payload)| payload.starts_with(sentinel.as_str()))
                    {
                        return true;
                    }
                    if written % 20 == 1 {
                        produce_record(
                            kafka,
                            returned,
                            1,
                            "s",
                            &format!("{sentinel}{written}"),
                            &[],
                        )
                        .await;
                    }
                    false
                }
            },
        )
        .await;
        let seen = polled.payloads();
        polled.stop().await;
        assert!(
            seen.iter()
                .any(|(source, partition, payload)| source == returned
                    && *partition == 1
                    && *payload == copy),
            "round {round}: the copy written before the member had a position was skipped (lost): {seen:?}"
        );
    }
}

/// R13: under librdkafka's default assignment (`range`), and under KIP-848
/// with the broker's `range` assignor, partition `p` of a topic and of its
/// return topic go to the same member, with two members: the rule the
/// parking's key order relies on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_p_of_a_topic_and_of_its_return_topic_share_a_member_under_range() {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real("partition_p_of_a_topic_and_of_its_return_topic") else {
        return;
    };
    co_located(&kafka).await;
    let kip_848 = KafkaBackend::real("partition_p_of_a_topic_and_of_its_return_topic")
        .expect("the broker")
        .with_protocol(GroupProtocol::Consumer)
        .with_settings(&[("group.remote.assignor", "range")]);
    co_located(&kip_848).await;
}

/// Two members of a group reading a topic of 4 partitions and its return
/// topic (through `.parking(..)`) settle with partition `p` of both on one
/// member.
async fn co_located(kafka: &KafkaBackend) {
    let topic = kafka.create_source(4).await.expect("topic");
    let group = kafka.new_group("g").await;
    let parking = parking_for(kafka, &topic, &group).await;
    let returned = parking.return_topic(&topic);
    let member = || async {
        Polled::start(
            kafka
                .source(&topic, &group)
                .parking(&parking)
                .build()
                .await
                .expect("source"),
        )
    };
    let first = member().await;
    let second = member().await;
    eventually(
        "the two members to share 8 partitions",
        PATIENCE,
        || async {
            let (a, b) = (first.assigned(), second.assigned());
            !a.is_empty() && !b.is_empty() && a.len() + b.len() == 8
        },
    )
    .await;
    for member in [first.assigned(), second.assigned()] {
        for partition in &member {
            let twin = if &*partition.source == topic.as_str() {
                PartitionKey::new(returned.as_str(), partition.partition)
            } else {
                PartitionKey::new(topic.as_str(), partition.partition)
            };
            assert!(
                member.contains(&twin),
                "{partition} without {twin}: {member:?}"
            );
        }
    }
    first.stop().await;
    second.stop().await;
    parking
        .shutdown(Duration::from_secs(15))
        .await
        .expect("the mover stops");
}

/// Issue 26: a parking whose return topic no source of its group reads
/// strands what it parks (the mover moves the copies to a return topic
/// nobody reads, and their originals were acknowledged). A source of the
/// group built after the parking without `.parking(&parking)` is refused at
/// build time, naming the fix. One built before it cannot be checked then:
/// until a source is built with `.parking(&parking)`, the parking refuses
/// to park, naming the fix, and the message is retried the ordinary way
/// (nothing reaches a retry topic). Then parks go through and come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parking_whose_return_topic_no_source_reads_parks_nothing() {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real("a_parking_whose_return_topic_no_source_reads") else {
        return;
    };
    let topic = kafka.create_source(1).await.expect("topic");
    let group = unique("g");
    let origin_only = || {
        KafkaSource::builder(kafka.settings())
            .group(&group)
            .topic(&topic)
    };
    // The wiring that stranded parked messages: a source that reads the
    // origin only, here built before the parking.
    let unwired = origin_only()
        .build()
        .await
        .expect("no parking to check it against yet");
    let parking = KafkaParking::builder(kafka.settings(), &group)
        .topics([&topic])
        .delivery_timeout(Duration::from_secs(10))
        .build()
        .await
        .expect("parking");
    let returned = parking.return_topic(&topic);
    let refused = parking
        .park(&consumed(&topic, 0, 1, Duration::ZERO), Duration::ZERO)
        .await;
    let Err(refused) = refused else {
        panic!(
            "parked though no source reads the return topic `{returned}`: the copy would never be handled"
        );
    };
    let said = refused.0.to_string();
    assert!(
        said.contains(".parking(&parking)") && said.contains(&returned),
        "the refusal names the return topic and the fix: {said}"
    );
    assert!(
        matches!(
            refused.0.downcast_ref::<ParkingError>(),
            Some(ParkingError::ReturnTopicUnread { topic: unread, .. }) if *unread == topic
        ),
        "{refused:?}"
    );
    drop(unwired);

    // Built after the parking, the same wiring is refused at build time.
    match origin_only().build().await {
        Err(intake_kafka::Error::Config { setting, problem }) => {
            assert_eq!(setting, "parking");
            assert!(
                problem.contains(".parking(&parking)") && problem.contains(&returned),
                "the refusal names the return topic and the fix: {problem}"
            );
        }
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("a source that does not read `{returned}` was built after its parking"),
    }

    let wired = origin_only()
        .parking(&parking)
        .build()
        .await
        .expect("a source with the parking");
    parking
        .park(&consumed(&topic, 0, 2, Duration::ZERO), Duration::ZERO)
        .await
        .expect("parked once a source reads the return topic");
    let back = read_back(&kafka, &returned, 2, BACK_WITHIN).await;
    let ids: Vec<&str> = back.iter().map(|record| record.payload.as_str()).collect();
    assert_eq!(ids, ["2"], "the refused message was never parked: {back:?}");
    drop(wired);
    parking
        .shutdown(Duration::from_secs(15))
        .await
        .expect("the mover stops");
}

/// A source that names its parking's return topic among its topics by hand
/// reads the copies: built after the parking, it is not refused, and the
/// parking parks for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_that_names_the_return_topic_by_hand_wires_its_parking() {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real("a_source_that_names_the_return_topic_by_hand") else {
        return;
    };
    let topic = kafka.create_source(1).await.expect("topic");
    let group = unique("g");
    let parking = parking_for(&kafka, &topic, &group).await;
    let source = KafkaSource::builder(kafka.settings())
        .group(&group)
        .topics([topic.clone(), parking.return_topic(&topic)])
        .build()
        .await
        .expect("the return topic is read");
    parking
        .park(&consumed(&topic, 0, 1, Duration::ZERO), Duration::ZERO)
        .await
        .expect("parked: a source reads the return topic");
    drop(source);
    parking
        .shutdown(Duration::from_secs(15))
        .await
        .expect("the mover stops");
}

/// R7: a record in a retry topic with a header name that is not UTF-8 (any
/// producer with write access can write one) must not kill the mover: it
/// and the records behind it come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_name_that_is_not_utf8_in_a_retry_topic_stops_no_mover() {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real("a_header_name_that_is_not_utf8_in_a_retry_topic") else {
        return;
    };
    let topic = kafka.create_source(1).await.expect("topic");
    let group = unique("g");
    let parking = parking_for(&kafka, &topic, &group).await;
    support::read_returns(&kafka, &parking, &topic, &group).await;
    let retry = parking.topic_for(&topic, Duration::ZERO);
    parking
        .park(&consumed(&topic, 0, 1, Duration::ZERO), Duration::ZERO)
        .await
        .expect("parked");
    produce_record(
        &kafka,
        &retry,
        0,
        "hostile",
        "2",
        &[
            (b"\xff\xfe", b"1"),
            (DUE.as_bytes(), b"0"),
            (ORIGIN_PARTITION.as_bytes(), b"0"),
        ],
    )
    .await;
    parking
        .park(&consumed(&topic, 0, 3, Duration::ZERO), Duration::ZERO)
        .await
        .expect("parked");
    let back = read_back(&kafka, &parking.return_topic(&topic), 3, BACK_WITHIN).await;
    let mut ids: Vec<&str> = back.iter().map(|record| record.payload.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        ["1", "2", "3"],
        "the hostile record and the one behind it came back: {back:?}"
    );
    let hostile = back.iter().find(|record| record.payload == "2").expect("2");
    assert_eq!(hostile.headers[0].0, "\u{fffd}\u{fffd}", "{hostile:?}");
    let health = parking.mover_health();
    assert!(health.is_live(), "{health:?}");
    assert_eq!(health.restarts, 0, "the mover never panicked: {health:?}");
    parking
        .shutdown(Duration::from_secs(15))
        .await
        .expect("the mover stops");
}

/// R8: records parked under a tier no longer configured (a deploy changed
/// the tiers) are found and moved back by their due time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_a_tier_no_longer_configured_come_back() {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real("records_of_a_tier_no_longer_configured_come_back") else {
        return;
    };
    let topic = kafka.create_source(2).await.expect("topic");
    let group = unique("g");
    let old = format!("{topic}.{group}.retry.7s");
    kafka.create_topic(&old, 2).await.expect("old tier's topic");
    produce_record(
        &kafka,
        &old,
        1,
        "k77",
        "77",
        &[
            (DUE.as_bytes(), b"0"),
            (ORIGIN_PARTITION.as_bytes(), b"1"),
            (LEGACY_ORIGIN_PARTITION.as_bytes(), b"1"),
        ],
    )
    .await;
    let parking = parking_for(&kafka, &topic, &group).await;
    support::read_returns(&kafka, &parking, &topic, &group).await;
    // A record of a configured tier, to know the mover runs.
    parking
        .park(&consumed(&topic, 0, 1, Duration::ZERO), Duration::ZERO)
        .await
        .expect("parked");
    let back = read_back(&kafka, &parking.return_topic(&topic), 2, BACK_WITHIN).await;
    let old_one = back.iter().find(|record| record.payload == "77");
    assert!(
        old_one.is_some_and(|record| record.partition == 1),
        "the record of the old 7s tier never came back: {back:?}"
    );
    parking
        .shutdown(Duration::from_secs(15))
        .await
        .expect("the mover stops");
}

/// Task 7: the mover sends a record back to the partition named by the
/// core's `intake.park.origin.partition`, and still by the crate's old
/// `intake.park.partition` for records parked by earlier versions; `park`
/// writes the old header no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mover_routes_by_the_cores_origin_partition_and_reads_the_old_header() {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real("the_mover_routes_by_the_cores_origin_partition") else {
        return;
    };
    let topic = kafka.create_source(3).await.expect("topic");
    let group = unique("g");
    let parking = parking_for(&kafka, &topic, &group).await;
    support::read_returns(&kafka, &parking, &topic, &group).await;
    let retry = parking.topic_for(&topic, Duration::ZERO);
    parking
        .park(&consumed(&topic, 0, 1, Duration::ZERO), Duration::ZERO)
        .await
        .expect("parked");
    let to_two = key_not_in(&kafka, 3, 2).await;
    let to_one = key_not_in(&kafka, 3, 1).await;
    produce_record(
        &kafka,
        &retry,
        0,
        &to_two,
        "2",
        &[(DUE.as_bytes(), b"0"), (ORIGIN_PARTITION.as_bytes(), b"2")],
    )
    .await;
    produce_record(
        &kafka,
        &retry,
        0,
        &to_one,
        "3",
        &[
            (DUE.as_bytes(), b"0"),
            (LEGACY_ORIGIN_PARTITION.as_bytes(), b"1"),
        ],
    )
    .await;
    let back = read_back(&kafka, &parking.return_topic(&topic), 3, BACK_WITHIN).await;
    let partition_of = |id: &str| {
        back.iter()
            .find(|record| record.payload == id)
            .map(|record| record.partition)
    };
    assert_eq!(partition_of("1"), Some(0), "{back:?}");
    assert_eq!(partition_of("2"), Some(2), "by the core header: {back:?}");
    assert_eq!(partition_of("3"), Some(1), "by the old header: {back:?}");
    let two = back.iter().find(|record| record.payload == "2").expect("2");
    assert_eq!(
        two.header(ORIGIN_PARTITION),
        Some("2"),
        "the core header goes back with the copy: the layer reads it"
    );
    let three = back.iter().find(|record| record.payload == "3").expect("3");
    assert_eq!(three.header(LEGACY_ORIGIN_PARTITION), None, "{three:?}");
    let parked = read_back(&kafka, &retry, 3, Duration::from_secs(10)).await;
    let first = parked
        .iter()
        .find(|record| record.payload == "1")
        .expect("1");
    assert_eq!(first.header(LEGACY_ORIGIN_PARTITION), None, "{first:?}");
    assert_eq!(first.header(ORIGIN_PARTITION), Some("0"), "{first:?}");
    parking
        .shutdown(Duration::from_secs(15))
        .await
        .expect("the mover stops");
}

/// R4 (Kafka): a copy that came back through the return topic and fails
/// for good is a dead letter of its first delivery: the letter names the
/// origin topic, partition and offset of the original record, not the
/// copy's offset in the return topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returned_copys_letter_names_the_original_record() {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real("a_returned_copys_letter_names_the_original_record")
    else {
        return;
    };
    let topic = kafka.create_source(1).await.expect("topic");
    let group = unique("g");
    // Ids 0..6 at offsets 0..6; id 3 fails, so its original is at offset 3
    // and its copy at offset 0 of the return topic.
    kafka
        .produce(&topic, numbered(0, 6))
        .await
        .expect("produce");
    let parking = parking_for(&kafka, &topic, &group).await;
    let returned = parking.return_topic(&topic);
    let source = kafka
        .source(&topic, &group)
        .parking(&parking)
        .build()
        .await
        .expect("source");
    let acker = source.acker();
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let parked_from: Arc<Mutex<Option<intake_core::FirstDelivery>>> = Arc::default();
    let handler = {
        let parked_from = parked_from.clone();
        tower::service_fn(move |message: Message| {
            let parked_from = parked_from.clone();
            async move {
                let id = id_of(&message)?;
                if id != 3 {
                    return Ok(());
                }
                match message.metadata().parked_from() {
                    None => Err(HandlerError::retry_later("not yet", Duration::ZERO)),
                    Some(first) => {
                        *parked_from.lock().expect("lock") = Some(first.clone());
                        Err(HandlerError::permanent("still wrong"))
                    }
                }
            }
        })
    };
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
    let store = KafkaDeadLetters::builder(kafka.settings())
        .dead_letters_of(&topic, &group)
        .build()
        .expect("the origin's dead letters")
        .store(
            KafkaPublisher::builder(kafka.settings())
                .build()
                .expect("publisher"),
        );
    let filter = Filter::all();
    eventually("the returned copy's letter", PATIENCE, || async {
        store.count(&filter).await.is_ok_and(|count| count > 0)
    })
    .await;
    let report = running.stop().await;
    assert_eq!(report.parked, 1, "{report:?}");
    assert_eq!(
        parked_from.lock().expect("lock").clone(),
        Some(intake_core::FirstDelivery {
            source: topic.as_str().into(),
            partition: 0,
            position: Position::Offset(3),
        }),
        "the handler saw the copy as its first delivery"
    );
    let page = store.list(&filter, 10, None).await.expect("list");
    let letter = page.letters[0].letter.as_ref().expect("a letter");
    let metadata = letter.message.metadata();
    assert_eq!(&**metadata.source(), topic, "the origin, not {returned}");
    assert_eq!(metadata.partition(), 0);
    assert_eq!(
        metadata.position(),
        Position::Offset(3),
        "the original's offset in the origin, not the copy's in {returned}"
    );
    assert_eq!(letter.class, ErrorClass::Permanent);
    let origin = kafka.read_all(&topic).await.expect("origin");
    let original = origin
        .iter()
        .find(|record| record.partition == 0 && record.offset == 3)
        .expect("offset 3");
    // A listing leaves payloads out: the letter itself.
    let read = store.read(&page.letters[0].id).await.expect("read");
    let read = read.letter.expect("a letter");
    assert_eq!(original.payload, read.message.payload().clone());
    assert_eq!(original.key, read.message.key().cloned());
    parking
        .shutdown(Duration::from_secs(15))
        .await
        .expect("the mover stops");
}

/// R25 on Kafka, through `is_returned_copy`: park headers a producer writes
/// on a record of the origin are ignored (a due time ahead does not hold
/// it, its origin headers name no first delivery); the same headers on a
/// copy in the return topic are believed (held until due, its first
/// delivery named).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn park_headers_are_believed_on_return_copies_only() {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real("park_headers_are_believed_on_return_copies_only") else {
        return;
    };
    let topic = kafka.create_source(1).await.expect("topic");
    let group = unique("g");
    let parking = parking_for(&kafka, &topic, &group).await;
    let returned = parking.return_topic(&topic);
    // 50 s ahead, and a layer that would hold that long: no timing of a
    // loaded machine can pass for a hold.
    let forged_due = unix_millis(SystemTime::now() + Duration::from_secs(50));
    let copy_due = unix_millis(SystemTime::now() + Duration::from_secs(3));
    let park_headers = |due: u64| {
        vec![
            (DUE.to_owned(), due.to_string()),
            (PARKS.to_owned(), "1".to_owned()),
            (PARK_ID.to_owned(), "77".to_owned()),
            (ORIGIN.to_owned(), topic.clone()),
            (ORIGIN_PARTITION.to_owned(), "0".to_owned()),
            (ORIGIN_POSITION.to_owned(), "41".to_owned()),
        ]
    };
    let as_raw = |headers: &[(String, String)]| -> Vec<(Vec<u8>, Vec<u8>)> {
        headers
            .iter()
            .map(|(name, value)| (name.clone().into_bytes(), value.clone().into_bytes()))
            .collect()
    };
    let forged = as_raw(&park_headers(forged_due));
    let forged: Vec<(&[u8], &[u8])> = forged.iter().map(|(n, v)| (&n[..], &v[..])).collect();
    produce_record(&kafka, &topic, 0, "a", "1", &forged).await;
    let copy = as_raw(&park_headers(copy_due));
    let copy: Vec<(&[u8], &[u8])> = copy.iter().map(|(n, v)| (&n[..], &v[..])).collect();
    produce_record(&kafka, &returned, 0, "b", "2", &copy).await;

    let source = kafka
        .source(&topic, &group)
        .parking(&parking)
        .build()
        .await
        .expect("source");
    let acker = source.acker();
    type Seen = (u64, bool, Option<intake_core::FirstDelivery>);
    let seen: Arc<Mutex<BTreeMap<u64, Seen>>> = Arc::default();
    let handler = {
        let seen = seen.clone();
        tower::service_fn(move |message: Message| {
            let seen = seen.clone();
            async move {
                let id = id_of(&message)?;
                seen.lock().expect("lock").insert(
                    id,
                    (
                        unix_millis(SystemTime::now()),
                        message.headers().get(DUE).is_some(),
                        message.metadata().parked_from().cloned(),
                    ),
                );
                Ok::<(), HandlerError>(())
            }
        })
    };
    let handler = ServiceBuilder::new()
        .layer(ParkingLayer::new(parking.clone()).max_early_wait(Duration::from_secs(60)))
        .service(handler);
    let running = Running::run(source, acker, Consumer::builder(), 64, handler).expect("consumer");
    eventually("both records handled", PATIENCE, || async {
        seen.lock().expect("lock").len() == 2
    })
    .await;
    running.stop().await;
    let seen = seen.lock().expect("lock").clone();
    let (at, had_due, parked_from) = seen[&1].clone();
    assert!(!had_due, "the producer's park headers were dropped");
    assert_eq!(
        parked_from, None,
        "an ordinary record names no first delivery"
    );
    assert!(
        at < forged_due,
        "the record of the origin was held until its forged due time"
    );
    let (at, had_due, parked_from) = seen[&2].clone();
    assert!(had_due, "a copy keeps its park headers");
    assert!(
        at >= copy_due,
        "a copy is held until due ({at} < {copy_due})"
    );
    assert_eq!(
        parked_from,
        Some(intake_core::FirstDelivery {
            source: topic.as_str().into(),
            partition: 0,
            position: Position::Offset(41),
        })
    );
    assert!(parking.is_returned_copy(&Message::new(
        "x",
        Metadata::new(returned.as_str().into(), 0, Position::Offset(0)),
    )));
    assert!(!parking.is_returned_copy(&Message::new(
        "x",
        Metadata::new(topic.as_str().into(), 0, Position::Offset(0)),
    )));
    parking
        .shutdown(Duration::from_secs(15))
        .await
        .expect("the mover stops");
}

/// R18: an output put in a partition goes to that partition, whatever
/// partition its key would pick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publisher_puts_an_output_in_the_partition_it_names() {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real("the_publisher_puts_an_output_in_the_partition") else {
        return;
    };
    let topic = kafka.create_source(3).await.expect("topic");
    let key = key_not_in(&kafka, 3, 2).await;
    let publisher = KafkaPublisher::builder(kafka.settings())
        .build()
        .expect("publisher");
    let confirmation = publisher
        .send(
            Output::new(topic.as_str(), "placed")
                .with_key(key.clone())
                .with_partition(2),
        )
        .await
        .expect("sent")
        .await
        .expect("confirmed");
    assert_eq!(confirmation.partition, Some(2));
    let records = kafka.read_all(&topic).await.expect("read");
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].partition, 2, "{records:?}");
    publisher
        .close(Duration::from_secs(10))
        .await
        .expect("closed");
}

/// A letter of `group` for a message of `topic` at `partition`/`offset`
/// with `key`, written by the group's sink.
async fn write_letter(
    kafka: &KafkaBackend,
    topic: &str,
    group: &str,
    partition: u32,
    offset: i64,
    key: &str,
    payload: &str,
) {
    let sink = KafkaDeadLetterSink::builder(kafka.settings(), group)
        .consumed_topics([topic])
        .build()
        .await
        .expect("sink");
    let message = Message::new(
        payload.to_owned(),
        Metadata::new(topic.into(), partition, Position::Offset(offset)),
    )
    .with_key(key.to_owned());
    sink.write(&DeadLetter::new(message, "bad", 1))
        .await
        .expect("letter written");
}

fn store_of(kafka: &KafkaBackend, topic: &str, group: &str) -> intake_kafka::KafkaDeadLetterStore {
    KafkaDeadLetters::builder(kafka.settings())
        .dead_letters_of(topic, group)
        .build()
        .expect("store")
        .store(
            KafkaPublisher::builder(kafka.settings())
                .build()
                .expect("publisher"),
        )
}

/// R18 through the store: a replay to the origin lands in the letter's
/// origin partition, even for a key Java's partitioner puts elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_to_the_origin_lands_in_the_letters_partition() {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real("a_replay_to_the_origin_lands_in_the_letters_partition")
    else {
        return;
    };
    let topic = kafka.create_source(3).await.expect("topic");
    let group = unique("g");
    let key = key_not_in(&kafka, 3, 2).await;
    write_letter(&kafka, &topic, &group, 2, 5, &key, "r1").await;
    let store = store_of(&kafka, &topic, &group);
    let report = store
        .replay(&Selection::Matching(Filter::all()), &Replay::to_origin())
        .await
        .expect("replayed");
    assert_eq!(report.replayed, 1, "{report:?}");
    let records = kafka.read_all(&topic).await.expect("read");
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(
        records[0].partition, 2,
        "the letter's partition: {records:?}"
    );
    assert_eq!(records[0].key.as_deref(), Some(key.as_bytes()));
}

/// R6 (Kafka): a replay to the group goes to the group's return topic,
/// into the origin partition, marked as the original's first delivery;
/// another group of the origin never sees it. Without a return topic, the
/// replay to the group is refused and nothing is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_to_the_group_goes_to_its_return_topic_only() {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real("a_replay_to_the_group_goes_to_its_return_topic_only")
    else {
        return;
    };
    let topic = kafka.create_source(3).await.expect("topic");
    let group = unique("g");
    let returned = format!("{topic}.{group}.returned");
    kafka
        .create_topic(&returned, 3)
        .await
        .expect("return topic");
    let key = key_not_in(&kafka, 3, 2).await;
    write_letter(&kafka, &topic, &group, 2, 5, &key, "r1").await;
    let store = store_of(&kafka, &topic, &group);
    let report = store
        .replay(&Selection::Matching(Filter::all()), &Replay::to_group())
        .await
        .expect("replayed to the group");
    assert_eq!(report.replayed, 1, "{report:?}");
    let back = kafka.read_all(&returned).await.expect("read");
    assert_eq!(back.len(), 1, "{back:?}");
    let replay = &back[0];
    assert_eq!(replay.partition, 2, "the origin partition: {replay:?}");
    let header = |name: &str| {
        replay
            .headers
            .iter()
            .rev()
            .find(|(key, _)| key == name)
            .map(|(_, value)| String::from_utf8_lossy(value).into_owned())
    };
    assert_eq!(header(ORIGIN).as_deref(), Some(topic.as_str()));
    assert_eq!(header(ORIGIN_PARTITION).as_deref(), Some("2"));
    assert_eq!(header(ORIGIN_POSITION).as_deref(), Some("5"));
    let origin = kafka.read_all(&topic).await.expect("origin");
    assert!(
        origin.is_empty(),
        "another group of the origin saw {origin:?}"
    );

    // A group without a return topic: refused, nothing published.
    let lone = unique("g");
    write_letter(&kafka, &topic, &lone, 1, 9, "k", "r2").await;
    let refused = store_of(&kafka, &topic, &lone)
        .replay(&Selection::Matching(Filter::all()), &Replay::to_group())
        .await
        .expect_err("no way back to the group");
    assert!(
        matches!(refused, StoreError::NoWayBackToGroup { .. }),
        "{refused:?}"
    );
    assert!(kafka.read_all(&topic).await.expect("origin").is_empty());
}
