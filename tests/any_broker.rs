//! [`AnyBroker`]: one service, the backend picked by the URL.
//!
//! - On the memory variant, a [`Service`] runs its safe stack end to end
//!   (dead letters, parking, retries, publishing), every part an `Any*`
//!   enum; and the conformance suites (consumer, publisher, derived
//!   parts) pass on the memory fixture seen through those enums.
//! - [`AnyBroker::from_url`] picks the backend by scheme, names the
//!   feature a backend needs when it is not compiled in, and never shows a
//!   password.
//! - With a backend's feature (`--features full`), a service on the URL of
//!   the real broker on 127.0.0.1 consumes what the broker's derived
//!   publisher sent. A broker that does not answer skips its test, saying
//!   so, unless `INTAKE_REQUIRE_BROKERS=1`.
//!
//! Every wait is on a condition, bounded; no test asserts how long anything
//! took.

use std::error::Error as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use intake::any_broker::BrokerUrlError;
use intake::backend::Broker;
use intake::memory::{MemoryBroker, Record};
use intake::publish::Output;
use intake::service::{Route, Service};
use intake::{AnyBroker, HandlerError, Key, Meta, Payload, State};
use tokio_util::sync::CancellationToken;

const PATIENCE: Duration = Duration::from_secs(60);

async fn until_drained(broker: &MemoryBroker, topic: &str, group: &str) {
    tokio::time::timeout(PATIENCE, async {
        while broker.lag(topic, group).unwrap_or(u64::MAX) > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{group} catches up on {topic} within {PATIENCE:?}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_on_the_memory_variant_runs_the_safe_stack_through_the_any_parts() {
    let memory = MemoryBroker::new();
    memory.create_topic("payments", 2).unwrap();
    memory.create_topic("orders", 2).unwrap();
    memory.create_topic("receipts", 1).unwrap();
    for (id, account) in [(1, "a"), (2, "later"), (3, "poison"), (4, "flaky")] {
        memory
            .send("payments", Record::new(id.to_string()).with_key(account))
            .unwrap();
        memory
            .send("orders", Record::new(id.to_string()).with_key(account))
            .unwrap();
    }
    let broker = AnyBroker::from(memory.clone());
    assert_eq!(broker.kind(), "memory");

    async fn bill(
        State(flaky): State<Arc<AtomicU64>>,
        Key(account): Key,
        Meta(meta): Meta,
    ) -> Result<(), HandlerError> {
        match account.as_deref() {
            Some(b"poison") => Err(HandlerError::permanent("refused for good")),
            Some(b"later") if meta.parked_from().is_none() => Err(HandlerError::retry_later(
                "not yet",
                Duration::from_millis(50),
            )),
            Some(b"flaky") if flaky.fetch_add(1, Ordering::Relaxed) < 2 => {
                Err(HandlerError::retryable("flaky downstream"))
            }
            _ => Ok(()),
        }
    }
    async fn receipt(Key(account): Key, Payload(id): Payload) -> Result<Output, HandlerError> {
        Ok(Output::new("receipts", id).with_key(account.unwrap_or_default()))
    }

    let flaky = Arc::new(AtomicU64::new(0));
    let stop = CancellationToken::new();
    let service = Service::with_state("billing", broker, Arc::clone(&flaky))
        .route_with(
            "payments",
            Route::new().backoff(Duration::from_millis(1), Duration::from_millis(5)),
            bill,
        )
        .route("orders", receipt);
    let running = tokio::spawn(service.run_until(stop.clone()));
    until_drained(&memory, "payments", "billing").await;
    until_drained(&memory, "orders", "billing").await;
    stop.cancel();
    let report = running.await.unwrap().unwrap();

    let billing = report.route("payments").and_then(|r| r.report()).unwrap();
    assert_eq!(
        (billing.succeeded, billing.dead_lettered),
        (3, 1),
        "the parked one came back and passed, the poison was dead-lettered"
    );
    let letters = memory.dead_letters("payments", "billing").unwrap();
    assert_eq!(letters.len(), 1, "through the AnyDeadLetterSink");
    assert_eq!(
        letters[0].message.key().map(|k| &k[..]),
        Some(&b"poison"[..])
    );
    assert_eq!(
        flaky.load(Ordering::Relaxed),
        3,
        "retried twice, then passed"
    );
    assert_eq!(
        memory.high_watermarks("receipts").unwrap(),
        [4],
        "a receipt per order, through the AnyPublisher"
    );
}

/// The traits' default methods are forwarded too: the memory parts'
/// overrides (a source that pauses one partition, a probe that counts the
/// parked backlog) answer through the enums, not the defaults (`false`,
/// `None`).
#[tokio::test]
async fn the_any_parts_keep_the_overrides_of_default_methods() {
    use intake::backend::{AckMode, Acker, RouteAddress, RouteOptions, Source, SourceEvent};
    use intake::lag::LagProbe;

    let memory = MemoryBroker::new();
    memory.create_topic("events", 1).unwrap();
    let broker = AnyBroker::from(memory);
    let address = RouteAddress::new("events", "readers");
    let parts = Broker::route(&broker, &address, &RouteOptions::new().parking())
        .await
        .expect("derive the route");
    assert_eq!(
        (
            parts.source.kind(),
            parts.acker.kind(),
            parts.dead_letter_sink.kind()
        ),
        ("memory", "memory", "memory")
    );
    assert_eq!(parts.parking.as_ref().map(|p| p.kind()), Some("memory"));
    assert_eq!(parts.acker.mode(), AckMode::Watermark);
    assert!(!parts.acker.supports_requeue());

    let mut source = parts.source;
    let mut deliveries = Vec::new();
    let assigned = tokio::time::timeout(PATIENCE, source.next(&mut deliveries, 8))
        .await
        .expect("the assignment within the patience")
        .expect("the assignment");
    let SourceEvent::Assigned(partitions) = assigned else {
        panic!("first the assignment: {assigned:?}");
    };
    assert!(
        source.pause(&partitions[0]),
        "the memory source pauses one partition"
    );
    source.resume(&partitions[0]);
    source.close().await.expect("close");

    let probe = Broker::lag_probe(&broker, &address)
        .await
        .expect("derive the lag probe");
    assert_eq!(probe.group(), "readers");
    assert_eq!(
        probe.parked().await.expect("the parked backlog"),
        Some(0),
        "the memory probe counts the parked backlog"
    );
    Broker::shutdown(&broker, Duration::from_secs(5))
        .await
        .expect("shut down");
}

// --- from_url ---

/// The whole text of `error` and its causes, and its `Debug`.
fn every_word_of(error: &BrokerUrlError) -> String {
    let mut text = format!("{error:?}");
    let mut cause: Option<&dyn std::error::Error> = Some(error);
    while let Some(error) = cause {
        text.push('\n');
        text.push_str(&error.to_string());
        cause = error.source();
    }
    text
}

#[test]
fn a_url_without_a_scheme_is_refused_without_being_shown() {
    for url in ["app:s3cret@127.0.0.1:9092", "127.0.0.1:9092", ""] {
        let error = AnyBroker::from_url(url).expect_err("no scheme");
        assert!(matches!(error, BrokerUrlError::NoScheme), "{error:?}");
        let text = every_word_of(&error);
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains("kafka://"), "says which schemes work: {text}");
    }
}

#[test]
fn an_unknown_scheme_is_named_and_the_password_is_not() {
    let error = AnyBroker::from_url("http://app:s3cret@127.0.0.1:8080").expect_err("http");
    assert!(
        matches!(&error, BrokerUrlError::UnknownScheme { scheme } if scheme == "http"),
        "{error:?}"
    );
    let text = every_word_of(&error);
    assert!(text.contains("`http://`"), "{text}");
    assert!(!text.contains("s3cret"), "{text}");
}

/// Each scheme, a URL of it that its backend takes, and the feature that
/// compiles that backend in.
const BACKEND_URLS: [(&str, &str, bool); 8] = [
    ("kafka://127.0.0.1:9092", "kafka", cfg!(feature = "kafka")),
    ("kafkas://127.0.0.1:9093", "kafka", cfg!(feature = "kafka")),
    ("redis://127.0.0.1:6379", "redis", cfg!(feature = "redis")),
    (
        "redis+unix:///run/redis.sock",
        "redis",
        cfg!(feature = "redis"),
    ),
    (
        "amqp://guest:guest@127.0.0.1:5672/%2f",
        "amqp",
        cfg!(feature = "amqp"),
    ),
    ("amqps://127.0.0.1:5671/%2f", "amqp", cfg!(feature = "amqp")),
    ("nats://127.0.0.1:4222", "nats", cfg!(feature = "nats")),
    ("tls://127.0.0.1:4222", "nats", cfg!(feature = "nats")),
];

#[test]
fn each_scheme_picks_its_backend_or_names_the_feature_it_needs() {
    for (url, feature, compiled) in BACKEND_URLS {
        let scheme = url.split_once("://").unwrap().0;
        match AnyBroker::from_url(url) {
            Ok(broker) => {
                assert!(compiled, "{url}: a broker without the `{feature}` feature");
                assert_eq!(broker.kind(), feature, "{url}");
            }
            Err(BrokerUrlError::NotCompiled {
                scheme: named,
                feature: needed,
            }) => {
                assert!(!compiled, "{url}: `{feature}` is compiled in");
                assert_eq!((named, needed), (scheme, feature), "{url}");
                let text = BrokerUrlError::NotCompiled {
                    scheme: named,
                    feature: needed,
                }
                .to_string();
                assert!(
                    text.contains(&format!("`{feature}` feature")),
                    "names the feature: {text}"
                );
            }
            Err(error) => panic!("{url}: {error:?}"),
        }
    }
}

#[test]
fn a_url_its_backend_refuses_shows_neither_password_in_the_error_chain_nor_in_debug() {
    // Each refused by its backend (no host, a port that is no number, a
    // path NATS does not take) when compiled in, else not compiled.
    for (url, feature) in [
        ("kafka://app:s3cret@", "kafka"),
        ("redis://app:s3cret@127.0.0.1:port/0", "redis"),
        ("amqp://app:s3cret@127.0.0.1:port/%2f", "amqp"),
        ("nats://app:s3cret@127.0.0.1:4222/path", "nats"),
    ] {
        let error = AnyBroker::from_url(url).expect_err(url);
        let text = every_word_of(&error);
        assert!(!text.contains("s3cret"), "{url}: {text}");
        match &error {
            BrokerUrlError::Invalid { url: shown, .. } => {
                assert!(shown.contains("***"), "{url}: shown as {shown}");
                assert!(error.source().is_some(), "{url}: the backend's error");
            }
            BrokerUrlError::NotCompiled {
                feature: needed, ..
            } => {
                assert_eq!(*needed, feature, "{url}");
            }
            other => panic!("{url}: {other:?}"),
        }
    }
}

#[test]
fn a_broker_from_a_url_with_a_password_does_not_show_it_in_debug() {
    for url in [
        "kafka://app:s3cret@127.0.0.1:9092",
        "redis://app:s3cret@127.0.0.1:6379/0",
        "amqp://app:s3cret@127.0.0.1:5672/%2f",
        "nats://app:s3cret@127.0.0.1:4222",
    ] {
        match AnyBroker::from_url(url) {
            Ok(broker) => {
                let shown = format!("{broker:?}");
                assert!(!shown.contains("s3cret"), "{url}: {shown}");
            }
            Err(error @ BrokerUrlError::NotCompiled { .. }) => {
                assert!(!every_word_of(&error).contains("s3cret"), "{url}");
            }
            Err(error) => panic!("{url}: {error:?}"),
        }
    }
}

// --- the memory fixture through the Any* enums: every conformance suite ---

mod memory_through_any {
    use intake::BoxError;
    use intake::any_broker::{AnyAcker, AnyDeadLetterSink, AnyPublisher, AnySource};
    use intake::backend::testkit::broker::BrokerBackend;
    use intake::backend::testkit::memory_backend::MemoryBackend;
    use intake::backend::testkit::{
        Backend, Capabilities, ConnectSettings, PublishingBackend, TestMessage,
    };
    use intake::backend::{Broker, DeadLetter};

    use super::AnyBroker;

    /// The memory broker's conformance fixture, every part it hands out
    /// wrapped in (or derived through) `AnyBroker`'s enums.
    #[derive(Debug, Default)]
    struct AnyMemory(MemoryBackend);

    impl AnyMemory {
        fn any(&self) -> AnyBroker {
            AnyBroker::from(self.0.broker().clone())
        }
    }

    #[async_trait::async_trait]
    impl Backend for AnyMemory {
        type Source = AnySource;
        type Acker = AnyAcker;
        type Sink = AnyDeadLetterSink;

        fn name(&self) -> &'static str {
            self.0.name()
        }

        fn capabilities(&self) -> Capabilities {
            self.0.capabilities()
        }

        async fn create_source(&self, partitions: u32) -> Result<String, BoxError> {
            self.0.create_source(partitions).await
        }

        async fn produce(&self, source: &str, messages: Vec<TestMessage>) -> Result<(), BoxError> {
            self.0.produce(source, messages).await
        }

        async fn connect(
            &self,
            source: &str,
            group: &str,
            settings: ConnectSettings,
        ) -> Result<(AnySource, AnyAcker), BoxError> {
            let (source, acker) = self.0.connect(source, group, settings).await?;
            Ok((AnySource::Memory(source), AnyAcker::Memory(acker)))
        }

        async fn connect_broadcast(
            &self,
            source: &str,
            settings: ConnectSettings,
        ) -> Option<Result<(AnySource, AnyAcker), BoxError>> {
            let connected = self.0.connect_broadcast(source, settings).await?;
            Some(
                connected
                    .map(|(source, acker)| (AnySource::Memory(source), AnyAcker::Memory(acker))),
            )
        }

        async fn dead_letter_sink(
            &self,
            source: &str,
            group: &str,
        ) -> Result<AnyDeadLetterSink, BoxError> {
            Ok(AnyDeadLetterSink::Memory(
                self.0.dead_letter_sink(source, group).await?,
            ))
        }

        async fn dead_letters(
            &self,
            source: &str,
            group: &str,
        ) -> Result<Vec<DeadLetter>, BoxError> {
            self.0.dead_letters(source, group).await
        }

        async fn unacknowledged(&self, source: &str, group: &str) -> Result<u64, BoxError> {
            self.0.unacknowledged(source, group).await
        }
    }

    #[async_trait::async_trait]
    impl PublishingBackend for AnyMemory {
        type Publisher = AnyPublisher;

        async fn publisher(&self) -> Result<AnyPublisher, BoxError> {
            Ok(Broker::publisher(&self.any()).await?)
        }

        fn destination(&self, source: &str) -> String {
            self.0.destination(source)
        }
    }

    impl BrokerBackend for AnyMemory {
        type Broker = AnyBroker;

        fn broker(&self) -> AnyBroker {
            self.any()
        }
    }

    async fn backend() -> Option<AnyMemory> {
        Some(AnyMemory::default())
    }

    intake_core::conformance_suite!(backend());
    intake_core::publisher_suite!(backend());
    intake_core::broker_suite!(backend());
}

// --- each compiled backend: a service on the real broker, from its URL ---

/// What the tests on the real brokers share.
#[cfg_attr(
    not(any(
        feature = "kafka",
        feature = "redis",
        feature = "amqp",
        feature = "nats"
    )),
    allow(dead_code)
)]
mod real {
    use super::*;
    use intake::backend::testkit::harness::unique_group;
    use intake::backend::testkit::skip_or_fail;

