//! intake's backend conformance suite, unchanged, on Apache Kafka at
//! 127.0.0.1:9092 (`.ci/services/kafka.sh`). Skipped with a printed reason
//! when no broker listens, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use intake_core::BoxError;
use intake_core::backend::testkit::PublishingBackend;
use intake_kafka::{KafkaPublisher, KafkaSettings};

async fn backend() -> Option<support::KafkaBackend> {
    support::init_tracing();
    support::KafkaBackend::real("the conformance suite on Apache Kafka")
}

#[async_trait::async_trait]
impl PublishingBackend for support::KafkaBackend {
    type Publisher = KafkaPublisher;

    async fn publisher(&self) -> Result<KafkaPublisher, BoxError> {
        Ok(KafkaPublisher::builder(KafkaSettings::new(self.brokers())).build()?)
    }

    fn destination(&self, source: &str) -> String {
        source.to_owned()
    }
}

intake_core::conformance_suite!(backend());
intake_core::publisher_suite!(backend());

impl intake_core::backend::testkit::BrokerBackend for support::KafkaBackend {
    type Broker = intake_kafka::KafkaBroker;

    /// With the fixture's test timings (fast group joins), like every
    /// source of the suite.
    fn broker(&self) -> intake_kafka::KafkaBroker {
        intake_kafka::KafkaBroker::new(self.settings())
    }
}

intake_core::broker_suite!(backend());

#[async_trait::async_trait]
impl intake_core::backend::testkit::dead_letter_store::StoreBackend for support::KafkaBackend {
    type Store = intake_kafka::KafkaDeadLetterStore;

    async fn dead_letter_store(&self, source: &str, group: &str) -> Result<Self::Store, BoxError> {
        let settings = KafkaSettings::new(self.brokers());
        Ok(intake_kafka::KafkaDeadLetters::builder(settings.clone())
            .dead_letters_of(source, group)
            .timeout(std::time::Duration::from_secs(10))
            .build()?
            .store(KafkaPublisher::builder(settings).build()?))
    }
}

intake_core::dead_letter_store_suite!(backend());

/// The low and high watermarks of partition 0 of `topic`.
async fn watermarks(brokers: &str, topic: &str) -> (i64, i64) {
    watermarks_of(brokers, topic, 0).await
}

/// The low and high watermarks of `partition` of `topic`.
async fn watermarks_of(brokers: &str, topic: &str, partition: i32) -> (i64, i64) {
    use intake_kafka::rdkafka::ClientConfig;
    use intake_kafka::rdkafka::consumer::{BaseConsumer, Consumer};
    let (brokers, topic) = (brokers.to_owned(), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .expect("a consumer");
        consumer
            .fetch_watermarks(&topic, partition, std::time::Duration::from_secs(10))
            .expect("watermarks")
    })
    .await
    .expect("the watermarks' task")
}

/// The keys of the side topic whose newest record is a mark (not a
/// tombstone): the ids removed that are still in the dead-letter topic.
async fn marked(backend: &support::KafkaBackend, topic: &str) -> Vec<String> {
    let side = format!("{topic}{}", intake_kafka::REMOVED_SUFFIX);
    let mut newest = std::collections::BTreeMap::new();
    for record in backend.read_all(&side).await.expect("the side topic") {
        let key = String::from_utf8_lossy(record.key.as_deref().unwrap_or_default()).into_owned();
        // A mark's value is the time of the removal, a tombstone's none.
        newest.insert(key, !record.payload.is_empty());
    }
    newest
        .into_iter()
        .filter_map(|(key, mark)| mark.then_some(key))
        .collect()
}

/// Produces to partition 0 of `topic` a record that is no letter, with a
/// header name that is not UTF-8 (rdkafka's own reader panics on it),
/// written through librdkafka's C API as a Go, C or Java producer would.
async fn stray_with_a_raw_header_name(brokers: &str, topic: &str) {
    use intake_kafka::rdkafka::ClientConfig;
    use intake_kafka::rdkafka::bindings;
    use intake_kafka::rdkafka::message::{BorrowedHeaders, OwnedHeaders};
    use intake_kafka::rdkafka::producer::{FutureProducer, FutureRecord};

    let headers = OwnedHeaders::new();
    let name: &[u8] = b"\xff\xfename";
    // `BorrowedHeaders` is rdkafka's view of the `rd_kafka_headers_t` that
    // `headers` owns; the pointer stays valid while `headers` lives.
    let native =
        headers.as_borrowed() as *const BorrowedHeaders as *mut bindings::rd_kafka_headers_t;
    // SAFETY: `native` is a live, writable header list; librdkafka copies
    // the name and value (of the lengths given) before returning.
    let added = unsafe {
        bindings::rd_kafka_header_add(
            native,
            name.as_ptr().cast::<std::ffi::c_char>(),
            isize::try_from(name.len()).expect("a short name"),
            b"v".as_ptr().cast(),
            1,
        )
    };
    assert_eq!(
        added,
        bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
    );
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("a producer");
    producer
        .send(
            FutureRecord::<[u8], [u8]>::to(topic)
                .partition(0)
                .payload(b"stray")
                .headers(headers),
            std::time::Duration::from_secs(10),
        )
        .await
        .expect("a record that is no letter");
}

