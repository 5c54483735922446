//! The partitions a run holds: the commit engine's table and the runtime's
//! own entry for each partition, side by side in [`Partitions`], whose
//! methods are the only way to change either, so the two stay in step.
//!
//! The runtime's entry counts the slots a partition's deliveries hold,
//! marks a partition being revoked, marks one over its uncommitted window
//! (see below), and tracks since when its oldest unfinished message has
//! been the oldest (for the observer's snapshots).
//!
//! # The uncommitted window
//!
//! A message that does not finish holds its partition's watermark, and
//! every later delivery of the partition then stays in the engine's ring.
//! Once a partition has `max_uncommitted` of them it is over its window:
//! the source is asked to pause that partition alone
//! ([`Source::pause`](crate::source::Source::pause)), and the other
//! partitions keep flowing. It is resumed once the ring is down to three
//! quarters of the window, so that a window at its bound does not pause and
//! resume the partition at every message. The pauses and resumes are
//! queued here, in order, and the run hands them to the source before it
//! asks it for more (`take_pause`).
//!
//! A partition over its window *stalls* the run (no delivery of any
//! partition is asked for) while the source cannot pause it, or while the
//! source keeps delivering it: what it had fetched before the pause is
//! admitted past the window, up to one in-flight budget, and no more.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::acker::{AckBatch, PartitionAck};
use crate::commit_engine::{CommitEngine, PartitionId, Ticket};
use crate::message::{Message, PartitionKey, Position, SourceName};
use crate::observer::PartitionSnapshot;

/// The runtime's entry for one partition (the commit engine keeps the rest).
#[derive(Clone, Debug, Default)]
struct Entry {
    /// Slots held by deliveries of this partition.
    held: u32,
    revoking: bool,
    over_window: bool,
    /// Over its window, and a pause of it is queued or was handed to the
    /// source (a resume is owed once it is back).
    paused: bool,
    /// Over its window and still fetched: it stops every partition's
    /// fetching (see the [module docs](self)).
    stalled: bool,
    /// Paused through [`ConsumerControl`](crate::consumer::ConsumerControl):
    /// no delivery of it starts, and the source is asked to stop fetching
    /// it (unless the window paused it already).
    user_paused: bool,
    /// The oldest unfinished position and since when it has been the oldest.
    oldest: Option<(Position, Instant)>,
}

/// The commit engine and the runtime's entries. See the [module docs](self).
pub(super) struct Partitions {
    engine: CommitEngine,
    /// Indexed by [`PartitionId::index`]: the engine hands out the ids, and
    /// the table grows to hold them when a partition is assigned.
    entries: Vec<Entry>,
    /// How many entries stall the run.
    stalled: usize,
    max_uncommitted: usize,
    /// A partition over its window leaves it at this many uncommitted
    /// deliveries (three quarters of `max_uncommitted`).
    resume_at: usize,
    /// A paused partition still fetched stalls the run from this many on:
    /// `max_uncommitted` and one in-flight budget.
    stall_at: usize,
    /// Pauses (`true`) and resumes for the source, oldest first.
    pauses: VecDeque<(PartitionKey, bool)>,
    /// Entries paused through the control (`Entry::user_paused`).
    user_paused: usize,
    /// Partitions the control paused, applied when they are assigned.
    user_pauses: std::collections::BTreeSet<PartitionKey>,
    /// The control paused every partition.
    all_paused: bool,
    /// The ids of assigned partitions by source and partition number, so a
    /// delivery finds its partition with a compare and an index, however
    /// the partitions of a fetch interleave. It names assigned partitions
    /// only: `assign` and `revoke` keep it in step (a revoked id named here
    /// would turn the partition's next delivery away).
    ids: PartitionIds,
}

/// Partition numbers above this are looked up in the engine's map instead:
/// a source's partition number must not size a table.
const DIRECT_PARTITIONS: u32 = 1 << 16;

/// Assigned partitions' ids, a table per source indexed by partition
/// number. A consumer reads one source or a few: the first source seen has
/// its table in place (the per-message path is a pointer compare and an
/// index), any other source's table is found by a linear search. (One
/// `Vec` of tables, the first checked first, reads simpler but cost 26
/// instructions per message in `pipeline_bytes`.)
#[derive(Default)]
struct PartitionIds {
    first: Option<(SourceName, Vec<Option<PartitionId>>)>,
    others: Vec<(SourceName, Vec<Option<PartitionId>>)>,
}

