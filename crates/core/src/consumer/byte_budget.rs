//! The in-flight byte budget: the bytes of the deliveries the runtime holds
//! ([`Message::byte_size`](crate::Message::byte_size)), against
//! `max_in_flight_bytes`, next to the slots that count them.
//!
//! The budget sizes fetches rather than turning deliveries away: what a
//! fetch brings is already in memory, so holding it back would bound
//! nothing. A fetch asks for as many deliveries as fit in the room left at
//! the average size of recent ones, for one delivery while no size is known
//! yet, and for none while the budget is spent. So the runtime holds at most
//! the budget plus what one fetch brings beyond its average (deliveries of
//! one fetch that are larger than those before), and a single message larger
//! than the whole budget still gets through, alone.
//!
//! A consumer given a [`SharedBudget`](super::SharedBudget) also holds its
//! lease here: admission takes room from it for a fetched batch, every byte
//! given back here goes back there too, and fetches are sized by both.

use std::task::Waker;

use super::shared_budget::{SharedBudget, SharedLease};

/// See the [module docs](self).
#[derive(Debug)]
pub(crate) struct ByteBudget {
    limit: usize,
    held: usize,
    /// A running average of admitted deliveries' sizes (0 until the first).
    average: usize,
    /// The most bytes held at once in this run.
    high_water: usize,
    /// This consumer's share of a budget shared with other consumers.
    shared: Option<SharedLease>,
}

impl ByteBudget {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit,
            held: 0,
            average: 0,
            high_water: 0,
            shared: None,
        }
    }

    /// A budget that also takes its room from `shared`, waking the run with
    /// `waker` when room it waits for is freed there.
    pub(crate) fn with_shared(limit: usize, shared: Option<&SharedBudget>, waker: &Waker) -> Self {
        let mut budget = Self::new(limit);
        budget.shared = shared.map(|shared| SharedLease::new(shared.clone(), waker.clone()));
        budget
    }

    /// How many of the first `candidates` deliveries of `buffer` may be
    /// admitted by the shared budget (all without one); takes their room.
    #[inline]
    pub(crate) fn take_shared(&mut self, buffer: &[crate::Message], candidates: usize) -> usize {
        match &mut self.shared {
            None => candidates,
            Some(lease) => lease.take_prefix(
                buffer[..candidates]
                    .iter()
                    .map(|message| message.byte_size() as u64),
            ),
        }
    }

    /// Gives back the shared room taken for a delivery that was then turned
    /// away (its own bytes were never held here).
    pub(crate) fn untake_shared(&mut self, bytes: usize) {
        if let Some(lease) = &mut self.shared {
            lease.give_back(bytes as u64);
        }
    }

    /// Whether fetched deliveries wait for shared room that is still not
    /// free; the run is woken when some is.
    pub(crate) fn waiting_for_shared(&mut self) -> bool {
        let average = self.average as u64;
        self.shared
            .as_mut()
            .is_some_and(|lease| lease.blocked(average))
    }

    /// Whether the consumer asked the shared budget for room and got none
    /// since it last took some (see [`SharedLease::denied_for`]); without
    /// the clock.
    #[inline]
    pub(crate) fn denied_shared(&self) -> bool {
        self.shared.as_ref().is_some_and(SharedLease::is_denied)
    }

    /// How long the consumer has been denied shared room, as of `now`.
    pub(crate) fn denied_shared_for(
        &self,
        now: tokio::time::Instant,
    ) -> Option<std::time::Duration> {
        self.shared.as_ref().and_then(|lease| lease.denied_for(now))
    }

    /// Counts an admitted delivery's bytes (before its handler may finish
    /// and give them back).
    #[inline]
    pub(crate) fn hold(&mut self, bytes: usize) {
        self.held += bytes;
        self.high_water = self.high_water.max(self.held);
    }

    /// Learns the size of a fetched batch: `bytes` over `count` deliveries.
    /// Half this batch's average and half the earlier one: follows a change
    /// of message sizes within a few fetches, computed once per batch.
    #[inline]
    pub(crate) fn observe(&mut self, bytes: usize, count: usize) {
        if count == 0 {
            return;
        }
        let batch = (bytes / count).max(1);
        self.average = if self.average == 0 {
            batch
        } else {
            (self.average + batch).div_ceil(2)
        };
    }

    /// Gives a freed delivery's bytes back.
    #[inline]
    pub(crate) fn give_back(&mut self, size: usize) {
        self.held = self.held.saturating_sub(size);
        if let Some(lease) = &mut self.shared {
            lease.give_back(size as u64);
        }
    }

    /// How many deliveries the next fetch should bring at most, by bytes:
    /// as many as fit in the room left at the average size (none while less
    /// than one fits), one while no size is known or nothing is held.
    #[inline]
    pub(crate) fn fetch_limit(&mut self) -> usize {
        let own = self.own_fetch_limit();
        match &mut self.shared {
            Some(lease) if own > 0 => own.min(lease.fetch_limit(self.average as u64)),
            _ => own,
        }
    }

    fn own_fetch_limit(&self) -> usize {
        if self.held == 0 {
            self.limit
                .checked_div(self.average)
                .map_or(1, |fit| fit.max(1))
        } else if self.held >= self.limit {
            0
        } else {
            (self.limit - self.held)
                .checked_div(self.average)
                .unwrap_or(0)
        }
    }

    /// The most bytes held at once so far.
    pub(crate) fn high_water(&self) -> usize {
        self.high_water
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spent_budget_fetches_nothing_until_bytes_come_back() {
        let mut budget = ByteBudget::new(100);
        budget.hold(60);
        budget.hold(40);
        budget.observe(100, 2);
        assert_eq!(budget.fetch_limit(), 0, "spent");
        budget.give_back(60);
        assert_eq!(budget.fetch_limit(), 1, "room for one more at the average");
        assert_eq!(budget.high_water(), 100);
        budget.give_back(40);
        assert_eq!(budget.fetch_limit(), 2, "nothing held");
    }

    #[test]
    fn fetches_are_sized_from_the_room_and_the_average_size() {
        let mut budget = ByteBudget::new(1_000);
        assert_eq!(budget.fetch_limit(), 1, "no size seen yet: learn one");
        budget.hold(100);
        budget.observe(100, 1);
        assert_eq!(budget.fetch_limit(), 9, "900 bytes of room at 100");
        budget.hold(850);
        assert_eq!(budget.fetch_limit(), 0, "less than one fits: wait");
        budget.give_back(950);
        assert!(budget.fetch_limit() >= 1, "nothing held: at least one");
    }

    #[test]
    fn a_message_larger_than_the_budget_is_fetched_alone() {
        let mut budget = ByteBudget::new(1_000);
        budget.hold(5_000);
        budget.observe(5_000, 1);
        assert_eq!(budget.fetch_limit(), 0);
        budget.give_back(5_000);
        assert_eq!(budget.fetch_limit(), 1);
    }
}
