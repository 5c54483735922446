//! [`ReplayCounters`]: what a [`ReplayLayer`](super::ReplayLayer) replayed,
//! refused and counted, shared with whoever reads it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::error::ErrorClass;

/// A handle on the counts of a [`ReplayLayer`](super::ReplayLayer) and of
/// every service it made. Cheap to clone; read it with
/// [`snapshot`](Self::snapshot) while the consumer runs or after it stopped.
///
/// The counts are of deliveries: a record the broker delivers again (a
/// retryable failure left it unacknowledged, a rebalance moved its
/// partition) is counted again.
#[derive(Clone, Debug, Default)]
pub struct ReplayCounters {
    counts: Arc<Mutex<ReplayCounts>>,
}

/// The counts of a [`ReplayCounters`] at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayCounts {
    /// Records consumed from the dead-letter destination.
    pub records: u64,
    /// Letters whose original message was handed to the handler; in a dry
    /// run, that would have been.
    pub replayed: u64,
    /// Of those, how many per class of their last failure, by
    /// [`ErrorClass::as_str`] (as
    /// [`ReplayReport::by_class`](crate::dead_letter::ReplayReport::by_class)
    /// counts them).
    pub by_class: BTreeMap<&'static str, u64>,
    /// Of those, how many the handler finished successfully (0 in a dry
    /// run).
    pub succeeded: u64,
    /// Letters the loop guard refused (in a dry run: would refuse), their
    /// message replayed the limit already.
    pub over_limit: u64,
    /// Reference letters (no payload to replay).
    pub references: u64,
    /// Records that are no readable dead letter.
    pub unreadable: u64,
}

impl ReplayCounters {
    /// The counts now.
    pub fn snapshot(&self) -> ReplayCounts {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ReplayCounts> {
        // Nothing panics while holding the lock; a poisoned one still
        // holds whole counts.
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn unreadable(&self) {
        let mut counts = self.lock();
        counts.records += 1;
        counts.unreadable += 1;
    }

    pub(super) fn over_limit(&self) {
        let mut counts = self.lock();
        counts.records += 1;
        counts.over_limit += 1;
    }

    pub(super) fn reference(&self) {
        let mut counts = self.lock();
        counts.records += 1;
        counts.references += 1;
    }

    pub(super) fn replayed(&self, class: ErrorClass) {
        let mut counts = self.lock();
        counts.records += 1;
        counts.replayed += 1;
        *counts.by_class.entry(class.as_str()).or_default() += 1;
    }

    pub(super) fn succeeded(&self) {
        self.lock().succeeded += 1;
    }
}
