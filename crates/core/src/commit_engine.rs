//! The ordered-commit engine: handlers finish in any order, yet a partition's
//! committed position never passes a message still in flight.
//!
//! Each admitted delivery gets a sequence number within its partition. The
//! engine keeps, per partition, a ring of `(position, done)` entries from the
//! oldest unfinished sequence number onwards; a completion marks its entry,
//! and the watermark moves over every done entry at the front. Both are O(1)
//! amortized and allocate nothing once the ring has grown to its working size.
//!
//! Sequence numbers, not positions, order the ring, so gaps in positions
//! (Kafka transaction markers, compaction, deleted stream entries) need no
//! special case: the watermark is the position of the last contiguous done
//! sequence number.
//!
//! Every assignment of a partition gets a fresh generation from one counter.
//! A [`Ticket`] carries its generation, and a completion whose generation is
//! not the partition's current one is dropped, so a partition that was
//! revoked (and perhaps reassigned) is never committed from stale work.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::acker::{AckBatch, AckMode, PartitionAck};
use crate::message::{PartitionKey, Position};
use crate::observer::PartitionProgress;

/// Index of a partition inside the engine. Stable while it is assigned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionId(u32);

impl PartitionId {
    /// The index as a `usize`, for tables indexed by partition.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Proof of admission: which partition, generation and sequence number a
/// delivery has. Completing it is how the engine learns the delivery is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    partition: PartitionId,
    generation: u64,
    seq: u64,
}

impl Ticket {
    /// The partition the delivery belongs to.
    pub fn partition(&self) -> PartitionId {
        self.partition
    }
}

/// What a completion did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// Recorded; the watermark may have moved.
    Recorded,
    /// The ticket belongs to an earlier assignment of the partition (or the
    /// partition is gone): ignored.
    Stale,
}

/// How a delivery left the window.
#[derive(Clone, Copy, Debug)]
enum Finish {
    Done,
    Requeue,
    RequeueAfter(Duration),
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    position: Position,
    done: bool,
}

#[derive(Debug)]
struct PartitionState {
    key: PartitionKey,
    generation: u64,
    assigned: bool,
    /// Sequence number of `window[0]`.
    base: u64,
    /// From the oldest unfinished entry to the newest admitted one.
    window: VecDeque<Entry>,
    /// Deliveries admitted and not completed.
    in_flight: usize,
    /// The last contiguous done position; what a commit would cover.
    watermark: Option<Position>,
    /// The watermark last handed out in a batch.
    sent_watermark: Option<Position>,
    completed: Vec<Position>,
    requeue: Vec<Position>,
    requeue_after: Vec<(Position, Duration)>,
    /// Completions recorded since the last batch took this partition's work:
    /// its share of the engine's `pending`.
    unbatched: usize,
    /// Whether the partition is in `dirty`.
    dirty: bool,
}

impl PartitionState {
    fn new(key: PartitionKey, generation: u64) -> Self {
        Self {
            key,
            generation,
            assigned: true,
            base: 0,
            window: VecDeque::new(),
            in_flight: 0,
            watermark: None,
            sent_watermark: None,
            completed: Vec::new(),
            requeue: Vec::new(),
            requeue_after: Vec::new(),
            unbatched: 0,
            dirty: false,
        }
    }

    /// Starts a new assignment. Returns how many unbatched completions of the
    /// old one were discarded.
    fn reset(&mut self, generation: u64) -> usize {
        self.generation = generation;
        self.assigned = true;
        self.base = 0;
        self.window.clear();
        self.in_flight = 0;
        self.watermark = None;
        self.sent_watermark = None;
        self.completed.clear();
        self.requeue.clear();
        self.requeue_after.clear();
        std::mem::take(&mut self.unbatched)
    }

    fn advance(&mut self) {
        while let Some(entry) = self.window.front() {
            if !entry.done {
                break;
            }
            self.watermark = Some(entry.position);
            self.window.pop_front();
            self.base += 1;
        }
    }
}

/// Per-partition ordered commit bookkeeping. See the [module docs](self).
#[derive(Debug)]
pub struct CommitEngine {
    mode: AckMode,
    partitions: Vec<PartitionState>,
    index: HashMap<PartitionKey, PartitionId>,
    free: Vec<PartitionId>,
    dirty: Vec<PartitionId>,
    next_generation: u64,
    pending: usize,
}