impl PartitionIds {
    #[inline]
    fn get(&self, source: &SourceName, partition: u32) -> Option<PartitionId> {
        let ids = match &self.first {
            Some((name, ids)) if Arc::ptr_eq(name, source) => ids,
            _ => self.table(source)?,
        };
        *ids.get(partition as usize)?
    }

    fn table(&self, source: &SourceName) -> Option<&Vec<Option<PartitionId>>> {
        self.first
            .iter()
            .chain(&self.others)
            .find(|(name, _)| **name == **source)
            .map(|(_, ids)| ids)
    }

    fn set(&mut self, key: &PartitionKey, id: Option<PartitionId>) {
        if key.partition >= DIRECT_PARTITIONS {
            return;
        }
        let source = &*key.source;
        let in_first = matches!(&self.first, Some((name, _)) if **name == *source);
        let other = self.others.iter().position(|(name, _)| **name == *source);
        let ids = match (in_first, other) {
            (true, _) => self.first.as_mut().map(|(_, ids)| ids),
            (false, Some(index)) => self.others.get_mut(index).map(|(_, ids)| ids),
            // Nothing to forget for a source never seen.
            (false, None) if id.is_none() => None,
            (false, None) if self.first.is_none() => {
                Some(&mut self.first.insert((key.source.clone(), Vec::new())).1)
            }
            (false, None) => {
                self.others.push((key.source.clone(), Vec::new()));
                self.others.last_mut().map(|(_, ids)| ids)
            }
        };
        let Some(ids) = ids else {
            return;
        };
        let slot = key.partition as usize;
        if ids.len() <= slot {
            if id.is_none() {
                return;
            }
            ids.resize(slot + 1, None);
        }
        ids[slot] = id;
    }
}

// The methods on the per-message path are `#[inline]`: the dispatcher is
// generic, so it is compiled in the user's crate, where a method of this
// (non-generic) type is otherwise a call across crates (18 instructions per
// message in `benches/callgrind.sh pipeline_bytes`).
impl Partitions {
    /// No partition yet; `max_uncommitted` is the window, and
    /// `max_in_flight` how far past it a paused partition's deliveries are
    /// still admitted.
    pub(super) fn new(engine: CommitEngine, max_uncommitted: usize, max_in_flight: usize) -> Self {
        Self {
            engine,
            entries: Vec::new(),
            stalled: 0,
            max_uncommitted,
            resume_at: max_uncommitted - max_uncommitted / 4,
            stall_at: max_uncommitted.saturating_add(max_in_flight),
            pauses: VecDeque::new(),
            user_paused: 0,
            user_pauses: std::collections::BTreeSet::new(),
            all_paused: false,
            ids: PartitionIds::default(),
        }
    }

    /// The commit engine, to read from.
    #[inline]
    pub(super) fn engine(&self) -> &CommitEngine {
        &self.engine
    }

    /// The partition of a fetched delivery, assigned on first sight (a
    /// source need not announce an assignment before delivering).
    #[inline]
    pub(super) fn of(&mut self, message: &Message) -> PartitionId {
        let metadata = message.metadata();
        if let Some(id) = self.ids.get(metadata.source(), metadata.partition()) {
            return id;
        }
        let key = metadata.partition_key();
        match self.engine.lookup(&key) {
            Some(id) => id,
            None => self.assign(key),
        }
    }

    /// Assigns `key` under a new generation of the engine (afresh if it was
    /// assigned already).
    pub(super) fn assign(&mut self, key: PartitionKey) -> PartitionId {
        let id = self.engine.assign(key);
        if self.entries.len() <= id.index() {
            self.entries.resize(id.index() + 1, Entry::default());
        }
        self.end_window(id);
        let entry = &mut self.entries[id.index()];
        // Deliveries of an earlier assignment that was not revoked may still
        // run; their tickets are stale now, and `held` keeps counting them
        // until they finish.
        let held = entry.held;
        if entry.user_paused {
            self.user_paused -= 1;
        }
        *entry = Entry {
            held,
            ..Entry::default()
        };
        if let Some(key) = self.engine.key(id) {
            self.ids.set(key, Some(id));
            if self.all_paused || self.user_pauses.contains(key) {
                // A pause names the partition, not the assignment.
                self.apply_user_pause(id, true);
            }
        }
        id
    }

