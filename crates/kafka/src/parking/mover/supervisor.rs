//! The mover's guard: what the mover and its parking share (its health),
//! and the supervisor that starts the mover again after a panic.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::wait::later;
use super::{POLL_CAP, ROUND_SLACK};
use crate::error::Error;

/// What the mover and the parking share.
#[derive(Debug)]
pub(in crate::parking) struct MoverShared {
    pub(in crate::parking) stop: AtomicBool,
    /// Records produced back (to the return topic) and committed.
    pub(in crate::parking) moved: AtomicU64,
    /// Records written to the tail of their retry topic again.
    pub(in crate::parking) requeued: AtomicU64,
    /// Whether a mover runs now: false before its first round, while it
    /// waits to start again after a panic, and once it stopped.
    pub(in crate::parking) running: AtomicBool,
    /// Times the mover panicked and was started again.
    pub(in crate::parking) restarts: AtomicU64,
    /// When the last round began, in milliseconds since `epoch` (0: none
    /// yet).
    pub(in crate::parking) last_round: AtomicU64,
    pub(in crate::parking) epoch: Instant,
}

impl Default for MoverShared {
    fn default() -> Self {
        Self {
            stop: AtomicBool::new(false),
            moved: AtomicU64::new(0),
            requeued: AtomicU64::new(0),
            running: AtomicBool::new(false),
            restarts: AtomicU64::new(0),
            last_round: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

impl MoverShared {
    pub(super) fn round_began(&self) {
        let millis = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        // 0 means "no round yet".
        self.last_round.store(millis.max(1), Ordering::Relaxed);
    }

    /// How long ago the last round began, `None` before the first.
    pub(in crate::parking) fn since_last_round(&self) -> Option<Duration> {
        match self.last_round.load(Ordering::Relaxed) {
            0 => None,
            millis => Some(
                self.epoch
                    .elapsed()
                    .saturating_sub(Duration::from_millis(millis)),
            ),
        }
    }

    /// How long a round may take before the mover counts as stalled.
    pub(in crate::parking) fn stall_after(delivery_timeout: Duration) -> Duration {
        delivery_timeout
            .saturating_add(Duration::from_secs(5))
            .saturating_add(ROUND_SLACK)
    }
}

/// Runs `first`, and after a panic a new mover from `make`, until asked to
/// stop: a panic is logged and counted, then the mover starts again after
/// a backoff (`min` doubling up to `max`; back to `min` after a run of at
/// least `max`). Held records were never committed: the new mover fetches
/// them again.
pub(super) fn supervise<M>(
    shared: &MoverShared,
    group: &str,
    first: M,
    mut make: impl FnMut() -> Result<M, Error>,
    run: impl Fn(M),
    (min, max): (Duration, Duration),
) {
    let mut next = Some(first);
    let mut backoff = min;
    while !shared.stop.load(Ordering::Acquire) {
        let mover = match next.take() {
            Some(mover) => mover,
            None => match make() {
                Ok(mover) => {
                    tracing::info!(
                        group,
                        restarts = shared.restarts.load(Ordering::Relaxed),
                        "kafka parking mover started again"
                    );
                    mover
                }
                Err(error) => {
                    tracing::error!(group, error = %intake_core::ErrorChain::new(&error), retry_in = ?backoff, "the kafka parking mover could not start again");
                    if wait_unless_stopped(shared, backoff) {
                        break;
                    }
                    backoff = backoff.saturating_mul(2).min(max);
                    continue;
                }
            },
        };
        shared.running.store(true, Ordering::Release);
        let started = Instant::now();
        // Unwinding drops the mover's consumer, which leaves the group: its
        // partitions go to the other movers of the group meanwhile.
        let ran = catch_unwind(AssertUnwindSafe(|| run(mover)));
        shared.running.store(false, Ordering::Release);
        let Err(panic) = ran else {
            break;
        };
        let restarts = shared.restarts.fetch_add(1, Ordering::Relaxed) + 1;
        if started.elapsed() >= max {
            backoff = min;
        }
        tracing::error!(
            group,
            panic = %panic_text(panic.as_ref()),
            restarts,
            retry_in = ?backoff,
            "the kafka parking mover panicked; parked messages do not come back until it runs again"
        );
        if wait_unless_stopped(shared, backoff) {
            break;
        }
        backoff = backoff.saturating_mul(2).min(max);
    }
    shared.running.store(false, Ordering::Release);
}

/// Sleeps `wait` in short steps; true when a stop was asked meanwhile.
fn wait_unless_stopped(shared: &MoverShared, wait: Duration) -> bool {
    let until = later(wait);
    while Instant::now() < until {
        if shared.stop.load(Ordering::Acquire) {
            return true;
        }
        std::thread::sleep(POLL_CAP.min(until.saturating_duration_since(Instant::now())));
    }
    shared.stop.load(Ordering::Acquire)
}

/// A panic's message, as far as it has one.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_stop_ends_the_wait_before_a_restart() {
        let shared = MoverShared::default();
        shared.stop.store(true, Ordering::Release);
        assert!(wait_unless_stopped(&shared, Duration::from_secs(3600)));
        let shared = MoverShared::default();
        assert!(!wait_unless_stopped(&shared, Duration::from_millis(1)));
    }

    /// A mover that panics is started again, counted, and the supervisor
    /// ends when a stop is asked: what keeps parked messages coming back
    /// after a bug, and what health reports.
    #[test]
    fn a_mover_that_panics_is_started_again_and_counted() {
        let shared = Arc::new(MoverShared::default());
        let made = std::sync::atomic::AtomicUsize::new(0);
        let runs = std::sync::atomic::AtomicUsize::new(0);
        let seen_running = AtomicBool::new(true);
        supervise(
            &shared,
            "g",
            0_usize,
            || Ok(made.fetch_add(1, Ordering::Relaxed) + 1),
            |mover: usize| {
                runs.fetch_add(1, Ordering::Relaxed);
                let running = shared.running.load(Ordering::Acquire);
                seen_running.fetch_and(running, Ordering::Relaxed);
                if mover < 2 {
                    panic!("mover {mover} fails");
                }
                // The third runs until asked to stop.
                shared.stop.store(true, Ordering::Release);
            },
            (Duration::from_millis(1), Duration::from_millis(4)),
        );
        assert_eq!(runs.load(Ordering::Relaxed), 3);
        assert_eq!(made.load(Ordering::Relaxed), 2, "two new movers");
        assert_eq!(shared.restarts.load(Ordering::Relaxed), 2);
        assert!(
            seen_running.load(Ordering::Relaxed),
            "running while it runs"
        );
        assert!(!shared.running.load(Ordering::Acquire), "not after");
    }

    #[test]
    fn a_panic_is_told_by_its_message() {
        let panic = catch_unwind(|| panic!("boom {}", 7)).expect_err("panicked");
        assert_eq!(panic_text(panic.as_ref()), "boom 7");
        let panic = catch_unwind(|| std::panic::panic_any(7_u8)).expect_err("panicked");
        assert_eq!(panic_text(panic.as_ref()), "a panic without a message");
    }
}