/// Kafka deletes only a prefix of a partition: a letter removed out of
/// order is marked in the side topic and skipped; once the letters before
/// it are removed too, the prefix is deleted (the low watermark moves) and
/// the marks tombstoned. A fresh store sees the same; a record that is no
/// letter (with a header name that is not UTF-8) is listed as unreadable
/// and never replayed; ids of other forms or
/// places remove nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_store_marks_letters_removed_out_of_order_and_deletes_the_prefix() {
    use intake_core::backend::DeadLetterSink;
    use intake_core::dead_letter::store::{
        DeadLetterStore, Filter, LetterId, Replay, Selection, SkipReason, StoreError,
    };
    use intake_core::{DeadLetter, Message, Metadata, Position};

    let Some(backend) = backend().await else {
        return;
    };
    let origin = support::unique("store-origin");
    let topic = support::unique("store-dlq");
    backend.create_topic(&origin, 1).await.expect("origin");
    let sink = intake_kafka::KafkaDeadLetterSink::builder(backend.settings(), "g")
        .topic_template(topic.as_str())
        .build()
        .await
        .expect("sink");
    for n in 0..5i64 {
        let metadata = Metadata::new(origin.as_str().into(), 0, Position::Offset(n));
        let message = Message::new(n.to_string(), metadata).with_key(format!("k{n}"));
        sink.write(&DeadLetter::new(message, "bad", 1))
            .await
            .expect("a letter");
    }
    stray_with_a_raw_header_name(backend.brokers(), &topic).await;
    let open = || async {
        let settings = KafkaSettings::new(backend.brokers());
        intake_kafka::KafkaDeadLetters::builder(settings.clone())
            .topic(topic.as_str())
            .timeout(std::time::Duration::from_secs(5))
            .build()
            .expect("the log")
            .store(
                KafkaPublisher::builder(settings)
                    .build()
                    .expect("publisher"),
            )
    };
    let store = open().await;
    let ids = |page: intake_core::dead_letter::store::Page| -> Vec<String> {
        page.letters
            .iter()
            .map(|stored| stored.id.to_string())
            .collect()
    };
    let summary = store.summary(&Filter::all()).await.expect("summary");
    assert_eq!((summary.total, summary.unreadable), (6, 1));
    let all = store.list(&Filter::all(), 100, None).await.expect("list");
    assert_eq!(ids(all), ["0:0", "0:1", "0:2", "0:3", "0:4", "0:5"]);

    let purge = |ids: &[&str]| Selection::Ids(ids.iter().map(|id| LetterId::from(*id)).collect());
    assert_eq!(store.purge(&purge(&["0:2"])).await.expect("purge"), 1);
    assert_eq!(store.count(&Filter::all()).await.expect("count"), 5);
    assert!(matches!(
        store.read(&"0:2".into()).await,
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(marked(&backend, &topic).await, ["0:2"]);
    assert_eq!(watermarks(backend.brokers(), &topic).await, (0, 6));

    // The prefix 0..=2 is complete: deleted, and no mark is left.
    assert_eq!(
        store.purge(&purge(&["0:1", "0:0"])).await.expect("purge"),
        2
    );
    assert_eq!(watermarks(backend.brokers(), &topic).await, (3, 6));
    assert!(marked(&backend, &topic).await.is_empty());
    let fresh = open().await;
    assert_eq!(fresh.count(&Filter::all()).await.expect("count"), 3);
    let left = fresh.list(&Filter::all(), 100, None).await.expect("list");
    assert_eq!(ids(left), ["0:3", "0:4", "0:5"]);

    // Removed already, never written, no such partition: nothing removed.
    let nothing = purge(&["0:1", "0:99", "1:0"]);
    assert_eq!(store.purge(&nothing).await.expect("purge"), 0);
    assert!(matches!(
        store.read(&"41".into()).await,
        Err(StoreError::InvalidId { .. })
    ));

    // Removals from the front of the partition are deletions: from here
    // on, nothing more is written to the side topic.
    let side = format!("{topic}{}", intake_kafka::REMOVED_SUFFIX);
    let side_records = backend.read_all(&side).await.expect("side topic").len();
    let report = fresh
        .replay(&Selection::Matching(Filter::all()), &Replay::to_origin())
        .await
        .expect("replay");
    assert_eq!(report.replayed, 2, "{report:?}");
    let skipped: Vec<(&str, &SkipReason)> = report
        .skipped
        .iter()
        .map(|skipped| (skipped.id.as_str(), &skipped.reason))
        .collect();
    assert_eq!(skipped, [("0:5", &SkipReason::Unreadable)]);
    let replayed = backend.read_all(&origin).await.expect("origin");
    let payloads: Vec<&[u8]> = replayed.iter().map(|r| &r.payload[..]).collect();
    assert_eq!(payloads, [b"3", b"4"]);
    assert_eq!(replayed[0].header("intake.replays"), Some("1"));
    assert_eq!(watermarks(backend.brokers(), &topic).await, (5, 6));

    assert_eq!(
        store
            .purge(&Selection::Matching(Filter::all()))
            .await
            .expect("purge"),
        1
    );
    assert_eq!(store.count(&Filter::all()).await.expect("count"), 0);
    assert_eq!(watermarks(backend.brokers(), &topic).await, (6, 6));
    assert!(marked(&backend, &topic).await.is_empty());
    let written = backend.read_all(&side).await.expect("side topic").len();
    assert_eq!(written, side_records, "records of the side topic");
    for name in [origin, topic.clone(), format!("{topic}.removed")] {
        let _ = backend.delete_topic(&name).await;
    }
}

/// On a dead-letter topic of several partitions, letters are in the order
/// of their partition, then their offset: the cursor walks from one
/// partition into the next, and a removal from the front of a partition
/// deletes that partition's prefix only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_store_walks_partitions_in_order() {
    use intake_core::dead_letter::store::{DeadLetterStore, Filter, LetterId, Selection};

    let Some(backend) = backend().await else {
        return;
    };
    let topic = support::unique("store-dlq-partitions");
    backend.create_topic(&topic, 2).await.expect("topic");
    for (partition, payloads) in [(0, ["a", "b"]), (1, ["c", "d"])] {
        backend
            .produce_to_partition(&topic, partition, payloads.map(str::to_owned))
            .await
            .expect("records");
    }
    let settings = KafkaSettings::new(backend.brokers());
    let store = intake_kafka::KafkaDeadLetters::builder(settings.clone())
        .topic(topic.as_str())
        .build()
        .expect("the log")
        .store(
            KafkaPublisher::builder(settings)
                .build()
                .expect("publisher"),
        );
    assert_eq!(store.count(&Filter::all()).await.expect("count"), 4);
    let mut walked = Vec::new();
    let mut after: Option<LetterId> = None;
    for _ in 0..5 {
        let page = store
            .list(&Filter::all(), 1, after.as_ref())
            .await
            .expect("list");
        walked.extend(page.letters.into_iter().map(|stored| stored.id.to_string()));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(walked, ["0:0", "0:1", "1:0", "1:1"]);

    let first_of_1 = Selection::Ids(vec!["1:0".into()]);
    assert_eq!(store.purge(&first_of_1).await.expect("purge"), 1);
    assert_eq!(watermarks_of(backend.brokers(), &topic, 0).await, (0, 2));
    assert_eq!(watermarks_of(backend.brokers(), &topic, 1).await, (1, 2));
    let all = Selection::Matching(Filter::all());
    assert_eq!(store.purge(&all).await.expect("purge"), 3);
    assert_eq!(store.count(&Filter::all()).await.expect("count"), 0);
    assert_eq!(watermarks_of(backend.brokers(), &topic, 1).await, (2, 2));
    let _ = backend.delete_topic(&topic).await;
}

#[async_trait::async_trait]
impl intake_core::backend::testkit::ControlBackend for support::KafkaBackend {
    type Channel = intake_kafka::KafkaControlChannel;

    /// From the broker value, with the fixture's settings (fast group
    /// joins for the instances' sources).
    async fn control_channel(
        &self,
        group: &str,
        log: intake_core::group_control::ControlLog,
    ) -> Result<Self::Channel, BoxError> {
        let broker = intake_kafka::KafkaBroker::new(self.settings());
        Ok(broker.control_channel(group, log).await?)
    }
}

intake_core::control_suite!(backend());

/// A control channel whose broker does not listen fails an append with a
/// transient error within its bound (the topic's lookup, 10 s), and neither
/// the error nor the channel's `Debug` shows the password of its settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_channel_at_a_closed_port_fails_an_append_transiently_without_secrets() {
    use intake_core::group_control::{ControlChannel, ControlLog};

    support::init_tracing();
    let port = intake_core::backend::testkit::closed_port().expect("a free port");
    let secret = "s3cret-control-password";
    let settings = KafkaSettings::new(format!("127.0.0.1:{port}"))
        .set("security.protocol", "SASL_PLAINTEXT")
        .set("sasl.mechanism", "PLAIN")
        .set("sasl.username", "billing")
        .set("sasl.password", secret);
    let channel = intake_kafka::KafkaBroker::new(settings)
        .control_channel("billing", ControlLog::Commands)
        .await
        .expect("the channel is made without connecting");
    assert_eq!(channel.topic(), "billing.intake-control");
    let started = std::time::Instant::now();
    let appended = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        channel.append(bytes::Bytes::from_static(b"pause")),
    )
    .await
    .expect("the append gives up within 30 s");
    let error = appended.expect_err("no broker stored the record");
    assert!(error.is_transient(), "{error:?}");
    let shown = format!("{} {error:?} {channel:?}", support::error_chain(&error));
    assert!(!shown.contains(secret), "{shown}");
    assert!(shown.contains("billing.intake-control"), "{shown}");
    println!("failed after {:?}: {shown}", started.elapsed());
}
