//! intake: consume messages from brokers with async fn handlers, tower
//! middleware and ordered commits.
//!
//! This facade re-exports [`intake_core`]: at the root, what a handler
//! author uses (the consumer, handlers and extractors, the layers, the
//! errors, the in-memory broker); under [`backend`], what a backend author
//! implements (`Source`, `Acker`, `DeadLetterSink`) and, with core's
//! `testkit` feature, the conformance suite. The backends are features,
//! none on by default: `kafka`, `redis`, `amqp`, `nats` and `postgres` (or
//! `full` for all) add the backend crates as `intake::kafka`,
//! `intake::redis_streams`, `intake::amqp`, `intake::nats` and
//! `intake::postgres`.
//!
//! ```
//! use intake::consumer::Consumer;
//! use intake::memory::{MemoryBroker, Record};
//! use intake::{Payload, handler_fn};
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = MemoryBroker::new();
//! broker.create_topic("events", 1)?;
//! broker.send("events", Record::new("hello"))?;
//! let (source, acker) = broker.consumer("events", "printer")?;
//! let handler = handler_fn(|Payload(payload): Payload| async move {
//!     tracing::info!(?payload, "event");
//! });
//! let shutdown = CancellationToken::new();
//! let run = tokio::spawn(Consumer::builder().build(source, acker, handler)?.run(shutdown.clone()));
//! while broker.lag("events", "printer")? > 0 {
//!     tokio::time::sleep(std::time::Duration::from_millis(5)).await;
//! }
//! shutdown.cancel();
//! assert_eq!(run.await??.succeeded, 1);
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

// An explicit list, not `intake_core::*`: the root holds what a handler or
// app author writes; what a backend author implements is under `backend`.

/// What a handler or app author uses, at the root.
pub use intake_core::{
    // The service and the app.
    App,
    AppError,
    AppReport,
    // The layers and their settings.
    Backoff,
    BackoffPolicy,
    BatchLayer,
    BatchSettings,
    // Errors and outcomes.
    BoxError,
    CatchPanicLayer,
    ConfigError,
    Constant,
    Consumer,
    ConsumerBuilder,
    // Observing a consumer.
    ConsumerObserver,
    // Messages.
    DeadLetter,
    DeadLetterLayer,
    // Handlers, extractors, what they return.
    Decode,
    DecodeError,
    Decoded,
    DeliveryOrder,
    Disabled,
    ErrorChain,
    ErrorClass,
    Exponential,
    FailurePolicy,
    FirstDelivery,
    FromMessage,
    FromMessageParts,
    FromRef,
    Handler,
    HandlerError,
    HandlerFn,
    Header,
    Headers,
    IntoHandlerResult,
    Json,
    Key,
    Message,
    Meta,
    Metadata,
    Outcome,
    ParkingLayer,
    PartitionKey,
    PartitionSnapshot,
    Payload,
    Position,
    RetryLayer,
    RunError,
    RunReport,
    SharedBudget,
    Shutdown,
    SourceName,
    State,
    TraceLayer,
    handler_fn,
    handler_fn_with_state,
};
#[cfg(feature = "metrics")]
pub use intake_core::{Metrics, MetricsLayer};

#[cfg(feature = "metrics")]
pub use intake_core::metrics;
pub use intake_core::service::{Route, Service};
/// Every module of the core, by topic.
pub use intake_core::{
    app, backend, backoff, batch, catch_panic, consumer, dead_letter, decode, error, handler, lag,
    memory, message, observer, parking, publish, redact, retry, service, shutdown_scope, trace,
};

pub mod any_broker;
pub use any_broker::AnyBroker;

/// The Kafka backend: source, acker and dead-letter sink on rdkafka.
#[cfg(feature = "kafka")]
pub use intake_kafka as kafka;

/// The Redis Streams backend (feature `redis`).
#[cfg(feature = "redis")]
pub use intake_redis_streams as redis_streams;

/// RabbitMQ (AMQP 0.9.1): source, acker and dead-letter sinks on lapin
/// (feature `amqp`).
#[cfg(feature = "amqp")]
pub use intake_amqp as amqp;

/// NATS JetStream: source, acker and dead-letter sink on async-nats
/// (feature `nats`).
#[cfg(feature = "nats")]
pub use intake_nats as nats;

/// Exactly-once effects in PostgreSQL (feature `postgres`).
#[cfg(feature = "postgres")]
pub use intake_postgres as postgres;

// Every Rust snippet of the README and the guides in docs/ compiles (and
// runs, unless it needs a broker): they cannot drift from the API.
// They use every backend and the HTTP listener: the README's test command
// (`--all-features`) runs them.
#[cfg(all(doctest, feature = "full", feature = "health-server"))]
mod docs_doctests;
