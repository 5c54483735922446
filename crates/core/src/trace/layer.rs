//! [`TraceLayer`]: wraps a handler in [`Trace`].

use std::sync::Arc;

use tower::Layer;

use super::Trace;

/// Runs each message of the handler it wraps in a span of its own. See
/// [`Trace`].
#[derive(Clone, Debug)]
pub struct TraceLayer {
    handler: Arc<str>,
    record_key: bool,
}

impl TraceLayer {
    /// Spans name the handler `handler` (the `handler` field) and record
    /// message keys.
    pub fn new(handler: impl Into<Arc<str>>) -> Self {
        Self {
            handler: handler.into(),
            record_key: true,
        }
    }

    /// Whether spans record the message's key as `key` (default `true`).
    /// Turn it off where keys are personal data that must not reach the
    /// tracing backend:
    ///
    /// ```
    /// use intake_core::TraceLayer;
    ///
    /// let layer = TraceLayer::new("billing").record_key(false);
    /// # let _ = layer;
    /// ```
    pub fn record_key(mut self, record: bool) -> Self {
        self.record_key = record;
        self
    }
}

impl<S> Layer<S> for TraceLayer {
    type Service = Trace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Trace::new(inner, Arc::clone(&self.handler)).record_key(self.record_key)
    }
}
