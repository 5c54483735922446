//! Delivery-order lanes: at most one delivery per lane runs at a time, and the
//! deliveries of a lane start in the order they were admitted.
//!
//! A lane is a partition (`DeliveryOrder::Partition`) or a key within a partition
//! (`DeliveryOrder::Key`). Each slot has an entry here, allocated with the
//! budget, that records its delivery's lane and links the deliveries
//! waiting in a lane into a list, so queueing allocates nothing; the map
//! holds only busy lanes.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use foldhash::fast::FixedState;

use super::slots::SlotId;
use crate::commit_engine::PartitionId;

#[derive(Clone, Copy, Debug)]
struct Lane {
    /// The delivery that holds the lane (ready or running).
    holder: SlotId,
    head: Option<SlotId>,
    tail: Option<SlotId>,
}

/// A held delivery's place in the lanes (one per slot).
#[derive(Clone, Copy, Debug, Default)]
struct Member {
    /// Its lane (`None`: unordered).
    lane: Option<LaneId>,
    /// Whether it holds its lane (a delivery that starts on the fast path
    /// and finishes at once never takes it).
    holds: bool,
    /// The next delivery queued behind it in its lane.
    next: Option<SlotId>,
    /// Its handler handed the lane on while it still runs (its outputs are
    /// sent, their confirmations awaited: see `turns.rs`): it never takes
    /// the lane again, its key's turns keep its order from then on.
    released: bool,
}

/// Which lane a delivery belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LaneId {
    /// A whole partition (`DeliveryOrder::Partition`).
    Partition(PartitionId),
    /// A key within a partition (`DeliveryOrder::Key`), by hash. Two keys that
    /// collide share a lane: over-serialized, never reordered.
    Key(u64),
}

/// The busy lanes, each with its holder and queue. Partition lanes live in a
/// table indexed by partition (no hashing on the hot path); key lanes in a
/// map.
struct Busy {
    by_partition: Vec<Option<Lane>>,
    by_key: HashMap<u64, Lane, FixedState>,
}

