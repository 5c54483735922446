//! [`Retry`]: the service that retries a handler's retryable failures.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower::Service;

use super::future::Again;
use super::{ResponseFuture, RetryObserver};
use crate::backoff::BackoffPolicy;
use crate::error::HandlerError;
use crate::message::Message;

/// Retries the retryable failures of `S` on the schedule of `P`, reporting
/// each retry to `O`. See the [module docs](super).
pub struct Retry<S, P, O = ()> {
    inner: S,
    config: Arc<RetryConfig<P, O>>,
    later: Option<std::time::Duration>,
}

/// The policy and observer, shared by every clone of a [`Retry`] and every
/// message in it (one reference count per message, whatever their size).
pub(crate) struct RetryConfig<P, O> {
    pub(super) policy: P,
    pub(super) observer: O,
}

impl<S, P, O> Retry<S, P, O> {
    /// After the in-process attempts are used up, a retryable failure asks
    /// to be [retried later](HandlerError::retry_later), after `delay`
    /// (a [`ParkingLayer`](crate::parking::ParkingLayer) outside parks it).
    pub fn then_retry_later(mut self, delay: std::time::Duration) -> Self {
        self.later = Some(delay);
        self
    }
}

impl<S, P: BackoffPolicy> Retry<S, P> {
    /// Wraps `inner`, retrying on `policy`'s schedule.
    pub fn new(inner: S, policy: P) -> Self {
        Self::with_observer(inner, policy, ())
    }
}

impl<S, P: BackoffPolicy, O: RetryObserver> Retry<S, P, O> {
    /// Wraps `inner`, retrying on `policy`'s schedule and reporting each
    /// retry to `observer`.
    pub fn with_observer(inner: S, policy: P, observer: O) -> Self {
        Self {
            inner,
            config: Arc::new(RetryConfig { policy, observer }),
            later: None,
        }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The retry schedule.
    pub fn policy(&self) -> &P {
        &self.config.policy
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, P, O> Clone for Retry<S, P, O> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
            later: self.later,
        }
    }
}

impl<S: fmt::Debug, P: fmt::Debug, O> fmt::Debug for Retry<S, P, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("inner", &self.inner)
            .field("policy", &self.config.policy)
            .finish_non_exhaustive()
    }
}

impl<S, P, O> Service<Message> for Retry<S, P, O>
where
    S: Service<Message, Response = ()> + Clone,
    S::Error: Into<HandlerError>,
    P: BackoffPolicy,
    O: RetryObserver,
{
    type Response = ();
    type Error = HandlerError;
    type Future = ResponseFuture<S::Future, S, P, O>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, message: Message) -> Self::Future {
        let attempt = message.metadata().attempt();
        if self.config.policy.is_disabled() {
            return ResponseFuture::new(self.inner.call(message), attempt, None, self.later);
        }
        // A retry needs the message again and a service to call. A message
        // clone bumps reference counts (no copy of the payload); the service
        // clone is polled ready before every retry.
        let again = Again {
            service: self.inner.clone(),
            message: message.clone(),
            config: Arc::clone(&self.config),
        };
        ResponseFuture::new(self.inner.call(message), attempt, Some(again), self.later)
    }
}
