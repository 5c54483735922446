//! [`RouteHealth`]: one route's state, kept from what its runtime reports
//! at each commit tick (a [`ConsumerObserver`]), never per message.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::lock;
use crate::acker::{AckBatch, AckError};
use crate::message::{PartitionKey, Position};
use crate::observer::{ConsumerObserver, PartitionSnapshot};
use crate::source::SourceError;

/// A route's state, as its observer last saw it.
pub(crate) struct RouteHealth {
    pub(super) state: Mutex<RouteState>,
    /// The route's own observer (metrics), which hears everything first.
    pub(super) inner: Option<Arc<dyn ConsumerObserver>>,
}

#[derive(Debug)]
pub(super) struct RouteState {
    pub(super) started_at: Option<Instant>,
    pub(super) stopping: bool,
    pub(super) ended: bool,
    pub(super) assigned: bool,
    pub(super) assignment_changed_at: Option<Instant>,
    pub(super) ack_failing: bool,
    /// Since when every acknowledgement has failed (the first failure
    /// after the last success).
    pub(super) ack_failing_since: Option<Instant>,
    pub(super) source_failing: bool,
    /// Since when the source has not reached its broker, at the last tick.
    pub(super) unreachable_since: Option<Instant>,
    /// Since when the consumer has been backing off without a successful
    /// probe, at the last tick.
    pub(super) backing_off_since: Option<Instant>,
    /// The backoff level at the last tick.
    pub(super) backoff_level: u32,
    /// Since when the route has asked its shared budget for room and got
    /// none, as the runtime last reported.
    pub(super) starved_since: Option<Instant>,
    pub(super) partitions: HashMap<PartitionKey, PartitionWatch>,
}

#[derive(Debug)]
pub(super) struct PartitionWatch {
    pub(super) watermark: Option<Position>,
    pub(super) uncommitted: usize,
    pub(super) last_progress: Instant,
    /// When the oldest unfinished message became unfinished, as far as the
    /// last tick could tell.
    pub(super) oldest_since: Option<Instant>,
}

impl std::fmt::Debug for RouteHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteHealth")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl ConsumerObserver for RouteHealth {
    fn on_partitions(&self, partitions: &[PartitionSnapshot]) {
        if let Some(inner) = &self.inner {
            inner.on_partitions(partitions);
        }
        let now = Instant::now();
        let mut guard = lock(&self.state);
        let state = &mut *guard;
        let mut changed = partitions.len() != state.partitions.len();
        for snapshot in partitions {
            let stats = &snapshot.stats;
            let oldest_since = snapshot
                .oldest_unfinished_age
                .map(|age| now.checked_sub(age).unwrap_or(now));
            match state.partitions.get_mut(&stats.partition) {
                Some(progress) => {
                    if progress.watermark != stats.watermark || stats.uncommitted == 0 {
                        progress.last_progress = now;
                        state.source_failing = false;
                    }
                    progress.watermark = stats.watermark;
                    progress.uncommitted = stats.uncommitted;
                    progress.oldest_since = oldest_since;
                }
                None => {
                    changed = true;
                    state.partitions.insert(
                        stats.partition.clone(),
                        PartitionWatch {
                            watermark: stats.watermark,
                            uncommitted: stats.uncommitted,
                            last_progress: now,
                            oldest_since,
                        },
                    );
                }
            }
        }
        if changed {
            state.assignment_changed_at = Some(now);
        }
        if !partitions.is_empty() {
            state.assigned = true;
        }
    }

    fn on_in_flight(&self, in_flight: usize) {
        if let Some(inner) = &self.inner {
            inner.on_in_flight(in_flight);
        }
    }

    fn on_ack(&self, batch: &AckBatch, result: Result<(), &AckError>, elapsed: Duration) {
        if let Some(inner) = &self.inner {
            inner.on_ack(batch, result, elapsed);
        }
        let mut state = lock(&self.state);
        state.ack_failing = result.is_err();
        if result.is_ok() {
            // Acknowledging needs the broker: it answers again.
            state.source_failing = false;
            state.ack_failing_since = None;
        } else if state.ack_failing_since.is_none() {
            state.ack_failing_since = Some(Instant::now());
        }
    }

    fn on_revoked(&self, partition: &PartitionKey) {
        if let Some(inner) = &self.inner {
            inner.on_revoked(partition);
        }
        let mut state = lock(&self.state);
        state.partitions.remove(partition);
        state.assignment_changed_at = Some(Instant::now());
    }

    fn on_panic(&self, partition: &PartitionKey) {
        if let Some(inner) = &self.inner {
            inner.on_panic(partition);
        }
    }

    fn on_probe_timeout(&self) {
        if let Some(inner) = &self.inner {
            inner.on_probe_timeout();
        }
    }

    fn on_source_error(&self, error: &SourceError, retry_in: Option<Duration>) {
        if let Some(inner) = &self.inner {
            inner.on_source_error(error, retry_in);
        }
        lock(&self.state).source_failing = true;
    }

    fn on_reachability(&self, unreachable_for: Option<Duration>) {
        if let Some(inner) = &self.inner {
            inner.on_reachability(unreachable_for);
        }
        let now = Instant::now();
        lock(&self.state).unreachable_since =
            unreachable_for.map(|duration| now.checked_sub(duration).unwrap_or(now));
    }

    fn on_shared_budget_wait(&self, waited: Option<Duration>) {
        if let Some(inner) = &self.inner {
            inner.on_shared_budget_wait(waited);
        }
        let now = Instant::now();
        lock(&self.state).starved_since =
            waited.map(|waited| now.checked_sub(waited).unwrap_or(now));
    }

    fn on_backoff(&self, level: u32) {
        if let Some(inner) = &self.inner {
            inner.on_backoff(level);
        }
        let mut state = lock(&self.state);
        // A level that fell means a probe succeeded: the consumer recovers,
        // even if it stays above 0 for want of messages to probe with.
        if level == 0 || level < state.backoff_level {
            state.backing_off_since = None;
        } else if level > state.backoff_level && state.backing_off_since.is_none() {
            state.backing_off_since = Some(Instant::now());
        }
        state.backoff_level = level;
    }
}
