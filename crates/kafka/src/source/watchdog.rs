//! Notices a consumer that stopped yielding while the broker has data, and
//! restarts its fetchers.
//!
//! rust-rdkafka issue 665 is the known case (a lost wakeup parks a stream
//! forever); polling on a thread of our own with a timeout rules that one
//! out, but a fetcher can still end up stopped (a pause that outlived a
//! rebalance, a fetch state machine stuck after a broker restart, a
//! partition whose start offset was never resolved). Symptom in every case:
//! nothing arrives, nothing is queued, the consumer is not paused, yet a
//! partition's position is behind its high watermark. A partition that has
//! yielded nothing yet has no position; its position is where it should
//! have started: the group's committed offset, else the reset policy's end.
//! The brokers are asked on a thread of their own (`stall_check`).

use std::time::{Duration, Instant};

/// When to look, and what was seen since the last look.
#[derive(Debug)]
pub(crate) struct Watchdog {
    interval: Duration,
    last_check: Instant,
    delivered: u64,
}

impl Watchdog {
    pub(crate) fn new(interval: Duration) -> Self {
        Self {
            interval,
            last_check: Instant::now(),
            delivered: 0,
        }
    }

    /// Counts messages handed to the runtime.
    pub(crate) fn record(&mut self, delivered: usize) {
        self.delivered += delivered as u64;
    }

    /// Starts the next period at `now`, forgetting what was delivered: the
    /// answer of a check that took longer than the interval is no reason
    /// to check again at once.
    pub(crate) fn restart(&mut self, now: Instant) {
        self.last_check = now;
        self.delivered = 0;
    }

    /// Whether a check is due now, and whether the consumer was idle (no
    /// message) since the last one. Starts the next period.
    pub(crate) fn due(&mut self, now: Instant) -> Option<bool> {
        if self.interval.is_zero() || now.duration_since(self.last_check) < self.interval {
            return None;
        }
        let idle = self.delivered == 0;
        self.last_check = now;
        self.delivered = 0;
        Some(idle)
    }
}

/// Where a partition without a committed offset starts
/// (`auto.offset.reset`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OffsetReset {
    /// At the low watermark.
    Earliest,
    /// At the high watermark.
    Latest,
    /// Nowhere: consuming fails.
    Error,
}

impl OffsetReset {
    /// Reads librdkafka's `auto.offset.reset` value (librdkafka's default,
    /// `largest`, when unset).
    pub(crate) fn from_setting(value: Option<&str>) -> Self {
        match value.map(str::to_ascii_lowercase).as_deref() {
            Some("smallest" | "earliest" | "beginning") => OffsetReset::Earliest,
            Some("error") => OffsetReset::Error,
            _ => OffsetReset::Latest,
        }
    }
}

/// Where a partition should resume if it is stalled: its next offset when
/// the broker holds messages at or past it, else `None`.
///
/// `position` is the next offset the consumer would return (librdkafka's
/// position), or, when it has not consumed from the partition yet, the
/// group's committed offset.
pub(crate) fn stalled_at(position: Option<i64>, high_watermark: i64) -> Option<i64> {
    position.filter(|&next| next >= 0 && next < high_watermark)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_behind_its_high_watermark_is_stalled() {
        assert_eq!(stalled_at(Some(5), 9), Some(5));
    }

    #[test]
    fn a_partition_at_its_high_watermark_is_idle_not_stalled() {
        assert_eq!(stalled_at(Some(9), 9), None);
    }

    #[test]
    fn an_unknown_position_is_never_judged() {
        assert_eq!(stalled_at(None, 9), None);
        assert_eq!(stalled_at(Some(-1001), 9), None);
    }

    #[test]
    fn the_reset_policy_reads_every_spelling_librdkafka_accepts() {
        for earliest in ["smallest", "earliest", "beginning", "Earliest"] {
            assert_eq!(
                OffsetReset::from_setting(Some(earliest)),
                OffsetReset::Earliest
            );
        }
        for latest in ["largest", "latest", "end"] {
            assert_eq!(OffsetReset::from_setting(Some(latest)), OffsetReset::Latest);
        }
        assert_eq!(OffsetReset::from_setting(None), OffsetReset::Latest);
        assert_eq!(OffsetReset::from_setting(Some("error")), OffsetReset::Error);
    }

    #[test]
    fn a_check_reports_idleness_once_per_interval() {
        let start = Instant::now();
        let mut watchdog = Watchdog::new(Duration::from_secs(1));
        assert_eq!(watchdog.due(start), None);
        watchdog.record(3);
        assert_eq!(watchdog.due(start + Duration::from_secs(2)), Some(false));
        assert_eq!(watchdog.due(start + Duration::from_secs(4)), Some(true));
    }

    #[test]
    fn a_zero_interval_disables_the_watchdog() {
        let mut watchdog = Watchdog::new(Duration::ZERO);
        assert_eq!(watchdog.due(Instant::now() + Duration::from_secs(60)), None);
    }
}
