//! [`RedisParkingBuilder`]: a parking's settings, checked before it
//! connects; [`build`](RedisParkingBuilder::build) runs the mover's first
//! round and starts it.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_core::{ConfigError, Exponential};
use tokio::sync::{Notify, watch};

use super::mover::{LONGEST_BACKOFF, Mover, pace, report};
use super::{Inner, RedisParking, StreamKeys};
use crate::connection::{Connector, SharedConnection};
use crate::error::Error;
use crate::settings::RedisSettings;
use crate::source::settings::{DEFAULT_PAYLOAD_FIELD, Settings};

/// Builds a [`RedisParking`]; see [`RedisParking::builder`] and
/// [`RedisStreamsSource::parking`](crate::RedisStreamsSource::parking).
#[derive(Clone)]
#[must_use = "a builder does nothing until `.build().await`"]
pub struct RedisParkingBuilder {
    server: Server,
    consumed: Vec<String>,
    group: Option<String>,
    /// Return streams set by hand: (consumed stream, return stream).
    returns: Vec<(String, String)>,
    /// The streams the source reads, for a builder from a source: each
    /// return stream must be among them.
    read_by_source: Option<Vec<String>>,
    payload_field: String,
    max_len: Option<u64>,
    batch: usize,
    poll_interval: Duration,
}

/// Where a parking connects.
#[derive(Clone)]
enum Server {
    Settings(RedisSettings),
    /// As the source it was made from does (server, TLS, timeouts).
    Source(Box<Connector>),
}

impl Server {
    /// How long a park or a mover round may take, reconnecting included.
    fn command_timeout(&self) -> Duration {
        match self {
            Server::Settings(settings) => settings.command_timeout,
            Server::Source(connector) => connector.command_timeout(),
        }
    }
}

impl fmt::Debug for RedisParkingBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("RedisParkingBuilder");
        match &self.server {
            Server::Settings(settings) => debug.field("connection", settings),
            Server::Source(connector) => debug.field("source_endpoint", connector.endpoint()),
        };
        debug
            .field("group", &self.group)
            .field("consumed", &self.consumed)
            .field("return_streams", &self.returns)
            .field("read_by_source", &self.read_by_source)
            .field("payload_field", &self.payload_field)
            .field("max_len", &self.max_len)
            .field("batch", &self.batch)
            .field("poll_interval", &self.poll_interval)
            .finish()
    }
}