    /// Whether something listens on 127.0.0.1:`port`; if not, skips `test`
    /// (or fails it under `INTAKE_REQUIRE_BROKERS=1`).
    pub fn listening(test: &str, port: u16) -> bool {
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        match std::net::TcpStream::connect_timeout(&address, Duration::from_secs(2)) {
            Ok(_) => true,
            Err(error) => {
                skip_or_fail(test, &format!("no broker on {address}: {error}"));
                false
            }
        }
    }

    pub fn unique(what: &str) -> String {
        unique_group(what)
    }

    /// A service of its own group on `broker` (made from `url`) consumes
    /// `source`, and receives what the broker's own publisher sends to
    /// `destination` (with the key `key`, where the backend routes by it):
    /// sent again every second until the handler saw it, so that a route
    /// whose group starts at the newest entry cannot miss it.
    pub async fn consumes_what_its_publisher_sends(
        url: &str,
        kind: &str,
        source: &str,
        destination: &str,
        key: &str,
    ) {
        let broker = AnyBroker::from_url(url).expect("a broker of the URL");
        assert_eq!(broker.kind(), kind);
        let (seen, mut saw) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
        async fn record(
            State(seen): State<tokio::sync::mpsc::UnboundedSender<Bytes>>,
            Payload(payload): Payload,
        ) {
            let _ = seen.send(payload);
        }
        let stop = CancellationToken::new();
        let service = Service::with_state(unique("any-broker"), broker.clone(), seen)
            .shutdown_timeout(Duration::from_secs(20))
            .route(source, record);
        let running = tokio::spawn(service.run_until(stop.clone()));

        let publisher = tokio::time::timeout(PATIENCE, Broker::publisher(&broker))
            .await
            .expect("the publisher within the patience")
            .expect("derive the publisher");
        let payload = unique("payload");
        let received = tokio::time::timeout(PATIENCE, async {
            loop {
                let output = Output::new(destination, payload.clone()).with_key(key.to_owned());
                intake::publish::Publisher::publish(&publisher, output)
                    .await
                    .expect("publish");
                let waited = tokio::time::timeout(Duration::from_secs(1), async {
                    while let Some(got) = saw.recv().await {
                        if got == payload.as_bytes() {
                            return true;
                        }
                    }
                    false
                })
                .await;
                match waited {
                    Ok(true) => return true,
                    // The handler's state is gone: the service stopped.
                    Ok(false) => return false,
                    Err(_) if running.is_finished() => return false,
                    Err(_) => continue,
                }
            }
        })
        .await;
        stop.cancel();
        let report = tokio::time::timeout(PATIENCE, running)
            .await
            .expect("the service stops within the patience")
            .expect("the service's task")
            .expect("the service ends well");
        assert!(
            received.unwrap_or_else(|_| panic!("the service saw no message within {PATIENCE:?}")),
            "the service stopped early: {report:?}"
        );
        let run = report
            .route(source)
            .and_then(|route| route.report())
            .expect("the route's report");
        assert!(run.succeeded >= 1, "{run:?}");
        assert_eq!(run.dead_lettered, 0, "{run:?}");
    }
}

