//! [`RedisDeadLetterSinkBuilder`]: a sink on a connection of its own, or
//! prefilled from a source and sharing its connection.

use std::fmt;
use std::sync::Arc;

use intake_core::ConfigError;

use super::RedisDeadLetterSink;
use crate::connection::SharedConnection;
use crate::counters::RedisCounters;
use crate::error::Error;
use crate::settings::RedisSettings;
use crate::source::settings::{
    DEFAULT_PAYLOAD_FIELD, DeadLetterStream, Settings, default_consumer_name,
};

/// Builds a [`RedisDeadLetterSink`]; see [`RedisDeadLetterSink::builder`]
/// and [`RedisStreamsSource::dead_letter_sink`].
///
/// A builder from a source starts with the source's group, consumer name,
/// payload field, dead-letter stream and streams, and shares the source's
/// connection for acknowledgements (and its counters). A builder of
/// [`RedisDeadLetterSink::builder`] opens a connection of its own with the
/// [`RedisSettings`] it was given.
///
/// [`RedisStreamsSource::dead_letter_sink`]: crate::RedisStreamsSource::dead_letter_sink
#[derive(Clone)]
#[must_use = "a builder does nothing until `.build().await`"]
pub struct RedisDeadLetterSinkBuilder {
    server: Server,
    consumed: Vec<String>,
    /// Return streams set by hand: (origin, return stream).
    returns: Vec<(String, String)>,
    deletes_acked: bool,
    group: Option<String>,
    consumer: Option<String>,
    payload_field: String,
    dead_letter_stream: DeadLetterStream,
}

/// Where a sink writes: a connection of its own, or its source's.
#[derive(Clone)]
enum Server {
    Settings(RedisSettings),
    /// The source's connection and counters.
    Source(Box<SharedConnection>, Arc<RedisCounters>),
}

impl fmt::Debug for RedisDeadLetterSinkBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("RedisDeadLetterSinkBuilder");
        match &self.server {
            Server::Settings(settings) => debug.field("connection", settings),
            Server::Source(shared, _) => {
                debug.field("source_endpoint", shared.connector().endpoint())
            }
        };
        debug
            .field("consumed", &self.consumed)
            .field("return_streams", &self.returns)
            .field("deletes_acked", &self.deletes_acked)
            .field("group", &self.group)
            .field("consumer", &self.consumer)
            .field("payload_field", &self.payload_field)
            .field("dead_letter_stream", &self.dead_letter_stream)
            .finish_non_exhaustive()
    }
}

impl RedisDeadLetterSinkBuilder {
    pub(super) fn new(settings: RedisSettings) -> Self {
        Self {
            server: Server::Settings(settings),
            consumed: Vec::new(),
            returns: Vec::new(),
            deletes_acked: false,
            group: None,
            consumer: None,
            payload_field: DEFAULT_PAYLOAD_FIELD.to_owned(),
            dead_letter_stream: DeadLetterStream::default(),
        }
    }

    /// A builder prefilled from a source: its checked settings, and its
    /// connection and counters.
    pub(crate) fn from_source(connection: SharedConnection, settings: &Settings) -> Self {
        Self {
            server: Server::Source(Box::new(connection), settings.counters.clone()),
            consumed: settings.streams.iter().map(|s| s.to_string()).collect(),
            returns: Vec::new(),
            deletes_acked: settings.delete_acked,
            group: settings.group.as_deref().map(str::to_owned),
            consumer: Some(settings.consumer.to_string()),
            payload_field: settings.payload_field.to_string(),
            dead_letter_stream: settings.dead_letter_stream.clone(),
        }
    }

    /// Where dead letters go (default: the source stream's name plus
    /// `:dlq`). A destination that is one of the
    /// [consumed streams](Self::consumed_stream) is refused by
    /// [`build`](Self::build); a letter the destination would send back
    /// into the stream it came from is refused when written.
    pub fn dead_letter_stream(mut self, stream: DeadLetterStream) -> Self {
        self.dead_letter_stream = stream;
        self
    }

    /// Names a stream whose entries this sink dead-letters (a builder from
    /// a source names the source's streams). Call it once per stream.
    pub fn consumed_stream(mut self, stream: impl Into<String>) -> Self {
        self.consumed.push(stream.into());
        self
    }

    /// Sets where the parked messages of consumed stream `stream` come back
    /// for the sink's group, when the parking was given another name than
    /// the default [`RedisParking::return_stream`](crate::RedisParking::return_stream)
    /// (its [`return_stream`](crate::RedisParkingBuilder::return_stream)):
    /// only an entry read from there has its park fields followed to
    /// `stream`.
    pub fn return_stream(
        mut self,
        stream: impl Into<String>,
        return_stream: impl Into<String>,
    ) -> Self {
        let (stream, return_stream) = (stream.into(), return_stream.into());
        self.returns.retain(|(origin, _)| *origin != stream);
        self.returns.push((stream, return_stream));
        self
    }

    /// Whether the consumer deletes the entries of the consumed streams once
    /// acknowledged (the source's
    /// [`delete_acked`](crate::RedisStreamsSourceBuilder::delete_acked); a
    /// builder from a source has it). A reference letter of such an entry,
    /// which would leave the payload at an origin that deletes it, is then
    /// refused ([`Error::ReferenceNotWritten`]): the entry stays pending.
    pub fn deletes_acked(mut self, deletes: bool) -> Self {
        self.deletes_acked = deletes;
        self
    }

    /// The consumer group whose pending entry each letter acknowledges, in
    /// the same atomic step as the write. Without one, nothing is
    /// acknowledged (a broadcast reader's letters).
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// The consumer name the letters record as their origin's (default
    /// `<hostname>-<pid>-<n>`).
    pub fn consumer(mut self, consumer: impl Into<String>) -> Self {
        self.consumer = Some(consumer.into());
        self
    }

    /// The field that carries each letter's payload (default `payload`).
    pub fn payload_field(mut self, field: impl Into<String>) -> Self {
        self.payload_field = field.into();
        self
    }

    /// Checks the settings, then connects (unless the sink shares its
    /// source's connection).
    ///
    /// Fails with [`Error::Config`] for an empty name or a dead-letter
    /// stream that is one of the consumed streams, before connecting, and
    /// with a typed error for a bad URL, an unreachable server or refused
    /// credentials.
    pub async fn build(self) -> Result<RedisDeadLetterSink, Error> {
        if matches!(&self.group, Some(group) if group.is_empty()) {
            return Err(ConfigError::new("group", "is empty").into());
        }
        if matches!(&self.consumer, Some(consumer) if consumer.is_empty()) {
            return Err(ConfigError::new("consumer", "is empty").into());
        }
        if self.payload_field.is_empty() {
            return Err(ConfigError::new("payload_field", "is empty").into());
        }
        self.dead_letter_stream.check(&self.consumed)?;
        let (connection, counters) = match self.server {
            Server::Source(connection, counters) => (*connection, counters),
            Server::Settings(settings) => {
                let connector = settings.connector()?;
                let connection = SharedConnection::new(connector.shared().await?, connector);
                (connection, Arc::default())
            }
        };
        let consumer = self.consumer.unwrap_or_else(default_consumer_name);
        Ok(RedisDeadLetterSink::on(
            connection,
            self.group.map(Arc::from),
            consumer.into(),
            self.payload_field.into(),
            self.dead_letter_stream,
            self.consumed.into_iter().collect(),
            self.returns,
            self.deletes_acked,
            counters,
        ))
    }
}
