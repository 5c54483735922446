//! Admission: a fetched delivery gets its partition, a ticket of the commit
//! engine, a slot of the budget and its ordering lane, and starts at once
//! when nothing waits before it (the fast path), or waits in `ready`.

use tower::Service;

use super::Dispatcher;
use crate::consumer::DeliveryOrder;
use crate::consumer::lanes::LaneId;
use crate::consumer::slots::SlotState;
use crate::error::HandlerError;
use crate::message::{Message, PartitionKey};
use crate::shutdown_scope;

impl<H> Dispatcher<H>
where
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    /// Admits as many buffered deliveries as the budget has free slots, and
    /// a shared budget room (the rest stay buffered, and the run waits for
    /// room), then starts what may start.
    pub(super) fn admit_all(&mut self, buffer: &mut Vec<Message>) {
        let token = self.token.clone();
        shutdown_scope::with_shutdown(&token, || {
            let free = buffer.len().min(self.slots.free_count());
            let admitted = self.bytes.take_shared(buffer, free);
            let mut bytes = 0;
            for message in buffer.drain(..admitted) {
                bytes += self.admit(message);
            }
            self.bytes.observe(bytes, admitted);
            self.pump();
        });
    }

    /// Admits one delivery: see the module docs. Returns its bytes, counted
    /// in the byte budget by the caller (0 when it was turned away).
    fn admit(&mut self, message: Message) -> usize {
        let partition = self.partitions.of(&message);
        if self.partitions.is_revoking(partition) {
            // Fetched after the revocation began: it belongs to the next
            // owner, who will receive it; acknowledging nothing is correct.
            self.report.released_on_revoke += 1;
            self.bytes.untake_shared(message.byte_size());
            return 0;
        }
        let position = message.metadata().position();
        let Some(ticket) = self.partitions.admit(partition, position) else {
            self.bytes.untake_shared(message.byte_size());
            return 0;
        };
        let Some(slot) = self.slots.acquire() else {
            // `admit_all` admits no more than the free slots; keep the
            // engine consistent anyway.
            tracing::error!("no free slot for an admitted delivery; it stays unacknowledged");
            self.bytes.untake_shared(message.byte_size());
            return 0;
        };
        if self.partitions.slot_held(partition) {
            tracing::warn!(
                partition = %message.metadata().partition_key(),
                max_uncommitted = self.settings.max_uncommitted,
                "a message holds this partition's watermark; fetching pauses until it finishes"
            );
        }
        let lane = match self.settings.ordering {
            DeliveryOrder::Unordered => None,
            DeliveryOrder::Partition => Some(LaneId::Partition(partition)),
            DeliveryOrder::Key => {
                let key = match &self.settings.key_with {
                    Some(key_with) => key_with(&message),
                    None => message.key().map(|key| &key[..]),
                };
                match key {
                    Some(key) => Some(self.lanes.key_lane(partition, key)),
                    None => {
                        self.without_key(&message);
                        None
                    }
                }
            }
        };
        let bytes = message.byte_size();
        self.bytes.hold(bytes);
        let entry = self.slots.get_mut(slot);
        entry.ticket = Some(ticket);
        entry.position = Some(position);
        entry.bytes = bytes;
        entry.message = Some(message);
        entry.state = SlotState::Ready;
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
        if let Some(id) = self.partitions.engine().lookup(&partition)
            && self.partitions.is_revoking(id)
        {
            self.take_back(id);
        }
        self.partitions.assign(partition);
    }
}
