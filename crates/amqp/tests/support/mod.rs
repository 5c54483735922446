//! The AMQP fixture for the conformance suite ([`Backend`]) and helpers for
//! the AMQP-specific tests, against the RabbitMQ on 127.0.0.1:5672.
//!
//! Every queue a test creates has a unique name. The fixture deletes what it
//! declared when it is cleaned up or dropped; queues also carry an
//! `x-expires` of five minutes, and exchanges go with their last binding, so
//! even a killed test run leaves nothing behind for long.
#![allow(dead_code)]

pub mod proxy;
pub mod raw;
pub mod steps;

use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use intake_amqp::lapin::message::Delivery;
use intake_amqp::lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use intake_amqp::lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use intake_amqp::lapin::{
    BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind,
};
use intake_amqp::{AmqpAcker, AmqpDeadLetterSink, AmqpSource, read_dead_letter};
use intake_core::backend::testkit::{self, Backend, Capabilities, ConnectSettings, TestMessage};
use intake_core::dead_letter::{Broker, EnvelopeError};
use intake_core::{BoxError, DeadLetter};

/// The broker the tests use (override with `INTAKE_AMQP_URL`).
pub fn url() -> String {
    std::env::var("INTAKE_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// A reconnect policy that records which retry numbers it was asked for,
/// and waits 20 ms each time.
#[derive(Clone, Default)]
pub struct RecordingBackoff(std::sync::Arc<Mutex<Vec<u32>>>);

impl intake_core::BackoffPolicy for RecordingBackoff {
    fn delay(&self, retry: u32) -> Option<Duration> {
        self.0
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .push(retry);
        Some(Duration::from_millis(20))
    }
}

impl RecordingBackoff {
    /// The retry numbers asked for so far.
    pub fn asked(&self) -> Vec<u32> {
        self.0
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .clone()
    }
}

/// Runs `rabbitmqctl` with `args`; its output, or why it failed.
pub async fn rabbitmqctl(args: &[&str]) -> Result<String, String> {
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("rabbitmqctl")
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| format!("rabbitmqctl {args:?} did not finish within 60 s"))?
    .map_err(|error| format!("rabbitmqctl is not available: {error}"))?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        Ok(text)
    } else {
        Err(format!(
            "rabbitmqctl {args:?} failed: {text}{}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// Asks `rabbitmqctl` to close the connection named `name`.
pub async fn close_connection_named(name: &str) -> Result<(), String> {
    let listing = tokio::process::Command::new("rabbitmqctl")
        .args([
            "list_connections",
            "-q",
            "--no-table-headers",
            "pid",
            "client_properties",
        ])
        .output()
        .await
        .map_err(|error| format!("rabbitmqctl is not available: {error}"))?;
    let listing = String::from_utf8_lossy(&listing.stdout);
    let pid = listing
        .lines()
        .find(|line| line.contains(&format!("\"{name}\"")))
        .and_then(|line| line.split_whitespace().next())
        .ok_or_else(|| format!("no connection named {name} in: {listing}"))?;
    let closed = tokio::process::Command::new("rabbitmqctl")
        .args(["close_connection", pid, "closed by the test"])
        .output()
        .await
        .map_err(|error| error.to_string())?;
    closed
        .status
        .success()
        .then_some(())
        .ok_or_else(|| String::from_utf8_lossy(&closed.stderr).into_owned())
}

/// The test broker's `host:port`.
pub fn broker_address() -> std::net::SocketAddr {
    use std::net::ToSocketAddrs;
    let uri = intake_amqp::lapin::uri::AMQPUri::from_str(&url()).expect("a valid test URL");
    (uri.authority.host.as_str(), uri.authority.port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addresses| addresses.next())
        .expect("the test broker's host resolves")
}

/// The test broker's URL with `address` in place of its host and port, and
/// `query` (such as `heartbeat=0`) appended.
pub fn url_at(address: std::net::SocketAddr, query: &str) -> String {
    let uri = intake_amqp::lapin::uri::AMQPUri::from_str(&url()).expect("a valid test URL");
    let user = &uri.authority.userinfo;
    let vhost: String = uri
        .vhost
        .bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() {
                char::from(byte).to_string()
            } else {
                format!("%{byte:02x}")
            }
        })
        .collect();
    format!(
        "amqp://{}:{}@{address}/{vhost}?{query}",
        user.username, user.password
    )
}

/// A name no other test (or earlier run) uses.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| since.subsec_nanos());
    format!(
        "intake-test-{prefix}-{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Arguments every test queue gets: deleted by the broker five minutes after
/// its last use, should the fixture not get to delete it.
pub fn expiring() -> FieldTable {
    let mut arguments = FieldTable::default();
    arguments.insert("x-expires".into(), AMQPValue::LongLongInt(300_000));
    arguments
}

/// The name of the dead-letter queue the fixture pairs with `queue`.
pub fn dead_letter_queue(queue: &str) -> String {
    format!("{queue}.dlq")
}

/// The fanout exchange the fixture produces through, so that a test key
/// travels as the routing key.
pub fn inbound_exchange(queue: &str) -> String {
    format!("{queue}.in")
}

/// A connection and a confirm-mode channel for producing and inspecting.
pub struct AmqpBackend {
    url: String,
    connection: Connection,
    channel: Channel,
    queues: Mutex<Vec<String>>,
    exchanges: Mutex<Vec<String>>,
}

impl AmqpBackend {
    /// Connects, or explains why the test is skipped (and fails it when
    /// `INTAKE_REQUIRE_BROKERS=1`).
    pub async fn connect_or_skip(test: &str) -> Option<Self> {
        match Self::connect().await {
            Ok(backend) => Some(backend),
            Err(error) => {
                let why = format!("no RabbitMQ at {}: {error}", redacted(&url()));
                intake_core::backend::testkit::skip_or_fail(test, &why);
                None
            }
        }
    }

    async fn connect() -> Result<Self, BoxError> {
        let url = url();
        let connection = tokio::time::timeout(
            Duration::from_secs(5),
            Connection::connect(&url, ConnectionProperties::default()),
        )
        .await
        .map_err(|_| "connection attempt timed out")??;
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Self {
            url,
            connection,
            channel,
            queues: Mutex::new(Vec::new()),
            exchanges: Mutex::new(Vec::new()),
        })
    }

    /// The broker URL (with credentials: do not print it).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The fixture's own channel.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Remembers `queue` for [`cleanup`](Self::cleanup).
    pub fn track_queue(&self, queue: &str) {
        self.queues
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .push(queue.to_owned());
    }

    /// Remembers `exchange` for [`cleanup`](Self::cleanup).
    pub fn track_exchange(&self, exchange: &str) {
        self.exchanges
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .push(exchange.to_owned());
    }

    /// Declares a classic queue with a unique name, its dead-letter queue
    /// and its inbound fanout exchange; returns the queue's name.
    pub async fn classic_queue(&self, prefix: &str) -> Result<String, BoxError> {
        let queue = unique(prefix);
        self.declare_queue(&queue, expiring()).await?;
        Ok(queue)
    }

    /// Declares `queue` with `arguments`, plus its dead-letter queue and
    /// inbound exchange.
    pub async fn declare_queue(&self, queue: &str, arguments: FieldTable) -> Result<(), BoxError> {
        let durable = arguments.contains_key("x-queue-type");
        self.channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    durable,
                    ..QueueDeclareOptions::default()
                },
                arguments,
            )
            .await?;
        self.track_queue(queue);
        let dlq = dead_letter_queue(queue);
        self.channel
            .queue_declare(
                dlq.as_str().into(),
                QueueDeclareOptions::default(),
                expiring(),
            )
            .await?;
        self.track_queue(&dlq);
        let inbound = inbound_exchange(queue);
        self.channel
            .exchange_declare(
                inbound.as_str().into(),
                ExchangeKind::Fanout,
                // As a broadcast source declares a fanout exchange (durable,
                // not auto-deleted), so broadcast instances can bind to it;
                // deleted with the fixture (`cleanup`, or its drop).
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        self.track_exchange(&inbound);
        self.channel
            .queue_bind(
                queue.into(),
                inbound.as_str().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(())
    }

    /// Publishes `payloads` to `queue` (through its inbound exchange) and
    /// waits for every confirm.
    pub async fn publish(&self, queue: &str, payloads: &[&[u8]]) -> Result<(), BoxError> {
        let messages = payloads
            .iter()
            .map(|payload| TestMessage {
                key: None,
                payload: Bytes::copy_from_slice(payload),
                headers: Default::default(),
            })
            .collect();
        self.produce(queue, messages).await
    }

    /// Publishes `count` numbered messages (`"0"`, `"1"`, …).
    pub async fn publish_numbered(&self, queue: &str, count: usize) -> Result<(), BoxError> {
        let messages = (0..count)
            .map(|index| TestMessage {
                key: None,
                payload: Bytes::from(index.to_string()),
                headers: Default::default(),
            })
            .collect();
        self.produce(queue, messages).await
    }

    /// Publishes `messages` frame by frame, bypassing lapin (which cannot
    /// write what is not UTF-8), and waits for the broker's confirms.
    pub async fn publish_raw(&self, messages: &[raw::RawMessage]) -> Result<(), BoxError> {
        let uri = intake_amqp::lapin::uri::AMQPUri::from_str(&self.url)?;
        let address = format!("{}:{}", uri.authority.host, uri.authority.port);
        let user = &uri.authority.userinfo;
        tokio::time::timeout(
            Duration::from_secs(10),
            raw::publish(
                &address,
                &user.username,
                &user.password,
                &uri.vhost,
                messages,
            ),
        )
        .await
        .map_err(|_| "the raw publish timed out")?
    }

    /// Messages of `queue`, ready or unacknowledged. Asks `rabbitmqctl`
    /// (which sees unacknowledged deliveries); where it is not available,
    /// falls back to the ready count a passive declare reports.
    pub async fn messages_in(&self, queue: &str) -> Result<u64, BoxError> {
        let output = tokio::process::Command::new("rabbitmqctl")
            .args([
                "list_queues",
                "-q",
                "--no-table-headers",
                "name",
                "messages",
            ])
            .output()
            .await;
        if let Ok(output) = output
            && output.status.success()
        {
            let listing = String::from_utf8_lossy(&output.stdout);
            for line in listing.lines() {
                let mut fields = line.split_whitespace();
                if fields.next() == Some(queue) {
                    return Ok(fields.next().unwrap_or("0").parse()?);
                }
            }
            return Err(format!("queue {queue} is not listed by rabbitmqctl").into());
        }
        let declared = self
            .channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        Ok(u64::from(declared.message_count()))
    }

    /// Reads every message of `queue` without consuming it (they are
    /// requeued when the reading channel closes), oldest first.
    pub async fn peek(&self, queue: &str) -> Result<Vec<(Bytes, FieldTable)>, BoxError> {
        Ok(self
            .peek_deliveries(queue)
            .await?
            .into_iter()
            .map(|delivery| {
                let headers = delivery.properties.headers().clone().unwrap_or_default();
                (Bytes::from(delivery.data), headers)
            })
            .collect())
    }

    /// The deliveries waiting in `queue`, left in it (taken unacknowledged
    /// on a channel of their own, which is closed).
    pub async fn peek_deliveries(&self, queue: &str) -> Result<Vec<Delivery>, BoxError> {
        let channel = self.connection.create_channel().await?;
        let mut read = Vec::new();
        while let Some(message) = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: false })
            .await?
        {
            read.push(message.delivery);
        }
        channel.close(200, "peeked".into()).await?;
        Ok(read)
    }

    /// The dead letters waiting in `queue`, read back with
    /// [`read_dead_letter`], left in it.
    pub async fn peek_dead_letters(
        &self,
        queue: &str,
    ) -> Result<Vec<Result<DeadLetter, EnvelopeError>>, BoxError> {
        Ok(self
            .peek_deliveries(queue)
            .await?
            .into_iter()
            .map(read_dead_letter)
            .collect())
    }

    fn take_declared(&self) -> (Vec<String>, Vec<String>) {
        let queues = std::mem::take(&mut *self.queues.lock().unwrap_or_else(|p| p.into_inner()));
        let exchanges =
            std::mem::take(&mut *self.exchanges.lock().unwrap_or_else(|p| p.into_inner()));
        (queues, exchanges)
    }

    /// Deletes every queue and exchange this fixture declared.
    pub async fn cleanup(&self) {
        let (queues, exchanges) = self.take_declared();
        delete(&self.channel, queues, exchanges).await;
    }
}

