//! [`MetricsService`]: the service that measures each message.

use std::sync::Arc;
use std::task::{Context, Poll};

use tower::Service;

use super::ResponseFuture;
use super::future::InFlight;
use super::series::{HandlerSeries, SourceSeries};
use crate::error::HandlerError;
use crate::message::{Message, SourceName};

/// Measures each message of `S`. See the [module docs](super).
pub struct MetricsService<S> {
    inner: S,
    handler: Arc<HandlerSeries>,
    // The series of the last source seen: consumers read one or a few
    // sources, so this skips the shared lookup for nearly every message.
    cached: Option<Arc<SourceSeries>>,
}

impl<S> MetricsService<S> {
    pub(super) fn new(inner: S, handler: Arc<HandlerSeries>) -> Self {
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
