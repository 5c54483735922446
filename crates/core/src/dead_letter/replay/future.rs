//! [`ReplayFuture`]: one record through the
//! [`ReplayService`](super::ReplayService): the handler's outcome on the
//! original message, or the verdict given without calling it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tracing::instrument::Instrumented;

use super::ReplayCounters;
use crate::error::HandlerError;

pin_project! {
    /// The future of [`ReplayService`](super::ReplayService).
    pub struct ReplayFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // The handler runs on the original message, in the replay's span.
        Replaying { #[pin] future: Instrumented<F>, counters: ReplayCounters },
        // Refused, unreadable or counted by a dry run: no handler runs.
        Done { outcome: Option<Result<(), HandlerError>> },
    }
}

impl<F> ReplayFuture<F> {
    pub(super) fn replaying(future: Instrumented<F>, counters: ReplayCounters) -> Self {
        Self {
            state: State::Replaying { future, counters },
        }
    }

    pub(super) fn done(outcome: Result<(), HandlerError>) -> Self {
        Self {
            state: State::Done {
                outcome: Some(outcome),
            },
        }
    }
}

impl<F, E> Future for ReplayFuture<F>
where
    F: Future<Output = Result<(), E>>,
    E: Into<HandlerError>,
{
    type Output = Result<(), HandlerError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Replaying { future, counters } => {
                let outcome = ready!(future.poll(cx)).map_err(Into::into);
                if outcome.is_ok() {
                    counters.succeeded();
                }
                Poll::Ready(outcome)
            }
            StateProj::Done { outcome } => Poll::Ready(outcome.take().unwrap_or_else(|| {
                Err(HandlerError::retryable(
                    "a replay's outcome was polled after it was returned",
                ))
            })),
        }
    }
}
