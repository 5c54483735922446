//! [`Ring`]: the newest entries up to a fixed bound, for the console's
//! history and its audit trail. Its storage is allocated once, at the
//! bound, and never grows past it.

use std::collections::VecDeque;

/// The newest `capacity` entries pushed, oldest first.
#[derive(Debug)]
pub(super) struct Ring<T> {
    entries: VecDeque<T>,
    capacity: usize,
}

impl<T> Ring<T> {
    /// An empty ring holding at most `capacity` entries (at least 1).
    pub(super) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            entries: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// Adds `entry`, dropping the oldest when the ring is full.
    pub(super) fn push(&mut self, entry: T) {
        if self.entries.len() == self.capacity {
            self.entries.pop_front();
        }
        self.entries.push_back(entry);
    }

    /// The entries, oldest first.
    pub(super) fn iter(&self) -> impl DoubleEndedIterator<Item = &T> + ExactSizeIterator {
        self.entries.iter()
    }

    /// How many entries it holds.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The most it holds.
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.capacity
    }

    /// How much room its storage has (for the test that it never grows).
    #[cfg(test)]
    fn allocated(&self) -> usize {
        self.entries.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_newest_entries_and_never_grows_past_its_bound() {
        let mut ring = Ring::new(180);
        let allocated = ring.allocated();
        assert!(allocated >= 180);
        for sample in 0..10_000u32 {
            ring.push(sample);
            assert!(ring.len() <= 180);
        }
        assert_eq!(ring.len(), 180);
        assert_eq!(ring.capacity(), 180);
        assert_eq!(ring.allocated(), allocated, "no storage beyond the bound");
        let kept: Vec<u32> = ring.iter().copied().collect();
        assert_eq!(kept.first(), Some(&(10_000 - 180)));
        assert_eq!(kept.last(), Some(&9_999));
        assert!(kept.windows(2).all(|pair| pair[0] + 1 == pair[1]));
    }

    #[test]
    fn a_ring_of_nothing_holds_one() {
        let mut ring = Ring::new(0);
        ring.push(1);
        ring.push(2);
        assert_eq!(ring.iter().copied().collect::<Vec<_>>(), vec![2]);
    }
}
