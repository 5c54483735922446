//! [`AnyBrokerError`]: what went wrong deriving a part, as the backend
//! said it.

use std::error::Error;
use std::fmt;

any_part! {
    /// What went wrong deriving a part from an
    /// [`AnyBroker`](super::AnyBroker): the backend's own error, unchanged.
    ///
    /// It adds no level of its own: `Display` and
    /// [`source`](Error::source) are the backend error's, so an error chain
    /// reads as on that backend. Match on the variant to reach the
    /// backend's type (its `is_transient` and the like).
    #[derive(Debug)]
    AnyBrokerError: Error, "error"
}

impl fmt::Display for AnyBrokerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        dispatch!(self, error => fmt::Display::fmt(error, f))
    }
}

impl Error for AnyBrokerError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        dispatch!(self, error => error.source())
    }
}
