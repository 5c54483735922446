//! [`ResponseFuture`]: a handler call whose panics become errors.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::Panicked;
use crate::error::HandlerError;

pin_project! {
    /// The future of [`CatchPanic`](super::CatchPanic).
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Running { #[pin] future: F },
        // The call itself panicked, or the future did: the error, until it
        // is returned.
        Panicked { error: Option<HandlerError> },
    }
}

impl<F> ResponseFuture<F> {
    pub(super) fn running(future: F) -> Self {
        Self {
            kind: Kind::Running { future },
        }
    }

    pub(super) fn panicked(panic: Panicked) -> Self {
        Self {
            kind: Kind::Panicked {
                error: Some(caught(panic)),
            },
        }
    }
}

/// A caught panic is logged and becomes a retryable error: most panics are
/// bugs that a retry will not fix, but some (an `unwrap` on a flaky reply)
/// are transient, and the retry cap and the dead-letter policy bound the cost
/// of trying again.
pub(super) fn caught(panic: Panicked) -> HandlerError {
    tracing::error!(panic = %panic.message(), "handler panicked");
    HandlerError::panicked(panic)
}

impl<F, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<(), E>>,
    E: Into<HandlerError>,
{
    type Output = Result<(), HandlerError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        match this.kind.as_mut().project() {
            KindProj::Running { future } => {
                match catch_unwind(AssertUnwindSafe(|| future.poll(cx))) {
                    Ok(poll) => poll.map_err(Into::into),
                    Err(payload) => {
                        let error = caught(Panicked::from_payload(&*payload));
                        // The panicked future is dropped here and never
                        // polled again.
                        this.kind.set(Kind::Panicked { error: None });
                        Poll::Ready(Err(error))
                    }
                }
            }
            KindProj::Panicked { error } => Poll::Ready(Err(error.take().unwrap_or_else(|| {
                HandlerError::retryable("CatchPanic future polled after it completed")
            }))),
        }
    }
}
