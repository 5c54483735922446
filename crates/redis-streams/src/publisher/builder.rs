//! [`RedisStreamsPublisherBuilder`]: the publisher's settings, checked
//! before it connects.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use intake_core::ConfigError;
use tokio::sync::{Notify, Semaphore, mpsc, watch};

use super::writer::{EntryFormat, Writer};
use super::{RedisStreamsPublisher, Shared};
use crate::connection::SharedConnection;
use crate::error::Error;
use crate::settings::RedisSettings;
use crate::source::settings::DEFAULT_PAYLOAD_FIELD;

/// Builds a [`RedisStreamsPublisher`]; see
/// [`RedisStreamsPublisher::builder`].
#[derive(Clone)]
#[must_use = "a builder does nothing until `.build().await`"]
pub struct RedisStreamsPublisherBuilder {
    connection: RedisSettings,
    payload_field: String,
    key_field: String,
    max_len: Option<u64>,
    max_pending: usize,
    max_pipeline: usize,
    send_timeout: Duration,
    queue_timeout: Duration,
}

impl fmt::Debug for RedisStreamsPublisherBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStreamsPublisherBuilder")
            .field("connection", &self.connection)
            .field("payload_field", &self.payload_field)
            .field("key_field", &self.key_field)
            .field("max_len", &self.max_len)
            .field("max_pending", &self.max_pending)
            .field("max_pipeline", &self.max_pipeline)
            .field("send_timeout", &self.send_timeout)
            .field("queue_timeout", &self.queue_timeout)
            .finish()
    }
}

impl RedisStreamsPublisherBuilder {
    /// Default of [`payload_field`](Self::payload_field), the source's too.
    pub const DEFAULT_PAYLOAD_FIELD: &'static str = DEFAULT_PAYLOAD_FIELD;
    /// Default of [`key_field`](Self::key_field).
    pub const DEFAULT_KEY_FIELD: &'static str = "key";
    /// Default of [`max_pending`](Self::max_pending).
    pub const DEFAULT_MAX_PENDING: usize = 10_000;
    /// Default of [`max_pipeline`](Self::max_pipeline).
    pub const DEFAULT_MAX_PIPELINE: usize = 1_000;
    /// Default of [`send_timeout`](Self::send_timeout).
    pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(10);
    /// Default of [`queue_timeout`](Self::queue_timeout).
    pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(25);

    pub(super) fn new(connection: RedisSettings) -> Self {
        Self {
            connection,
            payload_field: Self::DEFAULT_PAYLOAD_FIELD.to_owned(),
            key_field: Self::DEFAULT_KEY_FIELD.to_owned(),
            max_len: None,
            max_pending: Self::DEFAULT_MAX_PENDING,
            max_pipeline: Self::DEFAULT_MAX_PIPELINE,
            send_timeout: Self::DEFAULT_SEND_TIMEOUT,
            queue_timeout: Self::DEFAULT_QUEUE_TIMEOUT,
        }
    }

    /// The field that carries each entry's payload (default `payload`, as
    /// the source reads it).
    pub fn payload_field(mut self, field: impl Into<String>) -> Self {
        self.payload_field = field.into();
        self
    }

    /// The field that carries an output's key (default `key`); a source
    /// reads it back as the key when built with the same
    /// [`key_field`](crate::RedisStreamsSourceBuilder::key_field).
    pub fn key_field(mut self, field: impl Into<String>) -> Self {
        self.key_field = field.into();
        self
    }

    /// Trims each stream written to about `max_len` entries (`XADD … MAXLEN
    /// ~ max_len`; Redis trims whole nodes, so a stream may keep somewhat
    /// more). Default: no trimming. Entries trimmed before a consumer group
    /// read them are never delivered.
    pub fn max_len(mut self, max_len: u64) -> Self {
        self.max_len = Some(max_len);
        self
    }

    /// The buffer's bound: most outputs sent and not yet answered, queued
    /// or in a pipeline (default 10,000). A send waits for room, at most
    /// [`send_timeout`](Self::send_timeout).
    pub fn max_pending(mut self, max_pending: usize) -> Self {
        self.max_pending = max_pending;
        self
    }

    /// Most outputs in one pipeline (default 1,000); a pipeline also stops
    /// at 4 MiB of payloads, keys and headers.
    pub fn max_pipeline(mut self, max_pipeline: usize) -> Self {
        self.max_pipeline = max_pipeline;
        self
    }

