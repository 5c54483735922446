//! [`RedisCounters`]: what the source did besides handing out messages,
//! counted so that an application can export it as metrics.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one consumer (its source, acker and dead-letter sink share
/// them). Reading one is a relaxed atomic load; export them to the metrics
/// system of the application (they only grow).
///
/// Get them from [`RedisStreamsSource::counters`](crate::RedisStreamsSource::counters).
#[derive(Debug, Default)]
pub struct RedisCounters {
    vanished: AtomicU64,
    malformed: AtomicU64,
    dead_lettered: AtomicU64,
    dead_letters_reduced: AtomicU64,
    dead_letter_failures: AtomicU64,
    retries: AtomicU64,
    refreshed: AtomicU64,
    key_order_waits: AtomicU64,
    groups_created_again: AtomicU64,
}

impl RedisCounters {
    /// Entries that were deleted or trimmed from their stream while pending
    /// for the group: nothing is left to handle, so the source acknowledged
    /// them.
    pub fn vanished(&self) -> u64 {
        self.vanished.load(Ordering::Relaxed)
    }

    /// Entries of a reply that could not become a message (no valid id, a
    /// field list that is not a list) and were skipped; each is logged with
    /// the reply's command. A skipped entry stays pending and is claimed
    /// again later.
    pub fn malformed(&self) -> u64 {
        self.malformed.load(Ordering::Relaxed)
    }

    /// Entries the source wrote to the dead-letter stream instead of
    /// dispatching them (past `max_deliveries`, or without a payload field).
    pub fn dead_lettered(&self) -> u64 {
        self.dead_lettered.load(Ordering::Relaxed)
    }

    /// Dead letters written without the original fields, because with them
    /// they would exceed what Redis accepts in one entry; they carry the
    /// origin (stream and id) to find the original by.
    pub fn dead_letters_reduced(&self) -> u64 {
        self.dead_letters_reduced.load(Ordering::Relaxed)
    }

    /// Dead-letter writes of the source that failed; the entry stays
    /// pending and is tried again after `claim_min_idle`.
    pub fn dead_letter_failures(&self) -> u64 {
        self.dead_letter_failures.load(Ordering::Relaxed)
    }

    /// Transient failures (a lost connection, a failover's `READONLY`, a
    /// server still `LOADING`, …) after which the source waited and tried
    /// again.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// Entries held by this consumer (queued or running) whose idle time
    /// was reset, so that no consumer claims them from a live one.
    pub fn refreshed(&self) -> u64 {
        self.refreshed.load(Ordering::Relaxed)
    }

    /// Entries with a key that waited in the source for an older entry of
    /// their key, pending with another consumer of the group (running
    /// there, or left by one that died until it is claimed) or given back
    /// for a retry, before they were handed to the runtime. See
    /// [`keep_key_order`](crate::RedisStreamsSourceBuilder::keep_key_order).
    pub fn key_order_waits(&self) -> u64 {
        self.key_order_waits.load(Ordering::Relaxed)
    }

    /// Times the source found its consumer group (or the stream) gone
    /// (`NOGROUP`: `XGROUP DESTROY`, the key deleted) and created it again;
    /// each is logged at error level.
    pub fn groups_created_again(&self) -> u64 {
        self.groups_created_again.load(Ordering::Relaxed)
    }

    pub(crate) fn add_vanished(&self, count: usize) {
        self.vanished.fetch_add(count as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_malformed(&self, count: usize) {
        self.malformed.fetch_add(count as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_dead_lettered(&self, count: usize) {
        self.dead_lettered
            .fetch_add(count as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_dead_letters_reduced(&self, count: usize) {
        self.dead_letters_reduced
            .fetch_add(count as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_dead_letter_failures(&self, count: usize) {
        self.dead_letter_failures
            .fetch_add(count as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_retries(&self, count: usize) {
        self.retries.fetch_add(count as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_refreshed(&self, count: usize) {
        self.refreshed.fetch_add(count as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_key_order_waits(&self, count: usize) {
        self.key_order_waits
            .fetch_add(count as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_groups_created_again(&self, count: usize) {
        self.groups_created_again
            .fetch_add(count as u64, Ordering::Relaxed);
    }
}
