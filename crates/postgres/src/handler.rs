//! What an exactly-once handler is: an async fn whose first argument is the
//! [`Tx`] and whose other arguments are intake extractors.

use std::future::Future;

use intake_core::{BoxError, FromMessage, FromMessageParts, HandlerError, Message};

use crate::classify::classify_boxed;
use crate::tx::Tx;

/// An async fn (or closure) that [`exactly_once`](crate::exactly_once)
/// accepts: `async fn(Tx, A1, …, An) -> R` with `n <= 7`, where `A1 … An-1`
/// implement [`FromMessageParts`] (`Meta`, `Key`, `Headers`), `An`
/// implements [`FromMessage`] (`Json<T>`, `Payload`, `Message`, or a parts
/// extractor), and `R` is `()` or `Result<(), E>` ([`IntoTxResult`]).
///
/// `Args` records the argument types, so one fn type has one
/// implementation; you never name it. The fn is cloned for each message,
/// so keep a closure's captures cheap to clone (an `Arc` for shared state).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an exactly-once handler fn",
    label = "expected an async fn taking a `Tx` first, then extractors, and returning `()` or `Result<(), E>`",
    note = "an exactly-once handler is `async fn(Tx, A1, …, An) -> R` with at most 7 extractors",
    note = "`A1` to `An-1` read metadata (`Meta`, `Key`, `Headers`); `An` may consume the payload \
            (`Json<T>`, `Decoded<T>`, `Payload`, `Message`)",
    note = "the fn and its future must be `Send + 'static`: move owned data into `async move`",
    note = "a closure needs its argument types written out: `async move |tx: Tx, Json(order): Json<Order>| {{ … }}`"
)]
pub trait TxHandler<Args>: Clone + Send + Sized + 'static {
    /// The extracted arguments (all but the `Tx`).
    type Extracted: Send + 'static;
    /// The fn's future.
    type Future: Future<Output: IntoTxResult> + Send + 'static;

    /// Extracts the arguments from `message`, before any database work, or
    /// returns the error of the first extractor that failed.
    fn extract(message: Message) -> Result<Self::Extracted, HandlerError>;

    /// Calls the fn.
    fn call(self, tx: Tx, extracted: Self::Extracted) -> Self::Future;
}

impl<F, Fut> TxHandler<()> for F
where
    F: FnOnce(Tx) -> Fut + Clone + Send + 'static,
    Fut: Future<Output: IntoTxResult> + Send + 'static,
{
    type Extracted = ();
    type Future = Fut;

    fn extract(_message: Message) -> Result<(), HandlerError> {
        Ok(())
    }

    fn call(self, tx: Tx, (): ()) -> Fut {
        self(tx)
    }
}

/// Implements [`TxHandler`] for fns taking a `Tx`, the metadata extractors
/// `$parts` and the last extractor `$last`.
macro_rules! impl_tx_handler {
    ([$($parts:ident),*], $last:ident) => {
        #[allow(non_snake_case)]
        impl<F, Fut, M, $($parts,)* $last> TxHandler<(M, $($parts,)* $last,)> for F
        where
            F: FnOnce(Tx, $($parts,)* $last) -> Fut + Clone + Send + 'static,
            Fut: Future<Output: IntoTxResult> + Send + 'static,
            $($parts: FromMessageParts + Send + 'static,)*
            $last: FromMessage<M> + Send + 'static,
        {
            type Extracted = ($($parts,)* $last,);
            type Future = Fut;

            fn extract(message: Message) -> Result<Self::Extracted, HandlerError> {
                $(let $parts = $parts::from_message_parts(&message)?;)*
                let $last = <$last as FromMessage<M>>::from_message(message)?;
                Ok(($($parts,)* $last,))
            }

            fn call(self, tx: Tx, ($($parts,)* $last,): Self::Extracted) -> Fut {
                self(tx, $($parts,)* $last)
            }
        }
    };
}

impl_tx_handler!([], T1);
impl_tx_handler!([T1], T2);
impl_tx_handler!([T1, T2], T3);
impl_tx_handler!([T1, T2, T3], T4);
impl_tx_handler!([T1, T2, T3, T4], T5);
impl_tx_handler!([T1, T2, T3, T4, T5], T6);
impl_tx_handler!([T1, T2, T3, T4, T5, T6], T7);

/// What an exactly-once handler returns.
///
/// - `()`: commit.
/// - `Result<(), E>` with `E: Into<BoxError>`: `Ok` commits; `Err` rolls back
///   (the marker too) and becomes the message's [`HandlerError`]. A
///   `HandlerError` keeps its class; a `sqlx::Error` (returned directly, or
///   as the source of your error) is classified by its SQLSTATE
///   ([`error_class`](crate::error_class)): a constraint violation is
///   permanent, a serialization failure or deadlock retryable; any other
///   error is retryable.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an exactly-once handler result",
    label = "an exactly-once handler returns `()` or `Result<(), E>`",
    note = "return `()`, `Result<(), sqlx::Error>`, `Result<(), HandlerError>` or `Result<(), E>` \
            for any `E: Into<Box<dyn Error + Send + Sync>>`"
)]
pub trait IntoTxResult {
    /// The verdict: `Ok(())` commits.
    fn into_tx_result(self) -> Result<(), HandlerError>;
}

impl IntoTxResult for () {
    fn into_tx_result(self) -> Result<(), HandlerError> {
        Ok(())
    }
}

impl<E> IntoTxResult for Result<(), E>
where
    E: Into<BoxError>,
{
    fn into_tx_result(self) -> Result<(), HandlerError> {
        self.map_err(|error| classify_boxed(error.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn database_error(code: &'static str) -> sqlx::Error {
        #[derive(Debug)]
        struct Coded(&'static str);
        impl std::fmt::Display for Coded {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "error {}", self.0)
            }
        }
        impl std::error::Error for Coded {}
        impl sqlx::error::DatabaseError for Coded {
            fn message(&self) -> &str {
                "coded"
            }
            fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
                Some(self.0.into())
            }
            fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
                self
            }
            fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
                self
            }
            fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
                self
            }
            fn kind(&self) -> sqlx::error::ErrorKind {
                sqlx::error::ErrorKind::Other
            }
        }
        sqlx::Error::Database(Box::new(Coded(code)))
    }

    #[test]
    fn a_returned_constraint_violation_is_permanent() {
        let result: Result<(), sqlx::Error> = Err(database_error("23505"));
        assert!(result.into_tx_result().unwrap_err().is_permanent());
    }

    #[test]
    fn a_returned_deadlock_is_retryable() {
        let result: Result<(), sqlx::Error> = Err(database_error("40P01"));
        assert!(result.into_tx_result().unwrap_err().is_retryable());
    }

    #[test]
    fn a_constraint_violation_wrapped_in_the_users_error_is_still_permanent() {
        #[derive(Debug, thiserror::Error)]
        #[error("could not store the order")]
        struct StoreError(#[source] sqlx::Error);
        let result: Result<(), StoreError> = Err(StoreError(database_error("23503")));
        assert!(result.into_tx_result().unwrap_err().is_permanent());
    }

    #[test]
    fn an_explicit_retryable_class_beats_the_sqlstate() {
        let result: Result<(), HandlerError> =
            Err(HandlerError::retryable(database_error("23503")));
        assert!(result.into_tx_result().unwrap_err().is_retryable());
    }
}
