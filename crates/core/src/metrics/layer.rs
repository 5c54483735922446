//! [`MetricsLayer`]: wraps a handler in [`MetricsService`].

use std::sync::Arc;
use std::time::Duration;

use tower::Layer;

use super::MetricsService;
use super::series::{Families, HandlerSeries};
use crate::error::HandlerError;
use crate::message::Message;
use crate::retry::RetryObserver;

/// Measures the handler it wraps; made by [`Metrics::layer`]. See
/// [`MetricsService`].
///
/// Also a [`RetryObserver`]: give a clone to the retry layer
/// (`RetryLayer::new(policy).observe(metrics_layer.clone())`) and its
/// retries, and the panics they retry, are counted too.
///
/// [`Metrics::layer`]: super::Metrics::layer
#[derive(Clone)]
pub struct MetricsLayer {
    handler: Arc<HandlerSeries>,
}

impl std::fmt::Debug for MetricsLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsLayer")
            .field("handler", &self.handler.name)
            .finish_non_exhaustive()
    }
}

impl MetricsLayer {
    pub(super) fn new(families: Arc<Families>, handler: Arc<str>) -> Self {
        Self {
            handler: Arc::new(HandlerSeries::new(handler, families)),
        }
    }

    /// The handler name the layer labels its series with.
    pub fn handler(&self) -> &str {
        &self.handler.name
    }
}

impl<S> Layer<S> for MetricsLayer {
    type Service = MetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MetricsService::new(inner, Arc::clone(&self.handler))
    }
}

impl RetryObserver for MetricsLayer {
    fn on_retry(&self, message: &Message, error: &HandlerError, _delay: Duration) {
        let series = self.handler.for_source(message.metadata().source());
        series.retried.inc();
        if error.is_panic() {
            series.panicked.inc();
        }
    }
}
