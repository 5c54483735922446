//! The errors of parking: a park the broker refused, and the outcome of a
//! message that was parked.

use std::fmt;
use std::time::Duration;

use crate::error::{BoxError, HandlerError};

/// A park the broker did not confirm. The parking layer leaves the failure
/// as it was (retryable), so the message is retried the ordinary way.
#[derive(Debug, thiserror::Error)]
#[error("the message could not be parked")]
pub struct ParkError(#[source] pub BoxError);

impl ParkError {
    /// A park that failed because of `cause`.
    pub fn new(cause: impl Into<BoxError>) -> Self {
        Self(cause.into())
    }
}

/// The message is parked and will be handled again once due: the cause of
/// the [`Outcome::Parked`](crate::Outcome::Parked) the parking layer settles
/// a moved message with (class [`Ignore`](crate::ErrorClass::Ignore), so the
/// runtime acknowledges the original), or of the retryable error, marked
/// parked too, of a message handed back to the broker.
#[derive(Debug)]
pub struct ParkedMessage {
    pub(super) delay: Duration,
    /// The failure that asked for later; `None` for a message parked
    /// behind an earlier one of its key without running.
    pub(super) failure: Option<HandlerError>,
}

impl ParkedMessage {
    /// How long the message is parked for.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// The failure that asked for later; `None` when the message was parked
    /// only to stay behind an earlier parked message of its key.
    pub fn failure(&self) -> Option<&HandlerError> {
        self.failure.as_ref()
    }
}

impl fmt::Display for ParkedMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.failure {
            Some(_) => write!(f, "parked for {:?}", self.delay),
            None => write!(
                f,
                "parked for {:?} behind an earlier parked message of its key",
                self.delay
            ),
        }
    }
}

impl std::error::Error for ParkedMessage {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.failure
            .as_ref()
            .map(|failure| failure as &(dyn std::error::Error + 'static))
    }
}
