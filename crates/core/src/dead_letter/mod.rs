//! Where poison messages go: the [`DeadLetterSink`] trait and the record
//! written to it.
//!
//! A dead letter carries the original message (payload, key, headers) and its
//! origin (source, partition, position), the last error, the attempt count
//! and the time of failure. The original is acknowledged only after the sink
//! confirmed the write; a sink that fails leaves the original unacknowledged.
//!
//! # The layer
//!
//! [`DeadLetterLayer`] applies a [`FailurePolicy`] to a handler's final
//! failures: a [permanent](crate::error::ErrorClass::Permanent) failure, or a
//! retryable one that comes out of the retry layer (its retries are used
//! up, so put the retry layer inside this one). The policy is one of
//!
//! - [dead-letter](FailurePolicy::dead_letter): write a [`DeadLetter`] to a
//!   [`DeadLetterSink`], then acknowledge. A write that keeps failing leaves
//!   the message unacknowledged with a retryable error: it is delivered
//!   again, never lost.
//! - [discard](FailurePolicy::discard): log and acknowledge.
//! - [block](FailurePolicy::block): never skip the message; call the handler
//!   again after each backoff delay until it succeeds.
//!
//! A message that ends dead-lettered or discarded comes out as a
//! [`HandlerError`](crate::error::HandlerError) of class
//! [`Ignore`](crate::error::ErrorClass::Ignore) (so the runtime acknowledges
//! it) whose cause, [`DeadLettered`] or [`Discarded`], keeps the original
//! failure for metrics and traces. `Ignore` and `Interrupted` outcomes pass
//! through untouched.
//!
//! ```
//! use std::time::Duration;
//! use intake_core::dead_letter::{DeadLetter, DeadLetterError, DeadLetterLayer, DeadLetterSink};
//! use intake_core::retry::RetryLayer;
//! use intake_core::{Exponential, HandlerError, Message};
//! use tower::{ServiceBuilder, service_fn};
//!
//! /// Each backend provides a sink; this one only logs.
//! struct LogSink;
//!
//! #[async_trait::async_trait]
//! impl DeadLetterSink for LogSink {
//!     async fn write(&self, letter: &DeadLetter) -> Result<(), DeadLetterError> {
//!         tracing::error!(error = %letter.error, attempts = letter.attempts, "dead letter");
//!         Ok(())
//!     }
//! }
//!
//! let handler = ServiceBuilder::new()
//!     .layer(DeadLetterLayer::new(LogSink))
//!     .layer(RetryLayer::new(Exponential::default()))
//!     .service(service_fn(|message: Message| async move {
//!         serde_json::from_slice::<serde_json::Value>(message.payload())
//!             .map_err(HandlerError::permanent)?;
//!         Ok::<(), HandlerError>(())
//!     }));
//! # let _ = handler;
//! ```

mod error;
mod future;
mod layer;
mod policy;
mod service;

use std::time::SystemTime;

pub use self::error::{DeadLetterWriteFailed, DeadLettered, Discarded};
pub use self::future::ResponseFuture;
pub use self::layer::DeadLetterLayer;
pub use self::policy::FailurePolicy;
pub use self::service::DeadLetterService;
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

#[cfg(test)]
mod tests;
