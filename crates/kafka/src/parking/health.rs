//! The mover's health, for a health check and a metric.

use super::*;

impl KafkaParking {
    /// The mover's health as a part of an app's: add it with
    /// `health.add_check("parking", move || parking.part_health())`
    /// ([`MoverHealth::as_part_health`]).
    pub fn part_health(&self) -> PartHealth {
        self.mover_health().as_part_health()
    }

    /// The mover's state, for a health check or a metric: whether it runs,
    /// how often it panicked and was started again, how long ago its last
    /// round began. [`MoverHealth::is_live`] is false while parked
    /// messages cannot come back through this process: the mover stopped,
    /// waits to start again after a panic, or has not begun a round for
    /// longer than a round can take.
    pub fn mover_health(&self) -> MoverHealth {
        let shared = &*self.inner.mover;
        MoverHealth {
            running: shared.running.load(Ordering::Acquire),
            restarts: shared.restarts.load(Ordering::Relaxed),
            since_last_round: shared.since_last_round(),
            stall_after: MoverShared::stall_after(self.inner.delivery_timeout),
        }
    }
}

/// The state of a [`KafkaParking`]'s mover: see
/// [`KafkaParking::mover_health`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MoverHealth {
    /// Whether a mover runs: false before its first round, while it waits
    /// to start again after a panic, and after
    /// [`shutdown`](KafkaParking::shutdown).
    pub running: bool,
    /// How often the mover panicked and was started again (each logged at
    /// ERROR): a counter for a metric.
    pub restarts: u64,
    /// How long ago its last round began, `None` before the first.
    pub since_last_round: Option<Duration>,
    /// How long a round may take (the delivery timeout, with slack) before
    /// the mover counts as stalled.
    pub stall_after: Duration,
}

impl MoverHealth {
    /// Whether parked messages come back through this process: the mover
    /// runs and began a round within [`stall_after`](Self::stall_after).
    pub fn is_live(&self) -> bool {
        self.running
            && self
                .since_last_round
                .is_some_and(|since| since <= self.stall_after)
    }

    /// As a part of an app's health
    /// ([`Health::add_check`](intake_core::app::Health::add_check)): not
    /// live once no round began for [`stall_after`](Self::stall_after) (a
    /// restart of the process is what is left), not ready while it starts or
    /// starts again after a panic.
    pub fn as_part_health(&self) -> PartHealth {
        match (self.since_last_round, self.running) {
            (Some(since), _) if since > self.stall_after => PartHealth::NotLive(format!(
                "the parking mover began no round for {since:?} ({} restarts after a panic): \
                 parked messages do not come back",
                self.restarts
            )),
            (None, _) => {
                PartHealth::NotReady("the parking mover has not begun its first round".to_owned())
            }
            (Some(_), false) => PartHealth::NotReady(format!(
                "the parking mover starts again after a panic ({} restarts)",
                self.restarts
            )),
            (Some(_), true) => PartHealth::Healthy,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mover_is_live_while_it_turns_and_not_ready_while_it_starts() {
        let mover = |running, since_last_round: Option<u64>, restarts| MoverHealth {
            running,
            restarts,
            since_last_round: since_last_round.map(Duration::from_secs),
            stall_after: Duration::from_secs(60),
        };
        assert_eq!(
            mover(true, Some(1), 0).as_part_health(),
            PartHealth::Healthy
        );
        assert!(matches!(
            mover(false, None, 0).as_part_health(),
            PartHealth::NotReady(_)
        ));
        assert!(matches!(
            mover(false, Some(2), 1).as_part_health(),
            PartHealth::NotReady(_)
        ));
        // No round for longer than a round can take: parked messages stay
        // where they are until the process is restarted.
        for running in [true, false] {
            assert!(matches!(
                mover(running, Some(61), 3).as_part_health(),
                PartHealth::NotLive(reason) if reason.contains("3 restarts")
            ));
        }
    }
}
