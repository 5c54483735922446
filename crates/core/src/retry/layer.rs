//! [`RetryLayer`]: wraps a handler in [`Retry`].

use std::time::Duration;

use tower::Layer;

use super::{Retry, RetryObserver};
use crate::backoff::BackoffPolicy;

/// Retries retryable failures of the handler it wraps, on a
/// [`BackoffPolicy`]'s schedule. See [`Retry`].
#[derive(Clone, Debug)]
pub struct RetryLayer<P, O = ()> {
    policy: P,
    observer: O,
    later: Option<Duration>,
}

impl<P: BackoffPolicy> RetryLayer<P> {
    /// Retries on `policy`'s schedule until it gives up.
    ///
    /// The built-in policies are capped ([`Exponential::DEFAULT_MAX_RETRIES`]
    /// unless changed); a policy retries forever only when told to
    /// ([`Exponential::retry_forever`]). A [`Disabled`] policy never retries.
    ///
    /// [`Exponential::DEFAULT_MAX_RETRIES`]: crate::backoff::Exponential::DEFAULT_MAX_RETRIES
    /// [`Exponential::retry_forever`]: crate::backoff::Exponential::retry_forever
    /// [`Disabled`]: crate::backoff::Disabled
    pub fn new(policy: P) -> Self {
        Self {
            policy,
            observer: (),
            later: None,
        }
    }
}

impl<P: BackoffPolicy, O: RetryObserver> RetryLayer<P, O> {
    /// Reports every retry to `observer`; a
    /// `MetricsLayer` (feature `metrics`) counts them.
    pub fn observe<O2: RetryObserver>(self, observer: O2) -> RetryLayer<P, O2> {
        RetryLayer {
            policy: self.policy,
            observer,
            later: self.later,
        }
    }

    /// Once the policy's attempts are used up, a retryable failure asks to
    /// be [retried later](crate::HandlerError::retry_later), after `delay`,
    /// instead of going back to the runtime: a
    /// [`ParkingLayer`](crate::parking::ParkingLayer) outside this one
    /// parks it without holding its partition.
    pub fn then_retry_later(mut self, delay: Duration) -> Self {
        self.later = Some(delay);
        self
    }
}

impl<S, P, O> Layer<S> for RetryLayer<P, O>
where
    P: BackoffPolicy + Clone,
    O: RetryObserver + Clone,
{
    type Service = Retry<S, P, O>;

    fn layer(&self, inner: S) -> Self::Service {
        let retry = Retry::with_observer(inner, self.policy.clone(), self.observer.clone());
        match self.later {
            Some(delay) => retry.then_retry_later(delay),
            None => retry,
        }
    }
}
