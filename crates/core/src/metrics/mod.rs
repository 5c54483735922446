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

use std::sync::Arc;
use std::task::{Context, Poll};

use tower::Service;

/// The prometheus crate the metrics register in, so that a service names
/// the same version ([`Registry`](prometheus::Registry), the encoders)
/// without a dependency of its own.
pub use prometheus;

pub use self::collector::{Metrics, MetricsBuilder};
pub use self::dead_letters::{DeadLetterExporter, DeadLetterMetrics};
pub use self::error::RegisterError;
use self::future::InFlight;
pub use self::future::ResponseFuture;
pub use self::lag::{LagExporter, LagMetrics};
pub use self::layer::MetricsLayer;
use self::series::{HandlerSeries, SourceSeries};
use crate::error::HandlerError;
use crate::message::{Message, SourceName};

/// Measures each message of `S`. See the [module docs](self).
pub struct MetricsService<S> {
    inner: S,
    handler: Arc<HandlerSeries>,
    // The series of the last source seen: consumers read one or a few
    // sources, so this skips the shared lookup for nearly every message.
    cached: Option<Arc<SourceSeries>>,
}

impl<S> MetricsService<S> {
    fn new(inner: S, handler: Arc<HandlerSeries>) -> Self {
        Self {
            inner,
            handler,
            cached: None,
        }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    fn series(&mut self, source: &SourceName) -> Arc<SourceSeries> {
        if let Some(cached) = &self.cached
            && cached.is_for(source)
        {
            return Arc::clone(cached);
        }
        let series = self.handler.for_source(source);
        self.cached = Some(Arc::clone(&series));
        series
    }
}

impl<S: Clone> Clone for MetricsService<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            handler: Arc::clone(&self.handler),
            cached: self.cached.clone(),
        }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for MetricsService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsService")
            .field("inner", &self.inner)
            .field("handler", &self.handler.name)
            .finish_non_exhaustive()
    }
}

impl<S> Service<Message> for MetricsService<S>
where
    S: Service<Message, Response = ()>,
    S::Error: Into<HandlerError>,
{
    type Response = ();
    type Error = HandlerError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, message: Message) -> Self::Future {
        let series = self.series(message.metadata().source());
        series.consumed.inc();
        let in_flight = InFlight::enter(series);
        ResponseFuture::new(self.inner.call(message), in_flight)
    }
}

#[cfg(test)]
mod tests;
