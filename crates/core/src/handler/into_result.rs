//! What a handler fn may return.

use crate::error::{BoxError, HandlerError};
use crate::publish::{Output, Outputs};

/// A handler fn's return value, turned into the runtime's verdict.
///
/// Implemented for:
/// - `()`: the message is done;
/// - [`Output`], `Option<Output>`, `Vec<Output>` or [`Outputs`] (or a
///   `Result` of one): messages to publish; the handler is then wrapped in a
///   [`PublishLayer`](crate::publish::PublishLayer), which completes the
///   message once they are confirmed;
/// - `Result<(), E>` for any `E: Into<BoxError>`: `Ok` is done; `Err` becomes
///   a [`HandlerError`]. A `HandlerError` keeps its class (build one with
///   [`HandlerError::permanent`] to skip retries); any other error (your own
///   error type, `Box<dyn Error>`, `anyhow::Error`, a `String`) is
///   [retryable](crate::ErrorClass::Retryable), as a failure of unknown cause
///   most often is transient and the retry layer caps it.
///
/// `E: Into<BoxError>` rather than `E: Into<HandlerError>` so that `?` works on
/// any error in a handler returning `Result<(), MyError>` or
/// `Result<(), anyhow::Error>` without a `From` impl for `HandlerError`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a handler result",
    label = "a handler fn returns `()`, `Result<(), E>`, or outputs to publish",
    note = "to complete the message, return `()` or `Result<(), E>`: `E` is `HandlerError` (to \
            choose retryable / permanent / ignore) or any error that converts into \
            `Box<dyn Error + Send + Sync>` (retryable)",
    note = "to publish outputs first, return `Output`, `Option<Output>`, `Vec<Output>` or `Outputs` \
            (or a `Result` of one) and wrap the handler in a `PublishLayer`"
)]
pub trait IntoHandlerResult {
    /// What the handler service answers on success: `()` (the message is
    /// done), or the [`Outputs`] a [`PublishLayer`](crate::publish::PublishLayer)
    /// publishes before the message is done.
    type Response;

    /// The verdict: `Ok` acknowledges the message (once its outputs, if
    /// any, are confirmed).
    fn into_handler_result(self) -> Result<Self::Response, HandlerError>;
}

impl IntoHandlerResult for () {
    type Response = ();

    fn into_handler_result(self) -> Result<(), HandlerError> {
        Ok(())
    }
}

impl<E> IntoHandlerResult for Result<(), E>
where
    E: Into<BoxError>,
{
    type Response = ();

    fn into_handler_result(self) -> Result<(), HandlerError> {
        // A `HandlerError` is boxed here and unboxed by `From<BoxError>`: one
        // allocation on the failure path only, for one rule that covers every
        // error type.
        self.map_err(|error| HandlerError::from(error.into()))
    }
}

/// Implements [`IntoHandlerResult`] for a value that converts into
/// [`Outputs`], returned as it is or in a `Result`.
macro_rules! outputs_result {
    ($($output:ty),*) => {$(
        impl IntoHandlerResult for $output {
            type Response = Outputs;

            fn into_handler_result(self) -> Result<Outputs, HandlerError> {
                Ok(self.into())
            }
        }

        impl<E> IntoHandlerResult for Result<$output, E>
        where
            E: Into<BoxError>,
        {
            type Response = Outputs;

            fn into_handler_result(self) -> Result<Outputs, HandlerError> {
                self.map(Into::into).map_err(|error| HandlerError::from(error.into()))
            }
        }
    )*};
}

outputs_result!(Outputs, Output, Option<Output>, Vec<Output>);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorClass;

    #[test]
    fn unit_is_done() {
        assert!(().into_handler_result().is_ok());
    }

    #[test]
    fn a_handler_error_keeps_its_class_and_attempts() {
        let result: Result<(), HandlerError> =
            Err(HandlerError::permanent("bad order").with_attempts(2));
        let error = result.into_handler_result().unwrap_err();
        assert_eq!(error.class(), ErrorClass::Permanent);
        assert_eq!(error.attempts(), 2);
    }

    #[test]
    fn a_boxed_handler_error_keeps_its_class() {
        let result: Result<(), BoxError> = Err(Box::new(HandlerError::ignore("other tenant")));
        let error = result.into_handler_result().unwrap_err();
        assert_eq!(error.class(), ErrorClass::Ignore);
    }

    #[test]
    fn any_other_error_is_retryable_and_keeps_its_message() {
        let result: Result<(), std::io::Error> =
            Err(std::io::Error::other("connection reset by peer"));
        let error = result.into_handler_result().unwrap_err();
        assert_eq!(error.class(), ErrorClass::Retryable);
        assert_eq!(error.cause().to_string(), "connection reset by peer");
    }

    #[test]
    fn a_string_error_is_retryable() {
        let result: Result<(), String> = Err("inventory service down".to_owned());
        assert!(result.into_handler_result().unwrap_err().is_retryable());
    }
}
