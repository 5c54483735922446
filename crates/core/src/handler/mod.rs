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
//! - `R` is `()` or `Result<(), E>` where `E: Into<BoxError>`; see
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
//! A fn that is not a handler is rejected with a message that says what is
//! accepted; here the payload extractor is not last:
//!
//! ```compile_fail
//! use intake_core::{handler_fn, Key, Payload};
//!
//! let handler = handler_fn(async |Payload(payload): Payload, Key(key): Key| {});
//! ```
//!
//! # Cost
//!
//! Extraction is synchronous and the service's future is a named type
//! ([`ResponseFuture`]), so calling a `HandlerFn` allocates nothing beyond
//! what the fn itself and its extractors do (decoding JSON into a struct of
//! numbers allocates nothing).
//!
//! [`BoxError`]: crate::BoxError

mod extract;
mod future;
mod handler_fn;
mod into_result;
pub mod state;

use std::future::Future;

pub use extract::{FromMessage, FromMessageParts, Key, Meta, Payload};
pub use future::ResponseFuture;
pub use handler_fn::{HandlerFn, handler_fn, handler_fn_with_state};
pub use into_result::IntoHandlerResult;
pub use state::{FromRef, State};

use crate::error::HandlerError;
use crate::message::Message;
use state::{FromMessageAndState, FromMessagePartsAndState};

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
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an intake handler fn",
    label = "expected an async fn taking extractors and returning `()` or `Result<(), E>`",
    note = "a handler fn is `async fn(A1, …, An) -> R` with at most 8 arguments",
    note = "`A1` to `An-1` read metadata: they implement `FromMessageParts` (`Meta`, `Key`, `Headers`)",
    note = "`An` may consume the payload: it implements `FromMessage` (`Json<T>`, `Decoded<T>`, \
            `Payload`, `Message`) or `FromMessageParts`; the payload extractor goes last",
    note = "`R` is `()` or `Result<(), E>` with `E: Into<BoxError>` (`HandlerError`, your error type)",
    note = "a closure needs its argument types written out: `async |Json(order): Json<Order>| {{ … }}`",
    note = "the fn is cloned for each message: share state rather than copy it, as a `State<T>` \
            argument (`handler_fn_with_state(state, f)`, `app.handler(f)`) or a captured `Arc`; \
            deriving `Clone` on the state would give every message its own copy",
    note = "a `State<T>` argument takes `T` from the handler's state by `FromRef`: any `Clone` \
            state (put what is not `Clone` in an `Arc`), or a part of it you implement `FromRef` for"
)]
pub trait Handler<Args, S = ()>: Clone + Sized {
    /// The fn's future.
    type Future: Future<Output: IntoHandlerResult>;

    /// Extracts the arguments from `message` (and `state`) and calls the
    /// fn, or returns the error of the first extractor that failed.
    fn call(self, message: Message, state: &S) -> Result<Self::Future, HandlerError>;
}

impl<F, Fut, S> Handler<(), S> for F
where
    F: FnOnce() -> Fut + Clone,
    Fut: Future<Output: IntoHandlerResult>,
{
    type Future = Fut;

    fn call(self, _message: Message, _state: &S) -> Result<Fut, HandlerError> {
        Ok(self())
    }
}

/// Implements [`Handler`] for fns whose metadata extractors are `$parts` and
/// whose last argument is `$last`. `M` tells a direct `FromMessage` last
/// argument from a `FromMessageParts` one or a `State`.
macro_rules! impl_handler {
    ([$($parts:ident),*], $last:ident) => {
        #[allow(non_snake_case)]
        impl<F, Fut, S, M, $($parts,)* $last> Handler<(M, $($parts,)* $last,), S> for F
        where
            F: FnOnce($($parts,)* $last) -> Fut + Clone,
            Fut: Future<Output: IntoHandlerResult>,
            $($parts: FromMessagePartsAndState<S>,)*
            $last: FromMessageAndState<S, M>,
        {
            type Future = Fut;

            #[inline]
            fn call(self, message: Message, state: &S) -> Result<Fut, HandlerError> {
                $(let $parts = $parts::from_parts_and_state(&message, state)?;)*
                let $last = <$last as FromMessageAndState<S, M>>::from_message_and_state(message, state)?;
                Ok(self($($parts,)* $last))
            }
        }
    };
}

/// Calls `$name!([metadata extractors], last)` for every arity from 1 to 8.
macro_rules! for_each_arity {
    ($name:ident) => {
        $name!([], T1);
        $name!([T1], T2);
        $name!([T1, T2], T3);
        $name!([T1, T2, T3], T4);
        $name!([T1, T2, T3, T4], T5);
        $name!([T1, T2, T3, T4, T5], T6);
        $name!([T1, T2, T3, T4, T5, T6], T7);
        $name!([T1, T2, T3, T4, T5, T6, T7], T8);
    };
}

for_each_arity!(impl_handler);

#[cfg(test)]
mod tests;
