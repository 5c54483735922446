//! [`ResponseFuture`]: a handler call running inside its message's span.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tracing::Span;

use crate::error::{HandlerError, chain_for_log};

pin_project! {
    /// The future of [`Trace`](super::Trace): enters the span on every poll
    /// and records a failure on it.
    pub struct ResponseFuture<F> {
        #[pin]
        future: F,
        span: Span,
    }
}

impl<F> ResponseFuture<F> {
    pub(super) fn new(future: F, span: Span) -> Self {
        Self { future, span }
    }
}

impl<F, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<(), E>>,
    E: Into<HandlerError>,
{
    type Output = Result<(), HandlerError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let _entered = this.span.enter();
        match this.future.poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(())) => Poll::Ready(Ok(())),
            Poll::Ready(Err(error)) => {
                let error: HandlerError = error.into();
                if !this.span.is_disabled() {
                    this.span
                        .record("error", tracing::field::display(chain_for_log(&error)))
                        .record("error.class", error.class().as_str());
                    // Outside the retry layer, the span started at the
                    // first attempt; the error knows the last one.
                    if error.attempts() > 0 {
                        this.span.record("attempt", error.attempts());
                    }
                }
                Poll::Ready(Err(error))
            }
        }
    }
}
