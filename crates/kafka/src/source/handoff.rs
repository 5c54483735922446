//! The bounded queue between the polling thread and [`KafkaSource::next`].
//!
//! Events (assignments, revocations, errors) overtake queued messages: a
//! revocation first removes the queued messages of its partitions (they were
//! never handed to the runtime, so the next owner reads them again from the
//! committed offset), and an assignment always precedes the messages of its
//! partitions because those can only be fetched after it.
//!
//! # Holds: partitions the runtime paused
//!
//! The runtime pauses one partition ([`Source::pause`]) between two calls
//! of `next`, on its own thread, while the polling thread goes on polling.
//! The pause takes effect here at once: [`Handoff::hold`] removes the
//! partition's queued messages, and every batch pushed later leaves the
//! partition's messages out, until the polling thread has paused it in
//! librdkafka (after which none come). Each hold remembers the first offset
//! it left out, so that the partition resumes there (librdkafka would
//! resume after the last message polled): nothing is lost, nothing
//! delivered twice. The polling thread takes the holds and releases to
//! apply with [`Handoff::take_hold_changes`]; a released hold keeps
//! leaving messages out until then, so none arrives ahead of the rewind.
//!
//! [`KafkaSource::next`]: super::KafkaSource
//! [`Source::pause`]: intake_core::backend::Source::pause

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use intake_core::{
    PartitionKey, Position,
    backend::{SourceError, SourceEvent},
};
use tokio::sync::Notify;

use super::convert::Record;

/// What the polling thread hands over besides messages.
#[derive(Debug)]
pub(crate) enum Control {
    Event(SourceEvent),
    Error(SourceError),
}

#[derive(Debug, Default)]
struct Queue {
    events: VecDeque<Control>,
    messages: VecDeque<Record>,
    /// The bytes of `messages` ([`Record::byte_size`]).
    bytes: usize,
    /// The polling thread is gone; nothing more will come.
    finished: bool,
    /// Partitions the runtime paused (see the [module docs](self)); a few
    /// at most, so a list.
    holds: Vec<Hold>,
    /// Messages left out for holds so far (a fetcher that goes on fetching
    /// a held partition shows here).
    left_out: u64,
}

/// A partition the runtime paused: see the [module docs](self).
#[derive(Debug)]
struct Hold {
    partition: PartitionKey,
    /// The first offset left out of the queue while held: where fetching
    /// resumes.
    rewind: Option<i64>,
    /// The polling thread paused it in librdkafka.
    applied: bool,
    /// The runtime resumed it; the polling thread has not yet.
    released: bool,
}

impl Hold {
    fn holds(&self, record: &Record) -> bool {
        let metadata = record.metadata();
        self.partition.partition == metadata.partition()
            && *self.partition.source == **metadata.source()
    }

    fn leave_out(&mut self, record: &Record) {
        if let Position::Offset(offset) = record.metadata().position() {
            self.rewind = Some(self.rewind.map_or(offset, |rewind| rewind.min(offset)));
        }
    }
}

/// What the polling thread does for a hold ([`Handoff::take_hold_changes`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HoldChange {
    /// Pause the partition in librdkafka.
    Pause(PartitionKey),
    /// Fetch the partition again: from `rewind` if messages were left out,
    /// and resume it in librdkafka if `applied` (it was paused there).
    Resume {
        partition: PartitionKey,
        rewind: Option<i64>,
        applied: bool,
    },
}

impl Queue {
    fn end_holds(&mut self, partitions: &[PartitionKey]) {
        if !self.holds.is_empty() {
            self.holds
                .retain(|hold| !partitions.contains(&hold.partition));
        }
    }

    /// Removes from `messages` those of held partitions; returns their
    /// bytes.
    #[cold]
    fn leave_out_held(&mut self, messages: &mut Vec<Record>) -> usize {
        let holds = &mut self.holds;
        let before = messages.len();
        let mut bytes = 0;
        messages.retain(
            |record| match holds.iter_mut().find(|hold| hold.holds(record)) {
                Some(hold) => {
                    hold.leave_out(record);
                    bytes += record.byte_size();
                    false
                }
                None => true,
            },
        );
        self.left_out += (before - messages.len()) as u64;
        bytes
    }
}

