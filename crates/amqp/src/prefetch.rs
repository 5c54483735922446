//! [`Prefetch`]: how many unacknowledged deliveries the broker may push to
//! the source's consumer ahead of the runtime (`basic.qos`), from the
//! consumer's [`Limits`].
//!
//! The count is the consumer's `max_in_flight`: every delivery the runtime
//! holds is unacknowledged, so what lapin buffers plus what the runtime
//! holds stays within it however long the queue is. The bytes need more:
//! RabbitMQ refuses a `basic.qos` with a prefetch size (`NOT_IMPLEMENTED -
//! prefetch_size!=0`, and lapin does not send one), so the only bound it
//! takes is a count. Once deliveries were seen, the prefetch is therefore
//! also kept to as many as fit in half of `max_in_flight_bytes` at their
//! recent average size ([`Message::byte_size`](intake_core::Message::byte_size)).
//!
//! RabbitMQ applies a `basic.qos` only to the consumers started after it,
//! never to one already consuming, so the prefetch is computed when a
//! consumer starts: the first session's takes the count alone (no size is
//! known yet), and every reopened channel's takes the sizes seen so far.
//! Changing it on a running consumer would take a second consumer on the
//! channel; see `Consuming` in the source for why the source does not.

use intake_core::backend::Limits;
use intake_core::consumer::DEFAULT_MAX_IN_FLIGHT_BYTES;

/// AMQP's `prefetch-count` is a 16-bit number; 0 means "no limit".
const MAX_PREFETCH: u16 = u16::MAX;

/// The consumer runtime's default `max_in_flight`, assumed until the
/// runtime tells its own.
const DEFAULT_MAX_IN_FLIGHT: usize = 256;

/// Deliveries the running average weighs: past this count, the sums are
/// halved, so the average follows a change of sizes within about as many
/// deliveries and costs no memory per delivery.
const AVERAGE_WINDOW: u64 = 64;

/// The consumer's limits as the source knows them, and the recent sizes of
/// its deliveries; see the [module docs](self).
#[derive(Clone, Debug)]
pub(crate) struct Prefetch {
    max_in_flight: usize,
    max_in_flight_bytes: usize,
    recent_bytes: u64,
    recent_deliveries: u64,
}

impl Default for Prefetch {
    /// The consumer runtime's default limits (256 deliveries, 64 MiB), until
    /// it tells its own with [`Prefetch::set_limits`].
    fn default() -> Self {
        Self {
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            max_in_flight_bytes: DEFAULT_MAX_IN_FLIGHT_BYTES,
            recent_bytes: 0,
            recent_deliveries: 0,
        }
    }
}

impl Prefetch {
    /// Takes the consumer's limits.
    pub(crate) fn set_limits(&mut self, limits: Limits) {
        self.max_in_flight = limits.max_in_flight;
        self.max_in_flight_bytes = limits.max_in_flight_bytes;
    }

    /// Learns the size of a batch: `bytes` over `deliveries`. Cheap enough
    /// for every batch: a few additions, no allocation.
    pub(crate) fn observe(&mut self, bytes: usize, deliveries: usize) {
        if deliveries == 0 {
            return;
        }
        let to_u64 = |value: usize| u64::try_from(value).unwrap_or(u64::MAX);
        self.recent_bytes = self.recent_bytes.saturating_add(to_u64(bytes));
        self.recent_deliveries = self.recent_deliveries.saturating_add(to_u64(deliveries));
        while self.recent_deliveries > AVERAGE_WINDOW {
            self.recent_bytes /= 2;
            self.recent_deliveries /= 2;
        }
    }

    /// The prefetch for a consumer started now: the consumer's
    /// `max_in_flight` (1 to 65,535), and, once sizes are known, no more
    /// than fit in half of its byte budget at the recent average size (at
    /// least 1, so a message larger than the budget still comes, alone).
    pub(crate) fn count(&self) -> u16 {
        let by_count = u16::try_from(self.max_in_flight)
            .unwrap_or(MAX_PREFETCH)
            .max(1);
        if self.recent_deliveries == 0 {
            return by_count;
        }
        let average = (self.recent_bytes / self.recent_deliveries).max(1);
        let half_budget = u64::try_from(self.max_in_flight_bytes / 2).unwrap_or(u64::MAX);
        let by_bytes = u16::try_from(half_budget / average)
            .unwrap_or(MAX_PREFETCH)
            .max(1);
        by_count.min(by_bytes)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn limits(max_in_flight: usize, max_in_flight_bytes: usize) -> Limits {
        Limits::new(max_in_flight, max_in_flight_bytes, Duration::from_secs(10))
    }

    #[test]
    fn until_the_runtime_tells_its_limits_the_prefetch_is_its_default_budget() {
        assert_eq!(Prefetch::default().count(), 256);
    }

    #[test]
    fn the_count_is_the_consumers_budget_within_what_amqp_can_say() {
        let mut prefetch = Prefetch::default();
        prefetch.set_limits(limits(3, usize::MAX));
        assert_eq!(prefetch.count(), 3);
        // 0 would mean "no limit" to the broker.
        prefetch.set_limits(limits(0, usize::MAX));
        assert_eq!(prefetch.count(), 1);
        prefetch.set_limits(limits(100_000, usize::MAX));
        assert_eq!(prefetch.count(), u16::MAX);
    }

    #[test]
    fn large_messages_are_prefetched_within_half_the_byte_budget() {
        let mut prefetch = Prefetch::default();
        prefetch.set_limits(limits(256, 1 << 20));
        assert_eq!(prefetch.count(), 256, "no size known yet");
        prefetch.observe(500_000, 5);
        assert_eq!(prefetch.count(), 5, "512 KiB of 100 kB messages");
        // A message larger than the whole budget still comes, alone.
        prefetch.observe(50 << 20, 1);
        assert_eq!(prefetch.count(), 1);
    }

    #[test]
    fn the_average_follows_the_recent_sizes() {
        let mut prefetch = Prefetch::default();
        prefetch.set_limits(limits(1000, 64 << 20));
        prefetch.observe(1_000_000 * 64, 64);
        assert_eq!(prefetch.count(), 33);
        for _ in 0..100 {
            prefetch.observe(100_000 * 8, 8);
        }
        let count = prefetch.count();
        assert!(
            (320..=335).contains(&count),
            "sized for about 100 kB again: {count}"
        );
    }

    proptest::proptest! {
        /// Whatever the sizes, the prefetch times the recent average stays
        /// within the byte budget (or is a single delivery), and within the
        /// count budget.
        #[test]
        fn prefetch_times_the_recent_average_stays_within_the_budget(
            budget in 1usize..(1 << 30),
            max_in_flight in 1usize..100_000,
            batches in proptest::collection::vec((1usize..(4 << 20), 1usize..200), 1..200),
        ) {
            let mut prefetch = Prefetch::default();
            prefetch.set_limits(limits(max_in_flight, budget));
            for (size, count) in batches {
                prefetch.observe(size * count, count);
                let average = prefetch.recent_bytes / prefetch.recent_deliveries.max(1);
                let count = u64::from(prefetch.count());
                proptest::prop_assert!(count <= max_in_flight as u64);
                proptest::prop_assert!(
                    count == 1 || count * average <= budget as u64 / 2,
                    "prefetch {count} × average {average} over half the budget {budget}"
                );
            }
        }
    }
}
