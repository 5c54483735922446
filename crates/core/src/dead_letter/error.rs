//! What the dead-letter layer reports: [`DeadLettered`], [`Discarded`] and
//! [`DeadLetterWriteFailed`].
//!
//! The first two end a message (the layer returns them inside a
//! [`HandlerError::settled`] as [`Outcome::DeadLettered`](crate::Outcome::DeadLettered)
//! or [`Outcome::Discarded`](crate::Outcome::Discarded), of class
//! [`Ignore`](crate::error::ErrorClass::Ignore), so the runtime acknowledges
//! it and counts it by the outcome) and keep the original failure as their
//! source, so that metrics and traces still see why the message failed. The
//! runtime reads the outcome, not these types; they are here for a reader
//! who wants the details (the failure, whether only a reference was
//! written).

use std::fmt;

use super::DeadLetterError;
use crate::error::{ErrorChain, HandlerError};
use crate::redact::Capped;

/// The message failed for good and is now in the dead-letter destination,
/// whole or as a [reference](super::PayloadReference).
#[derive(Debug)]
pub struct DeadLettered {
    pub(super) error: HandlerError,
    pub(super) reference: bool,
}

impl DeadLettered {
    /// The failure that sent the message to the dead-letter destination.
    pub fn error(&self) -> &HandlerError {
        &self.error
    }

    /// Whether the destination holds only a reference to the message (its
    /// letter could not be written): its payload is only at its origin.
    pub fn is_reference(&self) -> bool {
        self.reference
    }
}

impl fmt::Display for DeadLettered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reference {
            true => f.write_str("the message failed and was dead-lettered as a reference"),
            false => f.write_str("the message failed and was dead-lettered"),
        }
    }
}

impl std::error::Error for DeadLettered {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// The message failed for good and was dropped, as its
/// [`FailurePolicy`](super::FailurePolicy) asked (perhaps as the fallback of
/// a dead-letter policy whose destination took neither the letter nor its
/// reference).
#[derive(Debug)]
pub struct Discarded {
    pub(super) error: HandlerError,
    pub(super) undeliverable: Option<DeadLetterError>,
}

impl Discarded {
    /// The failure that made the layer discard the message.
    pub fn error(&self) -> &HandlerError {
        &self.error
    }

    /// Why it was not dead-lettered, when the discard was a dead-letter
    /// policy's fallback.
    pub fn undeliverable(&self) -> Option<&DeadLetterError> {
        self.undeliverable.as_ref()
    }
}

impl fmt::Display for Discarded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the message failed and was discarded")
    }
}

impl std::error::Error for Discarded {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// The message failed for good, and writing it to the dead-letter
/// destination failed too, its reference included. It is left
/// unacknowledged (a retryable error) and will be delivered again; check the
/// dead-letter destination (does it exist, may this consumer write to it?),
/// or give the policy a [fallback](super::FailurePolicy::or_else).
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
        // The handler's failure is not this error's source (the write's
        // is), so its whole chain is told here, bounded like the handler
        // error's own text.
        write!(
            f,
            "the message could not be dead-lettered and is left unacknowledged for redelivery; \
             its handler failed with: {}",
            Capped::new(ErrorChain::new(&self.error), HandlerError::TEXT_LIMIT)
        )
    }
}

impl std::error::Error for DeadLetterWriteFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.write)
    }
}
