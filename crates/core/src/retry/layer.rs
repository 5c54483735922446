//! [`RetryLayer`]: wraps a handler in [`Retry`].

use tower::Layer;

use super::{Retry, RetryObserver};
use crate::backoff::BackoffPolicy;

/// Retries retryable failures of the handler it wraps, on a
/// [`BackoffPolicy`]'s schedule. See [`Retry`].
#[derive(Clone, Debug)]
pub struct RetryLayer<P, O = ()> {
    policy: P,
    observer: O,
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
        }
    }
}

impl<S, P, O> Layer<S> for RetryLayer<P, O>
where
    P: BackoffPolicy + Clone,
    O: RetryObserver + Clone,
{
    type Service = Retry<S, P, O>;

    fn layer(&self, inner: S) -> Self::Service {
        Retry::with_observer(inner, self.policy.clone(), self.observer.clone())
    }
}
