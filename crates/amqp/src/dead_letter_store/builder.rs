//! [`AmqpDeadLetterStoreBuilder`]: a dead-letter store's settings,
//! checked before it is used.

use std::fmt;
use std::time::Duration;

use intake_core::ConfigError;

use crate::connection::DEFAULT_CONNECT_TIMEOUT;
use crate::error::Error;
use crate::publisher::AmqpPublisher;
use crate::settings::AmqpSettings;

use super::AmqpDeadLetterStore;
use super::pass::close;

/// Builds an [`AmqpDeadLetterStore`]; see [`AmqpDeadLetterStore::builder`].
#[must_use = "a builder does nothing until `.build(publisher).await`"]
pub struct AmqpDeadLetterStoreBuilder {
    settings: AmqpSettings,
    queue: Option<String>,
    command_timeout: Duration,
    max_letters: usize,
    partial_answers: bool,
}

impl fmt::Debug for AmqpDeadLetterStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpDeadLetterStoreBuilder")
            .field("settings", &self.settings)
            .field("queue", &self.queue)
            .field("max_letters", &self.max_letters)
            .field("partial_answers", &self.partial_answers)
            .finish_non_exhaustive()
    }
}

impl AmqpDeadLetterStoreBuilder {
    /// The queue the dead letters wait in (the one bound to the sink's
    /// exchange and routing key).
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// How long to wait for each broker reply, and for the connection
    /// unless the settings give a
    /// [`connect_timeout`](AmqpSettings::connect_timeout) (default 10 s).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// The most letters one pass holds unacknowledged (default 10,000):
    /// the letters it looked at and leaves in the queue. It bounds what the
    /// broker holds for the pass; a pass that reaches it stops, and an
    /// operation that needed every letter fails with
    /// [`Error::PassLimit`](crate::Error::PassLimit) (see the
    /// [type docs](AmqpDeadLetterStore)).
    pub fn max_letters(mut self, max: usize) -> Self {
        self.max_letters = max;
        self
    }

    /// Operations that need every letter answer for the letters one pass
    /// looked at when it stops at
    /// [`max_letters`](Self::max_letters), instead of failing with
    /// [`Error::PassLimit`](crate::Error::PassLimit): a count or summary
    /// counts those, a listing ends after them, a read or an id not among
    /// them is not found, a purge or replay acts on them. Silent about the
    /// rest: for a caller that says itself that letters remain (an
    /// unfiltered [`count`](intake_core::dead_letter::store::DeadLetterStore::count) is exact: the queue's
    /// ready messages).
    pub fn partial_answers(mut self) -> Self {
        self.partial_answers = true;
        self
    }

    /// Checks the settings and that the queue exists, and returns the
    /// store, replaying through `publisher`.
    ///
    /// # Errors
    ///
    /// [`Error`] for a bad URL or setting, an unreachable broker, refused
    /// credentials or a queue that does not exist.
    pub async fn build(self, publisher: AmqpPublisher) -> Result<AmqpDeadLetterStore, Error> {
        let checked = self.settings.check()?;
        let queue = match self.queue {
            Some(queue) if !queue.is_empty() => queue,
            _ => {
                return Err(
                    ConfigError::new("queue", "is not set; name the dead-letter queue").into(),
                );
            }
        };
        if self.max_letters == 0 {
            return Err(
                ConfigError::new("max_letters", "is zero; a pass must take something").into(),
            );
        }
        if self.command_timeout.is_zero() {
            return Err(
                ConfigError::new("command_timeout", "is zero; give the broker time").into(),
            );
        }
        let store = AmqpDeadLetterStore {
            connect_timeout: checked.connect_timeout_or(self.command_timeout),
            connection_name: checked
                .connection_name
                .unwrap_or_else(|| "intake dead-letter store".to_owned()),
            url: checked.url,
            tls: checked.tls,
            queue,
            publisher,
            command_timeout: self.command_timeout,
            max_letters: self.max_letters,
            partial_answers: self.partial_answers,
        };
        let (connection, channel) = store.open().await?;
        let declared = store.ready(&channel).await;
        close(connection, channel).await;
        declared.map(|_| store)
    }
}

impl AmqpDeadLetterStore {
    /// A builder of the store of the dead letters in a queue of the broker
    /// `settings` describe (a URL alone converts into [`AmqpSettings`]).
    /// Its connections are named after the settings' connection name, or
    /// `intake dead-letter store` without one.
    pub fn builder(settings: impl Into<AmqpSettings>) -> AmqpDeadLetterStoreBuilder {
        AmqpDeadLetterStoreBuilder {
            settings: settings.into(),
            queue: None,
            command_timeout: DEFAULT_CONNECT_TIMEOUT,
            max_letters: 10_000,
            partial_answers: false,
        }
    }
}
