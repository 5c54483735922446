//! What a run did, and how it can fail.

use std::time::Duration;

use crate::error::HandlerError;
use crate::message::{PartitionKey, Position};
use crate::source::SourceError;

/// A delivery that was held but not finished when the run ended; the broker
/// delivers it again.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Unfinished {
    /// Its partition.
    pub partition: PartitionKey,
    /// Its position.
    pub position: Position,
    /// Whether its handler had started (and was cut off at the deadline)
    /// or it was still waiting for its turn.
    pub started: bool,
}

/// How the source's [`close`](crate::backend::Source::close) at the end of
/// the run went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum SourceClose {
    /// It closed.
    #[default]
    Closed,
    /// It returned an error (logged).
    Failed,
    /// It had not returned when the shutdown's time was up (a broker that
    /// cannot be reached, a client that keeps reconnecting); the run ended
    /// without it and the source was dropped.
    TimedOut,
}

/// What a run did, returned when it ends.
///
/// A message a layer settled counts as the [`Outcome`](crate::Outcome) it
/// gave ([`HandlerError::settled`]), whichever layer it was, intake's or
/// one of your own: `dead_lettered`, `parked`, `discarded`, `ignored`.
///
/// It counts what the runtime held, not what the broker holds. After a
/// shutdown the broker still has, unacknowledged: the deliveries in
/// `unfinished`; the finished work past the positions in `not_committed`;
/// and what the source had fetched ahead but never handed to the runtime
/// (librdkafka's prefetch, RabbitMQ's prefetch, Redis entries read into the
/// source's staging queue), which the report cannot see. So a broker's
/// pending count after a stop is usually larger than `unfinished`, and all
/// of it is delivered again to the group's next consumer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunReport {
    /// Handlers that succeeded.
    pub succeeded: u64,
    /// Messages a handler or layer asked to ignore
    /// ([`Outcome::Ignored`](crate::Outcome::Ignored); acknowledged).
    pub ignored: u64,
    /// Messages a layer wrote to a dead-letter destination
    /// ([`Outcome::DeadLettered`](crate::Outcome::DeadLettered);
    /// acknowledged once the destination confirmed; the letters are there,
    /// not lost). Counted apart from `ignored`.
    pub dead_lettered: u64,
    /// Messages dropped after a final failure: by a layer's discard policy
    /// ([`Outcome::Discarded`](crate::Outcome::Discarded)), or permanent
    /// failures that reached the runtime (no dead-letter layer took them),
    /// logged at error level. Acknowledged.
    pub discarded: u64,
    /// Retryable failures that reached the runtime and were dispatched again
    /// in process (brokers that cannot take a message back).
    pub redispatched: u64,
    /// Retryable failures handed back to the broker for redelivery.
    pub requeued: u64,
    /// Messages [parked](crate::parking) to be handled again later
    /// ([`Outcome::Parked`](crate::Outcome::Parked)): a copy parked at the
    /// broker and the original acknowledged, or the original handed back
    /// for a redelivery after a delay. Each comes back, so it is not
    /// [completed](Self::completed).
    pub parked: u64,
    /// Handlers that stopped because of the shutdown (left unacknowledged).
    pub interrupted: u64,
    /// Handler panics the runtime caught (a `CatchPanicLayer` inside the
    /// stack turns them into errors before the runtime sees them): each
    /// became a retryable failure of its message.
    pub panicked: u64,
    /// Deliveries dropped unacknowledged because their partition was revoked
    /// before they finished; the new owner receives them.
    pub released_on_revoke: u64,
    /// Acknowledgement round trips that failed.
    pub ack_failures: u64,
    /// Messages that ran unordered under [`DeliveryOrder::Key`](super::DeliveryOrder::Key)
    /// because they had no key (none from the broker, or none that
    /// [`ConsumerBuilder::key_with`](super::ConsumerBuilder::key_with)
    /// found). Warned about once per run: ordering degrades silently
    /// otherwise.
    pub without_key: u64,
    /// The last committed position of each partition at the end of the run,
    /// as the broker confirmed it in the final commit.
    pub committed: Vec<(PartitionKey, Position)>,
    /// Partitions whose final commit the broker did not confirm (it refused
    /// it, or had not answered when the shutdown's time was up), with the
    /// position that commit carried: work finished up to there may be
    /// delivered again to the next consumer.
    pub not_committed: Vec<(PartitionKey, Position)>,
    /// How the source's close went.
    pub close: SourceClose,
    /// Deliveries left unfinished by the shutdown.
    pub unfinished: Vec<Unfinished>,
    /// The most bytes of messages the runtime held at once
    /// ([`Message::byte_size`](crate::Message::byte_size); at most
    /// `max_in_flight_bytes`, or one message when a single one is larger).
    pub peak_in_flight_bytes: u64,
    /// How long the run took.
    pub elapsed: Duration,
}

impl RunReport {
    /// Messages completed (succeeded, ignored, dead-lettered or discarded).
    pub fn completed(&self) -> u64 {
        self.succeeded + self.ignored + self.dead_lettered + self.discarded
    }

    /// Whether the run left nothing for the broker to deliver again that it
    /// can see: every delivery it held finished ([`unfinished`](Self::unfinished)
    /// is empty) and the broker confirmed the final commit of every
    /// partition ([`not_committed`](Self::not_committed) is empty).
    ///
    /// A run whose final commit failed has handled messages the broker does
    /// not know are done: whatever `succeeded` counts, they are delivered
    /// again (and on an exactly-once pipeline, their outputs were not
    /// committed). A caller that reports a run's outcome (an exit status, a
    /// summary line) should say so when this is `false`.
    pub fn is_settled(&self) -> bool {
        self.unfinished.is_empty() && self.not_committed.is_empty()
    }
}

/// Why a run ended with an error. The report says what was done before.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The source failed in a way retrying cannot fix (or retries ran out).
    #[error("the source failed")]
    Source {
        /// The source's error.
        #[source]
        error: SourceError,
        /// What the run did before it stopped.
        report: Box<RunReport>,
    },
    /// The handler service reported an error from `poll_ready`, which means
    /// it can take no more messages.
    #[error("the handler service stopped accepting messages")]
    HandlerUnavailable {
        /// The service's error.
        #[source]
        error: HandlerError,
        /// What the run did before it stopped.
        report: Box<RunReport>,
    },
}

impl RunError {
    /// What the run did before it stopped.
    pub fn report(&self) -> &RunReport {
        match self {
            RunError::Source { report, .. } | RunError::HandlerUnavailable { report, .. } => report,
        }
    }
}
