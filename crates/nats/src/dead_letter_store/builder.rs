//! [`NatsDeadLettersBuilder`]: which dead-letter stream and subject to
//! read, checked before it connects, on a connection of its own.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use intake_core::{BackoffPolicy, ConfigError, Exponential};

use super::NatsDeadLetters;
use crate::connection;
use crate::dead_letter::{default_stream, default_subject};
use crate::error::Error;
use crate::settings::NatsSettings;

/// The default of [`NatsDeadLettersBuilder::request_timeout`].
const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Builds [`NatsDeadLetters`]; see [`NatsDeadLetters::builder`]. How it
/// connects is its [`NatsSettings`], as a source's.
#[must_use = "a builder does nothing until `.build().await`"]
pub struct NatsDeadLettersBuilder {
    settings: NatsSettings,
    request_timeout: Duration,
    stream: Option<String>,
    subject: Option<String>,
}

impl fmt::Debug for NatsDeadLettersBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsDeadLettersBuilder")
            .field("settings", &self.settings)
            .field("stream", &self.stream)
            .field("subject", &self.subject)
            .finish_non_exhaustive()
    }
}

impl NatsDeadLettersBuilder {
    pub(super) fn new(settings: NatsSettings) -> Self {
        Self {
            settings,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            stream: None,
            subject: None,
        }
    }

    /// The dead letters the default sink of `consumer` on `stream` writes:
    /// subject `<stream>.<consumer>.dlq` on stream `<stream>_dlq`.
    pub fn dead_letters_of(self, stream: &str, consumer: &str) -> Self {
        self.stream(default_stream(stream))
            .subject(default_subject(stream, consumer))
    }

    /// The dead-letter stream to read, by its own name (every subject,
    /// unless [`subject`](Self::subject) names one).
    pub fn stream(mut self, stream: impl Into<String>) -> Self {
        self.stream = Some(stream.into());
        self
    }

    /// Reads only the letters on `subject` (`*` and `>` allowed).
    pub fn subject(mut self, subject: impl Into<String>) -> Self {
        self.subject = Some(subject.into());
        self
    }

    /// Reads every subject of the stream.
    pub fn every_subject(mut self) -> Self {
        self.subject = None;
        self
    }

    /// How long each request may take (default 5 s): every store operation
    /// is a sequence of requests, each bounded by it.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Checks the settings, then connects.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for no stream, an empty name or subject, or a zero
    /// timeout, before connecting; [`Error::InvalidUrl`],
    /// [`Error::Unreachable`], [`Error::Unauthorized`], [`Error::Tls`],
    /// [`Error::Credentials`] when connecting fails. A stream that does not
    /// exist yet is no error: it holds no letters.
    pub async fn build(self) -> Result<NatsDeadLetters, Error> {
        let stream = match self.stream {
            Some(stream) if !stream.is_empty() => stream,
            Some(_) => return Err(ConfigError::new("stream", "is empty").into()),
            None => {
                return Err(ConfigError::new(
                    "stream",
                    "is not set; name the dead-letter stream (`stream`) or its source and \
                     consumer (`dead_letters_of`)",
                )
                .into());
            }
        };
        if self.subject.as_deref() == Some("") {
            return Err(ConfigError::new("subject", "is empty").into());
        }
        if self.request_timeout.is_zero() {
            return Err(ConfigError::new("request_timeout", "more than zero").into());
        }
        let settings = self
            .settings
            .connect_settings(self.request_timeout, store_reconnect_backoff)?;
        let connection = connection::connect(&settings).await?;
        let context = jetstream::ContextBuilder::new()
            .timeout(self.request_timeout)
            .build(connection.client);
        Ok(NatsDeadLetters {
            context,
            endpoint: connection.endpoint,
            stream: stream.into(),
            subject: self.subject.map(Into::into),
            timeout: self.request_timeout,
        })
    }
}

/// A store's reconnect backoff when its settings set none: 100 ms doubling
/// to 5 s, forever.
fn store_reconnect_backoff() -> Arc<dyn BackoffPolicy> {
    Arc::new(Exponential::new(Duration::from_millis(100), Duration::from_secs(5)).retry_forever())
}