impl CommitEngine {
    /// An engine collecting what `mode` asks for.
    pub fn new(mode: AckMode) -> Self {
        Self {
            mode,
            partitions: Vec::new(),
            index: HashMap::new(),
            free: Vec::new(),
            dirty: Vec::new(),
            next_generation: 1,
            pending: 0,
        }
    }

    /// Assigns `key` to this consumer under a new generation and returns its
    /// id. Reassigning a partition that is still assigned starts it afresh:
    /// tickets of the earlier generation become stale.
    pub fn assign(&mut self, key: PartitionKey) -> PartitionId {
        let generation = self.next_generation;
        self.next_generation += 1;
        if let Some(&id) = self.index.get(&key) {
            let discarded = self.partitions[id.index()].reset(generation);
            self.pending -= discarded;
            return id;
        }
        let id = match self.free.pop() {
            Some(id) => {
                self.partitions[id.index()] = PartitionState::new(key.clone(), generation);
                id
            }
            None => {
                let id = PartitionId(self.partitions.len() as u32);
                self.partitions
                    .push(PartitionState::new(key.clone(), generation));
                id
            }
        };
        self.index.insert(key, id);
        id
    }

    /// The id of an assigned partition.
    pub fn lookup(&self, key: &PartitionKey) -> Option<PartitionId> {
        self.index.get(key).copied()
    }

    /// The key of an assigned partition.
    pub fn key(&self, id: PartitionId) -> Option<&PartitionKey> {
        self.partitions
            .get(id.index())
            .filter(|state| state.assigned)
            .map(|state| &state.key)
    }

