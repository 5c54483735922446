//! [`RetryObserver`]: who hears about each retry the retry layer makes.

use std::time::Duration;

use crate::error::HandlerError;
use crate::message::Message;

/// Hears about every retry the retry layer is about to make, before its
/// backoff sleep. Only called on a failure path.
///
/// The metrics layer (`MetricsLayer`, feature `metrics`) implements it, so retries
/// (and panics that a retry hides) are counted even when the retry succeeds:
/// `RetryLayer::new(policy).observe(metrics_layer.clone())`.
pub trait RetryObserver: Send + Sync + 'static {
    /// `message` failed with `error` (retryable) and will be tried again
    /// after `delay`, as attempt `message.metadata().attempt() + 1`.
    fn on_retry(&self, message: &Message, error: &HandlerError, delay: Duration);
}

/// Observes nothing: the default.
impl RetryObserver for () {
    fn on_retry(&self, _message: &Message, _error: &HandlerError, _delay: Duration) {}
}
