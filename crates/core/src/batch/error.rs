//! [`BatchError`]: why a message of a batch has no outcome of its own.

use std::sync::Arc;

use crate::error::HandlerError;

/// Why a message handled in a batch failed without an outcome of its own.
/// Carried as the cause of the message's [`HandlerError`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// The batch handler failed as a whole; every message of the batch gets
    /// this, with the class of the handler's error.
    #[error("the batch handler failed for its whole batch of {size}")]
    Failed {
        /// Messages in the batch.
        size: usize,
        /// The handler's error, shared by the batch's messages.
        #[source]
        error: Arc<HandlerError>,
    },
    /// The batch handler returned fewer outcomes than it got messages. The
    /// messages without one are retried; return exactly one outcome per
    /// message, in the order of the batch.
    #[error(
        "the batch handler returned {returned} outcome(s) for a batch of {size}; message {index} \
         has none and will be retried (return one outcome per message, in order)"
    )]
    MissingOutcome {
        /// Messages in the batch.
        size: usize,
        /// Outcomes returned.
        returned: usize,
        /// Position of this message in the batch.
        index: usize,
    },
    /// The batch handler's future was dropped before it finished (the
    /// runtime shut down under it).
    #[error("the batch handler was dropped before it returned outcomes")]
    Abandoned,
    /// The batch layer was called outside a tokio runtime; it needs one to
    /// run its batches.
    #[error("the batch layer needs a tokio runtime: call it from within one")]
    NoRuntime,
    /// The task that hands batches to the handler has stopped (its runtime
    /// shut down); the message is retried.
    #[error("the batch worker has stopped (its runtime shut down)")]
    WorkerStopped,
}
