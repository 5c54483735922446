//! [`DeadLetterService`]: applies a [`FailurePolicy`] to a handler's final
//! failures.

use std::sync::Arc;
use std::task::{Context, Poll};

use tower::Service;

use super::{FailurePolicy, ResponseFuture};
use crate::error::HandlerError;
use crate::message::Message;

/// Applies a [`FailurePolicy`] to the final failures of `S`. See the
/// [module docs](super).
#[derive(Clone, Debug)]
pub struct DeadLetterService<S> {
    inner: S,
    policy: Arc<FailurePolicy>,
}

impl<S> DeadLetterService<S> {
    /// Wraps `inner` with `policy`.
    pub fn new(inner: S, policy: FailurePolicy) -> Self {
        Self::from_shared(inner, Arc::new(policy))
    }

    pub(super) fn from_shared(inner: S, policy: Arc<FailurePolicy>) -> Self {
        Self { inner, policy }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The failure policy.
    pub fn policy(&self) -> &FailurePolicy {
        &self.policy
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S> Service<Message> for DeadLetterService<S>
where
    S: Service<Message, Response = ()> + Clone,
    S::Error: Into<HandlerError>,
{
    type Response = ();
    type Error = HandlerError;
    type Future = ResponseFuture<S::Future, S>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, message: Message) -> Self::Future {
        // The dead letter is the original message, so a copy is kept
        // (reference counts, not bytes). Only `block` (as the policy or a
        // fallback of it) calls the handler again and needs a service of
        // its own.
        let again = self.policy.calls_again().then(|| self.inner.clone());
        let copy = message.clone();
        ResponseFuture::new(
            self.inner.call(message),
            copy,
            again,
            Arc::clone(&self.policy),
        )
    }
}