/// The queue; shared by the polling thread, the rebalance callback and the
/// source.
#[derive(Debug)]
pub(crate) struct Handoff {
    queue: Mutex<Queue>,
    /// Signalled when an event (or the end) is queued.
    event_ready: Notify,
    /// Signalled when messages are queued.
    messages_ready: Notify,
    /// Signalled when the source takes messages: the polling thread may be
    /// waiting for room.
    room: Condvar,
    /// Most messages queued before the polling thread pauses fetching; set
    /// from the runtime's budget ([`Handoff::set_capacity`]).
    capacity: AtomicUsize,
    /// Most bytes queued before the polling thread pauses fetching; set
    /// from the runtime's byte budget ([`Handoff::set_capacity`]).
    byte_capacity: AtomicUsize,
    /// A hold was added or released since the polling thread last took
    /// the changes: read once per polled batch, so that the lock is taken
    /// only when there is something to do.
    holds_changed: AtomicBool,
}

/// How full the queue is: messages and their bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Fill {
    pub(crate) messages: usize,
    pub(crate) bytes: usize,
}

/// What [`Handoff::take`] found.
pub(crate) enum Taken {
    /// Records were appended to the caller's buffer.
    Delivered,
    Event(SourceEvent),
    Error(SourceError),
    /// Nothing yet.
    Empty,
    /// The polling thread stopped and the queue is drained.
    Finished,
}

