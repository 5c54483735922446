//! Ordering lanes: at most one delivery per lane runs at a time, and the
//! deliveries of a lane start in the order they were admitted.
//!
//! A lane is a partition (`Ordering::Partition`) or a key within a partition
//! (`Ordering::Key`). Waiting deliveries form an intrusive list through their
//! slots, so queueing allocates nothing; the map holds only busy lanes.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use foldhash::fast::FixedState;

use super::slots::{SlotId, SlotState, Slots};
use crate::commit_engine::PartitionId;

#[derive(Clone, Copy, Debug)]
struct Lane {
    /// The delivery that holds the lane (ready or running).
    holder: SlotId,
    head: Option<SlotId>,
    tail: Option<SlotId>,
}

/// Busy lanes and their queues.
pub(crate) struct Lanes {
    busy: HashMap<u64, Lane, FixedState>,
    hasher: FixedState,
}

impl Lanes {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            busy: HashMap::with_capacity_and_hasher(capacity, FixedState::default()),
            hasher: FixedState::with_seed(rand::random()),
        }
    }

    /// The lane of a keyed message within its partition.
    pub(crate) fn key_lane(&self, partition: PartitionId, key: &[u8]) -> u64 {
        let mut hasher = self.hasher.build_hasher();
        hasher.write_u32(partition.index() as u32);
        hasher.write(key);
        hasher.finish()
    }

    /// The lane of a whole partition.
    pub(crate) fn partition_lane(partition: PartitionId) -> u64 {
        partition.index() as u64
    }

    /// Takes `lane` for `slot` if it is free (returns `true`), or queues
    /// `slot` behind it (returns `false`).
    pub(crate) fn acquire<F: std::future::Future>(
        &mut self,
        lane: u64,
        slot: SlotId,
        slots: &mut Slots<F>,
    ) -> bool {
        match self.busy.get_mut(&lane) {
            None => {
                self.busy.insert(
                    lane,
                    Lane {
                        holder: slot,
                        head: None,
                        tail: None,
                    },
                );
                true
            }
            Some(queue) => {
                let entry = slots.get_mut(slot);
                entry.state = SlotState::Queued;
                entry.next_in_lane = None;
                match queue.tail {
                    Some(tail) => slots.get_mut(tail).next_in_lane = Some(slot),
                    None => queue.head = Some(slot),
                }
                queue.tail = Some(slot);
                false
            }
        }
    }

    /// Releases `lane` held by `slot` and returns the next queued delivery,
    /// which now holds the lane. Does nothing if `slot` does not hold it (the
    /// lane was dropped by a revocation and perhaps taken again since).
    pub(crate) fn release<F: std::future::Future>(
        &mut self,
        lane: u64,
        slot: SlotId,
        slots: &mut Slots<F>,
    ) -> Option<SlotId> {
        let queue = self.busy.get_mut(&lane)?;
        if queue.holder != slot {
            return None;
        }
        match queue.head {
            None => {
                self.busy.remove(&lane);
                None
            }
            Some(next) => {
                let entry = slots.get_mut(next);
                queue.head = entry.next_in_lane.take();
                if queue.head.is_none() {
                    queue.tail = None;
                }
                queue.holder = next;
                Some(next)
            }
        }
    }

    /// Forgets `lane` entirely (its partition was revoked) and returns the
    /// deliveries that were queued in it, in order.
    pub(crate) fn drop_lane<F: std::future::Future>(
        &mut self,
        lane: u64,
        slots: &mut Slots<F>,
        queued: &mut Vec<SlotId>,
    ) {
        let Some(queue) = self.busy.remove(&lane) else {
            return;
        };
        let mut next = queue.head;
        while let Some(slot) = next {
            queued.push(slot);
            next = slots.get_mut(slot).next_in_lane.take();
        }
    }

    /// Number of busy lanes.
    #[cfg(test)]
    pub(crate) fn busy(&self) -> usize {
        self.busy.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Ready;

    #[test]
    fn a_lane_runs_one_delivery_at_a_time_in_admission_order() {
        let mut slots: Slots<Ready<()>> = Slots::new(4);
        let mut lanes = Lanes::with_capacity(4);
        let ids: Vec<SlotId> = (0..3).filter_map(|_| slots.acquire()).collect();
        assert!(lanes.acquire(9, ids[0], &mut slots));
        assert!(!lanes.acquire(9, ids[1], &mut slots));
        assert!(!lanes.acquire(9, ids[2], &mut slots));
        assert_eq!(lanes.release(9, ids[0], &mut slots), Some(ids[1]));
        assert_eq!(lanes.release(9, ids[1], &mut slots), Some(ids[2]));
        assert_eq!(lanes.release(9, ids[2], &mut slots), None);
        assert_eq!(lanes.busy(), 0);
    }

    #[test]
    fn a_former_holder_cannot_release_a_lane_taken_again() {
        let mut slots: Slots<Ready<()>> = Slots::new(4);
        let mut lanes = Lanes::with_capacity(4);
        let old = slots.acquire().unwrap_or_default();
        let new = slots.acquire().unwrap_or_default();
        assert!(lanes.acquire(1, old, &mut slots));
        let mut queued = Vec::new();
        lanes.drop_lane(1, &mut slots, &mut queued);
        assert!(lanes.acquire(1, new, &mut slots));
        assert_eq!(lanes.release(1, old, &mut slots), None);
        assert_eq!(lanes.busy(), 1);
    }
}
