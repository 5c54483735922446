//! Handlers: what a user writes to process a message.
//!
//! A handler is any `tower::Service<Message, Response = ()>` whose error
//! converts into [`HandlerError`]; the runtime acknowledges the message from
//! the result. Most handlers are plain async fns made into services with
//! [`handler_fn`], in the way axum turns fns into services:
//!
//! ```
//! use intake_core::{handler_fn, HandlerError, Json, Meta};
//! use serde::Deserialize;
//!
//! #[derive(Deserialize)]
//! struct Order {
//!     id: u64,
//!     quantity: u32,
//! }
//!
//! async fn reserve(Meta(meta): Meta, Json(order): Json<Order>) -> Result<(), HandlerError> {
//!     if order.quantity == 0 {
//!         return Err(HandlerError::permanent(format!("order {} has no items", order.id)));
//!     }
//!     tracing::info!(position = %meta.position(), order = order.id, "reserved");
//!     Ok(())
//! }
//!
//! let from_fn = handler_fn(reserve);
//! let from_closure = handler_fn(|Json(order): Json<Order>| async move {
//!     tracing::info!(order = order.id, "seen");
//! });
//! # drop((from_fn, from_closure));
//! ```
//!
//! # Accepted signatures
//!
//! `async fn(A1, …, An) -> R`, or a closure returning a future, or an async
//! closure (`async |…| { … }`), with 0 to 8 arguments:
//!
//! - every argument but the last implements [`FromMessageParts`]: it reads
//!   metadata from a borrowed message ([`Meta`], [`Key`],
//!   [`Headers`](crate::Headers));
//! - the last implements [`FromMessage`]: it may consume the message
//!   ([`Json<T>`](crate::Json), [`Decoded<T>`](crate::Decoded), [`Payload`],
//!   [`Message`]), or be a `FromMessageParts` extractor too;
//! - `R` is `()` or `Result<(), E>` where `E: Into<BoxError>`, or outputs
//!   to publish ([`Output`](crate::publish::Output) and the like, for a
//!   handler inside a [`PublishLayer`](crate::publish::PublishLayer)); see
//!   [`IntoHandlerResult`] for how an error is classified.
//!
//! If an extractor fails (a payload that is not valid JSON, say), the fn does
//! not run and the message gets the extractor's error; a decode failure is
//! [permanent](HandlerError::permanent).
//!
//! The fn is cloned for each message, so keep a closure's captures cheap to
//! clone: shared state goes in an `Arc`, or, better, is given once to
//! [`handler_fn_with_state`] (or [`App::handler`](crate::app::App::handler))
//! and taken as a [`State<T>`] argument (see [`state`]).
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//!
//! use intake_core::{handler_fn, Key, Payload};
//!
//! let bytes_seen = Arc::new(AtomicU64::new(0));
//! let handler = handler_fn(async move |Key(_key): Key, Payload(payload): Payload| {
//!     bytes_seen.fetch_add(payload.len() as u64, Ordering::Relaxed);
//! });
//! # drop(handler);
//! ```
//!
//! A fn that is not a handler is rejected with an error that names what is
//! wrong and the usual fix: the argument that is not an extractor or not in
//! its place, the `State<T>` the handler's state does not provide, the
//! return type. Here the payload extractor is not last, and the error is
//! ``handler argument `Payload` cannot be extracted from a message's
//! metadata`` with a note to move it last:
//!
//! ```compile_fail
//! use intake_core::{handler_fn, Key, Payload};
//!
//! let handler = handler_fn(async |Payload(payload): Payload, Key(key): Key| {});
//! ```
//!
//! `tests/compile_errors.rs` checks these errors word for word
//! (`tests/ui/`).
//!
//! # Cost
//!
//! Extraction is synchronous and the service's future is a named type
//! ([`ResponseFuture`]), so calling a `HandlerFn` allocates nothing beyond
//! what the fn itself and its extractors do (decoding JSON into a struct of
//! numbers allocates nothing).
//!
//! [`BoxError`]: crate::BoxError

mod args;
mod extract;
mod future;
mod handler_fn;
mod into_result;
mod settles;
pub mod state;

use std::future::Future;

pub use extract::{FromMessage, FromMessageParts, Key, Meta, Payload};
pub use future::ResponseFuture;
pub use handler_fn::{HandlerFn, handler_fn, handler_fn_with_state};
pub use into_result::IntoHandlerResult;
pub use settles::Settles;
pub use state::{FromRef, State};

use crate::error::HandlerError;
use crate::message::Message;
use args::{HandlerArgs, HandlerSignature};

/// An async fn (or closure) whose arguments are extractors: what
/// [`handler_fn`] accepts (and [`handler_fn_with_state`], with the state
/// `S` that [`State`] arguments are taken from). `Args` records the
/// argument types, so one fn type has one implementation; you never name
/// it.
///
/// Implemented for every `FnOnce(A1, …, An) -> Fut + Clone` with `n <= 8`
/// where `A1 … An-1: FromMessageParts` (or are a `State<T>`), `An:
/// FromMessage` (or a `State<T>`) and `Fut::Output: IntoHandlerResult`. See
/// the [module docs](self).
///
/// A fn that is not one is refused with an error naming what is wrong: the
/// argument that is not an extractor (or not in its place), the `State<T>`
/// the handler's state does not provide, or the return type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an intake handler fn",
    label = "expected an async fn taking extractors",
    note = "a handler fn is `async fn(A1, …, An) -> R` with at most 8 arguments (a closure \
            returning a future, or an async closure); a sync fn is not one: make it `async`",
    note = "`A1` to `An-1` implement `FromMessageParts` (`Meta`, `Key`, `Headers`) or are a \
            `State<T>`; `An` may consume the message (`Json<T>`, `Decoded<T>`, `Payload`, \
            `Message`): the payload extractor goes last",
    note = "`R` is `()`, `Result<(), E>`, or outputs to publish (`Output`, `Outputs`, or a \
            `Result` of one)",
    note = "a closure needs its argument types written out: `async |Json(order): Json<Order>| {{ … }}`"
)]
pub trait Handler<Args, S = ()>: Clone + Sized {
    /// The fn's future.
    type Future: Future<Output: IntoHandlerResult>;

    /// Extracts the arguments from `message` (and `state`) and calls the
    /// fn, or returns the error of the first extractor that failed.
    fn call(self, message: Message, state: &S) -> Result<Self::Future, HandlerError>;
}

// One impl for every arity, in two steps (see `args`): the fn's signature
// fixes `Args`, then `Args` must be extractors. The order of the bounds is
// the order the compiler proves them in; a failing extractor is then
// reported by name.
impl<F, Args, S> Handler<Args, S> for F
where
    F: HandlerSignature<Args> + Clone,
    Args: HandlerArgs<S, Values = <F as HandlerSignature<Args>>::Values>,
    <F as HandlerSignature<Args>>::Future: Future<Output: IntoHandlerResult>,
{
    type Future = <F as HandlerSignature<Args>>::Future;

    #[inline]
    fn call(self, message: Message, state: &S) -> Result<Self::Future, HandlerError> {
        Args::call(self, message, state)
    }
}

#[cfg(test)]
mod tests;
