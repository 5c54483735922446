//! The Kafka fixture for intake's conformance suite, on two brokers: the
//! in-process rdkafka `MockCluster` (fast tier) and Apache Kafka on
//! 127.0.0.1:9092 (real tier, `.ci/services/kafka.sh`).
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use intake_core::backend::RevocationOutcome;
use intake_core::backend::testkit::{self, Backend, Capabilities, ConnectSettings, TestMessage};
use intake_core::dead_letter::{Broker, EnvelopeError};
use intake_core::{
    BoxError, DeadLetter, Headers, Message, PartitionKey,
    backend::{Source, SourceEvent},
};
use intake_kafka::rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, NewTopic, ResourceSpecifier, TopicReplication,
};
use intake_kafka::rdkafka::client::DefaultClientContext;
use intake_kafka::rdkafka::consumer::{BaseConsumer, Consumer};
use intake_kafka::rdkafka::message::{Header, Headers as _, OwnedHeaders};
use intake_kafka::rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use intake_kafka::rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use intake_kafka::rdkafka::{ClientConfig, Message as _};
use intake_kafka::{
    GroupProtocol, KafkaAcker, KafkaDeadLetterSink, KafkaParking, KafkaSettings, KafkaSource,
    KafkaSourceBuilder,
};

/// The real tier's broker address.
pub const REAL_BROKERS: &str = "127.0.0.1:9092";

/// Builds, and drops, a source of `group` that reads `topic` with
/// `parking`: a parking parks a topic's messages only once a source of its
/// group was built to read their return topic (`.parking(&parking)`). For
/// the tests that park by hand and read the return topic themselves.
pub async fn read_returns(kafka: &KafkaBackend, parking: &KafkaParking, topic: &str, group: &str) {
    let source = kafka
        .source(topic, group)
        .parking(parking)
        .build()
        .await
        .expect("a source that reads the return topic");
    drop(source);
}

/// A name no other test (or earlier run) uses.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| since.as_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}-{}-{nanos}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Where topics live.
enum Tier {
    /// The producer owns the mock cluster; it lives as long as the fixture.
    Mock,
    Real(AdminClient<DefaultClientContext>),
}

/// A Kafka broker for tests, with a producer.
pub struct KafkaBackend {
    brokers: String,
    producer: FutureProducer,
    tier: Tier,
    /// Settings every consumer and sink of this fixture takes on top of the
    /// test timings; an empty value removes a timing.
    overrides: Vec<(String, String)>,
    /// The group protocol of every consumer; under KIP-848's the fixture
    /// sets none of the timings the broker keeps.
    protocol: GroupProtocol,
}

impl KafkaBackend {
    /// A fresh in-process mock cluster of one broker, with group joins
    /// made fast.
    pub fn mock() -> Self {
        let producer: FutureProducer = ClientConfig::new()
            .set("test.mock.num.brokers", "1")
            .set("message.timeout.ms", "10000")
            .create()
            .expect("a mock cluster starts in process");
        let client = producer.client();
        // SAFETY: the handle belongs to the producer's client, which outlives
        // this call; the function only sets a field of the mock cluster.
        unsafe {
            let mock =
                intake_kafka::rdkafka::bindings::rd_kafka_handle_mock_cluster(client.native_ptr());
            assert!(!mock.is_null(), "the producer owns a mock cluster");
            intake_kafka::rdkafka::bindings::rd_kafka_mock_group_initial_rebalance_delay_ms(
                mock, 0,
            );
        }
        let brokers = client
            .mock_cluster()
            .expect("the producer owns a mock cluster")
            .bootstrap_servers();
        Self {
            brokers,
            producer,
            tier: Tier::Mock,
            overrides: Vec::new(),
            protocol: GroupProtocol::Classic,
        }
    }

