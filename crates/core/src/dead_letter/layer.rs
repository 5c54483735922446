//! [`DeadLetterLayer`]: applies a [`FailurePolicy`] to the handler it wraps.

use std::sync::Arc;

use tower::Layer;

use super::{DeadLetterService, DeadLetterSink, FailurePolicy};

/// Applies a [`FailurePolicy`] (dead-letter, discard or block) to messages
/// whose handler failed for good. See [`DeadLetterService`].
#[derive(Clone, Debug)]
pub struct DeadLetterLayer {
    policy: Arc<FailurePolicy>,
}

impl DeadLetterLayer {
    /// Dead-letters failed messages to `sink`:
    /// [`FailurePolicy::dead_letter`].
    pub fn new(sink: impl DeadLetterSink) -> Self {
        Self::with_policy(FailurePolicy::dead_letter(sink))
    }

    /// Applies `policy` to failed messages.
    pub fn with_policy(policy: FailurePolicy) -> Self {
        Self {
            policy: Arc::new(policy),
        }
    }

    /// The failure policy.
    pub fn policy(&self) -> &FailurePolicy {
        &self.policy
    }
}

impl<S> Layer<S> for DeadLetterLayer {
    type Service = DeadLetterService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DeadLetterService::from_shared(inner, Arc::clone(&self.policy))
    }
}
