//! What the dead-letter layer reports: [`DeadLettered`], [`Discarded`] and
//! [`DeadLetterWriteFailed`].
//!
//! The first two end a message (the layer returns them inside a
//! [`HandlerError`] of class [`Ignore`](crate::error::ErrorClass::Ignore), so
//! the runtime acknowledges it) and keep the original failure, so that
//! metrics and traces still see why the message failed.

use std::fmt;

use super::DeadLetterError;
use crate::error::HandlerError;

/// The message failed for good and is now in the dead-letter destination.
#[derive(Debug)]
pub struct DeadLettered {
    pub(super) error: HandlerError,
}

impl DeadLettered {
    /// The failure that sent the message to the dead-letter destination.
    pub fn error(&self) -> &HandlerError {
        &self.error
    }
}

impl fmt::Display for DeadLettered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dead-lettered after: {}", self.error)
    }
}

impl std::error::Error for DeadLettered {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// The message failed for good and was dropped, as its
/// [`FailurePolicy`](super::FailurePolicy) asked.
#[derive(Debug)]
pub struct Discarded {
    pub(super) error: HandlerError,
}

impl Discarded {
    /// The failure that made the layer discard the message.
    pub fn error(&self) -> &HandlerError {
        &self.error
    }
}

impl fmt::Display for Discarded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "discarded after: {}", self.error)
    }
}

impl std::error::Error for Discarded {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// The message failed for good, and writing it to the dead-letter
/// destination failed too. It is left unacknowledged (a retryable error) and
/// will be delivered again; check the dead-letter destination (does it
/// exist, may this consumer write to it?).
#[derive(Debug)]
pub struct DeadLetterWriteFailed {
    pub(super) error: HandlerError,
    pub(super) write: DeadLetterError,
}

impl DeadLetterWriteFailed {
    /// The handler's failure.
    pub fn error(&self) -> &HandlerError {
        &self.error
    }

    /// Why the write failed.
    pub fn write_error(&self) -> &DeadLetterError {
        &self.write
    }
}

impl fmt::Display for DeadLetterWriteFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (left unacknowledged for redelivery) after the handler failed: {}",
            self.write, self.error
        )
    }
}

impl std::error::Error for DeadLetterWriteFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.write)
    }
}
