//! [`Panicked`]: the error a caught panic becomes.

use std::any::Any;
use std::fmt;

/// A handler panicked. Carried as the cause of a
/// [`HandlerError::panicked`](crate::error::HandlerError::panicked) (retryable;
/// [`is_panic`](crate::error::HandlerError::is_panic) says so, also after a
/// layer settled it); find it with
/// `error.cause().downcast_ref::<Panicked>()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Panicked {
    message: String,
}

impl Panicked {
    /// A panic with `message`.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }

    /// Reads the message out of a panic payload (`panic!("...")` carries a
    /// `&str` or a `String`; `panic_any` may carry anything).
    pub fn from_payload(payload: &(dyn Any + Send)) -> Self {
        let message = if let Some(message) = payload.downcast_ref::<&'static str>() {
            (*message).to_owned()
        } else if let Some(message) = payload.downcast_ref::<String>() {
            message.clone()
        } else {
            "a panic with a payload that is not a string".to_owned()
        };
        Self { message }
    }

    /// The panic message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Panicked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the handler panicked: {}", self.message)
    }
}

impl std::error::Error for Panicked {}