    /// Marks the assigned partition `key` as being revoked; `None` if it is
    /// not assigned.
    pub(super) fn begin_revoke(&mut self, key: &PartitionKey) -> Option<PartitionId> {
        let id = self.engine.lookup(key)?;
        self.entries[id.index()].revoking = true;
        Some(id)
    }

    /// Removes `id` from the engine (its tickets become stale) and clears its
    /// entry: a revocation completed.
    pub(super) fn revoke(&mut self, id: PartitionId) {
        self.end_window(id);
        // The source's pause ends with the assignment (`Source::resume`);
        // the control's stays, for the partition's next assignment.
        self.apply_user_pause(id, false);
        if let Some(key) = self.engine.key(id) {
            self.ids.set(key, None);
        }
        self.engine.revoke(id);
        self.entries[id.index()] = Entry::default();
    }

    /// Whether `id` is being revoked.
    #[inline]
    pub(super) fn is_revoking(&self, id: PartitionId) -> bool {
        self.entries[id.index()].revoking
    }

    /// Slots held by deliveries of `id`.
    pub(super) fn held(&self, id: PartitionId) -> u32 {
        self.entries[id.index()].held
    }

    /// Whether no delivery may be fetched: a partition over its window is
    /// still fetched (see the [module docs](self)).
    #[inline]
    pub(super) fn stalled(&self) -> bool {
        self.stalled > 0
    }

    /// Whether pauses or resumes wait to be handed to the source.
    #[inline]
    pub(super) fn pauses_due(&self) -> bool {
        !self.pauses.is_empty()
    }

    /// The oldest pause (`true`) or resume waiting for the source.
    pub(super) fn take_pause(&mut self) -> Option<(PartitionKey, bool)> {
        self.pauses.pop_front()
    }

    /// The source cannot pause `key` (it answered a pause with `false`):
    /// while it is over its window, the run stalls.
    #[cold]
    pub(super) fn pause_refused(&mut self, key: &PartitionKey) {
        let Some(id) = self.engine.lookup(key) else {
            return;
        };
        let entry = &mut self.entries[id.index()];
        if entry.paused && !entry.stalled {
            // No resume is owed for a pause that did not happen.
            entry.paused = false;
            entry.stalled = true;
            self.stalled += 1;
            tracing::warn!(
                partition = %key,
                max_uncommitted = self.max_uncommitted,
                "the source cannot pause one partition: fetching pauses for every partition \
                 until this one is back under its window"
            );
        }
    }

    /// Admits a delivery of `id` at `position` to the engine; `None` if the
    /// partition is not assigned.
    #[inline]
    pub(super) fn admit(&mut self, id: PartitionId, position: Position) -> Option<Ticket> {
        self.engine.admit(id, position)
    }

    /// A slot now holds a delivery of `id`. `true` when this takes the
    /// partition over its window (its pause is then queued).
    #[inline]
    pub(super) fn slot_held(&mut self, id: PartitionId) -> bool {
        let entry = &mut self.entries[id.index()];
        entry.held += 1;
        if entry.over_window {
            self.held_over_window(id);
            return false;
        }
        if self.engine.uncommitted(id) >= self.max_uncommitted {
            self.enter_window(id);
            return true;
        }
        false
    }

    /// `id` reached its window: pause it.
    #[cold]
    #[inline(never)]
    fn enter_window(&mut self, id: PartitionId) {
        let entry = &mut self.entries[id.index()];
        entry.over_window = true;
        match self.engine.key(id) {
            Some(key) => {
                entry.paused = true;
                if !entry.user_paused {
                    self.pauses.push_back((key.clone(), true));
                }
            }
            // Not assigned (its ticket would have been refused): nothing to
            // pause by name, so nothing is fetched until it is back.
            None => {
                entry.stalled = true;
                self.stalled += 1;
            }
        }
    }

