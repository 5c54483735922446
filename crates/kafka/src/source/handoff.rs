//! The bounded queue between the polling thread and [`KafkaSource::next`].
//!
//! Events (assignments, revocations, errors) overtake queued messages: a
//! revocation first removes the queued messages of its partitions (they were
//! never handed to the runtime, so the next owner reads them again from the
//! committed offset), and an assignment always precedes the messages of its
//! partitions because those can only be fetched after it.
//!
//! [`KafkaSource::next`]: super::KafkaSource

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use intake_core::{
    PartitionKey,
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

    /// Appends `messages` (emptying it) and wakes the source.
    pub(crate) fn push_messages(&self, messages: &mut Vec<Record>) {
        if messages.is_empty() {
            return;
        }
        let bytes: usize = messages.iter().map(Record::byte_size).sum();
        let mut queue = self.lock();
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

    /// Drops the queued messages of `partitions`.
    pub(crate) fn purge(&self, partitions: &[PartitionKey]) -> usize {
        let mut queue = self.lock();
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