async fn delete(channel: &Channel, queues: Vec<String>, exchanges: Vec<String>) {
    for queue in queues {
        let _ = channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    for exchange in exchanges {
        let _ = channel
            .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
            .await;
    }
}

/// Deletes what a test did not clean up itself (it failed, or it is a
/// conformance scenario, which has no cleanup step), from a thread of its
/// own so that it works from any runtime.
impl Drop for AmqpBackend {
    fn drop(&mut self) {
        let (queues, exchanges) = self.take_declared();
        if queues.is_empty() && exchanges.is_empty() {
            return;
        }
        let url = self.url.clone();
        let cleaner = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                let Ok(connection) =
                    Connection::connect(&url, ConnectionProperties::default()).await
                else {
                    return;
                };
                if let Ok(channel) = connection.create_channel().await {
                    delete(&channel, queues, exchanges).await;
                }
                let _ = connection.close(200, "cleaned up".into()).await;
            });
        });
        let _ = cleaner.join();
    }
}

/// `url` without its password, for skip messages.
fn redacted(url: &str) -> String {
    intake_amqp::AmqpUrl::parse(url)
        .map_or_else(|_| "<invalid URL>".to_owned(), |url| url.to_string())
}

#[async_trait::async_trait]
impl Backend for AmqpBackend {
    type Source = AmqpSource;
    type Acker = AmqpAcker;
    type Sink = AmqpDeadLetterSink;

