//! [`TraceLayer`]: wraps a handler in [`Trace`].

use std::sync::Arc;

use tower::Layer;

use super::Trace;

/// Runs each message of the handler it wraps in a span of its own. See
/// [`Trace`].
#[derive(Clone, Debug)]
pub struct TraceLayer {
    handler: Arc<str>,
}

impl TraceLayer {
    /// Spans name the handler `handler` (the `handler` field).
    pub fn new(handler: impl Into<Arc<str>>) -> Self {
        Self {
            handler: handler.into(),
        }
    }
}

impl<S> Layer<S> for TraceLayer {
    type Service = Trace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Trace::new(inner, Arc::clone(&self.handler))
    }
}
