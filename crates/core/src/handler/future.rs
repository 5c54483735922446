//! The future a [`HandlerFn`](super::HandlerFn) returns.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use super::into_result::IntoHandlerResult;
use crate::error::HandlerError;

pin_project! {
    /// Response future of [`HandlerFn`](super::HandlerFn): the user's fn's
    /// future, or the error of an extractor that failed before the fn ran.
    ///
    /// A named type rather than a boxed future, so calling a handler
    /// allocates nothing.
    pub struct ResponseFuture<Fut> {
        #[pin]
        state: State<Fut>,
    }
}

pin_project! {
    #[project = StateProjection]
    enum State<Fut> {
        Running {
            #[pin]
            future: Fut,
        },
        Rejected {
            error: Option<HandlerError>,
        },
    }
}

impl<Fut> ResponseFuture<Fut> {
    pub(super) fn running(future: Fut) -> Self {
        Self {
            state: State::Running { future },
        }
    }

    pub(super) fn rejected(error: HandlerError) -> Self {
        Self {
            state: State::Rejected { error: Some(error) },
        }
    }
}

impl<Fut> Future for ResponseFuture<Fut>
where
    Fut: Future,
    Fut::Output: IntoHandlerResult,
{
    type Output = Result<<Fut::Output as IntoHandlerResult>::Response, HandlerError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProjection::Running { future } => {
                future.poll(cx).map(IntoHandlerResult::into_handler_result)
            }
            StateProjection::Rejected { error } => {
                // `Future::poll` allows a panic after completion; so does
                // every `async fn`, which is what `Running` polls.
                let error = error
                    .take()
                    .expect("handler ResponseFuture polled after it completed");
                Poll::Ready(Err(error))
            }
        }
    }
}

impl<Fut> std::fmt::Debug for ResponseFuture<Fut> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Running { .. } => "running",
            State::Rejected { .. } => "rejected",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
