//! Admission: a fetched delivery gets its partition, a ticket of the commit
//! engine, a slot of the budget and its ordering lane, and starts at once
//! when nothing waits before it (the fast path), or waits in `ready`.

use std::sync::Arc;

use tower::Service;

use super::{Dispatcher, PartitionFlags};
use crate::commit_engine::PartitionId;
use crate::consumer::Ordering;
use crate::consumer::lanes::LaneId;
use crate::consumer::slots::SlotState;
use crate::error::HandlerError;
use crate::lifecycle;
use crate::message::Message;

impl<H> Dispatcher<H>
where
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    pub(super) fn admit_all(&mut self, buffer: &mut Vec<Message>) {
        let token = self.token.clone();
        lifecycle::with_shutdown(&token, || {
            let admitted = buffer.len().min(self.slots.free_count());
            for message in buffer.drain(..admitted) {
                self.admit(message);
            }
            self.pump();
        });
    }

    fn admit(&mut self, message: Message) {
        let partition = self.partition_of(&message);
        let flags = &mut self.partitions[partition.index()];
        if flags.revoking {
            // Fetched after the revocation began: it belongs to the next
            // owner, who will receive it; acknowledging nothing is correct.
            self.report.released_on_revoke += 1;
            return;
        }
        let position = message.metadata().position();
        let Some(ticket) = self.engine.admit(partition, position) else {
            return;
        };
        let Some(slot) = self.slots.acquire() else {
            // `admit_all` admits no more than the free slots; keep the
            // engine consistent anyway.
            tracing::error!("no free slot for an admitted delivery; it stays unacknowledged");
            return;
        };
        let flags = &mut self.partitions[partition.index()];
        flags.held += 1;
        if !flags.over_window && self.engine.uncommitted(partition) >= self.settings.max_uncommitted
        {
            flags.over_window = true;
            self.over_window += 1;
            tracing::warn!(
                partition = %message.metadata().partition_key(),
                max_uncommitted = self.settings.max_uncommitted,
                "a message holds this partition's watermark; fetching pauses until it finishes"
            );
        }
        let lane = match self.settings.ordering {
            Ordering::Unordered => None,
            Ordering::Partition => Some(LaneId::Partition(partition)),
            Ordering::Key => message.key().map(|key| self.lanes.key_lane(partition, key)),
        };
        let entry = self.slots.get_mut(slot);
        entry.ticket = Some(ticket);
        entry.position = Some(position);
        entry.message = Some(message);
        entry.lane = lane;
        entry.state = SlotState::Ready;
        // The fast path: nothing waits before it and its lane is free, so it
        // starts now. It takes its lane only if its handler does not finish
        // on the first poll (see `start`), which most do not need.
        let lane_free = lane.is_none_or(|lane| !self.lanes.is_busy(lane));
        if lane_free && self.ready.is_empty() && self.may_start_now() {
            self.start(slot, false);
            return;
        }
        if let Some(lane) = lane {
            if !self.lanes.acquire(lane, slot, &mut self.slots) {
                return;
            }
            self.slots.get_mut(slot).holds_lane = true;
        }
        self.ready.push_back(slot);
    }

    fn partition_of(&mut self, message: &Message) -> PartitionId {
        let metadata = message.metadata();
        if let Some((source, partition, id)) = &self.last_partition
            && *partition == metadata.partition()
            && (Arc::ptr_eq(source, metadata.source()) || **source == **metadata.source())
        {
            return *id;
        }
        let key = metadata.partition_key();
        let id = match self.engine.lookup(&key) {
            Some(id) => id,
            None => self.assign(key),
        };
        self.last_partition = Some((metadata.source().clone(), metadata.partition(), id));
        id
    }

    pub(super) fn assign(&mut self, partition: crate::message::PartitionKey) -> PartitionId {
        if let Some(id) = self.engine.lookup(&partition)
            && self.partitions[id.index()].revoking
        {
            self.take_back(id);
        }
        let id = self.engine.assign(partition);
        if self.partitions.len() <= id.index() {
            self.partitions
                .resize(id.index() + 1, PartitionFlags::default());
        }
        let flags = &mut self.partitions[id.index()];
        if flags.over_window {
            self.over_window -= 1;
        }
        // Deliveries of an earlier assignment that was not revoked may still
        // run; their tickets are stale now, and `held` keeps counting them
        // until they finish.
        let held = flags.held;
        *flags = PartitionFlags {
            held,
            ..PartitionFlags::default()
        };
        self.last_partition = None;
        id
    }
}
