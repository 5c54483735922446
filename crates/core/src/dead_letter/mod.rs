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
//!   [`DeadLetterSink`], then acknowledge. A write that keeps failing (a
//!   capped number of attempts, or one the destination
//!   [rejects](DeadLetterError::rejected)) is followed by a letter that
//!   carries only a [`PayloadReference`] (origin and sizes, no payload), and
//!   if that fails too, the policy's [fallback](FailurePolicy::or_else)
//!   decides: by default the message is left unacknowledged with a
//!   retryable error, delivered again, never lost.
//! - [discard](FailurePolicy::discard): log and acknowledge.
//! - [block](FailurePolicy::block): never skip the message; call the handler
//!   again after each backoff delay until it succeeds.
//!
//! A message that ends dead-lettered or discarded comes out as a
//! [`HandlerError`](crate::error::HandlerError) settled with its
//! [`Outcome`](crate::Outcome) (`DeadLettered` or `Discarded`, of class
//! [`Ignore`](crate::error::ErrorClass::Ignore), so the runtime acknowledges
//! it and counts it by the outcome), whose cause, [`DeadLettered`] or
//! [`Discarded`], keeps the original failure for metrics and traces. An
//! error a layer inside already settled (parked, say), an `Ignore` and an
//! `Interrupted` pass through untouched.
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

pub mod envelope;
mod error;
mod future;
mod layer;
mod policy;
mod reference;
pub mod replay;
mod service;
pub mod store;

use std::time::SystemTime;

use bytes::Bytes;

pub use self::envelope::{Broker, EnvelopeError, Origin};
pub use self::error::{DeadLetterWriteFailed, DeadLettered, Discarded};
pub use self::future::ResponseFuture;
pub use self::layer::DeadLetterLayer;
pub use self::policy::FailurePolicy;
pub use self::reference::PayloadReference;
pub use self::replay::{ReplayCounters, ReplayLayer, ReplayRefused};
pub use self::service::DeadLetterService;
pub use self::store::{
    DeadLetterLog, DeadLetterStore, Filter, LetterId, LogStore, Replay, ReplayReport, Selection,
    StoreError, StoredLetter, Summary,
};
use crate::error::{BoxError, ErrorClass};
use crate::message::{Headers, Message};

/// The loop guard's default, for the store's [`Replay`] and the
/// [`ReplayLayer`] alike: a letter whose message was replayed 3 times
/// already is not replayed again, so a message that fails on every replay
/// goes round at most that often.
pub const DEFAULT_MAX_REPLAYS: u32 = 3;

/// A message that failed for good, with why, how often and when.
///
/// Sinks write it as the [`envelope`] (the same field names on
/// every backend, see `docs/DEAD-LETTERS.md`), and [`DeadLetter::read`]
/// reads what any sink wrote back into this type.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The original message, with its metadata (the origin). In a letter
    /// that carries a [`reference`](Self::reference), a message with the
    /// same metadata, no payload, no key, and no headers but those that name
    /// a parked copy's first delivery ([`ORIGIN`](crate::parking::ORIGIN)
    /// and its partition and position).
    pub message: Message,
    /// The last error, as text, at most [`ERROR_LIMIT`](Self::ERROR_LIMIT)
    /// bytes (with a note of how much was cut).
    pub error: String,
    /// The class of the last failure: [`Permanent`](ErrorClass::Permanent),
    /// or [`Retryable`](ErrorClass::Retryable) with its retries used up.
    pub class: ErrorClass,
    /// Attempts made before giving up.
    pub attempts: u32,
    /// When the message first failed for good: the time the message itself
    /// carries in `intake.failed.first` (a message replayed from a
    /// dead-letter destination), otherwise [`failed_at`](Self::failed_at).
    pub first_failed_at: SystemTime,
    /// When the message was given up this time.
    pub failed_at: SystemTime,
    /// How often the message was replayed from a dead-letter destination:
    /// what it carries in `intake.replays`, otherwise 0.
    pub replays: u32,
    /// Set when this letter stands in for one that could not be written:
    /// the original's sizes. A sink writes one only where the original outlives
    /// its acknowledgement (a Kafka topic, a Redis stream that keeps acknowledged
    /// entries, a NATS stream under limits retention); where the
    /// acknowledgement deletes it (RabbitMQ, NATS work-queue streams) the sink
    /// refuses, and the message stays unacknowledged at its origin.
    pub reference: Option<PayloadReference>,
    /// The broker, group and consumer the message was consumed by. `None`
    /// in a letter the dead-letter layer makes: its sink fills them in as
    /// it writes. Set in a letter [read back](Self::read).
    pub origin: Option<Origin>,
    /// How many of the message's headers the destination holds no copy of
    /// (a reduced letter: the destination could not take them); they are
    /// still at the origin.
    pub headers_omitted: u32,
}

