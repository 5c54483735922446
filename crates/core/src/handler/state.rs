//! [`State<T>`]: shared state as a handler fn argument, axum's way.
//!
//! A handler fn made with [`handler_fn_with_state`](super::handler_fn_with_state)
//! (or [`App::handler`](crate::app::App::handler)) holds the state once; a
//! `State<T>` argument gets `T` from it through [`FromRef`] for each message.
//! The state is shared, not copied: keep it cheap to clone (an `Arc`, or a
//! pool that is one), and take parts of a larger state with `FromRef`.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//!
//! use intake_core::handler::{FromRef, State, handler_fn_with_state};
//! use intake_core::Json;
//!
//! /// Not `Clone`: shared through an `Arc`.
//! struct Ledger {
//!     total: AtomicU64,
//! }
//!
//! #[derive(Clone)]
//! struct Services {
//!     ledger: Arc<Ledger>,
//!     region: Arc<str>,
//! }
//!
//! // A handler that needs only the ledger takes just that part.
//! impl FromRef<Services> for Arc<Ledger> {
//!     fn from_ref(services: &Services) -> Self {
//!         services.ledger.clone()
//!     }
//! }
//!
//! async fn bill(State(ledger): State<Arc<Ledger>>, Json(amount): Json<u64>) {
//!     ledger.total.fetch_add(amount, Ordering::Relaxed);
//! }
//!
//! let services = Services {
//!     ledger: Arc::new(Ledger { total: AtomicU64::new(0) }),
//!     region: "eu".into(),
//! };
//! let handler = handler_fn_with_state(services, bill);
//! # drop(handler);
//! ```
//!
//! A state that is not `Clone` is refused with a note that says to share
//! it, not to derive `Clone` (which would copy it for every message):
//!
//! ```compile_fail
//! use intake_core::handler::{State, handler_fn_with_state};
//!
//! struct Pool;
//!
//! let handler = handler_fn_with_state(Pool, async |State(pool): State<Pool>| {});
//! ```

use super::extract::{FromMessage, FromMessageParts};
use crate::error::HandlerError;
use crate::message::Message;

/// The handler's state, or the part of it `T` names ([`FromRef`]).
///
/// See the [module docs](self).
#[derive(Clone, Copy, Debug, Default)]
pub struct State<T>(pub T);

/// How a `State<Self>` argument is made from the handler's state `S`: a
/// clone of `S` itself (any `Clone` state), or a part of it you name.
#[diagnostic::on_unimplemented(
    message = "`State<{Self}>` cannot be taken from the handler's state `{S}`",
    label = "`{Self}` is not `{S}`, nor a part of it with `FromRef<{S}>`",
    note = "for a part of a larger state, implement `FromRef<{S}>` for `{Self}`",
    note = "share the state, do not copy it: give it once (`App::with_state(state)`, \
            `handler_fn_with_state(state, f)`) and put what is not `Clone` in an `Arc` \
            (`State<Arc<{Self}>>`); deriving `Clone` on it would give every message its own copy"
)]
pub trait FromRef<S> {
    /// Takes `Self` from the state (a cheap clone: a reference count, a
    /// pool handle).
    fn from_ref(state: &S) -> Self;
}

impl<T: Clone> FromRef<T> for T {
    fn from_ref(state: &T) -> Self {
        state.clone()
    }
}

/// An argument before the last one of a handler fn with state `S`: a
/// [`FromMessageParts`] extractor or a [`State`]. Implemented for those;
/// you never implement it.
// The compiler shows this message only for the types that have an impl
// of their own besides the `FromMessageParts` one (`State`, `Publish`):
// for any other type it names the `FromMessageParts` bound that failed.
#[diagnostic::on_unimplemented(
    message = "handler argument `{Self}` cannot be taken from the handler's state `{S}`",
    label = "the handler's state is `{S}`",
    note = "a `State<T>` (or `Publish<T>`) argument takes `T` from the handler's state through \
            `FromRef`: `T` is the state itself (which must be `Clone`), or a part of it for which \
            you implement `FromRef<{S}>`",
    note = "give the state once: `App::with_state(state)` and `app.handler(f)`, or \
            `handler_fn_with_state(state, f)`; a `handler_fn(f)` has no state (`()`)",
    note = "share what is not `Clone` through an `Arc` (`State<Arc<T>>`): deriving `Clone` on it \
            would give every message its own copy"
)]
pub trait FromMessagePartsAndState<S>: Sized {
    /// Extracts `Self`, or fails with the error the message gets instead of
    /// running the handler.
    fn from_parts_and_state(message: &Message, state: &S) -> Result<Self, HandlerError>;
}

impl<S, T: FromMessageParts> FromMessagePartsAndState<S> for T {
    #[inline]
    fn from_parts_and_state(message: &Message, _state: &S) -> Result<Self, HandlerError> {
        T::from_message_parts(message)
    }
}

impl<S, T: FromRef<S>> FromMessagePartsAndState<S> for State<T> {
    #[inline]
    fn from_parts_and_state(_message: &Message, state: &S) -> Result<Self, HandlerError> {
        Ok(State(T::from_ref(state)))
    }
}

/// The last argument of a handler fn with state `S`: a [`FromMessage`]
/// extractor or a [`State`]. `M` tells them apart; implemented for those,
/// you never implement it.
// As above: shown for `State` and `Publish` only, others name their
// `FromMessage` bound.
#[diagnostic::on_unimplemented(
    message = "handler argument `{Self}` cannot be taken from the handler's state `{S}`",
    label = "the handler's state is `{S}`",
    note = "a `State<T>` (or `Publish<T>`) argument takes `T` from the handler's state through \
            `FromRef`: `T` is the state itself (which must be `Clone`), or a part of it for which \
            you implement `FromRef<{S}>`",
    note = "give the state once: `App::with_state(state)` and `app.handler(f)`, or \
            `handler_fn_with_state(state, f)`; a `handler_fn(f)` has no state (`()`)",
    note = "share what is not `Clone` through an `Arc` (`State<Arc<T>>`): deriving `Clone` on it \
            would give every message its own copy"
)]
pub trait FromMessageAndState<S, M>: Sized {
    /// Extracts `Self`, or fails with the error the message gets instead of
    /// running the handler.
    fn from_message_and_state(message: Message, state: &S) -> Result<Self, HandlerError>;
}

impl<S, M, T: FromMessage<M>> FromMessageAndState<S, (M,)> for T {
    #[inline]
    fn from_message_and_state(message: Message, _state: &S) -> Result<Self, HandlerError> {
        T::from_message(message)
    }
}

/// Marks a [`State`] as the last argument.
#[doc(hidden)]
#[derive(Debug)]
pub enum ViaState {}

impl<S, T: FromRef<S>> FromMessageAndState<S, ViaState> for State<T> {
    #[inline]
    fn from_message_and_state(_message: Message, state: &S) -> Result<Self, HandlerError> {
        Ok(State(T::from_ref(state)))
    }
}
