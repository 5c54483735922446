//! [`RouteHealth`]: one route's state, kept from what its runtime reports
//! at each commit tick (a [`ConsumerObserver`]), never per message.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::lock;
use crate::acker::{AckBatch, AckError, PartitionAck};
use crate::message::{PartitionKey, Position};
use crate::observer::{ConsumerObserver, PartitionSnapshot};
use crate::source::SourceError;

/// A route's state, as its observer last saw it.
pub(crate) struct RouteHealth {
    pub(super) state: Mutex<RouteState>,
    /// The route's own observer (metrics), which hears everything first.
    pub(super) inner: Option<Arc<dyn ConsumerObserver>>,
}

// Read by the console (`app::console`) too, which shows what health keeps.
#[derive(Debug, Default)]
pub(in crate::app) struct RouteState {
    pub(in crate::app) started_at: Option<Instant>,
    pub(in crate::app) stopping: bool,
    pub(in crate::app) ended: bool,
    pub(in crate::app) assigned: bool,
    pub(in crate::app) assignment_changed_at: Option<Instant>,
    pub(in crate::app) ack_failing: bool,
    /// Since when every acknowledgement has failed (the first failure
    /// after the last success).
    pub(in crate::app) ack_failing_since: Option<Instant>,
    pub(in crate::app) source_failing: bool,
    /// Since when the source has not reached its broker, at the last tick.
    pub(in crate::app) unreachable_since: Option<Instant>,
    /// Since when the consumer has been backing off without a successful
    /// probe, at the last tick.
    pub(in crate::app) backing_off_since: Option<Instant>,
    /// The backoff level at the last tick.
    pub(in crate::app) backoff_level: u32,
    /// Since when the route has asked its shared budget for room and got
    /// none, as the runtime last reported.
    pub(in crate::app) starved_since: Option<Instant>,
    /// Deliveries held (queued or running) at the last tick.
    pub(in crate::app) in_flight: usize,
    /// When an acknowledgement last succeeded.
    pub(in crate::app) last_commit_at: Option<Instant>,
    /// Messages committed so far, as far as the acknowledgements tell (see
    /// [`committed_count`]); the console's throughput.
    pub(in crate::app) committed_messages: u64,
    pub(in crate::app) partitions: HashMap<PartitionKey, PartitionWatch>,
    /// Each partition's commits, until it is revoked.
    pub(in crate::app) commits: HashMap<PartitionKey, CommitWatch>,
}

#[derive(Debug)]
pub(in crate::app) struct PartitionWatch {
    pub(in crate::app) watermark: Option<Position>,
    pub(in crate::app) uncommitted: usize,
    pub(in crate::app) last_progress: Instant,
    /// When the oldest unfinished message became unfinished, as far as the
    /// last tick could tell.
    pub(in crate::app) oldest_since: Option<Instant>,
    /// The newest position admitted, at the last tick.
    pub(in crate::app) newest: Option<Position>,
    /// Admitted messages whose handler has not finished, at the last tick.
    pub(in crate::app) in_flight: usize,
    /// The oldest unfinished message's position, at the last tick.
    pub(in crate::app) oldest_unfinished: Option<Position>,
    /// When the partition was first seen assigned (at a tick).
    #[cfg_attr(not(feature = "console"), allow(dead_code))]
    pub(in crate::app) assigned_at: Instant,
    /// Paused through the consumer's control, at the last tick: it holds
    /// its work on purpose, and never stalls.
    pub(in crate::app) paused: bool,
}

/// A partition's commits, kept apart from its [`PartitionWatch`]: an
/// acknowledgement can come before the first tick that shows the
/// partition.
#[derive(Debug, Default)]
pub(in crate::app) struct CommitWatch {
    /// The watermark the broker last confirmed.
    pub(in crate::app) committed: Option<Position>,
    /// When an acknowledgement carrying work of this partition last
    /// succeeded.
    pub(in crate::app) committed_at: Option<Instant>,
    /// Where counting committed messages goes on from: the last committed
    /// watermark, or, before the first commit, the position before the
    /// first unfinished message a tick saw; `None` until either is known.
    pub(in crate::app) counted_from: Option<Position>,
}

impl PartitionWatch {
    /// How long the partition has stalled at `now`, if it has for
    /// `window`: uncommitted work, a watermark that has not moved for the
    /// window, and an oldest unfinished message older than the window.
    /// A paused partition holds its work on purpose: it never stalls.
    pub(in crate::app) fn stalled_for(&self, now: Instant, window: Duration) -> Option<Duration> {
        if self.paused {
            return None;
        }
        let since = now.saturating_duration_since(self.last_progress);
        let oldest_waits = self
            .oldest_since
            .is_some_and(|at| now.saturating_duration_since(at) >= window);
        (self.uncommitted > 0 && since >= window && oldest_waits).then_some(since)
    }
}

/// The position before `position`, where positions are numbered (a Kafka
/// or memory offset, an AMQP tag).
fn before(position: Position) -> Option<Position> {
    match position {
        Position::Offset(offset) => offset.checked_sub(1).map(Position::Offset),
        Position::Tag(tag) => tag.checked_sub(1).map(Position::Tag),
        Position::StreamId { .. } => None,
    }
}

