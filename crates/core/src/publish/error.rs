//! [`PublishError`]: why an output was not confirmed.

use std::fmt;

use crate::error::{BoxError, ErrorClass, HandlerError};

/// What went wrong with a publish, and so what a caller should do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PublishErrorKind {
    /// The broker could not be reached, or did not confirm in time: the
    /// output may or may not be stored. Publish it again later (a
    /// duplicate is possible, as with any at-least-once pipeline).
    Unavailable,
    /// The broker refused this output (too large, no such destination, not
    /// allowed): sending it again as it is fails the same way.
    Rejected,
    /// The publisher was closed, or its connection gave up for good: make
    /// a new one.
    Closed,
}

impl PublishErrorKind {
    /// A short lowercase name, for logs and metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            PublishErrorKind::Unavailable => "unavailable",
            PublishErrorKind::Rejected => "rejected",
            PublishErrorKind::Closed => "closed",
        }
    }
}

impl fmt::Display for PublishErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An output that was not confirmed: its destination, what kind of failure
/// it was, and the broker client's error as the
/// [`source`](std::error::Error::source).
///
/// In a handler, `?` turns it into a [`HandlerError`]: an
/// [unavailable](PublishErrorKind::Unavailable) or
/// [closed](PublishErrorKind::Closed) publisher makes the input
/// [retryable](ErrorClass::Retryable) (it is delivered again and its
/// outputs published again), a [rejected](PublishErrorKind::Rejected)
/// output makes it [permanent](ErrorClass::Permanent) (to the dead-letter
/// destination: the same output would be refused again).
#[derive(Debug, thiserror::Error)]
#[error("{kind} publish to {destination:?}: {what}")]
pub struct PublishError {
    kind: PublishErrorKind,
    destination: String,
    what: String,
    #[source]
    source: Option<BoxError>,
}

impl PublishError {
    /// A failure of `kind` publishing to `destination`; `what` says it in a
    /// few words, including what to do (`"no confirmation within 30s;
    /// publish again"`).
    pub fn new(
        kind: PublishErrorKind,
        destination: impl Into<String>,
        what: impl Into<String>,
    ) -> Self {
        Self {
            kind,
            destination: destination.into(),
            what: what.into(),
            source: None,
        }
    }

    /// The broker client's error behind this one.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// What kind of failure it was.
    pub fn kind(&self) -> PublishErrorKind {
        self.kind
    }

    /// Where the output was going.
    pub fn destination(&self) -> &str {
        &self.destination
    }

    /// Whether publishing the same output again may succeed.
    pub fn is_transient(&self) -> bool {
        !matches!(self.kind, PublishErrorKind::Rejected)
    }

    /// What the failure means for the input whose output this was: see the
    /// type's docs.
    pub fn class(&self) -> ErrorClass {
        match self.kind {
            PublishErrorKind::Rejected => ErrorClass::Permanent,
            PublishErrorKind::Unavailable | PublishErrorKind::Closed => ErrorClass::Retryable,
        }
    }
}

/// Why [`PublishLayer`](super::PublishLayer) failed an input to keep its
/// key's outputs in input order (in [`Key`](crate::DeliveryOrder::Key) or
/// [`Partition`](crate::DeliveryOrder::Partition) order): the source of the
/// input's error, whose own outputs did not fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyOrderError {
    /// An output of an earlier input of the same key failed after this
    /// input's outputs were sent: they are published again after it (the
    /// input is retryable; the source of an
    /// [`Unavailable`](PublishErrorKind::Unavailable) `PublishError`).
    #[error("an earlier output of the same key failed")]
    EarlierOutputFailed,
    /// An earlier input of the same key was left unfinished (handed back to
    /// the broker, released at a revocation or a stop) before its outputs
    /// were confirmed: this input must not be acknowledged ahead of it, and
    /// is left for redelivery too (the error's class is
    /// [`Interrupted`](ErrorClass::Interrupted)).
    #[error("an earlier input of the same key was left unfinished")]
    EarlierInputUnfinished,
}

impl From<PublishError> for HandlerError {
    fn from(error: PublishError) -> Self {
        match error.class() {
            ErrorClass::Permanent => HandlerError::permanent(error),
            _ => HandlerError::retryable(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_this_level_and_the_cause_is_the_source() {
        let cause = std::io::Error::other("connection reset");
        let error = PublishError::new(
            PublishErrorKind::Unavailable,
            "orders.out",
            "no confirmation; publish again",
        )
        .with_source(cause);
        assert_eq!(
            error.to_string(),
            "unavailable publish to \"orders.out\": no confirmation; publish again"
        );
        let source = std::error::Error::source(&error).map(ToString::to_string);
        assert_eq!(source.as_deref(), Some("connection reset"));
    }

    #[test]
    fn a_rejected_output_makes_its_input_permanent_and_others_retryable() {
        let rejected = PublishError::new(PublishErrorKind::Rejected, "t", "too large");
        assert!(!rejected.is_transient());
        assert_eq!(HandlerError::from(rejected).class(), ErrorClass::Permanent);
        for kind in [PublishErrorKind::Unavailable, PublishErrorKind::Closed] {
            let error = PublishError::new(kind, "t", "down");
            assert!(error.is_transient());
            assert_eq!(HandlerError::from(error).class(), ErrorClass::Retryable);
        }
    }
}
