//! [`CatchPanic`]: the service that turns a handler's panic into an error.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::task::{Context, Poll};

use tower::Service;

use super::{Panicked, ResponseFuture, future};
use crate::error::HandlerError;
use crate::message::Message;

/// Catches panics of `S` and returns them as retryable errors. See the
/// [module docs](super).
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
