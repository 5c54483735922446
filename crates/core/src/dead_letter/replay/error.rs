//! Why a record of a dead-letter destination is not replayed
//! ([`ReplayRefused`]), and the outcome of a dry run ([`DryRunCounted`]).

use crate::dead_letter::EnvelopeError;

/// A record of the dead-letter destination that the
/// [`ReplayLayer`](super::ReplayLayer) does not hand to the handler. It
/// comes out as the cause of a
/// [permanent](crate::error::HandlerError::permanent) failure, so that the
/// failure policy outside the replay layer decides what becomes of the
/// record (written to a destination of its own, or dropped), and never as
/// one the runtime delivers again: a record that cannot be replayed now
/// cannot be replayed on the next delivery either.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayRefused {
    /// The record is not a dead letter this intake can read (something
    /// else wrote it there, or it was changed after a sink wrote it); the
    /// source says which field is wrong.
    #[error("the record is not a readable dead letter; it is not replayed")]
    Unreadable(#[source] EnvelopeError),
    /// The loop guard: the letter's message was replayed `replays` times
    /// already, and `max_replays` is the limit. A message that fails on
    /// every replay is not replayed for ever.
    #[error(
        "the dead letter was replayed {replays} time(s) already, and the limit is \
         {max_replays}; it is not replayed again"
    )]
    ReplayLimit {
        /// How often the message was replayed.
        replays: u32,
        /// The replay layer's limit.
        max_replays: u32,
    },
    /// The letter is a [reference](crate::dead_letter::PayloadReference):
    /// it carries no payload to replay; the original is still at its
    /// origin.
    #[error("the dead letter is a reference without payload; it is not replayed")]
    Reference,
}

/// The outcome of every record in a [dry run](super::ReplayLayer::dry_run):
/// counted in the [counters](super::ReplayCounters), not handled. It is the
/// cause of an [`Ignore`](crate::error::ErrorClass::Ignore) failure, which
/// the runtime acknowledges: see the [module docs](super) for what that
/// means on each broker.
#[derive(Debug, thiserror::Error)]
#[error("counted by a replay dry run; not handled")]
#[non_exhaustive]
pub struct DryRunCounted;