#[cfg(feature = "kafka")]
#[path = "../examples/support/kafka_topics.rs"]
mod kafka_topics;

#[cfg(feature = "kafka")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_url_gives_a_service_on_kafka() {
    let test = "a_kafka_url_gives_a_service_on_kafka";
    if !real::listening(test, 9092) {
        return;
    }
    let topic = real::unique("any-broker");
    let settings = intake::kafka::KafkaSettings::new("127.0.0.1:9092");
    kafka_topics::create_topic(&settings, &topic, 1)
        .await
        .expect("create the topic");
    real::consumes_what_its_publisher_sends("kafka://127.0.0.1:9092", "kafka", &topic, &topic, "k")
        .await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_url_gives_a_service_on_redis_streams() {
    let test = "a_redis_url_gives_a_service_on_redis_streams";
    if !real::listening(test, 6379) {
        return;
    }
    // The route creates the stream with its group.
    let stream = real::unique("any-broker");
    real::consumes_what_its_publisher_sends(
        "redis://127.0.0.1:6379",
        "redis",
        &stream,
        &stream,
        "k",
    )
    .await;
}

#[cfg(feature = "amqp")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_amqp_url_gives_a_service_on_rabbitmq() {
    use intake::amqp::lapin::types::AMQPValue;
    use intake::amqp::{Queue, Topology};

    let test = "an_amqp_url_gives_a_service_on_rabbitmq";
    if !real::listening(test, 5672) {
        return;
    }
    let url = "amqp://guest:guest@127.0.0.1:5672/%2f";
    let queue = real::unique("any-broker");
    // Unused, it goes away by itself.
    Topology::new()
        .queue(Queue::classic(queue.as_str()).argument("x-expires", AMQPValue::LongUInt(600_000)))
        .declare(url)
        .await
        .expect("declare the queue");
    // The broker's publisher routes by key: the default exchange (`""`),
    // the queue's name as the key.
    real::consumes_what_its_publisher_sends(url, "amqp", &queue, "", &queue).await;
}

#[cfg(feature = "nats")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_url_gives_a_service_on_nats_jetstream() {
    use intake::nats::async_nats::{self, jetstream};

    let test = "a_nats_url_gives_a_service_on_nats_jetstream";
    if !real::listening(test, 4222) {
        return;
    }
    let url = "nats://127.0.0.1:4222";
    let stream = real::unique("any-broker");
    let client = async_nats::connect(url).await.expect("connect to NATS");
    let context = jetstream::new(client);
    context
        .create_stream(jetstream::stream::Config {
            name: stream.clone(),
            // Not `{stream}.>`: the route's dead letters go to
            // `{stream}.{group}.dlq`, which this stream must not capture.
            subjects: vec![format!("in.{stream}.>")],
            ..Default::default()
        })
        .await
        .expect("create the stream");
    real::consumes_what_its_publisher_sends(url, "nats", &stream, &format!("in.{stream}.k"), "k")
        .await;
    let _ = context.delete_stream(&stream).await;
}
