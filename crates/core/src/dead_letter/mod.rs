//! Where poison messages go: the [`DeadLetterSink`] trait and the record
//! written to it.
//!
//! A dead letter carries the original message (payload, key, headers) and its
//! origin (source, partition, position), the last error, the attempt count
//! and the time of failure. The original is acknowledged only after the sink
//! confirmed the write; a sink that fails leaves the original unacknowledged.

use std::time::SystemTime;

use crate::error::BoxError;
use crate::message::Message;

/// A message that failed for good, with why and when.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    /// The original message, with its metadata (the origin).
    pub message: Message,
    /// The last error, as text.
    pub error: String,
    /// Attempts made before giving up.
    pub attempts: u32,
    /// When the message was given up.
    pub failed_at: SystemTime,
}

impl DeadLetter {
    /// A dead letter for `message` that failed with `error` after `attempts`.
    pub fn new(message: Message, error: impl Into<String>, attempts: u32) -> Self {
        Self {
            message,
            error: error.into(),
            attempts,
            failed_at: SystemTime::now(),
        }
    }
}

/// A failed dead-letter write. The original message stays unacknowledged.
#[derive(Debug, thiserror::Error)]
#[error("the dead-letter write failed: {0}")]
pub struct DeadLetterError(#[source] pub BoxError);

/// A durable place for dead letters (a topic, a stream, an exchange).
#[async_trait::async_trait]
pub trait DeadLetterSink: Send + Sync + 'static {
    /// Writes `letter` and resolves once the broker confirmed it durably.
    async fn write(&self, letter: &DeadLetter) -> Result<(), DeadLetterError>;
}

#[async_trait::async_trait]
impl<S: DeadLetterSink + ?Sized> DeadLetterSink for std::sync::Arc<S> {
    async fn write(&self, letter: &DeadLetter) -> Result<(), DeadLetterError> {
        (**self).write(letter).await
    }
}
