//! What the runtime reports about itself while it runs, for metrics.
//!
//! The runtime calls a [`ConsumerObserver`] at every commit tick, for every
//! acknowledgement round trip and for rare events (a caught panic, a probe
//! that timed out, a source error), never
//! per successful message, so observing costs nothing on the message path.

use std::time::Duration;

use crate::acker::{AckBatch, AckError};
use crate::message::{PartitionKey, Position};

/// A partition's positions and counts, as the commit engine holds them.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionProgress {
    /// The partition.
    pub partition: PartitionKey,
    /// The last contiguous done position.
    pub watermark: Option<Position>,
    /// The newest position admitted.
    pub newest: Option<Position>,
    /// Admitted messages not yet committable: the watermark's lag behind the
    /// newest admitted message, in messages.
    pub uncommitted: usize,
    /// Admitted messages whose handler has not finished.
    pub in_flight: usize,
    /// Position of the oldest unfinished message, if any.
    pub oldest_unfinished: Option<Position>,
}

/// A partition as the runtime sees it at a commit tick.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionSnapshot {
    /// Positions, counts and the oldest unfinished message.
    pub stats: PartitionProgress,
    /// How long the oldest unfinished message has been unfinished (at the
    /// resolution of the commit interval).
    pub oldest_unfinished_age: Option<Duration>,
    /// Paused through [`ConsumerControl`](crate::consumer::ConsumerControl):
    /// it holds its position and starts nothing, and health calls it paused
    /// rather than stalled.
    pub paused: bool,
}

/// Receives the runtime's state for metrics. Every method has a no-op default.
pub trait ConsumerObserver: Send + Sync + 'static {
    /// At every commit tick: each assigned partition.
    fn on_partitions(&self, _partitions: &[PartitionSnapshot]) {}

    /// At every commit tick: deliveries held (queued or running).
    fn on_in_flight(&self, _in_flight: usize) {}

    /// After each acknowledgement round trip.
    fn on_ack(&self, _batch: &AckBatch, _result: Result<(), &AckError>, _elapsed: Duration) {}

    /// When a partition is revoked (so per-partition series can be removed).
    fn on_revoked(&self, _partition: &PartitionKey) {}

    /// When the runtime caught a handler's panic (one that no
    /// `CatchPanicLayer` caught first) for a message of `partition`.
    fn on_panic(&self, _partition: &PartitionKey) {}

    /// When a backoff probe outlived the probe timeout and the consumer
    /// backed off again without its outcome.
    fn on_probe_timeout(&self) {}

    /// At every commit tick: how long the source has been unable to reach
    /// its broker, `None` while it reaches it. Only sources that reconnect
    /// on their own report this (see
    /// [`Source::reachability`](crate::backend::Source::reachability));
    /// for the others it is always `None`.
    fn on_reachability(&self, _unreachable_for: Option<Duration>) {}

    /// At every commit tick: the consumer-level backoff level (0: not
    /// backing off; see
    /// [`ConsumerBuilder::backoff`](crate::ConsumerBuilder::backoff)).
    fn on_backoff(&self, _level: u32) {}

    /// While the consumer wants room in the
    /// [`SharedBudget`](crate::consumer::SharedBudget) it shares with other
    /// consumers and gets none (they hold it all): how long it has waited,
    /// once that is a commit interval, then at most once per commit
    /// interval; `None` once it gets room again (or is offered some and has
    /// nothing to fetch). A consumer that keeps waiting while the others stay
    /// busy is starved: nothing of its own stalls, so nothing else shows it.
    /// Never called for a consumer without a shared budget.
    fn on_shared_budget_wait(&self, _waited: Option<Duration>) {}

    /// When [`Source::next`](crate::backend::Source::next) failed: with the
    /// delay before the next attempt for an error that is retried (a
    /// [transient](crate::backend::SourceError::is_transient) one, while the
    /// reconnect policy has retries left), `None` when the error ends the
    /// run.
    fn on_source_error(
        &self,
        _error: &crate::source::SourceError,
        _retry_in: Option<std::time::Duration>,
    ) {
    }
}
