//! [`Prefetch`]: how many unacknowledged deliveries the broker may push to
//! the source's consumer ahead of the runtime (`basic.qos`), from the
//! consumer's [`Limits`].
//!
//! The count is the consumer's `max_in_flight`: every delivery the runtime
//! holds is unacknowledged, so what lapin buffers plus what the runtime
//! holds stays within it however long the queue is.
//!
//! RabbitMQ applies a `basic.qos` only to the consumers started after it,
//! never to one already consuming, so the prefetch is computed when a
//! consumer starts. Changing it on a running consumer would take a second
//! consumer on the channel; see `Consuming` in the source for why the
//! source does not.

use intake_core::Limits;

/// AMQP's `prefetch-count` is a 16-bit number; 0 means "no limit".
const MAX_PREFETCH: u16 = u16::MAX;

/// The consumer runtime's default `max_in_flight`, assumed until the
/// runtime tells its own.
const DEFAULT_MAX_IN_FLIGHT: usize = 256;

/// The consumer's limits as the source knows them; see the
/// [module docs](self).
#[derive(Clone, Debug)]
pub(crate) struct Prefetch {
    max_in_flight: usize,
}

impl Default for Prefetch {
    /// The consumer runtime's default limits (256 deliveries), until it
    /// tells its own with [`Prefetch::set_limits`].
    fn default() -> Self {
        Self {
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        }
    }
}

impl Prefetch {
    /// Takes the consumer's limits.
    pub(crate) fn set_limits(&mut self, limits: Limits) {
        self.max_in_flight = limits.max_in_flight;
    }

    /// The prefetch for a consumer started now: the consumer's
    /// `max_in_flight` (1 to 65,535).
    pub(crate) fn count(&self) -> u16 {
        u16::try_from(self.max_in_flight)
            .unwrap_or(MAX_PREFETCH)
            .max(1)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn limits(max_in_flight: usize) -> Limits {
        Limits::new(max_in_flight, usize::MAX, Duration::from_secs(10))
    }

    #[test]
    fn until_the_runtime_tells_its_limits_the_prefetch_is_its_default_budget() {
        assert_eq!(Prefetch::default().count(), 256);
    }

    #[test]
    fn the_count_is_the_consumers_budget_within_what_amqp_can_say() {
        let mut prefetch = Prefetch::default();
        prefetch.set_limits(limits(3));
        assert_eq!(prefetch.count(), 3);
        // 0 would mean "no limit" to the broker.
        prefetch.set_limits(limits(0));
        assert_eq!(prefetch.count(), 1);
        prefetch.set_limits(limits(100_000));
        assert_eq!(prefetch.count(), u16::MAX);
    }
}
