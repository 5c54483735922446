//! [`StoreError`]: why a store operation failed.

use super::{LetterId, ReplayReport};
use crate::error::BoxError;
use crate::publish::PublishError;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The broker could not be asked (unreachable, refused the command, no
    /// answer in time); the store is unchanged by the failed step.
    #[error("the dead-letter store could not {operation} {destination:?}")]
    Broker {
        /// What was being done: `count`, `read`, `remove letters from`.
        operation: &'static str,
        /// The dead-letter destination.
        destination: String,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// An id not of the form this store's ids have.
    #[error("`{id}` is not a letter id of this store: {expected}")]
    InvalidId {
        /// The id as given.
        id: String,
        /// What an id looks like here.
        expected: &'static str,
    },
    /// [`read`](super::DeadLetterStore::read) of an id the store does not hold.
    #[error("the dead-letter store holds no letter {id}")]
    NotFound {
        /// The id.
        id: LetterId,
    },
    /// A replay to the [group](super::Target::Group) of a letter whose store
    /// knows no way back to the group alone: replaying to the origin would
    /// reach every group of it.
    #[error(
        "this store knows no way back into `{origin}` for its consumer group alone (a return \
         destination the group reads); replay to the origin instead if every group of it \
         should handle the messages again"
    )]
    NoWayBackToGroup {
        /// The letter's origin.
        origin: String,
    },
    /// A replayed message was not confirmed, and the replay stopped after
    /// the batch it was in. The letters whose publish was confirmed were
    /// removed (`report` counts them); this one, and those not sent yet,
    /// are still in the store: replay again.
    #[error("replaying letter {id} failed after {} were replayed", report.replayed)]
    Replay {
        /// The letter whose publish failed.
        id: LetterId,
        /// What was done before.
        report: Box<ReplayReport>,
        /// Why the publish failed.
        #[source]
        source: PublishError,
    },
}

impl StoreError {
    /// A failure of the broker while doing `operation` on `destination`.
    pub fn broker(
        operation: &'static str,
        destination: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Self::Broker {
            operation,
            destination: destination.into(),
            source: source.into(),
        }
    }
}