impl RedisParkingBuilder {
    /// Default of [`batch`](Self::batch).
    pub const DEFAULT_BATCH: usize = 100;
    /// The largest [`batch`](Self::batch): a script holds the server while
    /// it runs.
    pub const MAX_BATCH: usize = 1_000;
    /// Default of [`poll_interval`](Self::poll_interval).
    pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);

    pub(super) fn new(settings: RedisSettings) -> Self {
        Self::on(Server::Settings(settings))
    }

    fn on(server: Server) -> Self {
        Self {
            server,
            consumed: Vec::new(),
            group: None,
            returns: Vec::new(),
            read_by_source: None,
            payload_field: DEFAULT_PAYLOAD_FIELD.to_owned(),
            max_len: None,
            batch: Self::DEFAULT_BATCH,
            poll_interval: Self::DEFAULT_POLL_INTERVAL,
        }
    }

    /// A builder prefilled from a source: its connection settings (server,
    /// TLS, timeouts), its group, its payload field, and as consumed streams those of its
    /// streams that are not the default return stream of another.
    pub(crate) fn from_source(connector: Connector, settings: &Settings) -> Self {
        let streams: Vec<String> = settings.streams.iter().map(|s| s.to_string()).collect();
        let group = settings.group.as_deref().map(str::to_owned);
        let consumed = streams
            .iter()
            .filter(|stream| {
                group.as_deref().is_none_or(|group| {
                    !streams
                        .iter()
                        .any(|other| RedisParking::return_stream(other, group) == **stream)
                })
            })
            .cloned()
            .collect();
        Self {
            consumed,
            group,
            read_by_source: Some(streams),
            payload_field: settings.payload_field.to_string(),
            ..Self::on(Server::Source(Box::new(connector)))
        }
    }

    /// The consumer group whose messages this parks: the group that reads
    /// the return streams, and part of the name of every key of the
    /// parking. Required; a builder from a source has the source's.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Names a stream whose messages this parks, and whose parked messages
    /// its mover moves to the stream's return stream. Call it once per
    /// stream the consumer reads, its return streams aside; a builder from
    /// a source names the source's.
    pub fn consumed_stream(mut self, stream: impl Into<String>) -> Self {
        self.consumed.push(stream.into());
        self
    }

    /// Sets where the parked messages of consumed stream `stream` come
    /// back (default [`RedisParking::return_stream`]`(stream, group)`). The
    /// group's source must read it, and no other consumer: every reader of
    /// a return stream receives each copy. A builder from a source no
    /// longer takes `return_stream` for a stream of its own to park.
    pub fn return_stream(
        mut self,
        stream: impl Into<String>,
        return_stream: impl Into<String>,
    ) -> Self {
        let (stream, return_stream) = (stream.into(), return_stream.into());
        self.consumed.retain(|consumed| *consumed != return_stream);
        self.returns.retain(|(consumed, _)| *consumed != stream);
        self.returns.push((stream, return_stream));
        self
    }

    /// The field that carries each entry's payload (default `payload`): the
    /// source's [`payload_field`](crate::RedisStreamsSourceBuilder::payload_field).
    pub fn payload_field(mut self, field: impl Into<String>) -> Self {
        self.payload_field = field.into();
        self
    }

    /// Also trims each return stream a parked message moves into to about
    /// `max_len` entries (`XADD … MAXLEN ~ max_len`). Default: no such
    /// bound. Not needed to keep a return stream small: every round of the
    /// mover trims the copies its group acknowledged (see [`RedisParking`]).
    /// A hard bound on top, at the price that a copy the group has not read
    /// yet is trimmed too (lost) when the group lags that far behind. The
    /// parking streams are never trimmed.
    pub fn max_len(mut self, max_len: u64) -> Self {
        self.max_len = Some(max_len);
        self
    }

    /// Most due messages one round moves back per stream (default 100, at
    /// most [`MAX_BATCH`](Self::MAX_BATCH)); a round that moves this many
    /// is followed by another at once.
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch;
        self
    }

    /// The longest the mover sleeps between rounds (default 1 s): how late,
    /// at most, it notices a message another instance parked with a shorter
    /// delay than the ones it knows of.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// The keys of each consumed stream, once `check` passed.
    fn keys(&self, group: &str) -> Vec<StreamKeys> {
        self.consumed
            .iter()
            .map(|stream| {
                let returned = self
                    .returns
                    .iter()
                    .find(|(consumed, _)| consumed == stream)
                    .map(|(_, returned)| returned.as_str());
                StreamKeys::new(stream, group, returned)
            })
            .collect()
    }

    fn check(&self) -> Result<&str, ConfigError> {
        let group = match self.group.as_deref() {
            Some("") => return Err(ConfigError::new("group", "is empty")),
            Some(group) => group,
            None => {
                return Err(ConfigError::new(
                    "group",
                    "names no consumer group: parked messages come back to a stream only \
                     their group reads (a broadcast reader has none, so it cannot park)",
                ));
            }
        };
        if self.consumed.is_empty() {
            return Err(ConfigError::new(
                "consumed_stream",
                "names no stream: name each stream whose messages are parked",
            ));
        }
        if self.consumed.iter().any(String::is_empty) {
            return Err(ConfigError::new("consumed_stream", "is empty"));
        }
        for (stream, returned) in &self.returns {
            if returned.is_empty() {
                return Err(ConfigError::new("return_stream", "is empty"));
            }
            if !self.consumed.contains(stream) {
                return Err(ConfigError::new(
                    "return_stream",
                    format!("is set for `{stream}`, which is no consumed stream"),
                ));
            }
        }
        let keys = self.keys(group);
        for (n, own) in keys.iter().enumerate() {
            for (name, what) in [
                (&own.returned, "come back"),
                (&own.parked, "wait while parked"),
                (&own.due, "are indexed while parked"),
            ] {
                if self.consumed.contains(name) {
                    return Err(ConfigError::new(
                        "consumed_stream",
                        format!(
                            "`{name}` is where the parked messages of `{}` {what}; it cannot \
                             be a consumed stream too",
                            own.stream
                        ),
                    ));
                }
            }
            if let Some(other) = keys[..n]
                .iter()
                .find(|other| other.returned == own.returned)
            {
                return Err(ConfigError::new(
                    "return_stream",
                    format!(
                        "`{}` is the return stream of both `{}` and `{}`; give each stream \
                         its own",
                        own.returned, other.stream, own.stream
                    ),
                ));
            }
            if let Some(read) = &self.read_by_source
                && !read.contains(&own.returned)
            {
                return Err(ConfigError::new(
                    "return_stream",
                    format!(
                        "`{}`, where the parked messages of `{}` come back, is not read by the \
                         source: add `.stream(\"{}\")` to the source's builder",
                        own.returned, own.stream, own.returned
                    ),
                ));
            }
        }
        if self.payload_field.is_empty() {
            return Err(ConfigError::new("payload_field", "is empty"));
        }
        if self.max_len == Some(0) {
            return Err(ConfigError::new(
                "max_len",
                "is 0, which would trim every entry away",
            ));
        }
        if self.batch == 0 || self.batch > Self::MAX_BATCH {
            return Err(ConfigError::new(
                "batch",
                format!("must be 1 to {}", Self::MAX_BATCH),
            ));
        }
        let mut timeouts = vec![("poll_interval", self.poll_interval)];
        // A builder from a source connects as the source did.
        if let Server::Settings(settings) = &self.server {
            timeouts.push(("connect_timeout", settings.connect_timeout));
            timeouts.push(("command_timeout", settings.command_timeout));
        }
        for (name, timeout) in timeouts {
            if timeout.is_zero() {
                return Err(ConfigError::new(name, "is zero"));
            }
        }
        Ok(group)
    }

    /// Checks the settings, connects, runs a first round of the mover (so
    /// that a key of the wrong type or a missing permission fails here, and
    /// messages already due move at once) and starts the mover task on the
    /// current Tokio runtime.
    ///
    /// Fails with [`Error::Config`] for a setting that cannot work (no
    /// group; from a source, a return stream the source does not read),
    /// before connecting, and with a typed error for a bad URL, an
    /// unreachable server, refused credentials or a key of the wrong type
    /// (none of them shows the password).
    pub async fn build(self) -> Result<RedisParking, Error> {
        let group = self.check()?.to_owned();
        let command_timeout = self.server.command_timeout();
        let connector = match &self.server {
            Server::Settings(settings) => settings.connector()?,
            Server::Source(connector) => (**connector).clone(),
        };
        let connection = SharedConnection::new(connector.shared().await?, connector);
        let keys = self.keys(&group);
        let wake = Arc::new(Notify::new());
        let mover = Mover {
            connection: connection.clone(),
            keys: keys.clone(),
            group: group.clone(),
            batch: self.batch,
            max_len: self.max_len,
            poll_interval: self.poll_interval,
            command_timeout,
            reconnect: Exponential::new(Duration::from_millis(100), LONGEST_BACKOFF)
                .retry_forever(),
            wake: Arc::clone(&wake),
            failures: 0,
        };
        let mut wait = mover.poll_interval;
        for keys in &mover.keys {
            let round = mover.round(keys).await?;
            report(keys, &round);
            wait = pace(wait, &round);
        }
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(mover.run(wait, stopped));
        tracing::debug!(
            endpoint = %connection.connector().endpoint(),
            group,
            keys = ?keys,
            "Redis parking started"
        );
        Ok(RedisParking {
            inner: Arc::new(Inner {
                keys,
                group,
                payload_field: self.payload_field,
                connection,
                wake,
                stop,
                mover: Mutex::new(Some(task)),
                command_timeout,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_that_cannot_work_are_refused_before_connecting() {
        let builder = || {
            RedisParking::builder("redis://127.0.0.1")
                .group("billing")
                .consumed_stream("orders")
        };
        let refused = [
            (
                RedisParking::builder("redis://127.0.0.1").consumed_stream("orders"),
                "group",
            ),
            (builder().group(""), "group"),
            (
                RedisParking::builder("redis://127.0.0.1").group("billing"),
                "consumed_stream",
            ),
            (builder().consumed_stream(""), "consumed_stream"),
            (
                builder().consumed_stream("orders:billing:parked"),
                "consumed_stream",
            ),
            (
                builder().consumed_stream("orders:billing:returned"),
                "consumed_stream",
            ),
            (builder().return_stream("orders", ""), "return_stream"),
            (builder().return_stream("payments", "back"), "return_stream"),
            (
                builder()
                    .consumed_stream("payments")
                    .return_stream("orders", "back")
                    .return_stream("payments", "back"),
                "return_stream",
            ),
            (builder().payload_field(""), "payload_field"),
            (builder().max_len(0), "max_len"),
            (builder().batch(0), "batch"),
            (builder().batch(RedisParkingBuilder::MAX_BATCH + 1), "batch"),
            (builder().poll_interval(Duration::ZERO), "poll_interval"),
            (
                RedisParking::builder(
                    RedisSettings::new("redis://127.0.0.1").connect_timeout(Duration::ZERO),
                )
                .group("billing")
                .consumed_stream("orders"),
                "connect_timeout",
            ),
            (
                RedisParking::builder(
                    RedisSettings::new("redis://127.0.0.1").command_timeout(Duration::ZERO),
                )
                .group("billing")
                .consumed_stream("orders"),
                "command_timeout",
            ),
        ];
        for (builder, setting) in refused {
            let error = builder.check().err().map(|error| error.to_string());
            assert!(
                error
                    .as_deref()
                    .is_some_and(|error| error.contains(setting)),
                "{setting}: {error:?}"
            );
        }
        assert!(builder().consumed_stream("payments").check().is_ok());
        let custom = builder().return_stream("orders", "orders:back");
        assert_eq!(custom.check().ok(), Some("billing"));
        assert_eq!(custom.keys("billing")[0].returned, "orders:back");
    }

    /// A builder as `RedisStreamsSource::parking` makes it for a source
    /// of `streams` in `group`.
    fn from_source(streams: &[&str], group: Option<&str>) -> RedisParkingBuilder {
        let connector = RedisSettings::new("redis://127.0.0.1")
            .command_timeout(Duration::from_secs(3))
            .connector()
            .expect("a valid URL");
        let settings = Settings {
            streams: streams.iter().map(|s| (*s).into()).collect(),
            group: group.map(Arc::from),
            consumer: Arc::from("c1"),
            payload_field: Arc::from("body"),
            key_field: None,
            key_order: true,
            start: crate::StartFrom::Beginning,
            block: Duration::from_secs(1),
            claim_min_idle: Duration::from_secs(30),
            claim_interval: Duration::from_secs(5),
            max_deliveries: None,
            dead_letter_stream: crate::DeadLetterStream::default(),
            delete_acked: false,
            reconnect: Arc::new(Exponential::new(
                Duration::from_millis(100),
                LONGEST_BACKOFF,
            )),
            counters: Arc::default(),
        };
        RedisParkingBuilder::from_source(connector, &settings)
    }

    #[test]
    fn a_builder_from_a_source_parks_its_streams_and_needs_it_to_read_their_return_streams() {
        let both = from_source(&["orders", "orders:billing:returned"], Some("billing"));
        assert_eq!(
            both.consumed,
            ["orders"],
            "the return stream is no stream to park"
        );
        assert_eq!(both.payload_field, "body");
        assert_eq!(both.check().ok(), Some("billing"));

        let forgotten = from_source(&["orders"], Some("billing"))
            .check()
            .err()
            .map(|error| error.to_string());
        assert!(
            forgotten
                .as_deref()
                .is_some_and(|error| error.contains(".stream(\"orders:billing:returned\")")),
            "{forgotten:?}"
        );
        // A return stream of another group is a stream like any other: its
        // own return stream is missing.
        assert!(
            from_source(&["orders", "orders:shipping:returned"], Some("billing"))
                .check()
                .is_err()
        );
        // A return stream set by hand that the source reads.
        let custom = from_source(&["orders", "orders:back"], Some("billing"))
            .return_stream("orders", "orders:back");
        assert_eq!(custom.consumed, ["orders"]);
        assert!(custom.check().is_ok(), "{:?}", custom.check());

        let broadcast = from_source(&["orders"], None).check().err();
        assert!(
            broadcast.is_some_and(|error| error.to_string().contains("group")),
            "a broadcast reader has no group to park for"
        );
        assert_eq!(
            both.server.command_timeout(),
            Duration::from_secs(3),
            "connects as the source does, and bounds each park and round by its command timeout"
        );
    }

    #[test]
    fn the_builder_shows_no_password() {
        let builder = RedisParking::builder("redis://app:s3cr3t@cache:6379");
        let shown = format!("{builder:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("cache:6379"), "{shown}");
    }
}
