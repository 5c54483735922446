//! Turn a panic in a handler into a retryable error, so the consumer keeps
//! running.
//!
//! A panic while the handler is called or while its future is polled is
//! caught, logged at `ERROR` with its message, and becomes a
//! [retryable](crate::error::ErrorClass::Retryable)
//! [`HandlerError::panicked`] whose cause is [`Panicked`]. The metrics layer
//! (feature `metrics`) counts it as a panic
//! ([`is_panic`](HandlerError::is_panic)), whether a retry later succeeds or
//! not.
//!
//! Place it inside the retry layer (so a panic is retried like any transient
//! failure) and inside the metrics and tracing layers (so they see the
//! error). Binaries built with `panic = "abort"` cannot catch panics.
//!
//! Without this layer a panic is still caught: the consumer runtime catches
//! whatever unwinds out of the handler stack, counts it
//! ([`RunReport::panicked`](crate::consumer::RunReport::panicked),
//! `intake_consumer_panics_total`) and retries the message, so one bad
//! message never takes the consumer down. The layer is for a policy of your
//! own: panics the retry layer retries, and the dead-letter layer gives up
//! on, like any other failure.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use intake_core::catch_panic::CatchPanicLayer;
//! use intake_core::retry::RetryLayer;
//! use intake_core::{Constant, HandlerError, Message};
//! use tower::{ServiceBuilder, service_fn};
//!
//! let handler = ServiceBuilder::new()
//!     .layer(RetryLayer::new(Constant::new(Duration::from_secs(1)).max_retries(3)))
//!     .layer(CatchPanicLayer::new())
//!     .service(service_fn(|message: Message| async move {
//!         let text = std::str::from_utf8(message.payload()).map_err(HandlerError::permanent)?;
//!         assert!(!text.is_empty(), "a bug: empty orders are filtered upstream");
//!         Ok::<(), HandlerError>(())
//!     }));
//! # let _ = handler;
//! ```

mod error;
mod future;
mod layer;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::task::{Context, Poll};

use tower::Service;

pub use self::error::Panicked;
pub use self::future::ResponseFuture;
pub use self::layer::CatchPanicLayer;
use crate::error::HandlerError;
use crate::message::Message;

/// Catches panics of `S` and returns them as retryable errors. See the
/// [module docs](self).
#[derive(Clone, Debug)]
pub struct CatchPanic<S> {
    inner: S,
}

impl<S> CatchPanic<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Self { inner }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S> Service<Message> for CatchPanic<S>
where
    S: Service<Message, Response = ()>,
    S::Error: Into<HandlerError>,
{
    type Response = ();
    type Error = HandlerError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match catch_unwind(AssertUnwindSafe(|| self.inner.poll_ready(cx))) {
            Ok(poll) => poll.map_err(Into::into),
            Err(payload) => Poll::Ready(Err(future::caught(Panicked::from_payload(&*payload)))),
        }
    }

    fn call(&mut self, message: Message) -> Self::Future {
        // A handler may panic before it returns its future (a plain fn that
        // does its work in `call`).
        match catch_unwind(AssertUnwindSafe(|| self.inner.call(message))) {
            Ok(future) => ResponseFuture::running(future),
            Err(payload) => ResponseFuture::panicked(Panicked::from_payload(&*payload)),
        }
    }
}

#[cfg(test)]
mod tests;
