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
        let token = self.token.clone();
        shutdown_scope::with_shutdown(&token, || {
            self.admit_from(buffer);
            self.pump();
        });
        if !buffer.is_empty() {
            // `waiting` is empty: a swap moves them without a copy.
            std::mem::swap(buffer, &mut self.waiting);
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
        self.release_waiting(|waiting| *waiting == partition);
        if let Some(id) = self.partitions.engine().lookup(&partition)
            && self.partitions.is_revoking(id)
        {
            self.take_back(id);
        }
        self.partitions.assign(partition);
    }
}