    fn name(&self) -> &'static str {
        "amqp"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            broker: Broker::Amqp,
            // A queue has no partitions; a channel is one, per consumer.
            partitions: false,
            // Consumers of one queue share its messages.
            shared_groups: true,
            // The broker requeues a closed channel's deliveries at once.
            crash_redelivery_after: Duration::ZERO,
            key_order_through_crashes: true,
        }
    }

    async fn create_source(&self, _partitions: u32) -> Result<String, BoxError> {
        self.classic_queue("conformance").await
    }

    async fn produce(&self, source: &str, messages: Vec<TestMessage>) -> Result<(), BoxError> {
        let exchange = inbound_exchange(source);
        let mut confirms = Vec::with_capacity(messages.len());
        for message in messages {
            let routing_key = match &message.key {
                Some(key) => ShortString::try_new(String::from_utf8_lossy(key).into_owned())?,
                None => ShortString::default(),
            };
            let mut table = FieldTable::default();
            for header in &message.headers {
                table.insert(
                    ShortString::try_new(header.name.to_string())?,
                    AMQPValue::LongString(LongString::from(header.value.to_vec())),
                );
            }
            let properties = BasicProperties::default()
                .with_delivery_mode(2)
                .with_headers(table);
            confirms.push(
                self.channel
                    .basic_publish(
                        exchange.as_str().into(),
                        routing_key,
                        BasicPublishOptions {
                            mandatory: true,
                            ..BasicPublishOptions::default()
                        },
                        &message.payload,
                        properties,
                    )
                    .await?,
            );
        }
        for confirm in confirms {
            let confirmation = confirm.await?;
            if !confirmation.is_ack() || confirmation.take_message().is_some() {
                return Err(format!("the broker did not take a message for {source}").into());
            }
        }
        Ok(())
    }

    async fn connect(
        &self,
        source: &str,
        group: &str,
        // The consumer the suite runs tells the source its limits itself.
        _settings: ConnectSettings,
    ) -> Result<(Self::Source, Self::Acker), BoxError> {
        let consumer = AmqpSource::builder(
            intake_amqp::AmqpSettings::new(self.url.as_str())
                .connection_name(format!("{source}/{group}")),
        )
        .queue(source)
        .build()
        .await?;
        let acker = consumer.acker();
        Ok((consumer, acker))
    }

    async fn dead_letter_sink(&self, source: &str, _group: &str) -> Result<Self::Sink, BoxError> {
        Ok(AmqpDeadLetterSink::builder(self.url.as_str())
            .exchange("")
            .routing_key(dead_letter_queue(source))
            .consumed_queue(source)
            .build()
            .await?)
    }

    async fn dead_letters(&self, source: &str, _group: &str) -> Result<Vec<DeadLetter>, BoxError> {
        self.peek_dead_letters(&dead_letter_queue(source))
            .await?
            .into_iter()
            .map(|letter| Ok(letter?))
            .collect()
    }

    async fn unacknowledged(&self, source: &str, _group: &str) -> Result<u64, BoxError> {
        // Acknowledgements reach the queue process asynchronously: give
        // them a moment before reporting a count above zero.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        loop {
            let count = self.messages_in(source).await?;
            if count == 0 || tokio::time::Instant::now() >= deadline {
                return Ok(count);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Each instance binds a queue of its own to the fanout exchange the
    /// fixture produces through.
    async fn connect_broadcast(
        &self,
        source: &str,
        _settings: ConnectSettings,
    ) -> Option<Result<(Self::Source, Self::Acker), BoxError>> {
        let built = AmqpSource::builder(
            intake_amqp::AmqpSettings::new(self.url.as_str())
                .connection_name(format!("{source}/broadcast")),
        )
        .broadcast(inbound_exchange(source))
        .build()
        .await;
        testkit::with_acker(built, |source| source.acker())
    }

    async fn connect_unreachable(
        &self,
        source: &str,
        group: &str,
        password: &str,
    ) -> Option<Result<(Self::Source, Self::Acker), BoxError>> {
        let port = testkit::closed_port().expect("a free local port");
        let built = AmqpSource::builder(
            intake_amqp::AmqpSettings::new(format!("amqp://guest:{password}@127.0.0.1:{port}/%2f"))
                .connection_name(format!("{source}/{group}")),
        )
        .queue(source)
        .build()
        .await;
        testkit::with_acker(built, |source| source.acker())
    }
}

/// Publishes through the fanout exchange the fixture produces through,
/// with the key as the routing key, which the source reads back as the key.
#[async_trait::async_trait]
impl testkit::PublishingBackend for AmqpBackend {
    type Publisher = intake_amqp::AmqpPublisher;

    async fn publisher(&self) -> Result<Self::Publisher, BoxError> {
        Ok(intake_amqp::AmqpPublisher::builder(
            intake_amqp::AmqpSettings::new(self.url.as_str())
                .connection_name("conformance publisher"),
        )
        .route_by_key()
        .build()
        .await?)
    }

    fn destination(&self, source: &str) -> String {
        inbound_exchange(source)
    }
}
