//! Admission: a fetched delivery gets its partition, a ticket of the commit
//! engine, a slot of the budget and its ordering lane, and starts at once
//! when nothing waits before it (the fast path), or waits in `ready`.

use tower::Service;

use super::Dispatcher;
use crate::commit_engine::{PartitionId, Ticket};
use crate::consumer::DeliveryOrder;
use crate::consumer::lanes::LaneId;
use crate::consumer::slots::{SlotId, SlotState};
use crate::error::HandlerError;
use crate::message::{Message, PartitionKey, Position};
use crate::shutdown_scope;

impl<H> Dispatcher<H>
where
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    /// Admits as many fetched deliveries as the budget has free slots, and
    /// a shared budget room, then starts what may start. The rest wait for
    /// room in `waiting` (leaving `buffer` empty), admitted first when room
    /// comes back (see `fetch_plan`); meanwhile the source is asked for
    /// events only, so a revocation still gets through.
    pub(super) fn admit_all(&mut self, buffer: &mut Vec<Message>) {
        if !self.waiting.is_empty() {
            // Only a source that delivers when asked for none gets here:
            // its deliveries queue behind those that wait, in order.
            self.waiting.append(buffer);
            self.admit_waiting();
            return;
        }
        let (token, turns) = (self.token.clone(), self.turns.clone());
        shutdown_scope::with_shutdown(&token, || {
            turns.scope(|| {
                self.admit_from(buffer);
                self.pump();
            });
        });
        if !buffer.is_empty() {
            if self.waiting.is_empty() {
                // A swap moves them without a copy.
                std::mem::swap(buffer, &mut self.waiting);
            } else {
                // Behind those `admit` found no slot for, in order.
                self.waiting.append(buffer);
            }
        }
    }

    /// Admits what waits for room, as far as room allows, and starts what
    /// may start; `true` if it admitted any.
    #[cold]
    #[inline(never)]
    pub(super) fn admit_waiting(&mut self) -> bool {
        let mut waiting = std::mem::take(&mut self.waiting);
        let before = waiting.len();
        // Through `admit_all`, so that `admit_from`, on the per-message
        // path, has one caller to be inlined in. What is left comes back to
        // `self.waiting`.
        self.admit_all(&mut waiting);
        if self.waiting.is_empty() {
            // All admitted: keep the list's capacity for the next wait.
            self.waiting = waiting;
        }
        before > self.waiting.len()
    }

    /// Admits the longest prefix of `buffer` that the free slots and the
    /// shared budget allow, and removes it from `buffer`.
    #[inline]
    fn admit_from(&mut self, buffer: &mut Vec<Message>) {
        let free = buffer.len().min(self.slots.free_count());
        let admitted = self.bytes.take_shared(buffer, free);
        let mut bytes = 0;
        for message in buffer.drain(..admitted) {
            bytes += self.admit(message);
        }
        self.bytes.observe(bytes, admitted);
    }

    /// Releases the deliveries waiting for room that belong to a partition
    /// for which `stale` holds (revoked, or assigned afresh): they were
    /// fetched under an assignment that is over, and its next owner (or the
    /// new assignment, from the committed position) receives them again.
    #[cold]
    #[inline(never)]
    pub(super) fn release_waiting(&mut self, stale: impl Fn(&PartitionKey) -> bool) {
        if self.waiting.is_empty() {
            return;
        }
        let before = self.waiting.len();
        self.waiting
            .retain(|message| !stale(&message.metadata().partition_key()));
        let released = before - self.waiting.len();
        if released > 0 {
            tracing::debug!(
                released,
                "released deliveries that waited for shared room: their partition's assignment ended"
            );
            self.report.released_on_revoke += released as u64;
        }
    }

    /// Admits one delivery: see the module docs. Returns its bytes, counted
    /// in the byte budget by the caller (0 when it was turned away, or
    /// waits).
    ///
    /// The slot comes first, the ticket after it: a ticket is the commit
    /// engine's promise that the delivery finishes, so one taken for a
    /// delivery that then had no slot would hold its partition's watermark
    /// for good. A delivery without a slot (`admit_from` admits no more
    /// than the free slots, so none) waits for one with those that wait for
    /// shared room.
    fn admit(&mut self, message: Message) -> usize {
        let partition = self.partitions.of(&message);
        if self.partitions.is_held_back(partition) {
            if !self.partitions.is_revoking(partition) {
                return self.admit_paused(partition, message);
            }
            // Fetched after the revocation began: it belongs to the next
            // owner, who will receive it; acknowledging nothing is correct.
            self.report.released_on_revoke += 1;
            self.bytes.untake_shared(message.byte_size());
            return 0;
        }
        let Some(slot) = self.slots.acquire() else {
            self.wait_for_slot(message);
            return 0;
        };
        let position = message.metadata().position();
        let Some(ticket) = self.partitions.admit(partition, position) else {
            // `of` names an assigned partition, whose engine admits any
            // delivery; turned away as not this run's all the same.
            self.slots.unacquire(slot);
            self.bytes.untake_shared(message.byte_size());
            return 0;
        };
        if self.partitions.slot_held(partition) {
            tracing::warn!(
                partition = %message.metadata().partition_key(),
                max_uncommitted = self.settings.max_uncommitted,
                "a message holds this partition's watermark: fetching this partition pauses \
                 until it finishes"
            );
        }
        let lane = self.lane_for(partition, &message);
        let bytes = self.install(slot, ticket, position, message, SlotState::Ready);
        self.lanes.join(slot, lane);
        // The fast path: nothing waits before it and its lane is free, so it
        // starts now. It takes its lane only if its handler does not finish
        // on the first poll (see `start`), which most do not need.
        let lane_free = lane.is_none_or(|lane| !self.lanes.is_busy(lane));
        if lane_free && self.ready.is_empty() && self.may_start_now() {
            self.start(slot, false);
            return bytes;
        }
        if !self.lanes.acquire(slot) {
            self.slots.get_mut(slot).state = SlotState::Queued;
            return bytes;
        }
        self.ready.push_back(slot);
        bytes
    }

    /// Admits a delivery of a partition paused through the control: it
    /// takes its slot and its ticket (so the partition's watermark stays
    /// before it), and is held, without joining its lane, until the
    /// partition is resumed (`pause.rs`).
    #[cold]
    #[inline(never)]
    fn admit_paused(&mut self, partition: PartitionId, message: Message) -> usize {
        let Some(slot) = self.slots.acquire() else {
            self.wait_for_slot(message);
            return 0;
        };
        let position = message.metadata().position();
        let Some(ticket) = self.partitions.admit(partition, position) else {
            self.slots.unacquire(slot);
            self.bytes.untake_shared(message.byte_size());
            return 0;
        };
        self.partitions.slot_held(partition);
        let bytes = self.install(slot, ticket, position, message, SlotState::Queued);
        self.held.push((slot, false));
        bytes
    }

    /// Holds `message`'s bytes and puts it in `slot` with its ticket, in
    /// `state`; returns its size.
    #[inline(always)]
    fn install(
        &mut self,
        slot: SlotId,
        ticket: Ticket,
        position: Position,
        message: Message,
        state: SlotState,
    ) -> usize {
        let bytes = message.byte_size();
        self.bytes.hold(bytes);
        let entry = self.slots.get_mut(slot);
        entry.ticket = Some(ticket);
        entry.position = Some(position);
        entry.bytes = bytes;
        entry.message = Some(message);
        entry.state = state;
        bytes
    }

    /// The lane of a delivery: `admit`'s, and a held delivery's once it
    /// is resumed.
    #[inline(always)]
    pub(super) fn lane_for(&mut self, partition: PartitionId, message: &Message) -> Option<LaneId> {
        match self.settings.ordering {
            DeliveryOrder::Unordered => None,
            DeliveryOrder::Partition => Some(LaneId::Partition(partition)),
            DeliveryOrder::Key => {
                let key = match &self.settings.key_with {
                    Some(key_with) => key_with(message),
                    None => message.key().map(|key| &key[..]),
                };
                match key {
                    Some(key) => Some(self.lanes.key_lane(partition, key)),
                    None => {
                        self.without_key(message);
                        None
                    }
                }
            }
        }
    }

    /// Keeps a delivery that found no free slot, in order with any others,
    /// for `admit_waiting` to admit once one is free.
    #[cold]
    #[inline(never)]
    fn wait_for_slot(&mut self, message: Message) {
        self.bytes.untake_shared(message.byte_size());
        self.waiting.push(message);
    }

    /// Counts a message that runs unordered in `Key` mode for want of a
    /// key, and warns at the first: the ordering the user asked for does
    /// not hold for it.
    #[cold]
    fn without_key(&mut self, message: &Message) {
        self.report.without_key += 1;
        if self.report.without_key == 1 {
            tracing::warn!(
                partition = %message.metadata().partition_key(),
                position = %message.metadata().position(),
                "a message without a key runs unordered under DeliveryOrder::Key (the run \
                 report counts them in `without_key`); set ConsumerBuilder::key_with if the \
                 key is in a header or the payload"
            );
        }
    }

    /// A partition the source announced as assigned. One still being
    /// revoked is taken back first (see `take_back`).
    pub(super) fn assign(&mut self, partition: PartitionKey) {
        self.release_waiting(|waiting| *waiting == partition);
        if let Some(id) = self.partitions.engine().lookup(&partition)
            && self.partitions.is_revoking(id)
        {
            self.take_back(id);
        }
        self.partitions.assign(partition);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::acker::{AckMode, Acker};
    use crate::commit_engine::CommitEngine;
    use crate::consumer::ConsumerBuilder;
    use crate::consumer::ack_loop::ack_loop;
    use crate::consumer::slots::Slots;
    use crate::memory::MemoryBroker;
    use crate::message::{Metadata, Position};

    fn message(offset: i64) -> Message {
        Message::new(
            "",
            Metadata::new("orders".into(), 0, Position::Offset(offset)),
        )
    }

    /// Review C15: `admit_from` admits no more than the free slots, and
    /// `admit` must not rely on it. Called past the budget, a delivery took
    /// a ticket and then, finding no slot, was dropped: the ticket, never
    /// completed, held the partition's watermark for good, and the message
    /// was gone from the run.
    #[tokio::test(flavor = "current_thread")]
    async fn a_delivery_admitted_without_a_free_slot_takes_no_ticket_and_waits() {
        let broker = MemoryBroker::new();
        broker.create_topic("orders", 1).expect("topic");
        let (_source, acker) = broker.consumer("orders", "g").expect("join");
        let mode = acker.mode();
        let slots = Slots::new(2);
        let (acks, _drain) = ack_loop(
            acker,
            None,
            slots.runtime_waker().clone(),
            Arc::new(AtomicUsize::new(0)),
        );
        let mut settings = ConsumerBuilder::default().settings;
        settings.max_in_flight = 2;
        settings.ordering = DeliveryOrder::Unordered;
        let handler = tower::service_fn(|_message: Message| {
            std::future::pending::<Result<(), HandlerError>>()
        });
        let mut dispatcher = super::super::Dispatcher::new(
            handler,
            slots,
            settings,
            CommitEngine::new(mode),
            false,
            acks,
        );
        assert_eq!(mode, AckMode::Watermark);
        for offset in 0..3 {
            dispatcher.admit(message(offset));
        }
        let partition = dispatcher
            .partitions
            .engine()
            .lookup(&PartitionKey::new("orders", 0))
            .expect("assigned by its first delivery");
        assert_eq!(dispatcher.slots.held(), 2, "the budget holds two");
        assert_eq!(
            dispatcher.partitions.engine().uncommitted(partition),
            2,
            "only deliveries with a slot have a ticket"
        );
        let waiting: Vec<Position> = dispatcher
            .waiting
            .iter()
            .map(|message| message.metadata().position())
            .collect();
        assert_eq!(
            waiting,
            vec![Position::Offset(2)],
            "the third waits for a slot"
        );
    }
}
