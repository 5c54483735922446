//! The core of intake: consume messages from any broker with an async fn,
//! tower middleware and ordered commits.
//!
//! - [`Source`] and [`Acker`]: what a backend implements.
//! - [`CommitEngine`](commit_engine::CommitEngine): handlers finish out of
//!   order, yet a partition's committed position never passes a message still
//!   in flight.
//! - [`BackoffPolicy`]: one schedule type for retries, pauses and reconnects.
//! - [`DeadLetterSink`]: where poison messages go.
//! - [`handler_fn`]: an async fn whose arguments are extractors ([`Meta`],
//!   [`Key`], [`Json<T>`], [`Payload`], ...) as a handler service.
#![warn(missing_docs)]

pub mod acker;
pub mod backoff;
pub mod commit_engine;
pub mod consumer;
pub mod dead_letter;
pub mod decode;
pub mod error;
pub mod handler;
pub mod lifecycle;
pub mod message;
pub mod observer;
pub mod source;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use acker::{AckBatch, AckError, AckMode, Acker, PartitionAck};
pub use backoff::{Backoff, BackoffPolicy, Constant, Disabled, Exponential};
pub use consumer::{Consumer, ConsumerBuilder, Ordering, RunError, RunReport, Shutdown};
pub use dead_letter::{DeadLetter, DeadLetterError, DeadLetterSink};
pub use decode::{Decode, DecodeError, Decoded, Json};
pub use error::{BoxError, ConfigError, ErrorClass, HandlerError};
pub use handler::{
    FromMessage, FromMessageParts, Handler, HandlerFn, IntoHandlerResult, Key, Meta, Payload,
    handler_fn,
};
pub use message::{Header, Headers, Message, Metadata, PartitionKey, Position, SourceName};
pub use observer::{ConsumerObserver, PartitionSnapshot};
pub use source::{Revocation, RevocationHandle, Source, SourceError, SourceEvent};