impl Handoff {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            queue: Mutex::new(Queue::default()),
            event_ready: Notify::new(),
            messages_ready: Notify::new(),
            room: Condvar::new(),
            capacity: AtomicUsize::new(capacity.max(1)),
            byte_capacity: AtomicUsize::new(usize::MAX),
            holds_changed: AtomicBool::new(false),
        }
    }

    /// Bounds the queue: the polling thread pauses fetching once this many
    /// messages, or this many bytes, wait for the runtime.
    pub(crate) fn set_capacity(&self, messages: usize, bytes: usize) {
        self.capacity.store(messages.max(1), Ordering::Relaxed);
        self.byte_capacity.store(bytes.max(1), Ordering::Relaxed);
    }

    /// Most messages queued before fetching pauses.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// What waits for the runtime.
    pub(crate) fn fill(&self) -> Fill {
        let queue = self.lock();
        Fill {
            messages: queue.messages.len(),
            bytes: queue.bytes,
        }
    }

    /// Whether the queue holds `capacity` messages or its byte capacity, or
    /// more: time to pause.
    pub(crate) fn is_full(&self, fill: Fill) -> bool {
        fill.messages >= self.capacity() || fill.bytes >= self.byte_capacity.load(Ordering::Relaxed)
    }

    /// Whether the queue drained far enough to resume fetching. Resuming at a
    /// quarter, not just below capacity, keeps a slow runtime from making the
    /// consumer pause and resume (and refetch) for every batch.
    pub(crate) fn has_room(&self, fill: Fill) -> bool {
        fill.messages <= self.capacity() / 4
            && fill.bytes <= self.byte_capacity.load(Ordering::Relaxed) / 4
    }

    /// Waits up to `timeout` for the queue to drop below capacity. Returns
    /// whether it did. Lets a briefly full queue drain without pausing, since
    /// a pause discards librdkafka's prefetched messages and they must be
    /// fetched again.
    pub(crate) fn wait_for_room(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut queue = self.lock();
        loop {
            if queue.messages.len() < self.capacity()
                && queue.bytes < self.byte_capacity.load(Ordering::Relaxed)
            {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            queue = self
                .room
                .wait_timeout(queue, deadline - now)
                .unwrap_or_else(|poison| poison.into_inner())
                .0;
        }
    }

    /// Appends `messages` (emptying it), but those of held partitions, and
    /// wakes the source.
    pub(crate) fn push_messages(&self, messages: &mut Vec<Record>) {
        if messages.is_empty() {
            return;
        }
        let mut bytes: usize = messages.iter().map(Record::byte_size).sum();
        let mut queue = self.lock();
        if !queue.holds.is_empty() {
            bytes -= queue.leave_out_held(messages);
            if messages.is_empty() {
                return;
            }
        }
        queue.bytes += bytes;
        if queue.messages.is_empty() {
            // The usual case when the runtime keeps up: the batch's buffer
            // becomes the queue and the queue's empty one the next batch's,
            // instead of moving every record.
            let empty = std::mem::replace(
                &mut queue.messages,
                VecDeque::from(std::mem::take(messages)),
            );
            *messages = Vec::from(empty);
        } else {
            queue.messages.extend(messages.drain(..));
        }
        drop(queue);
        self.messages_ready.notify_one();
    }

    /// Queues an event ahead of the messages and wakes the source.
    pub(crate) fn push_control(&self, control: Control) {
        self.lock().events.push_back(control);
        self.event_ready.notify_one();
    }

    /// Stops handing out `partition`'s messages until
    /// [`release`](Self::release): its queued ones are removed now, later
    /// ones left out as they are pushed, and fetching resumes at the first
    /// of them (see the [module docs](self)).
    pub(crate) fn hold(&self, partition: &PartitionKey) {
        let mut guard = self.lock();
        let queue = &mut *guard;
        let index = match queue
            .holds
            .iter()
            .position(|hold| hold.partition == *partition)
        {
            Some(index) => {
                // Released, and held again before the polling thread saw
                // the release: still paused there, still to be rewound.
                queue.holds[index].released = false;
                index
            }
            None => {
                queue.holds.push(Hold {
                    partition: partition.clone(),
                    rewind: None,
                    applied: false,
                    released: false,
                });
                queue.holds.len() - 1
            }
        };
        let hold = &mut queue.holds[index];
        let mut left_out = 0;
        let mut left_out_bytes = 0;
        queue.messages.retain(|record| {
            if !hold.holds(record) {
                return true;
            }
            hold.leave_out(record);
            left_out += 1;
            left_out_bytes += record.byte_size();
            false
        });
        queue.bytes -= left_out_bytes;
        queue.left_out += left_out;
        drop(guard);
        self.holds_changed.store(true, Ordering::Release);
        // The queue may have room again.
        self.room.notify_one();
    }

    /// Hands out `partition`'s messages again after a [`hold`](Self::hold)
    /// (nothing if it is not held): the polling thread resumes it, at the
    /// first message left out.
    pub(crate) fn release(&self, partition: &PartitionKey) {
        let mut queue = self.lock();
        if let Some(hold) = queue
            .holds
            .iter_mut()
            .find(|hold| hold.partition == *partition)
        {
            hold.released = true;
            drop(queue);
            self.holds_changed.store(true, Ordering::Release);
        }
    }

    /// Appends to `changes` what the polling thread must do for the holds
    /// added or released since it last asked: pause the new ones in
    /// librdkafka (marked applied), fetch the released ones again (their
    /// holds end here). Cheap when nothing changed (an atomic load).
    pub(crate) fn take_hold_changes(&self, changes: &mut Vec<HoldChange>) {
        if !self.holds_changed.load(Ordering::Acquire) {
            return;
        }
        let mut queue = self.lock();
        self.holds_changed.store(false, Ordering::Release);
        queue.holds.retain_mut(|hold| {
            if hold.released {
                changes.push(HoldChange::Resume {
                    partition: hold.partition.clone(),
                    rewind: hold.rewind,
                    applied: hold.applied,
                });
                return false;
            }
            if !hold.applied {
                hold.applied = true;
                changes.push(HoldChange::Pause(hold.partition.clone()));
            }
            true
        });
    }

    /// Every partition held or released and not yet resumed by the
    /// polling thread: none of them is the source's own backpressure or
    /// watchdog to resume.
    pub(crate) fn held(&self) -> Vec<PartitionKey> {
        self.lock()
            .holds
            .iter()
            .map(|hold| hold.partition.clone())
            .collect()
    }

    /// Ends the holds of `partitions`, assigned afresh: see
    /// [`purge`](Self::purge).
    pub(crate) fn end_holds(&self, partitions: &[PartitionKey]) {
        self.lock().end_holds(partitions);
    }

    /// Messages left out for holds so far.
    #[cfg(test)]
    pub(crate) fn left_out(&self) -> u64 {
        self.lock().left_out
    }

    /// Drops the queued messages of `partitions`, and their holds: a pause
    /// ends with the assignment (revoked, the partition is fetched from its
    /// committed offset by whoever owns it next; assigned afresh, from its
    /// committed offset here, unpaused).
    pub(crate) fn purge(&self, partitions: &[PartitionKey]) -> usize {
        let mut queue = self.lock();
        queue.end_holds(partitions);
        let before = queue.messages.len();
        let mut purged_bytes = 0;
        queue.messages.retain(|message| {
            let metadata = message.metadata();
            let revoked = partitions.iter().any(|key| {
                key.partition == metadata.partition() && *key.source == **metadata.source()
            });
            if revoked {
                purged_bytes += message.byte_size();
            }
            !revoked
        });
        queue.bytes -= purged_bytes;
        before - queue.messages.len()
    }

    /// Marks the end of the stream; queued items are still taken.
    pub(crate) fn finish(&self) {
        self.lock().finished = true;
        self.event_ready.notify_one();
    }

    /// Drops everything queued, releasing any revocation waiting in it (a
    /// dropped `Revocation` tells its rebalance callback it was abandoned).
    pub(crate) fn abandon(&self) {
        let mut queue = self.lock();
        queue.messages.clear();
        queue.bytes = 0;
        let events = std::mem::take(&mut queue.events);
        drop(queue);
        self.room.notify_all();
        drop(events);
    }

    /// Takes the next event, or up to `max` messages into `deliveries`. With
    /// `max == 0` (the runtime's budget is full) only events are taken.
    pub(crate) fn take(&self, deliveries: &mut Vec<Record>, max: usize) -> Taken {
        let mut queue = self.lock();
        if let Some(control) = queue.events.pop_front() {
            return match control {
                Control::Event(event) => Taken::Event(event),
                Control::Error(error) => Taken::Error(error),
            };
        }
        if max > 0 && !queue.messages.is_empty() {
            if deliveries.is_empty() && queue.messages.len() <= max {
                // Everything queued fits: the queue's buffer is handed out
                // whole and the caller's empty one becomes the queue.
                let taken = std::mem::replace(
                    &mut queue.messages,
                    VecDeque::from(std::mem::take(deliveries)),
                );
                *deliveries = Vec::from(taken);
                queue.bytes = 0;
            } else {
                let count = max.min(queue.messages.len());
                let mut taken_bytes = 0;
                deliveries.extend(queue.messages.drain(..count).inspect(|message| {
                    taken_bytes += message.byte_size();
                }));
                queue.bytes -= taken_bytes;
            }
            drop(queue);
            self.room.notify_one();
            return Taken::Delivered;
        }
        if queue.finished {
            Taken::Finished
        } else {
            Taken::Empty
        }
    }

    /// Waits until something [`take`](Self::take) with the same `max` may
    /// hand out was pushed since the last wait: an event, or with `max > 0`
    /// messages too. With `max == 0` queued messages never wake the source,
    /// so a runtime with a full budget is not woken for nothing while the
    /// polling thread fills the queue.
    pub(crate) async fn wait(&self, max: usize) {
        if max == 0 {
            self.event_ready.notified().await;
        } else {
            tokio::select! {
                () = self.event_ready.notified() => {}
                () = self.messages_ready.notified() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use intake_core::{Metadata, Position, backend::Revocation};

    use super::*;

    fn message(topic: &str, partition: u32, offset: i64) -> Record {
        Record::new(
            Bytes::from_static(b"x"),
            Metadata::new(topic.into(), partition, Position::Offset(offset)),
        )
    }

    #[test]
    fn events_overtake_messages_and_a_revocation_purges_its_partitions() {
        let handoff = Handoff::new(8);
        let mut batch = vec![message("t", 0, 1), message("t", 1, 1), message("t", 0, 2)];
        handoff.push_messages(&mut batch);
        let revoked = vec![PartitionKey::new("t", 0)];
        assert_eq!(handoff.purge(&revoked), 2);
        let (revocation, _handle) = Revocation::new(revoked);
        handoff.push_control(Control::Event(SourceEvent::Revoked(revocation)));

        let mut out = Vec::new();
        assert!(matches!(
            handoff.take(&mut out, 10),
            Taken::Event(SourceEvent::Revoked(_))
        ));
        assert!(matches!(handoff.take(&mut out, 10), Taken::Delivered));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].metadata().partition(), 1);
        assert!(matches!(handoff.take(&mut out, 10), Taken::Empty));
    }

    #[test]
    fn whole_batches_change_hands_in_order_and_keep_the_byte_count() {
        let handoff = Handoff::new(100);
        let mut batch: Vec<_> = (0..3).map(|offset| message("t", 0, offset)).collect();
        handoff.push_messages(&mut batch);
        assert!(batch.is_empty());
        batch.extend((3..5).map(|offset| message("t", 0, offset)));
        handoff.push_messages(&mut batch);
        assert_eq!(
            handoff.fill(),
            Fill {
                messages: 5,
                bytes: 5
            }
        );
        let mut out = Vec::new();
        assert!(matches!(handoff.take(&mut out, 10), Taken::Delivered));
        let offsets: Vec<_> = out.iter().map(|r| r.metadata().position()).collect();
        assert_eq!(offsets, (0..5).map(Position::Offset).collect::<Vec<_>>());
        assert_eq!(handoff.fill(), Fill::default());

        // A caller that still holds records gets the rest appended.
        batch.extend((5..7).map(|offset| message("t", 0, offset)));
        handoff.push_messages(&mut batch);
        assert!(matches!(handoff.take(&mut out, 10), Taken::Delivered));
        assert_eq!(out.len(), 7);
        assert_eq!(out[6].metadata().position(), Position::Offset(6));
        assert_eq!(handoff.fill(), Fill::default());
    }

    #[test]
    fn take_never_hands_out_more_than_asked() {
        let handoff = Handoff::new(8);
        let mut batch: Vec<_> = (0..5).map(|offset| message("t", 0, offset)).collect();
        handoff.push_messages(&mut batch);
        let mut out = Vec::new();
        assert!(matches!(handoff.take(&mut out, 2), Taken::Delivered));
        assert_eq!(out.len(), 2);
        assert_eq!(handoff.fill().messages, 3);
    }

    #[test]
    fn the_queue_is_full_at_its_byte_capacity_and_counts_bytes_out_again() {
        let handoff = Handoff::new(1000);
        handoff.set_capacity(1000, 10);
        // `message` payloads are one byte each.
        let mut batch: Vec<_> = (0..10).map(|offset| message("t", 0, offset)).collect();
        handoff.push_messages(&mut batch);
        assert!(handoff.is_full(handoff.fill()), "10 bytes of 10");
        let mut out = Vec::new();
        assert!(matches!(handoff.take(&mut out, 8), Taken::Delivered));
        assert_eq!(
            handoff.fill(),
            Fill {
                messages: 2,
                bytes: 2
            }
        );
        assert!(handoff.has_room(handoff.fill()));
        assert_eq!(handoff.purge(&[PartitionKey::new("t", 0)]), 2);
        assert_eq!(handoff.fill(), Fill::default());
    }

    #[test]
    fn abandoning_releases_a_waiting_revocation() {
        let handoff = Handoff::new(8);
        let (revocation, handle) = Revocation::new(vec![PartitionKey::new("t", 0)]);
        handoff.push_control(Control::Event(SourceEvent::Revoked(revocation)));
        handoff.abandon();
        assert!(
            handle
                .wait_blocking(std::time::Duration::from_secs(5))
                .is_err()
        );
    }

    fn offsets(records: &[Record]) -> Vec<(u32, Position)> {
        records
            .iter()
            .map(|record| (record.metadata().partition(), record.metadata().position()))
            .collect()
    }

    #[test]
    fn a_hold_takes_its_partitions_queued_messages_back_and_leaves_out_later_ones() {
        let handoff = Handoff::new(100);
        let held = PartitionKey::new("t", 0);
        let mut batch = vec![message("t", 0, 4), message("t", 1, 7), message("t", 0, 5)];
        handoff.push_messages(&mut batch);
        handoff.hold(&held);
        assert_eq!(
            handoff.fill(),
            Fill {
                messages: 1,
                bytes: 1
            },
            "only partition 1's message is left, and its byte"
        );
        // A batch the polling thread polled before it saw the hold.
        let mut batch = vec![message("t", 0, 6), message("t", 1, 8), message("u", 0, 1)];
        handoff.push_messages(&mut batch);
        let mut out = Vec::new();
        assert!(matches!(handoff.take(&mut out, 10), Taken::Delivered));
        assert_eq!(
            offsets(&out),
            [
                (1, Position::Offset(7)),
                (1, Position::Offset(8)),
                (0, Position::Offset(1)),
            ],
            "partition 0 of another topic is not held"
        );
        assert_eq!(handoff.left_out(), 3);
        assert_eq!(handoff.held(), std::slice::from_ref(&held));

        let mut changes = Vec::new();
        handoff.take_hold_changes(&mut changes);
        assert_eq!(changes, [HoldChange::Pause(held.clone())]);
        changes.clear();
        handoff.take_hold_changes(&mut changes);
        assert!(changes.is_empty(), "a pause is applied once");

        handoff.release(&held);
        // Released, it still leaves messages out until the polling thread
        // rewinds it: none may come ahead of the rewind.
        let mut batch = vec![message("t", 0, 7)];
        handoff.push_messages(&mut batch);
        assert_eq!(handoff.fill(), Fill::default());
        handoff.take_hold_changes(&mut changes);
        assert_eq!(
            changes,
            [HoldChange::Resume {
                partition: held.clone(),
                rewind: Some(4),
                applied: true
            }],
            "fetched again from the first message left out"
        );
        assert!(handoff.held().is_empty());
        let mut batch = vec![message("t", 0, 4)];
        handoff.push_messages(&mut batch);
        assert_eq!(handoff.fill().messages, 1, "no longer held");
    }

    #[test]
    fn a_hold_released_and_taken_again_before_the_polling_thread_saw_it_keeps_its_rewind() {
        let handoff = Handoff::new(100);
        let held = PartitionKey::new("t", 2);
        let mut batch = vec![message("t", 2, 10)];
        handoff.push_messages(&mut batch);
        handoff.hold(&held);
        let mut changes = Vec::new();
        handoff.take_hold_changes(&mut changes);
        changes.clear();
        handoff.release(&held);
        handoff.hold(&held);
        let mut batch = vec![message("t", 2, 11)];
        handoff.push_messages(&mut batch);
        handoff.take_hold_changes(&mut changes);
        assert!(
            changes.is_empty(),
            "still paused in librdkafka: {changes:?}"
        );
        handoff.release(&held);
        handoff.take_hold_changes(&mut changes);
        assert_eq!(
            changes,
            [HoldChange::Resume {
                partition: held,
                rewind: Some(10),
                applied: true
            }]
        );
    }

    #[test]
    fn a_hold_ends_with_its_assignment_and_a_release_of_no_hold_does_nothing() {
        let handoff = Handoff::new(100);
        let (revoked, assigned) = (PartitionKey::new("t", 0), PartitionKey::new("t", 1));
        handoff.hold(&revoked);
        handoff.hold(&assigned);
        handoff.purge(std::slice::from_ref(&revoked));
        handoff.end_holds(std::slice::from_ref(&assigned));
        assert!(handoff.held().is_empty());
        let mut batch = vec![message("t", 0, 1), message("t", 1, 1)];
        handoff.push_messages(&mut batch);
        assert_eq!(handoff.fill().messages, 2);
        // The runtime resumes them once it hears of the revocation: nothing
        // is held, so nothing is done.
        handoff.release(&revoked);
        let mut changes = Vec::new();
        handoff.take_hold_changes(&mut changes);
        assert!(changes.is_empty(), "{changes:?}");
    }

    #[tokio::test]
    async fn with_max_zero_queued_messages_do_not_wake_the_source() {
        let handoff = Handoff::new(8);
        let mut batch = vec![message("t", 0, 1)];
        handoff.push_messages(&mut batch);
        let mut out = Vec::new();
        assert!(matches!(handoff.take(&mut out, 0), Taken::Empty));
        let waited =
            tokio::time::timeout(std::time::Duration::from_millis(50), handoff.wait(0)).await;
        assert!(
            waited.is_err(),
            "messages woke a source asked for events only"
        );

        let (revocation, _handle) = Revocation::new(vec![PartitionKey::new("t", 0)]);
        handoff.push_control(Control::Event(SourceEvent::Revoked(revocation)));
        handoff.wait(0).await;
        assert!(matches!(
            handoff.take(&mut out, 0),
            Taken::Event(SourceEvent::Revoked(_))
        ));
        assert!(out.is_empty());
    }
}