    /// How long a send waits for room in a full buffer before it fails with
    /// [`Unavailable`](intake_core::publish::PublishErrorKind::Unavailable)
    /// (default 10 s).
    pub fn send_timeout(mut self, timeout: Duration) -> Self {
        self.send_timeout = timeout;
        self
    }

    /// How long an output may wait in the queue, from its send (default
    /// 25 s): one the writer takes later fails with
    /// [`Unavailable`](intake_core::publish::PublishErrorKind::Unavailable)
    /// without being sent (certainly not added). With the settings'
    /// [`command_timeout`](RedisSettings::command_timeout), which bounds the
    /// reply to one pipeline, reconnecting included, it bounds every receipt:
    /// answered at most `queue_timeout + command_timeout` (30 s by default)
    /// after the send.
    pub fn queue_timeout(mut self, timeout: Duration) -> Self {
        self.queue_timeout = timeout;
        self
    }

    fn check(&self) -> Result<(), ConfigError> {
        if self.payload_field.is_empty() {
            return Err(ConfigError::new("payload_field", "is empty"));
        }
        if self.key_field.is_empty() {
            return Err(ConfigError::new("key_field", "is empty"));
        }
        if self.key_field == self.payload_field {
            return Err(ConfigError::new(
                "key_field",
                "is the payload field; a source would read the key as the payload",
            ));
        }
        if self.max_len == Some(0) {
            return Err(ConfigError::new(
                "max_len",
                "is 0, which would trim every entry away",
            ));
        }
        if self.max_pending == 0 || self.max_pending > Semaphore::MAX_PERMITS {
            return Err(ConfigError::new(
                "max_pending",
                format!("must be 1 to {}", Semaphore::MAX_PERMITS),
            ));
        }
        if self.max_pipeline == 0 {
            return Err(ConfigError::new("max_pipeline", "is 0"));
        }
        for (name, timeout) in [
            ("send_timeout", self.send_timeout),
            ("queue_timeout", self.queue_timeout),
            ("command_timeout", self.connection.command_timeout),
            ("connect_timeout", self.connection.connect_timeout),
        ] {
            if timeout.is_zero() {
                return Err(ConfigError::new(name, "is zero"));
            }
        }
        Ok(())
    }

    /// Checks the settings, connects, and starts the writer task (on the
    /// current Tokio runtime).
    ///
    /// Fails with [`Error::Config`] for a setting that cannot work, before
    /// connecting, and with a typed error for a bad URL, an unreachable
    /// server or refused credentials (none of them shows the password).
    pub async fn build(self) -> Result<RedisStreamsPublisher, Error> {
        self.check()?;
        let connector = self.connection.connector()?;
        let connection = SharedConnection::new(connector.shared().await?, connector.clone());
        let (queue, queued) = mpsc::unbounded_channel();
        let (stopped, stopped_receiver) = watch::channel(false);
        let closing = Arc::new(Notify::new());
        let room = Arc::new(Semaphore::new(self.max_pending));
        let writer = Writer {
            queue: queued,
            connection,
            format: EntryFormat {
                payload_field: self.payload_field.into(),
                key_field: self.key_field.into(),
                max_len: self.max_len,
            },
            max_pipeline: self.max_pipeline,
            queue_timeout: self.queue_timeout,
            command_timeout: self.connection.command_timeout,
            room: Arc::clone(&room),
            closing: Arc::clone(&closing),
            stopped,
        };
        tokio::spawn(writer.run());
        tracing::debug!(
            endpoint = %connector.endpoint(),
            max_pending = self.max_pending,
            "Redis publisher connected"
        );
        Ok(RedisStreamsPublisher {
            shared: Arc::new(Shared {
                queue,
                room,
                max_pending: self.max_pending,
                send_timeout: self.send_timeout,
                closing,
                stopped: stopped_receiver,
                endpoint: connector.endpoint().clone(),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_that_cannot_work_are_refused_before_connecting() {
        let builder = || RedisStreamsPublisher::builder("redis://127.0.0.1");
        let refused = [
            (builder().payload_field(""), "payload_field"),
            (builder().key_field(""), "key_field"),
            (builder().key_field("payload"), "key_field"),
            (builder().max_len(0), "max_len"),
            (builder().max_pending(0), "max_pending"),
            (builder().max_pipeline(0), "max_pipeline"),
            (builder().send_timeout(Duration::ZERO), "send_timeout"),
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
        assert!(builder().max_len(1).check().is_ok());
    }

    #[test]
    fn the_builder_shows_no_password() {
        let builder = RedisStreamsPublisher::builder("redis://app:s3cr3t@cache:6379");
        let shown = format!("{builder:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("cache:6379"), "{shown}");
    }
}
