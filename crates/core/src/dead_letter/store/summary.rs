//! [`Summary`]: counts per error class and the oldest letter.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use super::StoredLetter;

/// What a store holds, for a dry run's counts and the depth metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Summary {
    /// Letters (and unreadable entries) selected.
    pub total: u64,
    /// Readable letters per class of their last failure, by
    /// [`ErrorClass::as_str`](crate::ErrorClass::as_str).
    pub by_class: BTreeMap<&'static str, u64>,
    /// Entries that cannot be read as dead letters.
    pub unreadable: u64,
    /// When the longest-waiting letter was given up
    /// ([`DeadLetter::failed_at`](crate::dead_letter::DeadLetter::failed_at));
    /// `None` when no readable letter is selected.
    pub oldest_failed_at: Option<SystemTime>,
}

impl Summary {
    /// Adds `stored` to the counts.
    pub fn add(&mut self, stored: &StoredLetter) {
        self.total += 1;
        match &stored.letter {
            Ok(letter) => {
                *self.by_class.entry(letter.class.as_str()).or_default() += 1;
                self.oldest_failed_at = Some(match self.oldest_failed_at {
                    Some(oldest) => oldest.min(letter.failed_at),
                    None => letter.failed_at,
                });
            }
            Err(_) => self.unreadable += 1,
        }
    }

    /// How long the oldest letter has waited at `now` (zero for a letter
    /// stamped later than `now`: clocks of different hosts disagree).
    pub fn oldest_age(&self, now: SystemTime) -> Option<Duration> {
        self.oldest_failed_at
            .map(|oldest| now.duration_since(oldest).unwrap_or_default())
    }
}
