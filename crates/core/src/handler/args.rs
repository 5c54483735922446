//! How [`Handler`](super::Handler) is implemented: in two steps, so that a
//! wrong argument is named in the compile error.
//!
//! One blanket `Handler` impl asks two things of a fn: [`HandlerSignature`]
//! (an `FnOnce` of some arity returning a future; one impl per arity, told
//! apart by the fn's own signature) and [`HandlerArgs`] (its argument types
//! are extractors; one impl per tuple length). The first fixes the argument
//! tuple, so the second has a single candidate impl, and the compiler
//! reports the argument whose extractor bound fails (``the trait
//! `FromMessageParts` is not implemented for `Payload` ``) rather than
//! "`Handler` is not implemented" for the whole fn, which is what it says
//! when the extractor bounds sit on nine per-arity impls that all fail.

use std::future::Future;

use super::state::{FromMessageAndState, FromMessagePartsAndState};
use crate::error::HandlerError;
use crate::message::Message;

/// A fn of some arity returning a future: the shape of a handler fn,
/// whatever its argument types. `Args` is the argument tuple with the last
/// argument's marker first (see [`HandlerArgs`]).
///
/// Implemented for every `FnOnce(T1, …, Tn) -> Fut` with `n <= 8` and `Fut:
/// Future`; you never implement or name it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an async fn of at most 8 arguments",
    label = "expected an async fn (or a closure returning a future) taking extractors",
    note = "a handler fn is `async fn(A1, …, An) -> R` with at most 8 arguments; a sync fn \
            is not one: make it `async`",
    note = "a closure needs its argument types written out: `async |Json(order): Json<Order>| {{ … }}`"
)]
pub trait HandlerSignature<Args>: Sized {
    /// The fn's future.
    type Future: Future;

    /// The fn's arguments, in order.
    type Values;

    /// Calls the fn.
    fn call_with(self, values: Self::Values) -> Self::Future;
}

/// The argument types of a handler fn with state `S`: every one but the
/// last a [`FromMessagePartsAndState`], the last a [`FromMessageAndState`]
/// (whose marker `M` is the tuple's first element).
///
/// Implemented for those tuples of up to 8 arguments; you never implement
/// or name it.
pub trait HandlerArgs<S>: Sized {
    /// The extracted arguments, in order.
    type Values;

    /// Extracts the arguments in order and calls `f` with them, or returns
    /// the error of the first extractor that failed.
    ///
    /// One step rather than "extract, then call": the arguments go straight
    /// into the call instead of through a `Result` of their tuple, which
    /// the optimizer did not see through (25 instructions per message more
    /// on `benches/callgrind.sh pipeline_json`).
    fn call<F>(f: F, message: Message, state: &S) -> Result<F::Future, HandlerError>
    where
        F: HandlerSignature<Self, Values = Self::Values>;
}

impl<F, Fut> HandlerSignature<()> for F
where
    F: FnOnce() -> Fut,
    Fut: Future,
{
    type Future = Fut;
    type Values = ();

    #[inline]
    fn call_with(self, (): ()) -> Fut {
        self()
    }
}

impl<S> HandlerArgs<S> for () {
    type Values = ();

    #[inline]
    fn call<F>(f: F, _message: Message, _state: &S) -> Result<F::Future, HandlerError>
    where
        F: HandlerSignature<Self, Values = ()>,
    {
        Ok(f.call_with(()))
    }
}

/// Implements [`HandlerSignature`] and [`HandlerArgs`] for fns whose
/// metadata extractors are `$parts` and whose last argument is `$last`.
macro_rules! impl_handler_args {
    ([$($parts:ident),*], $last:ident) => {
        #[allow(non_snake_case)]
        impl<F, Fut, M, $($parts,)* $last> HandlerSignature<(M, $($parts,)* $last,)> for F
        where
            F: FnOnce($($parts,)* $last) -> Fut,
            Fut: Future,
        {
            type Future = Fut;
            type Values = ($($parts,)* $last,);

            #[inline]
            fn call_with(self, ($($parts,)* $last,): Self::Values) -> Fut {
                self($($parts,)* $last)
            }
        }

        #[allow(non_snake_case)]
        impl<S, M, $($parts,)* $last> HandlerArgs<S> for (M, $($parts,)* $last,)
        where
            $($parts: FromMessagePartsAndState<S>,)*
            $last: FromMessageAndState<S, M>,
        {
            type Values = ($($parts,)* $last,);

            #[inline]
            fn call<F>(f: F, message: Message, state: &S) -> Result<F::Future, HandlerError>
            where
                F: HandlerSignature<Self, Values = Self::Values>,
            {
                $(let $parts = $parts::from_parts_and_state(&message, state)?;)*
                let $last = $last::from_message_and_state(message, state)?;
                Ok(f.call_with(($($parts,)* $last,)))
            }
        }
    };
}

impl_handler_args!([], T1);
impl_handler_args!([T1], T2);
impl_handler_args!([T1, T2], T3);
impl_handler_args!([T1, T2, T3], T4);
impl_handler_args!([T1, T2, T3, T4], T5);
impl_handler_args!([T1, T2, T3, T4, T5], T6);
impl_handler_args!([T1, T2, T3, T4, T5, T6], T7);
impl_handler_args!([T1, T2, T3, T4, T5, T6, T7], T8);