    /// A delivery of `id`, over its window, was admitted all the same:
    /// fetched before its pause. Past one budget of them the source is not
    /// pausing it, and the run stalls.
    #[cold]
    #[inline(never)]
    fn held_over_window(&mut self, id: PartitionId) {
        let entry = &mut self.entries[id.index()];
        if entry.stalled || self.engine.uncommitted(id) < self.stall_at {
            return;
        }
        entry.stalled = true;
        self.stalled += 1;
        tracing::warn!(
            partition = ?self.engine.key(id),
            max_uncommitted = self.max_uncommitted,
            "the source still delivers a partition it was asked to pause: fetching pauses for \
             every partition until this one is back under its window"
        );
    }

    /// A slot that held a delivery of `id` is free again; the partition
    /// leaves the window once its watermark has moved back far enough.
    #[inline]
    pub(super) fn slot_freed(&mut self, id: PartitionId) {
        if let Some(entry) = self.entries.get_mut(id.index()) {
            entry.held = entry.held.saturating_sub(1);
            if entry.over_window && self.engine.uncommitted(id) <= self.resume_at {
                self.end_window(id);
            }
        }
    }

    /// `id` is no longer over its window (back under it, revoked, or
    /// assigned afresh): it no longer stalls the run, and a pause handed to
    /// the source is undone.
    #[cold]
    #[inline(never)]
    fn end_window(&mut self, id: PartitionId) {
        let Some(entry) = self.entries.get_mut(id.index()) else {
            return;
        };
        entry.over_window = false;
        if std::mem::take(&mut entry.stalled) {
            self.stalled -= 1;
        }
        if std::mem::take(&mut entry.paused)
            && !entry.user_paused
            && let Some(key) = self.engine.key(id)
        {
            self.pauses.push_back((key.clone(), false));
        }
    }

    /// Whether no delivery of `id` may start now: it is being revoked, or
    /// the control paused it (one read on the per-message path for both).
    #[inline]
    pub(super) fn is_held_back(&self, id: PartitionId) -> bool {
        let entry = &self.entries[id.index()];
        entry.revoking | entry.user_paused
    }

    /// Whether the control paused `id`.
    pub(super) fn is_user_paused(&self, id: PartitionId) -> bool {
        self.entries
            .get(id.index())
            .is_some_and(|entry| entry.user_paused)
    }

    /// Whether the control paused any assigned partition.
    #[inline]
    pub(super) fn any_user_paused(&self) -> bool {
        self.user_paused > 0
    }

    /// The control pauses (`true`) or resumes `key`, assigned now or later.
    #[cold]
    pub(super) fn user_pause(&mut self, key: &PartitionKey, pause: bool) {
        if pause {
            self.user_pauses.insert(key.clone());
        } else {
            self.user_pauses.remove(key);
        }
        if let Some(id) = self.engine.lookup(key) {
            self.apply_user_pause(id, pause || self.all_paused);
        }
    }

    /// The control pauses (`true`) or resumes every partition.
    #[cold]
    pub(super) fn user_pause_all(&mut self, pause: bool) {
        self.all_paused = pause;
        self.user_pauses.clear();
        let ids: Vec<PartitionId> = self.engine.assigned().collect();
        for id in ids {
            self.apply_user_pause(id, pause);
        }
    }

    /// Marks `id` paused by the control or not, and queues the source's
    /// pause or resume unless its window holds it paused already.
    #[cold]
    fn apply_user_pause(&mut self, id: PartitionId, pause: bool) {
        let Some(entry) = self.entries.get_mut(id.index()) else {
            return;
        };
        if entry.user_paused == pause {
            return;
        }
        entry.user_paused = pause;
        if pause {
            self.user_paused += 1;
        } else {
            self.user_paused -= 1;
        }
        if !entry.paused
            && let Some(key) = self.engine.key(id)
        {
            self.pauses.push_back((key.clone(), pause));
        }
    }

    /// Records that the delivery behind `ticket` is done.
    #[inline]
    pub(super) fn complete(&mut self, ticket: Ticket) {
        self.engine.complete(ticket);
    }

    /// Records that the delivery behind `ticket` goes back to the broker.
    pub(super) fn requeue(&mut self, ticket: Ticket) {
        self.engine.requeue(ticket);
    }

