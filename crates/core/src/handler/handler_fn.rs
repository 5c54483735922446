//! [`handler_fn`]: an async fn as a tower service.

use std::fmt;
use std::marker::PhantomData;
use std::task::{Context, Poll};

use tower::Service;

use super::Handler;
use super::future::ResponseFuture;
use crate::error::HandlerError;
use crate::message::Message;

/// Turns an async fn or closure whose arguments are extractors into a
/// handler: a `tower::Service<Message, Response = (), Error = HandlerError>`.
///
/// See the [module docs](super) for the accepted signatures.
///
/// ```
/// use intake_core::{handler_fn, HandlerError, Message};
///
/// let handler = handler_fn(async |message: Message| -> Result<(), HandlerError> {
///     if message.payload().is_empty() {
///         return Err(HandlerError::permanent("empty payload"));
///     }
///     Ok(())
/// });
/// # drop(handler);
/// ```
pub fn handler_fn<F, Args>(f: F) -> HandlerFn<F, Args>
where
    F: Handler<Args>,
{
    HandlerFn {
        f,
        _args: PhantomData,
    }
}

/// A handler fn as a tower service; built by [`handler_fn`].
///
/// Always ready. Each call clones the fn (a closure's captures: keep them
/// cheap to clone, an `Arc` for shared state), extracts the arguments, and
/// returns the fn's future wrapped in a [`ResponseFuture`]; nothing is boxed.
pub struct HandlerFn<F, Args> {
    f: F,
    // `fn() -> Args`: the service owns no `Args`, so it is `Send`/`Sync`
    // whatever the extractors are.
    _args: PhantomData<fn() -> Args>,
}

impl<F, Args> HandlerFn<F, Args> {
    /// The wrapped fn.
    pub fn get_ref(&self) -> &F {
        &self.f
    }

    /// Unwraps the fn.
    pub fn into_inner(self) -> F {
        self.f
    }
}

impl<F: Clone, Args> Clone for HandlerFn<F, Args> {
    fn clone(&self) -> Self {
        Self {
            f: self.f.clone(),
            _args: PhantomData,
        }
    }
}

impl<F, Args> fmt::Debug for HandlerFn<F, Args> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerFn")
            .field("f", &std::any::type_name::<F>())
            .finish()
    }
}

impl<F, Args> Service<Message> for HandlerFn<F, Args>
where
    F: Handler<Args>,
{
    type Response = ();
    type Error = HandlerError;
    type Future = ResponseFuture<F::Future>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), HandlerError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, message: Message) -> Self::Future {
        match self.f.clone().call(message) {
            Ok(future) => ResponseFuture::running(future),
            Err(error) => ResponseFuture::rejected(error),
        }
    }
}