    /// Apache Kafka on 127.0.0.1:9092, or `None` (after printing why) when
    /// nothing listens there. With `INTAKE_REQUIRE_BROKERS=1` a missing
    /// broker fails the test instead.
    pub fn real(test: &str) -> Option<Self> {
        let reachable = std::net::TcpStream::connect_timeout(
            &REAL_BROKERS.parse().expect("a socket address"),
            Duration::from_secs(1),
        )
        .is_ok();
        if !reachable {
            let why = format!(
                "no Kafka broker on {REAL_BROKERS} (start one with `.ci/services/kafka.sh`)"
            );
            intake_core::backend::testkit::skip_or_fail(test, &why);
            return None;
        }
        Some(Self::at(REAL_BROKERS))
    }

    /// A real broker at `brokers` (a test's own, say).
    pub fn at(brokers: &str) -> Self {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("message.timeout.ms", "30000")
            .create()
            .expect("producer settings are valid");
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .create()
            .expect("admin settings are valid");
        Self {
            brokers: brokers.into(),
            producer,
            tier: Tier::Real(admin),
            overrides: Vec::new(),
            protocol: GroupProtocol::Classic,
        }
    }

    pub fn brokers(&self) -> &str {
        &self.brokers
    }

    /// Consumer settings: fast group protocol timings for tests.
    ///
    /// On the mock cluster, cooperative-sticky assignment: the mock refuses
    /// offset commits while a classic (eager) group is joining, where real
    /// brokers accept them from the current generation (Kafka's
    /// PreparingRebalance), so under eager rebalancing every revoke-time
    /// commit would be refused there. Tests of eager rebalancing on the mock
    /// ask for `range` themselves; Apache Kafka runs librdkafka's default
    /// (eager `range,roundrobin`) unless a test asks for cooperative-sticky.
    pub fn settings(&self) -> KafkaSettings {
        let mut chosen = vec![
            ("max.poll.interval.ms", "120000"),
            ("topic.metadata.refresh.interval.ms", "1000"),
        ];
        match self.protocol {
            // The broker's `group.consumer.*` timings (`.ci/services/kafka.sh`).
            GroupProtocol::Consumer => chosen.push(("group.protocol", "consumer")),
            _ => {
                chosen.push(("session.timeout.ms", "6000"));
                chosen.push(("heartbeat.interval.ms", "500"));
                if let Tier::Mock = self.tier {
                    chosen.push(("partition.assignment.strategy", "cooperative-sticky"));
                }
            }
        }
        for (key, value) in &self.overrides {
            chosen.retain(|(chosen_key, _)| chosen_key != key);
            if !value.is_empty() {
                chosen.push((key, value));
            }
        }
        chosen.into_iter().fold(
            KafkaSettings::new(&self.brokers),
            |settings, (key, value)| settings.set(key, value),
        )
    }

    /// The same broker, with `overrides` on every consumer's settings (an
    /// empty value removes the fixture's own timing of that name).
    pub fn with_settings(mut self, overrides: &[(&str, &str)]) -> Self {
        self.overrides = overrides
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
        self
    }

    /// The same broker, its consumers in groups of `protocol`.
    pub fn with_protocol(mut self, protocol: GroupProtocol) -> Self {
        self.protocol = protocol;
        self
    }

    /// Has the mock cluster answer the next requests of `api`, one each,
    /// with `errors` (mock tier only).
    pub fn refuse_next(
        &self,
        api: intake_kafka::rdkafka::types::RDKafkaApiKey,
        errors: &[intake_kafka::rdkafka::types::RDKafkaRespErr],
    ) {
        let mock = self
            .producer
            .client()
            .mock_cluster()
            .expect("the mock tier injects errors");
        mock.request_errors(api, errors);
    }

    /// Drops the errors [`refuse_next`](Self::refuse_next) queued for `api`
    /// and not yet answered.
    pub fn clear_refusals(&self, api: intake_kafka::rdkafka::types::RDKafkaApiKey) {
        if let Some(mock) = self.producer.client().mock_cluster() {
            mock.clear_request_errors(api);
        }
    }