    /// Records that the delivery behind `ticket` goes back to the broker,
    /// for a redelivery no sooner than `delay`.
    pub(super) fn requeue_after(&mut self, ticket: Ticket, delay: std::time::Duration) {
        self.engine.requeue_after(ticket, delay);
    }

    /// Puts back the work of an acknowledgement that failed.
    pub(super) fn restore(&mut self, ack: PartitionAck) {
        self.engine.restore(ack);
    }

    /// Moves all pending work into `batch`.
    pub(super) fn take_batch(&mut self, batch: &mut AckBatch) {
        self.engine.take_batch(batch);
    }

    /// Moves the work of `id` into `batch`, its watermark included even if
    /// it was sent before.
    pub(super) fn take_final_batch(&mut self, id: PartitionId, batch: &mut AckBatch) {
        self.engine.take_final_batch(id, batch);
    }

    /// A snapshot of every assigned partition at `now`, with how long its
    /// oldest unfinished message has been the oldest.
    pub(super) fn snapshots(&mut self, now: Instant) -> Vec<PartitionSnapshot> {
        let mut snapshots = Vec::new();
        for id in self.engine.assigned() {
            let Some(stats) = self.engine.progress(id) else {
                continue;
            };
            let entry = &mut self.entries[id.index()];
            let age = match (stats.oldest_unfinished, entry.oldest) {
                (None, _) => {
                    entry.oldest = None;
                    None
                }
                (Some(position), Some((tracked, since))) if tracked == position => {
                    Some(now.duration_since(since))
                }
                (Some(position), _) => {
                    entry.oldest = Some((position, now));
                    Some(Duration::ZERO)
                }
            };
            snapshots.push(PartitionSnapshot {
                stats,
                oldest_unfinished_age: age,
                paused: entry.user_paused,
            });
        }
        snapshots
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acker::AckMode;
    use crate::message::Metadata;

    fn message(source: &SourceName, partition: u32) -> Message {
        Message::new(
            "",
            Metadata::new(source.clone(), partition, Position::Offset(0)),
        )
    }

    fn partitions() -> Partitions {
        Partitions::new(CommitEngine::new(AckMode::Watermark), 100, 10)
    }

    #[test]
    fn interleaved_partitions_of_several_sources_each_find_their_own_id() {
        let mut partitions = partitions();
        let orders: SourceName = Arc::from("orders");
        let refunds: SourceName = Arc::from("refunds");
        let mut seen = Vec::new();
        for round in 0..3 {
            for partition in [0, 7, 3, DIRECT_PARTITIONS + 1] {
                for source in [&orders, &refunds] {
                    let id = partitions.of(&message(source, partition));
                    let key = PartitionKey::new(source.clone(), partition);
                    assert_eq!(partitions.engine().key(id), Some(&key));
                    if round == 0 {
                        seen.push(id);
                    } else {
                        assert!(seen.contains(&id), "the same id every time");
                    }
                }
            }
        }
        assert_eq!(seen.len(), 8, "one id per partition");
        // Another Arc with the same name is the same source.
        let again: SourceName = Arc::from("orders");
        assert_eq!(partitions.of(&message(&again, 7)), seen[2]);
    }

    #[test]
    fn a_revoked_partition_is_assigned_afresh_and_its_old_id_is_not_reused_for_it() {
        let mut partitions = partitions();
        let orders: SourceName = Arc::from("orders");
        let first = partitions.of(&message(&orders, 1));
        let other = partitions.of(&message(&orders, 2));
        let ticket = partitions.admit(first, Position::Offset(0));
        assert!(ticket.is_some());
        partitions.revoke(first);
        // The freed id goes to the next new partition; partition 1's next
        // delivery must not resolve to it through a stale table entry.
        let third = partitions.of(&message(&orders, 3));
        let again = partitions.of(&message(&orders, 1));
        assert_ne!(again, third);
        assert_ne!(again, other);
        assert_eq!(
            partitions.engine().key(again),
            Some(&PartitionKey::new(orders.clone(), 1))
        );
        assert_eq!(
            partitions.engine().key(third),
            Some(&PartitionKey::new(orders, 3))
        );
    }
}
