//! The core of intake: consume messages from any broker with an async fn,
//! tower middleware and ordered commits.
//!
//! The crate root is for people who write handlers and run consumers:
//!
//! - [`Consumer`]: joins a source, an acker and a handler, and runs them
//!   within a budget ([`ConsumerBuilder`]), in a [`DeliveryOrder`], until a
//!   [`Shutdown`]; its [`RunReport`] says what it did.
//! - [`handler_fn`]: an async fn whose arguments are extractors ([`Meta`],
//!   [`Key`], [`Json<T>`], [`Payload`], ...) as a handler service; a failure
//!   is a [`HandlerError`] whose [`ErrorClass`] says what it means.
//! - Middleware as tower layers, composed with `tower::ServiceBuilder`:
//!   [`RetryLayer`], [`CatchPanicLayer`], [`DeadLetterLayer`] (with its
//!   [`FailurePolicy`]), [`TraceLayer`], [`BatchLayer`] and, with the
//!   `metrics` feature, `MetricsLayer` (prometheus); [`BackoffPolicy`] is
//!   the one schedule type for retries, pauses and reconnects.
//! - [`App`]: several consumers (routes) run as one service under one
//!   [`SharedBudget`], with a shared [`State`], startup and shutdown hooks
//!   and a drain on SIGTERM or Ctrl-C (see [`app`]).
//! - [`memory`]: an in-process broker with Kafka's model, for tests,
//!   examples and benchmarks.
//!
//! What a backend author implements ([`backend::Source`],
//! [`backend::Acker`], [`backend::DeadLetterSink`]) and the conformance
//! suite that accepts a backend live in [`backend`].
//!
//! # Example
//!
//! A consumer on the in-memory broker, with retries and a dead-letter topic:
//!
//! ```
//! use intake_core::consumer::{Consumer, DeliveryOrder};
//! use intake_core::dead_letter::DeadLetterLayer;
//! use intake_core::memory::{MemoryBroker, Record};
//! use intake_core::retry::RetryLayer;
//! use intake_core::{Exponential, Json, Meta, handler_fn};
//! use tokio_util::sync::CancellationToken;
//! use tower::ServiceBuilder;
//!
//! #[derive(serde::Deserialize)]
//! struct Order {
//!     id: u64,
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = MemoryBroker::new();
//! broker.create_topic("orders", 2)?;
//! broker.send("orders", Record::new(r#"{"id":1}"#).with_key("customer-7"))?;
//! broker.send("orders", Record::new("not json").with_key("customer-8"))?;
//!
//! let handler = ServiceBuilder::new()
//!     .layer(DeadLetterLayer::new(broker.dead_letter_sink("orders", "billing")?))
//!     .layer(RetryLayer::new(Exponential::default()))
//!     .service(handler_fn(|Meta(meta): Meta, Json(order): Json<Order>| async move {
//!         tracing::info!(order = order.id, attempt = meta.attempt(), "billed");
//!     }));
//!
//! let (source, acker) = broker.consumer("orders", "billing")?;
//! let shutdown = CancellationToken::new();
//! let consumer = Consumer::builder()
//!     .max_in_flight(64)
//!     .ordering(DeliveryOrder::Key)
//!     .build(source, acker, handler)?;
//! let run = tokio::spawn(consumer.run(shutdown.clone()));
//! while broker.lag("orders", "billing")? > 0 {
//!     tokio::time::sleep(std::time::Duration::from_millis(5)).await;
//! }
//! shutdown.cancel();
//! let report = run.await??;
//! assert_eq!(report.succeeded, 1);
//! assert_eq!(broker.dead_letters("orders", "billing")?.len(), 1);
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

// What a backend author needs is public under `backend` only.
mod acker;
pub mod app;
pub mod backend;
pub mod backoff;
pub mod batch;
pub mod catch_panic;
// The engine is the runtime's own; the `internals` feature opens it to the
// property tests and the benchmark that drive it directly.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod commit_engine;
#[cfg(not(feature = "internals"))]
mod commit_engine;
pub mod consumer;
pub mod dead_letter;
mod deadline;
pub mod decode;
pub mod error;
pub mod group_control;
pub mod handler;
mod interruptible_sleep;
pub mod lag;
#[cfg(test)]
mod layer_testing;
pub mod memory;
pub mod message;
#[cfg(feature = "metrics")]
pub mod metrics;
pub mod observer;
mod outcome;
pub mod parking;
pub mod publish;
mod reachability;
pub mod redact;
pub mod retry;
pub mod service;
pub mod shutdown_scope;
mod source;
pub mod trace;

pub use app::{App, AppError, AppReport};
pub use backoff::{Backoff, BackoffPolicy, Constant, Disabled, Exponential};
pub use batch::{BatchLayer, BatchSettings};
pub use catch_panic::CatchPanicLayer;
pub use consumer::{
    Consumer, ConsumerBuilder, DeliveryOrder, RunError, RunReport, SharedBudget, Shutdown,
};
pub use dead_letter::{DeadLetter, DeadLetterLayer, FailurePolicy};
pub use decode::{Decode, DecodeError, Decoded, Json};
pub use error::{BoxError, ConfigError, ErrorChain, ErrorClass, HandlerError};
pub use handler::{
    FromMessage, FromMessageParts, FromRef, Handler, HandlerFn, IntoHandlerResult, Key, Meta,
    Payload, State, handler_fn, handler_fn_with_state,
};
pub use lag::{LagError, LagProbe, ParkedTier, PartitionLag};
pub use message::{
    FirstDelivery, Header, Headers, Message, Metadata, PartitionKey, Position, SourceName,
};
#[cfg(feature = "metrics")]
pub use metrics::{Metrics, MetricsLayer};
pub use observer::{ConsumerObserver, PartitionSnapshot};
pub use outcome::Outcome;
pub use parking::ParkingLayer;
pub use retry::RetryLayer;
pub use trace::TraceLayer;
