//! [`ResponseFuture`]: one message through [`Retry`](super::Retry), attempt
//! after attempt.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use pin_project_lite::pin_project;
use tower::Service;

use super::RetryObserver;
use super::service::RetryConfig;
use crate::backoff::BackoffPolicy;
use crate::error::{HandlerError, chain_for_log};
use crate::interruptible_sleep::{InterruptibleSleep, Wake, outlasts_the_drain};
use crate::message::Message;

pin_project! {
    /// The future of [`Retry`](super::Retry): resolves with the outcome of the
    /// last attempt.
    pub struct ResponseFuture<F, S, P, O> {
        #[pin]
        state: State<F>,
        // What another attempt needs; `None` when the policy can never retry,
        // so such a stack keeps no copy of the message.
        again: Option<Again<S, P, O>>,
        // The attempt running now, as the handler sees it in `Metadata`.
        attempt: u32,
        // Retries made so far (the argument of `BackoffPolicy::delay`).
        retries: u32,
        // Once the attempts are used up, retry later, after this.
        later: Option<Duration>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Called { #[pin] future: F },
        // Boxed: a sleep is large and only failures need one, so the future
        // of a message that succeeds stays small.
        Sleeping { sleep: Pin<Box<InterruptibleSleep>> },
        Ready,
    }
}

/// What another attempt needs: a service to call, the message as
/// delivered, and the policy.
pub(super) struct Again<S, P, O> {
    pub(super) service: S,
    pub(super) message: Message,
    pub(super) config: Arc<RetryConfig<P, O>>,
}

impl<F, S, P, O> ResponseFuture<F, S, P, O> {
    pub(super) fn new(
        future: F,
        attempt: u32,
        again: Option<Again<S, P, O>>,
        later: Option<Duration>,
    ) -> Self {
        Self {
            state: State::Called { future },
            again,
            attempt,
            retries: 0,
            later,
        }
    }
}

/// The final error carries the attempts made, the handler's own count
/// (from a nested layer) if it is higher.
fn finish(error: HandlerError, attempt: u32) -> HandlerError {
    let attempts = error.attempts().max(attempt);
    error.with_attempts(attempts)
}

/// The final error of a message whose attempts are used up: asked to be
/// retried later when the layer says so.
fn exhausted(error: HandlerError, attempt: u32, later: Option<Duration>) -> HandlerError {
    let error = finish(error, attempt);
    match later {
        Some(delay) if error.is_retryable() && error.retry_after().is_none() => {
            error.with_retry_after(delay)
        }
        _ => error,
    }
}

impl<F, S, P, O, E> Future for ResponseFuture<F, S, P, O>
where
    F: Future<Output = Result<(), E>>,
    E: Into<HandlerError>,
    S: Service<Message, Response = (), Error = E, Future = F>,
    P: BackoffPolicy,
    O: RetryObserver,
{
    type Output = Result<(), HandlerError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Called { future } => {
                    let error: HandlerError = match ready!(future.poll(cx)) {
                        Ok(()) => return Poll::Ready(Ok(())),
                        Err(error) => error.into(),
                    };
                    let Some(again) = this.again.as_ref() else {
                        return Poll::Ready(Err(exhausted(error, *this.attempt, *this.later)));
                    };
                    // A failure that asks for later is not retried now.
                    if !error.is_retryable() || error.retry_after().is_some() {
                        return Poll::Ready(Err(finish(error, *this.attempt)));
                    }
                    let retry = *this.retries + 1;
                    let Some(delay) = again.config.policy.delay(retry) else {
                        tracing::debug!(
                            source = %again.message.metadata().source(),
                            partition = again.message.metadata().partition(),
                            position = %again.message.metadata().position(),
                            attempts = *this.attempt,
                            error = %chain_for_log(&error),
                            "retries exhausted",
                        );
                        return Poll::Ready(Err(exhausted(error, *this.attempt, *this.later)));
                    };
                    if outlasts_the_drain(delay) {
                        return Poll::Ready(Err(
                            HandlerError::interrupted().with_attempts(*this.attempt)
                        ));
                    }
                    again
                        .config
                        .observer
                        .on_retry(&again.message, &error, delay);
                    tracing::debug!(
                        source = %again.message.metadata().source(),
                        partition = again.message.metadata().partition(),
                        position = %again.message.metadata().position(),
                        attempt = *this.attempt,
                        retry_in = ?delay,
                        error = %chain_for_log(&error),
                        "handler failed, retrying",
                    );
                    *this.retries = retry;
                    if delay.is_zero() {
                        this.state.set(State::Ready);
                    } else {
                        this.state.set(State::Sleeping {
                            sleep: Box::pin(InterruptibleSleep::new(delay)),
                        });
                    }
                }
                StateProj::Sleeping { sleep } => match ready!(sleep.as_mut().poll(cx)) {
                    Wake::Elapsed => this.state.set(State::Ready),
                    Wake::ShuttingDown => {
                        return Poll::Ready(Err(
                            HandlerError::interrupted().with_attempts(*this.attempt)
                        ));
                    }
                },
                StateProj::Ready => {
                    let Some(again) = this.again.as_mut() else {
                        // Unreachable: `Ready` is only entered with a copy.
                        return Poll::Ready(Err(HandlerError::retryable(
                            "retry state lost its message copy",
                        )));
                    };
                    if let Err(error) = ready!(again.service.poll_ready(cx)) {
                        return Poll::Ready(Err(finish(error.into(), *this.attempt)));
                    }
                    *this.attempt = this.attempt.saturating_add(1);
                    let mut message = again.message.clone();
                    message.metadata_mut().set_attempt(*this.attempt);
                    again.message.metadata_mut().set_attempt(*this.attempt);
                    let future = again.service.call(message);
                    this.state.set(State::Called { future });
                }
            }
        }
    }
}
