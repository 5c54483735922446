//! Test support: a Redis connection for setting up and inspecting streams,
//! unique names, a by-hand driver for sources and ackers, and the
//! [`RedisBackend`] fixture of the conformance suite.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use intake_core::backend::testkit::{self, Backend, Capabilities, ConnectSettings, TestMessage};
use intake_core::dead_letter::{Broker, EnvelopeError};
use intake_core::{
    BoxError, DeadLetter, Headers, Message, PartitionKey,
    backend::{AckBatch, Acker, PartitionAck, Source},
};
use intake_redis_streams::{
    RedisDeadLetterSink, RedisSettings, RedisStreamsAcker, RedisStreamsPublisher,
    RedisStreamsSource, RedisStreamsSourceBuilder,
};
use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, Value};

/// The server under test (`INTAKE_REDIS_URL`, default the local one).
pub fn redis_url() -> String {
    std::env::var("INTAKE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A connection for setting up and inspecting streams, or `None` (after
/// printing why) when Redis is absent and not required.
///
/// With `INTAKE_REQUIRE_BROKERS=1` an absent Redis fails the test.
pub async fn redis_or_skip(test: &str) -> Option<MultiplexedConnection> {
    let connected = async {
        let client = redis::Client::open(redis_url())?;
        let mut connection = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING")
            .query_async::<()>(&mut connection)
            .await?;
        Ok::<_, redis::RedisError>(connection)
    }
    .await;
    match connected {
        Ok(connection) => Some(connection),
        Err(error) => {
            let why = format!("Redis is not reachable at {}: {error}", redis_url());
            intake_core::backend::testkit::skip_or_fail(test, &why);
            None
        }
    }
}

/// A name no other test (or earlier run) uses.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    format!(
        "intake-test:{prefix}:{}:{nanos}:{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Adds `count` entries `payload = <prefix><n>` to `stream`, in one round trip.
pub async fn produce(
    connection: &mut MultiplexedConnection,
    stream: &str,
    prefix: &str,
    count: usize,
) {
    let mut pipe = redis::pipe();
    for n in 0..count {
        pipe.cmd("XADD")
            .arg(stream)
            .arg("*")
            .arg("payload")
            .arg(format!("{prefix}{n}"))
            .ignore();
    }
    pipe.query_async::<()>(connection)
        .await
        .expect("XADD of test entries");
}

/// An ACL user with every permission, for tests that must tell their own
/// connections apart or need a password. Returns its name, password and a
/// URL that logs in as it; remove it with [`drop_user`].
pub async fn temporary_user(connection: &mut MultiplexedConnection) -> (String, String, String) {
    let name = unique("user").replace(':', "-");
    let password = format!("pw-{}", unique("secret").replace(':', "-"));
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&name)
        .arg("on")
        .arg(format!(">{password}"))
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query_async::<()>(connection)
        .await
        .expect("ACL SETUSER");
    let address = redis_url()
        .strip_prefix("redis://")
        .map(str::to_owned)
        .unwrap_or_else(|| "127.0.0.1:6379".to_owned());
    let url = format!("redis://{name}:{password}@{address}");
    (name, password, url)
}

/// Removes a user made by [`temporary_user`].
pub async fn drop_user(connection: &mut MultiplexedConnection, name: &str) {
    let _ = redis::cmd("ACL")
        .arg("DELUSER")
        .arg(name)
        .query_async::<()>(connection)
        .await;
}

/// A group consumer config for tests: short block and claim times.
pub fn group_builder(stream: &str, group: &str, consumer: &str) -> RedisStreamsSourceBuilder {
    RedisStreamsSource::builder(redis_url())
        .stream(stream)
        .group(group)
        .consumer(consumer)
        .block(Duration::from_millis(100))
        .claim_min_idle(Duration::from_millis(500))
        .claim_interval(Duration::from_millis(100))
}

/// Calls `next` until `count` messages arrived or `deadline` passed.
pub async fn receive(
    source: &mut RedisStreamsSource,
    count: usize,
    max: usize,
    deadline: Duration,
) -> Vec<Message> {
    let mut received = Vec::new();
    let mut buffer = Vec::new();
    let _ = tokio::time::timeout(deadline, async {
        while received.len() < count {
            buffer.clear();
            match source
                .next(&mut buffer, max.min(count - received.len()))
                .await
            {
                Ok(_) => received.append(&mut buffer),
                Err(error) => panic!("source failed: {error}"),
            }
        }
    })
    .await;
    received
}

/// Acknowledges `messages` through `acker`, as the commit engine would.
pub async fn ack(acker: &mut RedisStreamsAcker, messages: &[Message]) {
    let mut batch = AckBatch::default();
    for message in messages {
        let key = message.metadata().partition_key();
        let index = match batch.partitions.iter().position(|ack| ack.partition == key) {
            Some(index) => index,
            None => {
                batch.partitions.push(PartitionAck::new(key));
                batch.partitions.len() - 1
            }
        };
        batch.partitions[index]
            .completed
            .push(message.metadata().position());
    }
    acker.ack(&batch).await.expect("XACK");
}

/// Payloads as text.
pub fn payloads(messages: &[Message]) -> Vec<String> {
    messages
        .iter()
        .map(|message| String::from_utf8_lossy(message.payload()).into_owned())
        .collect()
}

/// Entries of `stream` that `group` has not acknowledged (pending), plus
/// those it has not read yet.
pub async fn unacknowledged(
    connection: &mut MultiplexedConnection,
    stream: &str,
    group: &str,
) -> Result<u64, BoxError> {
    let groups: Value = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(stream)
        .query_async(connection)
        .await?;
    let Value::Array(groups) = groups else {
        return Err("XINFO GROUPS: not an array".into());
    };
    for info in groups {
        let fields: Vec<(String, Value)> = match info {
            Value::Array(items) => items
                .chunks(2)
                .filter_map(|pair| match pair {
                    [Value::BulkString(name), value] => {
                        Some((String::from_utf8_lossy(name).into_owned(), value.clone()))
                    }
                    [Value::SimpleString(name), value] => Some((name.clone(), value.clone())),
                    _ => None,
                })
                .collect(),
            Value::Map(pairs) => pairs
                .into_iter()
                .filter_map(|(name, value)| match name {
                    Value::BulkString(name) => {
                        Some((String::from_utf8_lossy(&name).into_owned(), value))
                    }
                    Value::SimpleString(name) => Some((name, value)),
                    _ => None,
                })
                .collect(),
            _ => continue,
        };
        let field = |name: &str| {
            fields
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        let is_group =
            matches!(field("name"), Some(Value::BulkString(name)) if name == group.as_bytes());
        if !is_group {
            continue;
        }
        let pending = match field("pending") {
            Some(Value::Int(pending)) => pending as u64,
            _ => 0,
        };
        let last_delivered = match field("last-delivered-id") {
            Some(Value::BulkString(id)) => String::from_utf8_lossy(&id).into_owned(),
            _ => "0-0".to_owned(),
        };
        let unread: Vec<Value> = redis::cmd("XRANGE")
            .arg(stream)
            .arg(format!("({last_delivered}"))
            .arg("+")
            .query_async(connection)
            .await?;
        return Ok(pending + unread.len() as u64);
    }
    let length: u64 = connection.xlen(stream).await?;
    Ok(length)
}

/// Asserts that `group` has acknowledged every entry of `stream`.
pub async fn assert_all_acknowledged(
    connection: &mut MultiplexedConnection,
    stream: &str,
    group: &str,
) {
    let left = unacknowledged(connection, stream, group).await.ok();
    assert_eq!(
        left,
        Some(0),
        "entries of {stream} left unacknowledged by {group}"
    );
}

/// The fields of every entry of `stream`, oldest first.
pub async fn entries(
    connection: &mut MultiplexedConnection,
    stream: &str,
) -> Vec<Vec<(String, Bytes)>> {
    let reply: Value = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query_async(connection)
        .await
        .expect("XRANGE");
    let Value::Array(entries) = reply else {
        return Vec::new();
    };
    entries
        .into_iter()
        .filter_map(|entry| match entry {
            Value::Array(mut parts) if parts.len() == 2 => match parts.pop() {
                Some(Value::Array(fields)) => Some(
                    fields
                        .chunks(2)
                        .filter_map(|pair| match pair {
                            [Value::BulkString(name), Value::BulkString(value)] => Some((
                                String::from_utf8_lossy(name).into_owned(),
                                Bytes::copy_from_slice(value),
                            )),
                            _ => None,
                        })
                        .collect(),
                ),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// The value of `name` among `fields`, as text.
pub fn field(fields: &[(String, Bytes)], name: &str) -> Option<String> {
    fields
        .iter()
        .find(|(field, _)| field == name)
        .map(|(_, value)| String::from_utf8_lossy(value).into_owned())
}

/// A dead-letter entry's fields read back as a dead letter: the first
/// `payload` field is the payload (as the source reads entries), the others
/// the headers; a stream entry has no key slot.
pub fn dead_letter_of(fields: &[(String, Bytes)]) -> Result<DeadLetter, EnvelopeError> {
    let payload_at = fields.iter().position(|(name, _)| name == "payload");
    let payload = payload_at.map_or_else(Bytes::new, |at| fields[at].1.clone());
    let headers: Headers = fields
        .iter()
        .enumerate()
        .filter(|(at, _)| Some(*at) != payload_at)
        .map(|(_, (name, value))| (name.as_str(), value.clone()))
        .collect();
    DeadLetter::read(None, payload, &headers)
}

/// The conformance suite's fixture for Redis Streams.
pub struct RedisBackend {
    admin: MultiplexedConnection,
    claim_min_idle: Duration,
}

impl RedisBackend {
    /// The fixture, or `None` when Redis is absent (see [`redis_or_skip`]).
    pub async fn new(test: &str) -> Option<Self> {
        Some(Self {
            admin: redis_or_skip(test).await?,
            claim_min_idle: Duration::from_millis(500),
        })
    }

    fn config(&self, source: &str, group: &str) -> RedisStreamsSourceBuilder {
        group_builder(source, group, &unique("consumer"))
            .key_field("key")
            .claim_min_idle(self.claim_min_idle)
    }
}

#[async_trait::async_trait]
impl Backend for RedisBackend {
    type Source = RedisStreamsSource;
    type Acker = RedisStreamsAcker;
    type Sink = RedisDeadLetterSink;

    fn name(&self) -> &'static str {
        "redis"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            broker: Broker::Redis,
            partitions: false,
            shared_groups: true,
            crash_redelivery_after: self.claim_min_idle,
            key_order_through_crashes: true,
        }
    }

    async fn create_source(&self, _partitions: u32) -> Result<String, BoxError> {
        Ok(unique("stream"))
    }

    async fn produce(&self, source: &str, messages: Vec<TestMessage>) -> Result<(), BoxError> {
        let mut pipe = redis::pipe();
        for message in &messages {
            let command = pipe.cmd("XADD").arg(source).arg("*");
            command.arg("payload").arg(message.payload.as_ref());
            if let Some(key) = &message.key {
                command.arg("key").arg(key.as_ref());
            }
            for header in &message.headers {
                command.arg(&*header.name).arg(header.value.as_ref());
            }
            command.ignore();
        }
        let mut admin = self.admin.clone();
        pipe.query_async::<()>(&mut admin).await?;
        Ok(())
    }

    async fn connect(
        &self,
        source: &str,
        group: &str,
        _settings: ConnectSettings,
    ) -> Result<(Self::Source, Self::Acker), BoxError> {
        let source = self.config(source, group).build().await?;
        let acker = source.acker();
        Ok((source, acker))
    }

    async fn dead_letter_sink(&self, source: &str, group: &str) -> Result<Self::Sink, BoxError> {
        let sink = RedisDeadLetterSink::builder(redis_url())
            .consumed_stream(source)
            .group(group)
            .build()
            .await?;
        Ok(sink)
    }

    async fn dead_letters(&self, source: &str, _group: &str) -> Result<Vec<DeadLetter>, BoxError> {
        let mut admin = self.admin.clone();
        let stream = format!("{source}:dlq");
        entries(&mut admin, &stream)
            .await
            .iter()
            .map(|fields| Ok(dead_letter_of(fields)?))
            .collect()
    }

    async fn unacknowledged(&self, source: &str, group: &str) -> Result<u64, BoxError> {
        let mut admin = self.admin.clone();
        unacknowledged(&mut admin, source, group).await
    }

    async fn connect_broadcast(
        &self,
        source: &str,
        _settings: ConnectSettings,
    ) -> Option<Result<(Self::Source, Self::Acker), BoxError>> {
        let built = RedisStreamsSource::builder(redis_url())
            .stream(source)
            .key_field("key")
            .broadcast()
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
        let built = RedisStreamsSource::builder(
            RedisSettings::new(format!("redis://intake:{password}@127.0.0.1:{port}"))
                .connect_timeout(Duration::from_secs(2)),
        )
        .stream(source)
        .group(group)
        .consumer("unreachable")
        .build()
        .await;
        testkit::with_acker(built, |source| source.acker())
    }
}

#[async_trait::async_trait]
impl testkit::PublishingBackend for RedisBackend {
    type Publisher = RedisStreamsPublisher;

    async fn publisher(&self) -> Result<Self::Publisher, BoxError> {
        Ok(RedisStreamsPublisher::builder(redis_url()).build().await?)
    }

    fn destination(&self, source: &str) -> String {
        source.to_owned()
    }
}

/// The partition key of a stream.
pub fn partition(stream: &str) -> PartitionKey {
    PartitionKey::new(stream, 0)
}

/// A TCP proxy in front of Redis that can go away and come back on the same
/// port, to simulate an outage without touching the server.
pub struct Proxy {
    address: std::net::SocketAddr,
    tasks: tokio::task::JoinSet<()>,
}

impl Proxy {
    /// A proxy on a free local port.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let address = listener.local_addr().expect("proxy address");
        Self::serve(listener, address)
    }

    fn serve(listener: tokio::net::TcpListener, address: std::net::SocketAddr) -> Self {
        let mut tasks = tokio::task::JoinSet::new();
        let upstream = redis_url()
            .strip_prefix("redis://")
            .unwrap_or("127.0.0.1:6379")
            .trim_end_matches('/')
            .to_owned();
        tasks.spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((mut client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                connections.spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Self { address, tasks }
    }

    /// Where the proxy listens.
    pub fn address(&self) -> std::net::SocketAddr {
        self.address
    }

    /// Closes the port and every connection through it.
    pub fn stop(&mut self) {
        // Aborting the accept task drops the listener and, with its
        // JoinSet, every forwarding task and socket.
        self.tasks.abort_all();
    }

    /// Listens again on the same port.
    pub async fn restart(mut self) -> Self {
        let address = self.address;
        self.tasks.shutdown().await;
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .expect("bind the proxy again");
        Self::serve(listener, address)
    }
}
