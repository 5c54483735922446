//! Prometheus metrics: what the handlers did and what the consumer holds.
//!
//! [`Metrics`] registers intake's metrics in a [`prometheus::Registry`] the
//! application passes in (and serves as it likes). Its
//! [`layer`](Metrics::layer) measures a handler: consumed, succeeded, failed
//! by class, dead-lettered, discarded, panicked, latency and in flight, per
//! source and handler. Given to the consumer as its
//! [`ConsumerObserver`](crate::observer::ConsumerObserver), it also keeps
//! per-partition gauges (commit lag, oldest unfinished message's age, in
//! flight) and counts acknowledgement round trips.
//!
//! Label sets are resolved once per (source, handler) and cached in the
//! service, so a message costs a few atomic increments and no allocation.
//!
//! Put the metrics layer outermost, so it sees each message's final outcome
//! once, and let it observe the retry layer so retries are counted.
//!
//! # Example
//!
//! ```
//! use intake_core::catch_panic::CatchPanicLayer;
//! use intake_core::metrics::Metrics;
//! use intake_core::retry::RetryLayer;
//! use intake_core::{Exponential, HandlerError, Message};
//! use tower::{ServiceBuilder, service_fn};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let registry = prometheus::Registry::new();
//! let metrics = Metrics::register(&registry)?;
//! let measured = metrics.layer("orders");
//!
//! let handler = ServiceBuilder::new()
//!     .layer(measured.clone())
//!     .layer(RetryLayer::new(Exponential::default()).observe(measured))
//!     .layer(CatchPanicLayer::new())
//!     .service(service_fn(|_message: Message| async { Ok::<(), HandlerError>(()) }));
//! # let _ = handler;
//! # Ok(())
//! # }
//! ```

mod collector;
mod dead_letters;
mod error;
mod future;
mod lag;
mod layer;
mod observer;
mod series;
mod service;

/// The prometheus crate the metrics register in, so that a service names
/// the same version ([`Registry`](prometheus::Registry), the encoders)
/// without a dependency of its own.
pub use prometheus;

pub use self::collector::{Metrics, MetricsBuilder};
pub use self::dead_letters::{DeadLetterExporter, DeadLetterMetrics};
pub use self::error::RegisterError;
pub use self::future::ResponseFuture;
pub use self::lag::{LagExporter, LagMetrics};
pub use self::layer::MetricsLayer;
pub use self::service::MetricsService;

#[cfg(test)]
mod tests;
