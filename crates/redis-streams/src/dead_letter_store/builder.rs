//! [`RedisDeadLettersBuilder`]: the dead-letter stream to read, its scope
//! and its payload field.

use std::fmt;
use std::sync::Arc;

use intake_core::ConfigError;

use super::RedisDeadLetters;
use crate::connection::SharedConnection;
use crate::error::Error;
use crate::settings::RedisSettings;
use crate::source::settings::{DEFAULT_PAYLOAD_FIELD, DeadLetterStream};

/// Builds [`RedisDeadLetters`]; see [`RedisDeadLetters::builder`].
#[derive(Clone)]
#[must_use = "a builder does nothing until `.build().await`"]
pub struct RedisDeadLettersBuilder {
    connection: RedisSettings,
    stream: Option<String>,
    payload_field: String,
    group: Option<String>,
    returns: Vec<(String, String)>,
}

impl fmt::Debug for RedisDeadLettersBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisDeadLettersBuilder")
            .field("connection", &self.connection)
            .field("stream", &self.stream)
            .field("payload_field", &self.payload_field)
            .field("group", &self.group)
            .field("return_streams", &self.returns)
            .finish_non_exhaustive()
    }
}

impl RedisDeadLettersBuilder {
    pub(super) fn new(settings: RedisSettings) -> Self {
        Self {
            connection: settings,
            stream: None,
            payload_field: DEFAULT_PAYLOAD_FIELD.to_owned(),
            group: None,
            returns: Vec::new(),
        }
    }

    /// The dead-letter stream to read, by its own name.
    pub fn stream(mut self, stream: impl Into<String>) -> Self {
        self.stream = Some(stream.into());
        self
    }

    /// The dead-letter stream of source stream `stream` under the default
    /// [`DeadLetterStream`] (`<stream>:dlq`).
    pub fn dead_letters_of(self, stream: &str) -> Self {
        self.dead_letters_of_with(stream, &DeadLetterStream::default())
    }

    /// The dead-letter stream of source stream `stream` under `naming`
    /// (what the sink was given).
    pub fn dead_letters_of_with(self, stream: &str, naming: &DeadLetterStream) -> Self {
        self.stream(naming.name_for(stream))
    }

    /// Scopes the log to the letters of consumer group `group` (their
    /// `intake.origin.group`): it counts, lists, reads, replays and purges
    /// those alone, and a replay to the group goes to the group's return
    /// stream (see [`RedisDeadLetters`]). Letters written without a group
    /// (a broadcast reader's) belong to no group's scope.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Sets the group's return stream of origin `stream`, when its parking
    /// was given another name than the default
    /// [`RedisParking::return_stream`](crate::RedisParking::return_stream).
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

    /// The field that carries each letter's payload (default `payload`, the
    /// sink's).
    pub fn payload_field(mut self, field: impl Into<String>) -> Self {
        self.payload_field = field.into();
        self
    }

    /// Checks the settings, then connects.
    ///
    /// Fails with [`Error::Config`] for no stream or an empty name, before
    /// connecting, and with a typed error for a bad URL, an unreachable
    /// server or refused credentials.
    pub async fn build(self) -> Result<RedisDeadLetters, Error> {
        let stream = match self.stream {
            Some(stream) if !stream.is_empty() => stream,
            Some(_) => return Err(ConfigError::new("stream", "is empty").into()),
            None => {
                return Err(ConfigError::new(
                    "stream",
                    "is not set; name the dead-letter stream (`stream`) or its source \
                     (`dead_letters_of`)",
                )
                .into());
            }
        };
        if self.payload_field.is_empty() {
            return Err(ConfigError::new("payload_field", "is empty").into());
        }
        if self.group.as_deref() == Some("") {
            return Err(ConfigError::new("group", "is empty").into());
        }
        let connector = self.connection.connector()?;
        let connection = SharedConnection::new(connector.shared().await?, connector);
        Ok(RedisDeadLetters {
            connection,
            stream: stream.into(),
            payload_field: self.payload_field.into(),
            group: self.group.map(Arc::from),
            returns: self.returns.into(),
        })
    }
}
