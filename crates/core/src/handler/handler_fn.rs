//! [`handler_fn`]: an async fn as a tower service.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::task::{Context, Poll};

use tower::Service;

use super::Handler;
use super::future::ResponseFuture;
use super::into_result::IntoHandlerResult;
use crate::error::HandlerError;
use crate::message::Message;

/// Turns an async fn or closure whose arguments are extractors into a
/// handler: a `tower::Service<Message, Error = HandlerError>` answering `()`
/// (or, for a fn that returns outputs, the [`Outputs`] a
/// [`PublishLayer`] publishes).
///
/// [`Outputs`]: crate::publish::Outputs
/// [`PublishLayer`]: crate::publish::PublishLayer
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
        state: (),
        _args: PhantomData,
    }
}

/// [`handler_fn`] with a state: the fn's [`State<T>`](super::State)
/// arguments are taken from `state` (held once by the service; each message
/// gets a clone through [`FromRef`](super::FromRef), so keep it cheap to
/// clone: an `Arc`, a pool handle).
///
/// ```
/// use std::sync::Arc;
///
/// use intake_core::handler::{State, handler_fn_with_state};
/// use intake_core::Payload;
///
/// struct Database; // not `Clone`: shared through an `Arc`
///
/// let handler = handler_fn_with_state(
///     Arc::new(Database),
///     async |State(db): State<Arc<Database>>, Payload(payload): Payload| {
///         let _ = (db, payload);
///     },
/// );
/// # drop(handler);
/// ```
pub fn handler_fn_with_state<S, F, Args>(state: S, f: F) -> HandlerFn<F, Args, S>
where
    F: Handler<Args, S>,
{
    HandlerFn {
        f,
        state,
        _args: PhantomData,
    }
}

/// A handler fn as a tower service; built by [`handler_fn`].
///
/// Always ready. Each call clones the fn (a closure's captures: keep them
/// cheap to clone, an `Arc` for shared state), extracts the arguments, and
/// returns the fn's future wrapped in a [`ResponseFuture`]; nothing is boxed.
pub struct HandlerFn<F, Args, S = ()> {
    f: F,
    /// What `State` arguments are taken from.
    state: S,
    // `fn() -> Args`: the service owns no `Args`, so it is `Send`/`Sync`
    // whatever the extractors are.
    _args: PhantomData<fn() -> Args>,
}

impl<F, Args, S> HandlerFn<F, Args, S> {
    /// The wrapped fn.
    pub fn get_ref(&self) -> &F {
        &self.f
    }

    /// Unwraps the fn.
    pub fn into_inner(self) -> F {
        self.f
    }

    /// The state `State` arguments are taken from.
    pub fn state(&self) -> &S {
        &self.state
    }
}

impl<F: Clone, Args, S: Clone> Clone for HandlerFn<F, Args, S> {
    fn clone(&self) -> Self {
        Self {
            f: self.f.clone(),
            state: self.state.clone(),
            _args: PhantomData,
        }
    }
}

impl<F, Args, S> fmt::Debug for HandlerFn<F, Args, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerFn")
            .field("f", &std::any::type_name::<F>())
            .finish()
    }
}

impl<F, Args, S> Service<Message> for HandlerFn<F, Args, S>
where
    F: Handler<Args, S>,
{
    type Response = <<F::Future as Future>::Output as IntoHandlerResult>::Response;
    type Error = HandlerError;
    type Future = ResponseFuture<F::Future>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), HandlerError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, message: Message) -> Self::Future {
        match self.f.clone().call(message, &self.state) {
            Ok(future) => ResponseFuture::running(future),
            Err(error) => ResponseFuture::rejected(error),
        }
    }
}