    /// Ids of all assigned partitions.
    pub fn assigned(&self) -> impl Iterator<Item = PartitionId> + '_ {
        self.index.values().copied()
    }

    /// Removes the partition. Its outstanding tickets become stale, and its
    /// not-yet-batched work is discarded: call
    /// [`take_partition_batch`](Self::take_partition_batch) first to commit it.
    pub fn revoke(&mut self, id: PartitionId) {
        let Some(state) = self.partitions.get_mut(id.index()) else {
            return;
        };
        if !state.assigned {
            return;
        }
        state.assigned = false;
        self.pending -= std::mem::take(&mut state.unbatched);
        state.window.clear();
        state.completed.clear();
        state.requeue.clear();
        state.requeue_after.clear();
        state.in_flight = 0;
        self.index.remove(&state.key);
        self.dirty.retain(|&dirty| dirty != id);
        state.dirty = false;
        self.free.push(id);
    }

    // `admit`, `complete` and `uncommitted` run for every message
    // and are `#[inline]`: the dispatcher is generic, so it is compiled in
    // the user's crate, where a method of this type is otherwise a call
    // across crates (33 instructions per message in `benches/callgrind.sh
    // pipeline_bytes`: 714 with the calls, 681 inlined).

    /// Admits a delivery at `position` of partition `id`.
    ///
    /// Positions of one partition must be admitted in increasing order.
    /// Returns `None` if the partition is not assigned.
    #[inline]
    pub fn admit(&mut self, id: PartitionId, position: Position) -> Option<Ticket> {
        let state = self.partitions.get_mut(id.index())?;
        if !state.assigned {
            return None;
        }
        let seq = state.base + state.window.len() as u64;
        state.window.push_back(Entry {
            position,
            done: false,
        });
        state.in_flight += 1;
        Some(Ticket {
            partition: id,
            generation: state.generation,
            seq,
        })
    }

    /// Records that the delivery behind `ticket` is done (acknowledged).
    #[inline]
    pub fn complete(&mut self, ticket: Ticket) -> Completion {
        // The common case in its own few lines: the oldest unfinished
        // delivery of its partition finishes (deliveries of a partition
        // mostly finish in order), so the watermark passes it at once, with
        // no mark to write and read back. Its entry is not done: the front
        // of a window never is (`advance` takes every done entry off it).
        if self.mode != AckMode::Ids
            && let Some(state) = self.partitions.get_mut(ticket.partition.index())
            && state.assigned
            && state.generation == ticket.generation
            && ticket.seq == state.base
            && let Some(entry) = state.window.pop_front()
        {
            debug_assert!(!entry.done, "the front of a window is never done");
            state.watermark = Some(entry.position);
            state.base += 1;
            state.in_flight -= 1;
            state.advance();
            if !state.dirty {
                state.dirty = true;
                self.dirty.push(ticket.partition);
            }
            state.unbatched += 1;
            self.pending += 1;
            return Completion::Recorded;
        }
        self.finish(ticket, Finish::Done)
    }

    /// Records that the delivery behind `ticket` goes back to the broker for
    /// redelivery. For the watermark it counts as done (the broker owns it
    /// again); the acker requeues it before applying the watermark.
    pub fn requeue(&mut self, ticket: Ticket) -> Completion {
        self.finish(ticket, Finish::Requeue)
    }

    /// Like [`requeue`](Self::requeue), for a redelivery no sooner than
    /// `delay` (a message the broker parks: NATS `nak` with a delay).
    pub fn requeue_after(&mut self, ticket: Ticket, delay: Duration) -> Completion {
        self.finish(ticket, Finish::RequeueAfter(delay))
    }

    fn finish(&mut self, ticket: Ticket, finish: Finish) -> Completion {
        let Some(state) = self.partitions.get_mut(ticket.partition.index()) else {
            return Completion::Stale;
        };
        if !state.assigned || state.generation != ticket.generation || ticket.seq < state.base {
            return Completion::Stale;
        }
        let offset = (ticket.seq - state.base) as usize;
        let Some(entry) = state.window.get_mut(offset) else {
            return Completion::Stale;
        };
        if entry.done {
            return Completion::Stale;
        }
        entry.done = true;
        let position = entry.position;
        state.in_flight -= 1;
        match finish {
            Finish::Requeue => state.requeue.push(position),
            Finish::RequeueAfter(delay) => state.requeue_after.push((position, delay)),
            Finish::Done if self.mode == AckMode::Ids => state.completed.push(position),
            Finish::Done => {}
        }
        if offset == 0 {
            state.advance();
        }
        if !state.dirty {
            state.dirty = true;
            self.dirty.push(ticket.partition);
        }
        state.unbatched += 1;
        self.pending += 1;
        Completion::Recorded
    }

    /// Completions recorded since the last batch was taken.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Moves all pending work into `batch` (appending one [`PartitionAck`]
    /// per partition with work).
    pub fn take_batch(&mut self, batch: &mut AckBatch) {
        let dirty = std::mem::take(&mut self.dirty);
        for &id in &dirty {
            if let Some(ack) = self.take_partition(id) {
                batch.partitions.push(ack);
            }
        }
        self.dirty = dirty;
        self.dirty.clear();
        debug_assert_eq!(self.pending, 0, "every dirty partition was taken");
    }

    /// Moves the pending work of one partition into `batch` (for a
    /// revocation, which commits only what it releases).
    pub fn take_partition_batch(&mut self, id: PartitionId, batch: &mut AckBatch) {
        if let Some(ack) = self.take_partition(id) {
            batch.partitions.push(ack);
        }
        self.dirty.retain(|&dirty| dirty != id);
    }

    /// Like [`take_partition_batch`](Self::take_partition_batch), but the
    /// partition's watermark is included even if it was sent before: a
    /// partition about to be released is committed once more, synchronously,
    /// so its commit is durable before another consumer takes over.
    pub fn take_final_batch(&mut self, id: PartitionId, batch: &mut AckBatch) {
        if let Some(state) = self.partitions.get_mut(id.index())
            && state.assigned
            && state.watermark.is_some()
        {
            state.sent_watermark = None;
            if !state.dirty {
                state.dirty = true;
                self.dirty.push(id);
            }
        }
        self.take_partition_batch(id, batch);
    }

    /// Puts back the work of a batch the acker could not deliver, so the next
    /// batch carries it again: the partition's current watermark is sent
    /// again and, in [`AckMode::Ids`], the completed positions are listed
    /// again. A batch may have failed after part of it reached the broker, so
    /// an acker must tolerate work it already applied (Redis `XACK` does;
    /// the AMQP acker keeps a per-channel record, because RabbitMQ closes a
    /// channel on a second ack of a tag). Requeues are not put back: a broker
    /// that did not receive them redelivers those messages anyway. Work for a
    /// partition no longer assigned is dropped.
    pub fn restore(&mut self, ack: PartitionAck) {
        let Some(&id) = self.index.get(&ack.partition) else {
            return;
        };
        let state = &mut self.partitions[id.index()];
        let mut work = 0;
        if ack.watermark.is_some() && state.watermark.is_some() {
            state.sent_watermark = None;
            work += 1;
        }
        if self.mode == AckMode::Ids {
            work += ack.completed.len();
            state.completed.extend(ack.completed);
        }
        if work == 0 {
            return;
        }
        state.unbatched += work;
        self.pending += work;
        if !state.dirty {
            state.dirty = true;
            self.dirty.push(id);
        }
    }

    fn take_partition(&mut self, id: PartitionId) -> Option<PartitionAck> {
        let state = self.partitions.get_mut(id.index())?;
        state.dirty = false;
        self.pending -= std::mem::take(&mut state.unbatched);
        if !state.assigned {
            return None;
        }
        let watermark = if state.watermark != state.sent_watermark {
            state.sent_watermark = state.watermark;
            state.watermark
        } else {
            None
        };
        let ack = PartitionAck {
            partition: state.key.clone(),
            watermark,
            completed: std::mem::take(&mut state.completed),
            requeue: std::mem::take(&mut state.requeue),
            requeue_after: std::mem::take(&mut state.requeue_after),
        };
        (!ack.is_empty()).then_some(ack)
    }

    /// The current watermark of a partition (done, maybe not yet sent).
    pub fn watermark(&self, id: PartitionId) -> Option<Position> {
        self.partitions
            .get(id.index())
            .filter(|state| state.assigned)
            .and_then(|state| state.watermark)
    }

    /// Admitted messages of partition `id` that the watermark has not passed.
    #[inline]
    pub fn uncommitted(&self, id: PartitionId) -> usize {
        self.partitions
            .get(id.index())
            .filter(|state| state.assigned)
            .map_or(0, |state| state.window.len())
    }

    /// Admitted messages of partition `id` whose handler has not finished
    /// (the runtime reads it from [`stats`](Self::stats)).
    #[cfg(any(test, feature = "internals"))]
    pub fn in_flight(&self, id: PartitionId) -> usize {
        self.partitions
            .get(id.index())
            .filter(|state| state.assigned)
            .map_or(0, |state| state.in_flight)
    }

    /// A snapshot of partition `id`.
    pub fn progress(&self, id: PartitionId) -> Option<PartitionProgress> {
        let state = self
            .partitions
            .get(id.index())
            .filter(|state| state.assigned)?;
        Some(PartitionProgress {
            partition: state.key.clone(),
            watermark: state.watermark,
            // Not kept apart (a store per message): the newest admitted
            // is the window's back, or, once every admitted delivery is
            // done and passed, the watermark.
            newest: state
                .window
                .back()
                .map(|entry| entry.position)
                .or(state.watermark),
            uncommitted: state.window.len(),
            in_flight: state.in_flight,
            oldest_unfinished: state.window.front().map(|entry| entry.position),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine_with_partition(mode: AckMode) -> (CommitEngine, PartitionId) {
        let mut engine = CommitEngine::new(mode);
        let id = engine.assign(PartitionKey::new("orders", 0));
        (engine, id)
    }

    fn admit_offsets(engine: &mut CommitEngine, id: PartitionId, offsets: &[i64]) -> Vec<Ticket> {
        offsets
            .iter()
            .filter_map(|&offset| engine.admit(id, Position::Offset(offset)))
            .collect()
    }

    #[test]
    fn watermark_waits_for_the_oldest_unfinished_message() {
        let (mut engine, id) = engine_with_partition(AckMode::Watermark);
        let tickets = admit_offsets(&mut engine, id, &[0, 1, 2]);
        engine.complete(tickets[2]);
        engine.complete(tickets[1]);
        assert_eq!(engine.watermark(id), None);
        engine.complete(tickets[0]);
        assert_eq!(engine.watermark(id), Some(Position::Offset(2)));
    }

    #[test]
    fn gaps_in_positions_are_skipped() {
        let (mut engine, id) = engine_with_partition(AckMode::Watermark);
        let tickets = admit_offsets(&mut engine, id, &[10, 13, 20]);
        for ticket in tickets {
            engine.complete(ticket);
        }
        assert_eq!(engine.watermark(id), Some(Position::Offset(20)));
    }

    #[test]
    fn stale_generation_is_ignored_after_reassignment() {
        let (mut engine, id) = engine_with_partition(AckMode::Watermark);
        let old = admit_offsets(&mut engine, id, &[0]);
        let again = engine.assign(PartitionKey::new("orders", 0));
        assert_eq!(again, id);
        assert_eq!(engine.complete(old[0]), Completion::Stale);
        assert_eq!(engine.watermark(id), None);
    }

    #[test]
    fn revoked_partition_never_yields_a_batch() {
        let (mut engine, id) = engine_with_partition(AckMode::Watermark);
        let tickets = admit_offsets(&mut engine, id, &[0, 1]);
        engine.complete(tickets[0]);
        engine.revoke(id);
        assert_eq!(engine.complete(tickets[1]), Completion::Stale);
        let mut batch = AckBatch::default();
        engine.take_batch(&mut batch);
        assert!(batch.partitions.is_empty());
        assert_eq!(engine.pending(), 0);
    }

    #[test]
    fn a_reused_slot_does_not_accept_tickets_of_its_previous_partition() {
        let (mut engine, id) = engine_with_partition(AckMode::Watermark);
        let old = admit_offsets(&mut engine, id, &[0]);
        engine.revoke(id);
        let other = engine.assign(PartitionKey::new("payments", 3));
        assert_eq!(other, id);
        admit_offsets(&mut engine, other, &[0]);
        assert_eq!(engine.complete(old[0]), Completion::Stale);
        assert_eq!(engine.watermark(other), None);
    }

    #[test]
    fn batches_carry_ids_in_ids_mode_and_only_moved_watermarks() {
        let (mut engine, id) = engine_with_partition(AckMode::Ids);
        let tickets = admit_offsets(&mut engine, id, &[0, 1, 2]);
        engine.complete(tickets[1]);
        let mut batch = AckBatch::default();
        engine.take_batch(&mut batch);
        assert_eq!(batch.partitions.len(), 1);
        assert_eq!(batch.partitions[0].watermark, None);
        assert_eq!(batch.partitions[0].completed, vec![Position::Offset(1)]);

        engine.complete(tickets[0]);
        engine.requeue(tickets[2]);
        let mut batch = AckBatch::default();
        engine.take_batch(&mut batch);
        let ack = &batch.partitions[0];
        assert_eq!(ack.watermark, Some(Position::Offset(2)));
        assert_eq!(ack.completed, vec![Position::Offset(0)]);
        assert_eq!(ack.requeue, vec![Position::Offset(2)]);
    }

    #[test]
    fn pending_counts_the_completions_not_yet_taken_in_a_batch() {
        let mut engine = CommitEngine::new(AckMode::Watermark);
        let orders = engine.assign(PartitionKey::new("orders", 0));
        let payments = engine.assign(PartitionKey::new("payments", 0));
        let order_tickets = admit_offsets(&mut engine, orders, &[0, 1, 2]);
        let payment_tickets = admit_offsets(&mut engine, payments, &[0, 1, 2]);
        engine.requeue(order_tickets[0]);
        engine.complete(order_tickets[1]);
        engine.complete(order_tickets[2]);
        for ticket in payment_tickets {
            engine.complete(ticket);
        }
        assert_eq!(engine.pending(), 6);

        let mut batch = AckBatch::default();
        engine.take_partition_batch(orders, &mut batch);
        assert_eq!(
            engine.pending(),
            3,
            "the payments completions are still pending"
        );

        engine.revoke(payments);
        assert_eq!(
            engine.pending(),
            0,
            "a revoked partition's work is discarded"
        );
    }

    #[test]
    fn reassignment_discards_the_pending_work_of_the_old_generation() {
        let (mut engine, id) = engine_with_partition(AckMode::Ids);
        let tickets = admit_offsets(&mut engine, id, &[0, 1]);
        engine.complete(tickets[1]);
        engine.assign(PartitionKey::new("orders", 0));
        assert_eq!(engine.pending(), 0);
        let mut batch = AckBatch::default();
        engine.take_batch(&mut batch);
        assert!(batch.is_empty());
    }

    #[test]
    fn restored_work_is_sent_again() {
        let (mut engine, id) = engine_with_partition(AckMode::Ids);
        let tickets = admit_offsets(&mut engine, id, &[0, 1]);
        engine.complete(tickets[0]);
        let mut failed = AckBatch::default();
        engine.take_batch(&mut failed);
        assert_eq!(engine.pending(), 0);
        for ack in failed.partitions {
            engine.restore(ack);
        }
        let mut again = AckBatch::default();
        engine.take_batch(&mut again);
        assert_eq!(again.partitions[0].watermark, Some(Position::Offset(0)));
        assert_eq!(again.partitions[0].completed, vec![Position::Offset(0)]);
    }

    #[test]
    fn a_ticket_completes_once() {
        let (mut engine, id) = engine_with_partition(AckMode::Watermark);
        let tickets = admit_offsets(&mut engine, id, &[0, 1]);
        assert_eq!(engine.complete(tickets[1]), Completion::Recorded);
        assert_eq!(engine.complete(tickets[1]), Completion::Stale);
        assert_eq!(engine.in_flight(id), 1);
    }
}
