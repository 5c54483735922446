//! A store's failure as the command reports it, with its exit code.

use intake_core::dead_letter::store::StoreError;
use intake_core::publish::PublishErrorKind;

use crate::failure::Failure;

/// A store's failure as the command reports it: a replay the broker
/// refused (no such destination, too large, not allowed) exits 3, since
/// trying again as it is fails the same way; one it did not confirm, 1.
pub fn store_failure(what: &str, error: StoreError) -> Failure {
    match error {
        StoreError::InvalidId { .. } => Failure::Usage(format!("{what}: {error}")),
        StoreError::NotFound { .. } => Failure::NotFound(format!("{what}: {error}")),
        StoreError::NoWayBackToGroup { ref origin } => Failure::NotPossible(format!(
            "{what}: these letters cannot go back to their consumer group alone: the store knows \
             no way back into `{origin}` that only this group reads (a return topic or stream \
             its parking reads), and nothing of `{origin}` was replayed. Replay with \
             --to-origin if every consumer group of `{origin}` should handle them again, or \
             with --to DESTINATION to send them elsewhere"
        )),
        StoreError::Broker { ref source, .. }
            if matches!(
                source.downcast_ref::<intake_amqp::Error>(),
                Some(intake_amqp::Error::PassLimit { .. })
            ) =>
        {
            Failure::PassLimit {
                what: what.to_owned(),
                source: Box::new(error),
            }
        }
        StoreError::Replay { ref source, .. } if source.kind() == PublishErrorKind::Rejected => {
            Failure::Refused {
                what: what.to_owned(),
                source: Box::new(error),
            }
        }
        error => Failure::Unavailable {
            what: what.to_owned(),
            source: Box::new(error),
        },
    }
}
