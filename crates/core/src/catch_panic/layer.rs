//! [`CatchPanicLayer`]: wraps a handler in [`CatchPanic`].

use tower::Layer;

use super::CatchPanic;

/// Turns panics of the handler it wraps into retryable errors. See
/// [`CatchPanic`].
#[derive(Clone, Copy, Debug, Default)]
pub struct CatchPanicLayer;

impl CatchPanicLayer {
    /// The layer.
    pub fn new() -> Self {
        Self
    }
}

impl<S> Layer<S> for CatchPanicLayer {
    type Service = CatchPanic<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CatchPanic::new(inner)
    }
}
