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
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use intake_core::{Message, PartitionKey, SourceError, SourceEvent};
use tokio::sync::Notify;

/// What the polling thread hands over besides messages.
#[derive(Debug)]
pub(crate) enum Control {
    Event(SourceEvent),
    Error(SourceError),
}

#[derive(Debug, Default)]
struct Queue {
    events: VecDeque<Control>,
    messages: VecDeque<Message>,
    /// The polling thread is gone; nothing more will come.
    finished: bool,
}

/// The queue; shared by the polling thread, the rebalance callback and the
/// source.
#[derive(Debug)]
pub(crate) struct Handoff {
    queue: Mutex<Queue>,
    ready: Notify,
    /// Signalled when the source takes messages: the polling thread may be
    /// waiting for room.
    room: Condvar,
    capacity: usize,
}

/// What [`Handoff::take`] found.
pub(crate) enum Taken {
    /// Messages were appended to the caller's buffer.
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
            ready: Notify::new(),
            room: Condvar::new(),
            capacity,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Messages waiting for the runtime.
    pub(crate) fn queued(&self) -> usize {
        self.lock().messages.len()
    }

    /// Whether the queue holds `capacity` messages or more: time to pause.
    pub(crate) fn is_full(&self, queued: usize) -> bool {
        queued >= self.capacity
    }

    /// Whether the queue drained far enough to resume fetching. Resuming at a
    /// quarter, not just below capacity, keeps a slow runtime from making the
    /// consumer pause and resume (and refetch) for every batch.
    pub(crate) fn has_room(&self, queued: usize) -> bool {
        queued <= self.capacity / 4
    }

    /// Waits up to `timeout` for the queue to drop below capacity. Returns
    /// whether it did. Lets a briefly full queue drain without pausing, since
    /// a pause discards librdkafka's prefetched messages and they must be
    /// fetched again.
    pub(crate) fn wait_for_room(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut queue = self.lock();
        loop {
            if queue.messages.len() < self.capacity {
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
    pub(crate) fn push_messages(&self, messages: &mut Vec<Message>) {
        if messages.is_empty() {
            return;
        }
        self.lock().messages.extend(messages.drain(..));
        self.ready.notify_one();
    }

    /// Queues an event ahead of the messages and wakes the source.
    pub(crate) fn push_control(&self, control: Control) {
        self.lock().events.push_back(control);
        self.ready.notify_one();
    }

    /// Drops the queued messages of `partitions`.
    pub(crate) fn purge(&self, partitions: &[PartitionKey]) -> usize {
        let mut queue = self.lock();
        let before = queue.messages.len();
        queue.messages.retain(|message| {
            let metadata = message.metadata();
            !partitions.iter().any(|key| {
                key.partition == metadata.partition() && *key.source == **metadata.source()
            })
        });
        before - queue.messages.len()
    }

    /// Marks the end of the stream; queued items are still taken.
    pub(crate) fn finish(&self) {
        self.lock().finished = true;
        self.ready.notify_one();
    }

    /// Drops everything queued, releasing any revocation waiting in it (a
    /// dropped `Revocation` tells its rebalance callback it was abandoned).
    pub(crate) fn abandon(&self) {
        let mut queue = self.lock();
        queue.messages.clear();
        let events = std::mem::take(&mut queue.events);
        drop(queue);
        self.room.notify_all();
        drop(events);
    }

    /// Takes the next event, or up to `max` messages into `deliveries`. With
    /// `max == 0` (the runtime's budget is full) only events are taken.
    pub(crate) fn take(&self, deliveries: &mut Vec<Message>, max: usize) -> Taken {
        let mut queue = self.lock();
        if let Some(control) = queue.events.pop_front() {
            return match control {
                Control::Event(event) => Taken::Event(event),
                Control::Error(error) => Taken::Error(error),
            };
        }
        if max > 0 && !queue.messages.is_empty() {
            let count = max.min(queue.messages.len());
            deliveries.extend(queue.messages.drain(..count));
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

    /// Waits until something was pushed since the last wait.
    pub(crate) async fn wait(&self) {
        self.ready.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use intake_core::{Metadata, Position, Revocation};

    use super::*;

    fn message(topic: &str, partition: u32, offset: i64) -> Message {
        Message::new(
            "x",
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
    fn take_never_hands_out_more_than_asked() {
        let handoff = Handoff::new(8);
        let mut batch: Vec<_> = (0..5).map(|offset| message("t", 0, offset)).collect();
        handoff.push_messages(&mut batch);
        let mut out = Vec::new();
        assert!(matches!(handoff.take(&mut out, 2), Taken::Delivered));
        assert_eq!(out.len(), 2);
        assert_eq!(handoff.queued(), 3);
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
}