    /// A group name no other test uses (see [`unique`]), with the test
    /// timings of this fixture's protocol. Under KIP-848 the broker keeps
    /// them, per group: its defaults (a 5 s heartbeat, a 45 s session)
    /// would make every reconciliation take seconds, so the group is given
    /// the classic fixture's (0.5 s, 6 s) before any member joins.
    pub async fn new_group(&self, prefix: &str) -> String {
        let group = unique(prefix);
        if let (GroupProtocol::Consumer, Tier::Real(admin)) = (self.protocol, &self.tier) {
            let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
            let timings = AlterConfig::new(ResourceSpecifier::Group(&group))
                .set("consumer.heartbeat.interval.ms", "500")
                .set("consumer.session.timeout.ms", "6000");
            let altered = admin
                .alter_configs(&[timings], &options)
                .await
                .expect("the broker takes group configs");
            for result in altered {
                result.unwrap_or_else(|(_, code)| panic!("group config of {group}: {code}"));
            }
            // The broker applies them a moment after it answers.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                // rdkafka 0.39 cannot read an entry whose source is the
                // group's own config (RD_KAFKA_CONFIG_SOURCE_GROUP_CONFIG):
                // the describe fails once the broker applied them.
                let applied = match admin
                    .describe_configs(&[ResourceSpecifier::Group(&group)], &options)
                    .await
                {
                    Err(error) => error.to_string().contains("GROUP_CONFIG"),
                    Ok(found) => found.into_iter().flatten().any(|config| {
                        config.entries.iter().any(|entry| {
                            entry.name == "consumer.heartbeat.interval.ms"
                                && entry.value.as_deref() == Some("500")
                        })
                    }),
                };
                if applied {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "group config of {group} not applied in 10 s"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        group
    }

    /// The group protocol of this fixture's consumers.
    pub fn protocol(&self) -> GroupProtocol {
        self.protocol
    }

    /// A source builder for `topic` in `group` with test timings.
    pub fn source(&self, topic: &str, group: &str) -> KafkaSourceBuilder {
        KafkaSource::builder(self.settings())
            .group(group)
            .topic(topic)
            .connect_timeout(Duration::from_secs(10))
            .close_timeout(Duration::from_secs(5))
    }

    /// Creates `topic` with `partitions` partitions.
    pub async fn create_topic(&self, topic: &str, partitions: u32) -> Result<(), BoxError> {
        self.create_topic_with(topic, partitions, &[]).await
    }

    /// Creates `topic` with `partitions` partitions and the topic settings
    /// `config` (real tier; the mock cluster takes none).
    pub async fn create_topic_with(
        &self,
        topic: &str,
        partitions: u32,
        config: &[(&str, &str)],
    ) -> Result<(), BoxError> {
        let count = i32::try_from(partitions)?;
        match &self.tier {
            Tier::Mock => {
                let mock = self
                    .producer
                    .client()
                    .mock_cluster()
                    .ok_or("the producer owns no mock cluster")?;
                if !config.is_empty() {
                    return Err("the mock cluster takes no topic settings".into());
                }
                mock.create_topic(topic, count, 1)?;
            }
            Tier::Real(admin) => {
                let new_topic = config.iter().fold(
                    NewTopic::new(topic, count, TopicReplication::Fixed(1)),
                    |new_topic, (key, value)| new_topic.set(key, value),
                );
                let results = admin
                    .create_topics(
                        &[new_topic],
                        &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
                    )
                    .await?;
                for result in results {
                    result.map_err(|(name, code)| format!("creating {name}: {code}"))?;
                }
            }
        }
        Ok(())
    }

    /// Deletes `topic` (real tier only).
    pub async fn delete_topic(&self, topic: &str) -> Result<(), BoxError> {
        let Tier::Real(admin) = &self.tier else {
            return Err("the mock tier deletes no topics".into());
        };
        let results = admin
            .delete_topics(
                &[topic],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
            )
            .await?;
        for result in results {
            result.map_err(|(name, code)| format!("deleting {name}: {code}"))?;
        }
        Ok(())
    }

    /// Produces `messages` to `topic` (partition by key) and waits for every
    /// delivery report.
    pub async fn produce_to(&self, topic: &str, messages: &[TestMessage]) -> Result<(), BoxError> {
        let sends = messages.iter().map(|message| {
            let mut headers = OwnedHeaders::new();
            for original in &message.headers {
                headers = headers.insert(Header {
                    key: &original.name,
                    value: Some(original.value.as_ref()),
                });
            }
            let mut record = FutureRecord::<[u8], [u8]>::to(topic)
                .payload(message.payload.as_ref())
                .headers(headers);
            if let Some(key) = &message.key {
                record = record.key(key.as_ref());
            }
            self.producer.send(record, Duration::from_secs(30))
        });
        for delivered in futures_util::future::join_all(sends).await {
            delivered.map_err(|(error, _)| error)?;
        }
        Ok(())
    }

    /// Produces to an explicit partition.
    pub async fn produce_to_partition(
        &self,
        topic: &str,
        partition: i32,
        payloads: impl IntoIterator<Item = String>,
    ) -> Result<(), BoxError> {
        let payloads: Vec<String> = payloads.into_iter().collect();
        let sends = payloads.iter().map(|payload| {
            self.producer.send(
                FutureRecord::<[u8], [u8]>::to(topic)
                    .partition(partition)
                    .payload(payload.as_bytes()),
                Duration::from_secs(30),
            )
        });
        for delivered in futures_util::future::join_all(sends).await {
            delivered.map_err(|(error, _)| error)?;
        }
        Ok(())
    }

    /// Per partition of `topic`: the committed offset of `group` (if any)
    /// and the high watermark.
    pub async fn offsets(
        &self,
        topic: &str,
        group: &str,
    ) -> Result<Vec<(i32, Option<i64>, i64)>, BoxError> {
        let brokers = self.brokers.clone();
        let topic = topic.to_owned();
        let group = group.to_owned();
        tokio::task::spawn_blocking(move || -> Result<_, BoxError> {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &brokers)
                .set("group.id", &group)
                .set("enable.auto.commit", "false")
                .create()?;
            let metadata = consumer.fetch_metadata(Some(&topic), Duration::from_secs(10))?;
            let partitions: Vec<i32> = metadata
                .topics()
                .iter()
                .filter(|found| found.name() == topic)
                .flat_map(|found| found.partitions().iter().map(|p| p.id()))
                .collect();
            let mut list = TopicPartitionList::new();
            for partition in &partitions {
                list.add_partition(&topic, *partition);
            }
            let committed = consumer.committed_offsets(list, Duration::from_secs(10))?;
            let mut offsets = Vec::new();
            for partition in partitions {
                let (_, high) =
                    consumer.fetch_watermarks(&topic, partition, Duration::from_secs(10))?;
                let committed = committed
                    .find_partition(&topic, partition)
                    .and_then(|element| match element.offset() {
                        Offset::Offset(offset) => Some(offset),
                        _ => None,
                    });
                offsets.push((partition, committed, high));
            }
            Ok(offsets)
        })
        .await?
    }

    /// Every record of `topic`, from the start, read until the high
    /// watermarks.
    pub async fn read_all(&self, topic: &str) -> Result<Vec<ReadRecord>, BoxError> {
        let brokers = self.brokers.clone();
        let topic = topic.to_owned();
        let reader_group = unique("intake-reader");
        tokio::task::spawn_blocking(move || -> Result<_, BoxError> {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &brokers)
                .set("group.id", &reader_group)
                .set("enable.auto.commit", "false")
                .create()?;
            let metadata = consumer.fetch_metadata(Some(&topic), Duration::from_secs(10))?;
            let Some(found) = metadata.topics().iter().find(|found| found.name() == topic) else {
                return Ok(Vec::new());
            };
            if found.error().is_some() || found.partitions().is_empty() {
                return Ok(Vec::new());
            }
            let mut list = TopicPartitionList::new();
            let mut remaining = 0;
            for partition in found.partitions() {
                let (low, high) =
                    consumer.fetch_watermarks(&topic, partition.id(), Duration::from_secs(10))?;
                remaining += (high - low).max(0);
                list.add_partition_offset(&topic, partition.id(), Offset::Beginning)?;
            }
            consumer.assign(&list)?;
            let mut records = Vec::new();
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while remaining > 0 && std::time::Instant::now() < deadline {
                let Some(polled) = consumer.poll(Duration::from_millis(200)) else {
                    continue;
                };
                let message = polled?;
                remaining -= 1;
                let headers = message
                    .headers()
                    .map(|headers| {
                        headers
                            .iter()
                            .map(|h| {
                                (
                                    h.key.to_owned(),
                                    Bytes::copy_from_slice(h.value.unwrap_or_default()),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                records.push(ReadRecord {
                    partition: message.partition(),
                    offset: message.offset(),
                    key: message.key().map(Bytes::copy_from_slice),
                    payload: Bytes::copy_from_slice(message.payload().unwrap_or_default()),
                    headers,
                });
            }
            if remaining > 0 {
                return Err(format!("{remaining} records of {topic} not read within 30 s").into());
            }
            Ok(records)
        })
        .await?
    }
}

/// A record read back from a topic.
#[derive(Debug, Clone)]
pub struct ReadRecord {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Bytes>,
    pub payload: Bytes,
    pub headers: Vec<(String, Bytes)>,
}

impl ReadRecord {
    /// The record as a dead letter: the record key is the key slot.
    pub fn dead_letter(&self) -> Result<DeadLetter, EnvelopeError> {
        let headers: Headers = self
            .headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.clone()))
            .collect();
        DeadLetter::read(self.key.clone(), self.payload.clone(), &headers)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .and_then(|(_, value)| std::str::from_utf8(value).ok())
    }
}

#[async_trait]
impl Backend for KafkaBackend {
    type Source = KafkaSource;
    type Acker = KafkaAcker;
    type Sink = KafkaDeadLetterSink;

    fn name(&self) -> &'static str {
        match self.tier {
            Tier::Mock => "kafka (mock cluster)",
            Tier::Real(_) => "kafka (Apache Kafka)",
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            broker: Broker::Kafka,
            partitions: true,
            shared_groups: true,
            // A consumer dropped without closing leaves the group as its
            // polling thread closes; the session timeout bounds the rest.
            crash_redelivery_after: Duration::from_secs(6),
            key_order_through_crashes: true,
        }
    }

    async fn create_source(&self, partitions: u32) -> Result<String, BoxError> {
        let topic = unique("intake-topic");
        self.create_topic(&topic, partitions).await?;
        Ok(topic)
    }

    async fn produce(&self, source: &str, messages: Vec<TestMessage>) -> Result<(), BoxError> {
        self.produce_to(source, &messages).await
    }

    async fn connect(
        &self,
        source: &str,
        group: &str,
        _settings: ConnectSettings,
    ) -> Result<(KafkaSource, KafkaAcker), BoxError> {
        // The consumer sizes the source's hand-over queue from its own
        // budget (`Source::set_limits`).
        let source = self.source(source, group).build().await?;
        let acker = source.acker();
        Ok((source, acker))
    }

    async fn dead_letter_sink(
        &self,
        source: &str,
        group: &str,
    ) -> Result<KafkaDeadLetterSink, BoxError> {
        // What `KafkaSource::dead_letter_sink` fills in, without a source.
        Ok(KafkaDeadLetterSink::builder(self.settings(), group)
            .consumed_topics([source])
            .build()
            .await?)
    }

    async fn dead_letters(&self, source: &str, group: &str) -> Result<Vec<DeadLetter>, BoxError> {
        let topic = format!("{source}.{group}.dlq");
        let records = self.read_all(&topic).await?;
        records
            .into_iter()
            .map(|record| Ok(record.dead_letter()?))
            .collect()
    }

    async fn unacknowledged(&self, source: &str, group: &str) -> Result<u64, BoxError> {
        let offsets = self.offsets(source, group).await?;
        Ok(offsets
            .into_iter()
            .map(|(_, committed, high)| (high - committed.unwrap_or(0)).max(0) as u64)
            .sum())
    }

    async fn connect_broadcast(
        &self,
        source: &str,
        _settings: ConnectSettings,
    ) -> Option<Result<(KafkaSource, KafkaAcker), BoxError>> {
        let built = KafkaSource::builder(self.settings())
            .topic(source)
            .broadcast()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .await;
        testkit::with_acker(built, |source| source.acker())
    }

    async fn connect_unreachable(
        &self,
        source: &str,
        group: &str,
        password: &str,
    ) -> Option<Result<(KafkaSource, KafkaAcker), BoxError>> {
        // A closed port, with SASL credentials as a Kafka user gives them.
        let settings = KafkaSettings::new(format!(
            "127.0.0.1:{}",
            testkit::closed_port().expect("a free local port")
        ))
        .set("security.protocol", "SASL_PLAINTEXT")
        .set("sasl.mechanism", "PLAIN")
        .set("sasl.username", "intake")
        .set("sasl.password", password);
        let built = KafkaSource::builder(settings)
            .group(group)
            .topic(source)
            .connect_timeout(Duration::from_secs(3))
            .build()
            .await;
        testkit::with_acker(built, |source| source.acker())
    }
}

pub mod consumer;
pub mod own_broker;

/// One test per consumer group protocol of `scenario`, an `async fn(&str,
/// GroupProtocol)` taking the test's name: `NAME::classic` and
/// `NAME::consumer` (KIP-848), so that a scenario runs once under each and
/// a filter on either name picks one.
#[allow(unused_macros)]
macro_rules! per_group_protocol {
    ($(#[$meta:meta])* $name:ident => $scenario:ident) => {
        $(#[$meta])*
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn classic() {
                super::$scenario(
                    concat!(stringify!($name), "::classic"),
                    intake_kafka::GroupProtocol::Classic,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn consumer() {
                super::$scenario(
                    concat!(stringify!($name), "::consumer"),
                    intake_kafka::GroupProtocol::Consumer,
                )
                .await;
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use per_group_protocol;

/// What [`take`] collected from a source.
#[derive(Debug, Default)]
pub struct Taken {
    /// Messages, in the order the source handed them out.
    pub messages: Vec<Message>,
    /// Partitions assigned meanwhile.
    pub assigned: Vec<PartitionKey>,
}

/// Calls `source.next` until `count` messages arrived (or `patience` passed),
/// as the runtime would with a budget of `max`. Revocations are completed at
/// once with nothing committed.
pub async fn take(source: &mut KafkaSource, count: usize, max: usize, patience: Duration) -> Taken {
    let mut taken = Taken::default();
    let mut buffer = Vec::new();
    let _ = tokio::time::timeout(patience, async {
        while taken.messages.len() < count {
            let wanted = max.min(count - taken.messages.len());
            match source.next(&mut buffer, wanted).await {
                Ok(SourceEvent::Delivered) => taken.messages.append(&mut buffer),
                Ok(SourceEvent::Assigned(partitions)) => taken.assigned.extend(partitions),
                Ok(SourceEvent::Revoked(revocation)) => {
                    revocation.complete(RevocationOutcome::default());
                }
                // Exhausted, an event added later, or an error: done.
                Ok(_) | Err(_) => break,
            }
        }
    })
    .await;
    taken
}

/// The next message of `source`; panics after `patience`.
pub async fn next_message(source: &mut KafkaSource, patience: Duration) -> Message {
    let mut taken = take(source, 1, 1, patience).await;
    taken
        .messages
        .pop()
        .unwrap_or_else(|| panic!("no message within {patience:?}"))
}

/// Logs to the test output, filtered by `RUST_LOG` (default: warnings).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

/// `error` and every cause below it (its `source` chain), as a log line
/// that follows the chain shows them: each level's `Display` describes its
/// own level only.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut shown = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        shown.push_str(": ");
        shown.push_str(&inner.to_string());
        cause = inner.source();
    }
    shown
}