impl Busy {
    fn contains(&self, lane: LaneId) -> bool {
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
}

/// The busy lanes, and each held delivery's place in them.
pub(crate) struct Lanes {
    busy: Busy,
    hasher: FixedState,
    /// Indexed by slot: valid from `join` until the slot holds another
    /// delivery, which joins again.
    members: Box<[Member]>,
}

// `join` and `release` run for every message and are `#[inline]`: the
// dispatcher is generic, so it is compiled in the user's crate, where a
// method of this (non-generic) type is otherwise a call across crates.
impl Lanes {
    /// Lanes for a budget of `capacity` slots.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            busy: Busy {
                by_partition: Vec::new(),
                by_key: HashMap::with_capacity_and_hasher(capacity, FixedState::default()),
            },
            hasher: FixedState::with_seed(rand::random()),
            members: vec![Member::default(); capacity].into_boxed_slice(),
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
        self.busy.contains(lane)
    }

    /// Records the lane of the delivery `slot` now holds (`None`:
    /// unordered). It holds no lane yet.
    #[inline]
    pub(crate) fn join(&mut self, slot: SlotId, lane: Option<LaneId>) {
        self.members[slot as usize] = Member {
            lane,
            holds: false,
            next: None,
            released: false,
        };
    }

    /// The lane of the delivery in `slot`.
    pub(crate) fn lane_of(&self, slot: SlotId) -> Option<LaneId> {
        self.members[slot as usize].lane
    }

    /// Takes the lane of `slot`'s delivery if it is free (returns `true`),
    /// or queues the delivery behind it (returns `false`). A delivery
    /// without a lane, or holding its lane already, has nothing to wait
    /// for (`true`), nor has one that [handed its lane
    /// on](Self::release_early).
    pub(crate) fn acquire(&mut self, slot: SlotId) -> bool {
        let member = self.members[slot as usize];
        let Some(lane) = member.lane.filter(|_| !member.holds && !member.released) else {
            return true;
        };
        match self.busy.get_mut(lane) {
            None => {
                self.busy.insert(
                    lane,
                    Lane {
                        holder: slot,
                        head: None,
                        tail: None,
                    },
                );
                self.members[slot as usize].holds = true;
                true
            }
            Some(queue) => {
                self.members[slot as usize].next = None;
                match queue.tail {
                    Some(tail) => self.members[tail as usize].next = Some(slot),
                    None => queue.head = Some(slot),
                }
                queue.tail = Some(slot);
                false
            }
        }
    }

    /// Releases the lane `slot`'s delivery holds, if it holds one, and
    /// returns the next queued delivery, which now holds the lane. Does
    /// nothing if the lane has another holder (it was dropped by a
    /// revocation and perhaps taken again since).
    #[inline]
    pub(crate) fn release(&mut self, slot: SlotId) -> Option<SlotId> {
        let member = self.members[slot as usize];
        let lane = member.lane.filter(|_| member.holds)?;
        let queue = self.busy.get_mut(lane)?;
        if queue.holder != slot {
            return None;
        }
        match queue.head {
            None => {
                self.busy.remove(lane);
                None
            }
            Some(next) => {
                let after = self.members[next as usize].next.take();
                queue.head = after;
                if after.is_none() {
                    queue.tail = None;
                }
                queue.holder = next;
                self.members[next as usize].holds = true;
                Some(next)
            }
        }
    }

    /// Hands on the lane of `slot`'s delivery while it still runs (its
    /// outputs are sent): returns the next queued delivery, which now holds
    /// the lane. The delivery never takes its lane again.
    pub(crate) fn release_early(&mut self, slot: SlotId) -> Option<SlotId> {
        let next = self.release(slot);
        let member = &mut self.members[slot as usize];
        member.holds = false;
        member.released = true;
        next
    }

    /// Whether `slot`'s delivery handed its lane on while running.
    pub(crate) fn released_early(&self, slot: SlotId) -> bool {
        self.members[slot as usize].released
    }

    /// Forgets `lane` entirely (its partition was revoked), with the queue
    /// of deliveries waiting in it.
    pub(crate) fn drop_lane(&mut self, lane: LaneId) {
        let Some(queue) = self.busy.remove(lane) else {
            return;
        };
        let mut next = queue.head;
        while let Some(slot) = next {
            next = self.members[slot as usize].next.take();
        }
    }

    /// Number of busy lanes.
    #[cfg(test)]
    pub(crate) fn busy(&self) -> usize {
        self.busy.by_key.len() + self.busy.by_partition.iter().flatten().count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lane_runs_one_delivery_at_a_time_in_admission_order() {
        let mut lanes = Lanes::with_capacity(4);
        let ids: Vec<SlotId> = (0..3).collect();
        let lane = LaneId::Key(9);
        for &slot in &ids {
            lanes.join(slot, Some(lane));
        }
        assert!(lanes.acquire(ids[0]));
        assert!(!lanes.acquire(ids[1]));
        assert!(!lanes.acquire(ids[2]));
        assert_eq!(lanes.release(ids[0]), Some(ids[1]));
        assert_eq!(lanes.release(ids[1]), Some(ids[2]));
        assert_eq!(lanes.release(ids[2]), None);
        assert_eq!(lanes.busy(), 0);
    }

    #[test]
    fn a_former_holder_cannot_release_a_lane_taken_again() {
        let mut lanes = Lanes::with_capacity(4);
        let (old, new) = (0, 1);
        let lane = LaneId::Key(1);
        lanes.join(old, Some(lane));
        lanes.join(new, Some(lane));
        assert!(lanes.acquire(old));
        lanes.drop_lane(lane);
        assert!(lanes.acquire(new));
        assert_eq!(lanes.release(old), None);
        assert_eq!(lanes.busy(), 1);
    }

    #[test]
    fn a_delivery_that_handed_its_lane_on_never_takes_it_again() {
        let mut lanes = Lanes::with_capacity(4);
        let lane = LaneId::Key(3);
        for slot in 0..3 {
            lanes.join(slot, Some(lane));
        }
        assert!(lanes.acquire(0));
        assert!(!lanes.acquire(1));
        assert_eq!(lanes.release_early(0), Some(1));
        // Dispatched again (a retry) while the next one holds the lane.
        assert!(lanes.acquire(0), "nothing to wait for");
        assert!(!lanes.acquire(2), "queued behind the holder");
        assert_eq!(lanes.release(0), None, "it holds nothing");
        assert_eq!(lanes.release(1), Some(2));
        assert_eq!(lanes.release(2), None);
        assert_eq!(lanes.busy(), 0);
    }
}
