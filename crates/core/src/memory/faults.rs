//! Fault injection: make a consumer group's fetches, commits or dead-letter
//! writes fail or slow down, to test how the runtime copes.
//!
//! Faults belong to one consumer group of one topic, so tests sharing a
//! broker do not disturb each other. Checking for a fault costs one relaxed
//! atomic load on the fetch and commit paths.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// The counters behind [`Faults`], shared by the group's sources, ackers and
/// dead-letter sinks.
#[derive(Debug, Default)]
pub(crate) struct FaultState {
    failing_fetches: AtomicU32,
    failing_commits: AtomicU32,
    failing_dead_letter_writes: AtomicU32,
    commit_delay_nanos: AtomicU64,
}

impl FaultState {
    /// Whether this fetch should fail; counts it down if so.
    pub(crate) fn take_fetch_failure(&self) -> bool {
        take_one(&self.failing_fetches)
    }

    /// Whether this commit should fail; counts it down if so.
    pub(crate) fn take_commit_failure(&self) -> bool {
        take_one(&self.failing_commits)
    }

    /// Whether this dead-letter write should fail; counts it down if so.
    pub(crate) fn take_dead_letter_failure(&self) -> bool {
        take_one(&self.failing_dead_letter_writes)
    }

    /// How long each commit waits before it reaches the broker.
    pub(crate) fn commit_delay(&self) -> Option<Duration> {
        match self.commit_delay_nanos.load(Ordering::Relaxed) {
            0 => None,
            nanos => Some(Duration::from_nanos(nanos)),
        }
    }
}

/// The error of an injected fault, as the source, acker or sink returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InjectedFault {
    /// From [`Faults::fail_next_fetches`].
    #[error("injected fetch failure (Faults::fail_next_fetches)")]
    Fetch,
    /// From [`Faults::fail_next_commits`].
    #[error("injected commit failure (Faults::fail_next_commits)")]
    Commit,
    /// From [`Faults::fail_next_dead_letter_writes`].
    #[error("injected dead-letter write failure (Faults::fail_next_dead_letter_writes)")]
    DeadLetterWrite,
}

/// Decrements `counter` if it is positive; true if it did.
fn take_one(counter: &AtomicU32) -> bool {
    // The load keeps the fault-free path to one uncontended read.
    counter.load(Ordering::Relaxed) > 0
        && counter
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |left| {
                left.checked_sub(1)
            })
            .is_ok()
}

/// Injects faults into one consumer group of one topic. Cheap to clone; every
/// clone controls the same faults.
///
/// Get one from [`MemoryBroker::faults`](super::MemoryBroker::faults).
#[derive(Clone, Debug)]
pub struct Faults {
    pub(crate) state: Arc<FaultState>,
}

impl Faults {
    /// The next `count` calls of [`Source::next`](crate::backend::Source::next) on the
    /// group's sources return [`SourceError::Transient`](crate::backend::SourceError::Transient)
    /// without fetching anything.
    pub fn fail_next_fetches(&self, count: u32) {
        self.state.failing_fetches.store(count, Ordering::Release);
    }

    /// The next `count` acknowledgement batches of the group's ackers fail
    /// with [`AckError::Broker`](crate::backend::AckError::Broker) and commit nothing.
    pub fn fail_next_commits(&self, count: u32) {
        self.state.failing_commits.store(count, Ordering::Release);
    }

    /// The next `count` writes of the group's dead-letter sinks fail with a
    /// [`DeadLetterError`](crate::backend::DeadLetterError) and store nothing.
    pub fn fail_next_dead_letter_writes(&self, count: u32) {
        self.state
            .failing_dead_letter_writes
            .store(count, Ordering::Release);
    }

    /// Every acknowledgement batch of the group waits `delay` before it is
    /// committed, like a slow broker round trip. `Duration::ZERO` removes the
    /// delay. A commit dropped while it waits commits nothing.
    pub fn delay_commits(&self, delay: Duration) {
        let nanos = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        self.state
            .commit_delay_nanos
            .store(nanos, Ordering::Release);
    }

    /// Removes every injected fault.
    pub fn clear(&self) {
        self.fail_next_fetches(0);
        self.fail_next_commits(0);
        self.fail_next_dead_letter_writes(0);
        self.delay_commits(Duration::ZERO);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_fires_exactly_as_often_as_asked() {
        let faults = Faults {
            state: Arc::default(),
        };
        faults.fail_next_commits(2);
        assert!(faults.state.take_commit_failure());
        assert!(faults.state.take_commit_failure());
        assert!(!faults.state.take_commit_failure());
        assert!(!faults.state.take_fetch_failure());
    }

    #[test]
    fn a_zero_delay_means_no_delay() {
        let faults = Faults {
            state: Arc::default(),
        };
        faults.delay_commits(Duration::from_millis(5));
        assert_eq!(faults.state.commit_delay(), Some(Duration::from_millis(5)));
        faults.clear();
        assert_eq!(faults.state.commit_delay(), None);
    }
}