/// How many messages a successful acknowledgement of `ack` committed:
/// its completed positions where the acker takes ids, else how far the
/// watermark moved past `from` where positions are numbered. With `from`
/// unknown (the first commit of a partition whose messages were all done
/// before a tick saw one unfinished) it counts the one message the
/// watermark names, which under-counts a first commit that carried more.
pub(in crate::app) fn committed_count(from: Option<Position>, ack: &PartitionAck) -> u64 {
    if !ack.completed.is_empty() {
        return u64::try_from(ack.completed.len()).unwrap_or(u64::MAX);
    }
    match (from, ack.watermark) {
        (Some(Position::Offset(from)), Some(Position::Offset(to))) if to > from => {
            to.abs_diff(from)
        }
        (Some(Position::Tag(from)), Some(Position::Tag(to))) if to > from => to - from,
        // An AMQP channel numbers its deliveries from 1.
        (None, Some(Position::Tag(to))) => to,
        (None, Some(_)) => 1,
        _ => 0,
    }
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
                    progress.newest = stats.newest;
                    progress.in_flight = stats.in_flight;
                    progress.oldest_unfinished = stats.oldest_unfinished;
                    if progress.paused && !snapshot.paused {
                        // Held while paused: the stall window starts over.
                        progress.last_progress = now;
                    }
                    progress.paused = snapshot.paused;
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
                            newest: stats.newest,
                            in_flight: stats.in_flight,
                            oldest_unfinished: stats.oldest_unfinished,
                            assigned_at: now,
                            paused: snapshot.paused,
                        },
                    );
                }
            }
            // The key is cloned only for a partition new to the map, not
            // at every tick.
            let start = stats.oldest_unfinished.and_then(before);
            match state.commits.get_mut(&stats.partition) {
                Some(commits) => {
                    if commits.counted_from.is_none() {
                        commits.counted_from = start;
                    }
                }
                None => {
                    let commits = CommitWatch {
                        counted_from: start,
                        ..CommitWatch::default()
                    };
                    state.commits.insert(stats.partition.clone(), commits);
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
        lock(&self.state).in_flight = in_flight;
    }

    fn on_ack(&self, batch: &AckBatch, result: Result<(), &AckError>, elapsed: Duration) {
        if let Some(inner) = &self.inner {
            inner.on_ack(batch, result, elapsed);
        }
        let mut guard = lock(&self.state);
        let state = &mut *guard;
        state.ack_failing = result.is_err();
        if result.is_ok() {
            // Acknowledging needs the broker: it answers again.
            state.source_failing = false;
            state.ack_failing_since = None;
            let now = Instant::now();
            state.last_commit_at = Some(now);
            for ack in &batch.partitions {
                let known = state.commits.get_mut(&ack.partition);
                let from = known.as_ref().and_then(|commits| commits.counted_from);
                let count = committed_count(from, ack);
                let committed = |commits: &mut CommitWatch| {
                    commits.committed_at = Some(now);
                    if ack.watermark.is_some() {
                        commits.committed = ack.watermark;
                        commits.counted_from = ack.watermark;
                    }
                };
                match known {
                    Some(commits) => committed(commits),
                    None => {
                        let mut commits = CommitWatch::default();
                        committed(&mut commits);
                        state.commits.insert(ack.partition.clone(), commits);
                    }
                }
                state.committed_messages = state.committed_messages.saturating_add(count);
            }
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
        state.commits.remove(partition);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(watermark: Option<Position>, completed: Vec<Position>) -> PartitionAck {
        let mut ack = PartitionAck::new(PartitionKey::new("orders", 0));
        ack.watermark = watermark;
        ack.completed = completed;
        ack
    }

    #[test]
    fn a_commit_counts_its_ids_or_how_far_a_numbered_watermark_moved() {
        let offset = |offset| Some(Position::Offset(offset));
        let id = |ms| Position::StreamId { ms, seq: 0 };
        assert_eq!(committed_count(offset(4), &ack(offset(9), Vec::new())), 5);
        assert_eq!(committed_count(offset(9), &ack(offset(9), Vec::new())), 0);
        assert_eq!(committed_count(offset(9), &ack(None, Vec::new())), 0);
        assert_eq!(
            committed_count(None, &ack(Some(id(3)), vec![id(1), id(3), id(2)])),
            3
        );
        assert_eq!(
            committed_count(
                Some(Position::Tag(2)),
                &ack(Some(Position::Tag(7)), Vec::new())
            ),
            5
        );
        assert_eq!(
            committed_count(None, &ack(Some(Position::Tag(7)), Vec::new())),
            7
        );
        // Unknown start: the message the watermark names, at least.
        assert_eq!(committed_count(None, &ack(offset(41), Vec::new())), 1);
        // A watermark that went back (a reset) counts nothing.
        assert_eq!(committed_count(offset(9), &ack(offset(3), Vec::new())), 0);
        assert_eq!(before(Position::Offset(0)), Some(Position::Offset(-1)));
        assert_eq!(before(Position::Offset(i64::MIN)), None);
        assert_eq!(before(id(5)), None);
    }
}