impl DeadLetter {
    /// The most bytes of error text a letter carries, the note of how much
    /// was cut included. An error can quote what it failed on (serde quotes
    /// a wrongly typed value whole), and a letter must fit its destination.
    pub const ERROR_LIMIT: usize = 4096;

    /// A dead letter for `message` that failed permanently with `error`
    /// after `attempts`, now; the error text is cut at
    /// [`ERROR_LIMIT`](Self::ERROR_LIMIT) bytes.
    pub fn new(message: Message, error: impl Into<String>, attempts: u32) -> Self {
        let failed_at = SystemTime::now();
        let (first_failed_at, replays) = envelope::earlier_failure(&message);
        let error = error.into();
        let error = match envelope::capped_error(&error, Self::ERROR_LIMIT) {
            std::borrow::Cow::Borrowed(_) => error,
            std::borrow::Cow::Owned(capped) => capped,
        };
        Self {
            message,
            error,
            class: ErrorClass::Permanent,
            attempts,
            first_failed_at: first_failed_at.unwrap_or(failed_at),
            failed_at,
            replays,
            reference: None,
            origin: None,
            headers_omitted: 0,
        }
    }

    /// Sets the class of the last failure (the dead-letter layer sets the
    /// handler's).
    pub fn with_class(mut self, class: ErrorClass) -> Self {
        self.class = class;
        self
    }

    /// The letter that stands in for this one when it cannot be written:
    /// the same origin, error, attempts and times, and instead of the
    /// message's payload, key and headers, their sizes.
    pub fn to_reference(&self) -> DeadLetter {
        use crate::parking::{ORIGIN, ORIGIN_PARTITION, ORIGIN_POSITION};
        let reference = PayloadReference::of(&self.message);
        // A parked copy's first delivery is where the original is: a sink
        // that finds it from these headers must still find it in the
        // reference, the one thing the reference points at.
        let first_delivery: Headers = self
            .message
            .headers()
            .iter()
            .filter(|header| [ORIGIN, ORIGIN_PARTITION, ORIGIN_POSITION].contains(&&*header.name))
            .map(|header| (header.name.clone(), header.value.clone()))
            .collect();
        DeadLetter {
            message: Message::new(Bytes::new(), self.message.metadata().clone())
                .with_headers(first_delivery),
            reference: Some(reference),
            ..self.clone()
        }
    }

    /// Reads a dead letter back from what a sink wrote: the record's key
    /// slot (`None` on a carrier without one: Redis, AMQP), the payload,
    /// and the headers or fields besides the payload. See
    /// [`envelope::read`].
    ///
    /// ```
    /// # use intake_core::{DeadLetter, Message};
    /// # fn letter_of(consumed: &Message) -> Result<DeadLetter, intake_core::dead_letter::EnvelopeError> {
    /// // A message consumed from a Kafka dead-letter topic:
    /// DeadLetter::read(consumed.key().cloned(), consumed.payload().clone(), consumed.headers())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`EnvelopeError`] naming the field that is missing, malformed or
    /// repeated.
    pub fn read(
        key_slot: Option<Bytes>,
        payload: Bytes,
        headers: &Headers,
    ) -> Result<DeadLetter, EnvelopeError> {
        envelope::read(key_slot, payload, headers)
    }
}

/// A failed dead-letter write.
#[derive(Debug, thiserror::Error)]
#[error("the dead-letter write failed")]
pub struct DeadLetterError(#[source] pub BoxError);

impl DeadLetterError {
    /// A letter the destination can never take as it is (larger than it
    /// accepts, a header it refuses): the dead-letter layer does not try it
    /// again but writes its [reference](DeadLetter::to_reference) at once.
    /// Sinks return it after checking a letter against their limits.
    pub fn rejected(reason: impl Into<BoxError>) -> Self {
        Self(Box::new(Rejected(reason.into())))
    }

    /// Whether the destination [rejected](Self::rejected) the letter for good.
    pub fn is_rejected(&self) -> bool {
        self.0.is::<Rejected>()
    }
}

/// The cause of a [rejected](DeadLetterError::rejected) write.
#[derive(Debug, thiserror::Error)]
#[error("the destination rejects this letter as it is")]
struct Rejected(#[source] BoxError);

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
mod replay_tests;
#[cfg(test)]
mod tests;
