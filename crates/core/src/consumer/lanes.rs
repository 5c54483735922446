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

/// Which lane a delivery belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LaneId {
    /// A whole partition (`Ordering::Partition`).
    Partition(PartitionId),
    /// A key within a partition (`Ordering::Key`), by hash. Two keys that
    /// collide share a lane: over-serialized, never reordered.
    Key(u64),
}

/// Busy lanes and their queues. Partition lanes live in a table indexed by
/// partition (no hashing on the hot path); key lanes in a map.
pub(crate) struct Lanes {
    by_partition: Vec<Option<Lane>>,
    by_key: HashMap<u64, Lane, FixedState>,
    hasher: FixedState,
}

impl Lanes {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            by_partition: Vec::new(),
            by_key: HashMap::with_capacity_and_hasher(capacity, FixedState::default()),
            hasher: FixedState::with_seed(rand::random()),
        }
    }

    /// The lane of a keyed message within its partition.
    pub(crate) fn key_lane(&self, partition: PartitionId, key: &[u8]) -> LaneId {
        let mut hasher = self.hasher.build_hasher();
        hasher.write_u32(partition.index() as u32);
        hasher.write(key);
        LaneId::Key(hasher.finish())
    }

    /// Whether a delivery holds `lane`.
    pub(crate) fn is_busy(&self, lane: LaneId) -> bool {
        match lane {
            LaneId::Partition(partition) => self
                .by_partition
                .get(partition.index())
                .is_some_and(Option::is_some),
            LaneId::Key(hash) => self.by_key.contains_key(&hash),
        }
    }

    fn get_mut(&mut self, lane: LaneId) -> Option<&mut Lane> {
        match lane {
            LaneId::Partition(partition) => self.by_partition.get_mut(partition.index())?.as_mut(),
            LaneId::Key(hash) => self.by_key.get_mut(&hash),
        }
    }

    fn insert(&mut self, lane: LaneId, value: Lane) {
        match lane {
            LaneId::Partition(partition) => {
                let index = partition.index();
                if self.by_partition.len() <= index {
                    self.by_partition.resize(index + 1, None);
                }
                self.by_partition[index] = Some(value);
            }
            LaneId::Key(hash) => {
                self.by_key.insert(hash, value);
            }
        }
    }

    fn remove(&mut self, lane: LaneId) -> Option<Lane> {
        match lane {
            LaneId::Partition(partition) => self.by_partition.get_mut(partition.index())?.take(),
            LaneId::Key(hash) => self.by_key.remove(&hash),
        }
    }

    /// Takes `lane` for `slot` if it is free (returns `true`), or queues
    /// `slot` behind it (returns `false`).
    pub(crate) fn acquire<F: std::future::Future>(
        &mut self,
        lane: LaneId,
        slot: SlotId,
        slots: &mut Slots<F>,
    ) -> bool {
        match self.get_mut(lane) {
            None => {
                self.insert(
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
        lane: LaneId,
        slot: SlotId,
        slots: &mut Slots<F>,
    ) -> Option<SlotId> {
        let queue = self.get_mut(lane)?;
        if queue.holder != slot {
            return None;
        }
        match queue.head {
            None => {
                self.remove(lane);
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
        lane: LaneId,
        slots: &mut Slots<F>,
        queued: &mut Vec<SlotId>,
    ) {
        let Some(queue) = self.remove(lane) else {
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
        self.by_key.len() + self.by_partition.iter().flatten().count()
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
        let lane = LaneId::Key(9);
        assert!(lanes.acquire(lane, ids[0], &mut slots));
        assert!(!lanes.acquire(lane, ids[1], &mut slots));
        assert!(!lanes.acquire(lane, ids[2], &mut slots));
        assert_eq!(lanes.release(lane, ids[0], &mut slots), Some(ids[1]));
        assert_eq!(lanes.release(lane, ids[1], &mut slots), Some(ids[2]));
        assert_eq!(lanes.release(lane, ids[2], &mut slots), None);
        assert_eq!(lanes.busy(), 0);
    }

    #[test]
    fn a_former_holder_cannot_release_a_lane_taken_again() {
        let mut slots: Slots<Ready<()>> = Slots::new(4);
        let mut lanes = Lanes::with_capacity(4);
        let old = slots.acquire().unwrap_or_default();
        let new = slots.acquire().unwrap_or_default();
        let lane = LaneId::Key(1);
        assert!(lanes.acquire(lane, old, &mut slots));
        let mut queued = Vec::new();
        lanes.drop_lane(lane, &mut slots, &mut queued);
        assert!(lanes.acquire(lane, new, &mut slots));
        assert_eq!(lanes.release(lane, old, &mut slots), None);
        assert_eq!(lanes.busy(), 1);
    }
}
