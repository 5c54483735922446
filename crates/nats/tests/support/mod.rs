//! Test support: the shared nats-server (`.ci/services/nats.sh`), unique
//! names, producing, reading dead letters back, and the [`NatsBackend`]
//! fixture of the conformance suite.
#![allow(dead_code)]

pub mod own_server;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use intake_core::backend::testkit::{self, Backend, Capabilities, ConnectSettings, TestMessage};
use intake_core::dead_letter::Broker;
use intake_core::{BoxError, Constant, DeadLetter, Headers, Message, Metadata, Position};
use intake_nats::async_nats::jetstream;
use intake_nats::async_nats::{self, HeaderMap};
use intake_nats::{NatsAcker, NatsDeadLetterSink, NatsSettings, NatsSource, NatsSourceBuilder};

/// The shared server's URL (`INTAKE_NATS_URL`, default the local one).
pub fn nats_url() -> String {
    std::env::var("INTAKE_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// Logs for tests that want them (`RUST_LOG`).
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A client of the shared server, or `None` (after saying why) when it is
/// absent and not required (`INTAKE_REQUIRE_BROKERS=1` fails instead).
pub async fn nats_or_skip(test: &str) -> Option<async_nats::Client> {
    init_tracing();
    match async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .connect(nats_url())
        .await
    {
        Ok(client) => Some(client),
        Err(error) => {
            let why = format!(
                "no NATS server at {} ({error}); start one with `.ci/services/nats.sh`",
                nats_url()
            );
            intake_core::backend::testkit::skip_or_fail(test, &why);
            None
        }
    }
}

/// A name no other test (or earlier run) uses, valid as a stream or
/// consumer name and as a subject token.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    format!(
        "{prefix}_{}_{nanos}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Creates stream `name` storing `in.<name>.>`: not `<name>.>`, which
/// would store the default dead-letter subject `<name>.<group>.dlq` too
/// (the sink refuses that: see `tests/dead_letters.rs`).
pub async fn create_stream(client: &async_nats::Client, name: &str) -> Result<(), BoxError> {
    jetstream::new(client.clone())
        .create_stream(jetstream::stream::Config {
            name: name.to_owned(),
            subjects: vec![format!("in.{name}.>")],
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await?;
    Ok(())
}

/// The subject a test message with `key` goes to: `in.<stream>.<key>`, the
/// key's characters that a subject token cannot hold replaced.
pub fn subject_of(stream: &str, key: Option<&[u8]>) -> String {
    let token: String = match key {
        Some(key) if !key.is_empty() => String::from_utf8_lossy(key)
            .chars()
            .map(|c| match c {
                '.' | '*' | '>' => '_',
                c if c.is_whitespace() || c.is_control() => '_',
                c => c,
            })
            .collect(),
        _ => "nokey".to_owned(),
    };
    format!("in.{stream}.{token}")
}

/// Publishes `messages` to `stream` and waits for every publish ack.
pub async fn produce(
    client: &async_nats::Client,
    stream: &str,
    messages: Vec<TestMessage>,
) -> Result<(), BoxError> {
    let context = jetstream::new(client.clone());
    let mut pending = Vec::with_capacity(messages.len());
    for message in messages {
        let mut headers = HeaderMap::new();
        for header in message.headers.iter() {
            let value = std::str::from_utf8(&header.value)?;
            headers.append(&*header.name, value);
        }
        let subject = subject_of(stream, message.key.as_deref());
        pending.push(
            context
                .publish_with_headers(subject, headers, message.payload)
                .await?,
        );
    }
    for ack in pending {
        ack.await?;
    }
    Ok(())
}

/// Every message stored on `subject` in `stream`, oldest first, read with
/// the stream's message API (JSON, so no header is parsed by the client's
/// wire parser), as intake messages.
pub async fn stored(
    client: &async_nats::Client,
    stream: &str,
    subject: &str,
) -> Result<Vec<Message>, BoxError> {
    let context = jetstream::new(client.clone());
    let mut handle = match context.get_stream(stream).await {
        Ok(handle) => handle,
        Err(error)
            if matches!(
                error.kind(),
                jetstream::context::GetStreamErrorKind::JetStream(ref js)
                    if js.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
            ) =>
        {
            return Ok(Vec::new());
        }
        Err(error) => return Err(error.into()),
    };
    let state = handle.info().await?.state.clone();
    let mut messages = Vec::new();
    if state.messages == 0 {
        return Ok(messages);
    }
    for sequence in state.first_sequence..=state.last_sequence {
        let raw = match handle.get_raw_message(sequence).await {
            Ok(raw) => raw,
            Err(_) => continue,
        };
        if raw.subject.as_str() != subject {
            continue;
        }
        let headers: Headers = raw
            .headers
            .iter()
            .flat_map(|(name, values)| {
                let name = name.to_string();
                values.iter().map(move |value| {
                    (
                        name.clone(),
                        Bytes::copy_from_slice(value.as_str().as_bytes()),
                    )
                })
            })
            .collect();
        let metadata = Metadata::new(
            stream.into(),
            0,
            Position::Offset(i64::try_from(sequence).unwrap_or(i64::MAX)),
        );
        messages.push(Message::new(raw.payload.clone(), metadata).with_headers(headers));
    }
    Ok(messages)
}

/// Deliveries `group` holds unacknowledged plus those it has not received.
pub async fn unacknowledged(
    client: &async_nats::Client,
    stream: &str,
    group: &str,
) -> Result<u64, BoxError> {
    let context = jetstream::new(client.clone());
    let handle = context.get_stream(stream).await?;
    let info = handle.consumer_info(group).await?;
    Ok(info.num_ack_pending as u64 + info.num_pending)
}

/// The NATS fixture of the conformance suite, on the shared server.
pub struct NatsBackend {
    client: async_nats::Client,
}

/// How long the fixture's consumers let a delivery go unacknowledged
/// before the server delivers it again: short, for the crash scenario.
pub const ACK_WAIT: Duration = Duration::from_secs(2);

impl NatsBackend {
    /// The fixture, or `None` when no server runs (said why).
    pub async fn new(test: &str) -> Option<Self> {
        let client = nats_or_skip(test).await?;
        Some(Self { client })
    }

    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// A source builder for `stream` in `group` with test timings.
    pub fn source(&self, stream: &str, group: &str) -> NatsSourceBuilder {
        NatsSource::builder(nats_url())
            .stream(stream)
            .consumer(group)
            .ack_wait(ACK_WAIT)
            .redelivery_backoff(Constant::new(Duration::from_millis(50)).retry_forever())
            .fetch_wait(Duration::from_secs(1))
            .ack_timeout(Duration::from_secs(5))
    }
}

#[async_trait::async_trait]
impl Backend for NatsBackend {
    type Source = NatsSource;
    type Acker = NatsAcker;
    type Sink = NatsDeadLetterSink;

    fn name(&self) -> &'static str {
        "nats"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            broker: Broker::Nats,
            partitions: false,
            shared_groups: true,
            crash_redelivery_after: ACK_WAIT + Duration::from_secs(1),
            // JetStream redelivers a crashed consumer's messages after
            // `ack_wait`, behind newer ones of their keys.
            key_order_through_crashes: false,
        }
    }

    async fn create_source(&self, _partitions: u32) -> Result<String, BoxError> {
        let name = unique("conformance");
        create_stream(&self.client, &name).await?;
        Ok(name)
    }

    async fn produce(&self, source: &str, messages: Vec<TestMessage>) -> Result<(), BoxError> {
        produce(&self.client, source, messages).await
    }

    async fn connect(
        &self,
        source: &str,
        group: &str,
        _settings: ConnectSettings,
    ) -> Result<(NatsSource, NatsAcker), BoxError> {
        let source = self.source(source, group).build().await?;
        let acker = source.acker();
        Ok((source, acker))
    }

    async fn dead_letter_sink(
        &self,
        source: &str,
        group: &str,
    ) -> Result<NatsDeadLetterSink, BoxError> {
        let prefill = self.source(source, group).build().await?;
        Ok(prefill.dead_letter_sink().build().await?)
    }

    async fn dead_letters(&self, source: &str, group: &str) -> Result<Vec<DeadLetter>, BoxError> {
        let stream = intake_nats::default_dead_letter_stream(source);
        let subject = intake_nats::default_dead_letter_subject(source, group);
        stored(&self.client, &stream, &subject)
            .await?
            .iter()
            .map(|message| intake_nats::read_dead_letter(message).map_err(BoxError::from))
            .collect()
    }

    async fn unacknowledged(&self, source: &str, group: &str) -> Result<u64, BoxError> {
        unacknowledged(&self.client, source, group).await
    }

    async fn connect_broadcast(
        &self,
        source: &str,
        _settings: ConnectSettings,
    ) -> Option<Result<(NatsSource, NatsAcker), BoxError>> {
        let built = NatsSource::builder(nats_url())
            .stream(source)
            .broadcast()
            .ack_wait(ACK_WAIT)
            .fetch_wait(Duration::from_secs(1))
            .build()
            .await;
        testkit::with_acker(built, |source| source.acker())
    }

    async fn connect_unreachable(
        &self,
        source: &str,
        group: &str,
        password: &str,
    ) -> Option<Result<(NatsSource, NatsAcker), BoxError>> {
        // A closed local port, the password in the URL as NATS users give
        // it.
        let port = testkit::closed_port();
        let port = match port {
            Ok(port) => port,
            Err(error) => return Some(Err(error.into())),
        };
        let settings = NatsSettings::new(format!("nats://app:{password}@127.0.0.1:{port}"))
            .connect_timeout(Duration::from_secs(3));
        let built = NatsSource::builder(settings)
            .stream(source)
            .consumer(group)
            .build()
            .await;
        testkit::with_acker(built, |source| source.acker())
    }
}

#[async_trait::async_trait]
impl testkit::PublishingBackend for NatsBackend {
    type Publisher = intake_nats::NatsPublisher;

    async fn publisher(&self) -> Result<intake_nats::NatsPublisher, BoxError> {
        Ok(intake_nats::NatsPublisher::builder(nats_url())
            .ack_timeout(Duration::from_secs(5))
            .build()
            .await?)
    }

    /// A subject of the stream (`in.<stream>.>`): an output's key becomes
    /// its last token, `in.<stream>.published.<key>`.
    fn destination(&self, source: &str) -> String {
        format!("in.{source}.published")
    }

    /// The source reads a message's key from its subject.
    fn key_read_back(&self, destination: &str, key: &str) -> String {
        format!("{destination}.{key}")
    }
}

/// The broker value the suite derives every part from, on the shared
/// server, with the fixture's confirmation timeout. The derived parts keep
/// the broker's defaults otherwise (`ack_wait` 30 s).
impl testkit::BrokerBackend for NatsBackend {
    type Broker = intake_nats::NatsBroker;

    fn broker(&self) -> intake_nats::NatsBroker {
        intake_nats::NatsBroker::new(nats_url()).ack_timeout(Duration::from_secs(5))
    }
}

/// A consumer running in a task of its own.
pub struct Running {
    pub shutdown: tokio_util::sync::CancellationToken,
    pub task: tokio::task::JoinHandle<Result<intake_core::RunReport, intake_core::RunError>>,
}

impl Running {
    /// Runs `source` and `acker` with `handler` under `builder`.
    pub fn start<H>(
        builder: intake_core::ConsumerBuilder,
        source: NatsSource,
        acker: NatsAcker,
        handler: H,
    ) -> Self
    where
        H: tower::Service<Message, Response = (), Error = intake_core::HandlerError>
            + Send
            + 'static,
        H::Future: Send + 'static,
    {
        let consumer = builder
            .build(source, acker, handler)
            .expect("valid consumer settings");
        let shutdown = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(consumer.run(shutdown.clone()));
        Self { shutdown, task }
    }

    /// Stops gracefully and returns the report.
    pub async fn stop(self) -> intake_core::RunReport {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .expect("the consumer stops within 60 s")
            .expect("the consumer task")
            .expect("the consumer run")
    }
}

/// Waits until `condition` holds, at most `patience`; panics naming `what`.
pub async fn wait_until(what: &str, patience: Duration, condition: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + patience;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {patience:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Payloads seen by a test handler, with the attempt of each delivery.
#[derive(Clone, Default)]
pub struct Seen {
    inner: std::sync::Arc<std::sync::Mutex<Vec<(Bytes, u32)>>>,
}

impl Seen {
    pub fn record(&self, message: &Message) {
        if let Ok(mut seen) = self.inner.lock() {
            seen.push((message.payload().clone(), message.metadata().attempt()));
        }
    }

    /// How often `payload` was handled.
    pub fn count(&self, payload: &[u8]) -> usize {
        self.inner
            .lock()
            .map(|seen| seen.iter().filter(|(seen, _)| &seen[..] == payload).count())
            .unwrap_or_default()
    }

    /// The attempts `payload` was handled with, in order.
    pub fn attempts(&self, payload: &[u8]) -> Vec<u32> {
        self.inner
            .lock()
            .map(|seen| {
                seen.iter()
                    .filter(|(seen, _)| &seen[..] == payload)
                    .map(|(_, attempt)| *attempt)
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn total(&self) -> usize {
        self.inner.lock().map(|seen| seen.len()).unwrap_or_default()
    }
}

/// `count` messages `<prefix><n>` on `in.<stream>.k<n % 4>`.
pub fn numbered(prefix: &str, count: usize) -> Vec<TestMessage> {
    (0..count)
        .map(|n| TestMessage::new(format!("k{}", n % 4), format!("{prefix}{n}")))
        .collect()
}

/// [`unacknowledged`] from a synchronous condition (a test's `wait_until`).
pub fn block_on_unacknowledged(client: &async_nats::Client, stream: &str, group: &str) -> u64 {
    let client = client.clone();
    let (stream, group) = (stream.to_owned(), group.to_owned());
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()
            .and_then(|runtime| {
                runtime
                    .block_on(unacknowledged(&client, &stream, &group))
                    .ok()
            })
            .unwrap_or(u64::MAX)
    })
    .join()
    .unwrap_or(u64::MAX)
}
