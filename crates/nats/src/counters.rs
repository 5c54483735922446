//! Counts of what the source, acker and sink did that a user may want to
//! watch: reports of slow deliveries, naks, the source's own dead letters,
//! messages that were no JetStream delivery.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters shared by a source, its acker and its dead-letter sink; read
/// them with [`NatsSource::counters`](crate::NatsSource::counters).
#[derive(Debug, Default)]
pub struct NatsCounters {
    progress_reports: AtomicU64,
    naks: AtomicU64,
    terms: AtomicU64,
    source_dead_letters: AtomicU64,
    not_deliveries: AtomicU64,
    pull_requests: AtomicU64,
    parked_here: AtomicU64,
}

impl NatsCounters {
    /// `+WPI` reports sent for deliveries held longer than half their
    /// `ack_wait`.
    pub fn progress_reports(&self) -> u64 {
        self.progress_reports.load(Ordering::Relaxed)
    }

    /// Deliveries handed back with `-NAK` and a delay (retryable failures
    /// without a dead-letter layer, and unfinished work at close).
    pub fn naks(&self) -> u64 {
        self.naks.load(Ordering::Relaxed)
    }

    /// Originals ended with `+TERM` after their dead letter was confirmed.
    pub fn terms(&self) -> u64 {
        self.terms.load(Ordering::Relaxed)
    }

    /// Deliveries the source dead-lettered itself because the server had
    /// delivered them more often than `max_deliveries`.
    pub fn source_dead_letters(&self) -> u64 {
        self.source_dead_letters.load(Ordering::Relaxed)
    }

    /// Messages that arrived on the source's inbox without a JetStream
    /// reply subject (not a delivery of the consumer: nothing to ack),
    /// skipped and logged.
    pub fn not_deliveries(&self) -> u64 {
        self.not_deliveries.load(Ordering::Relaxed)
    }

    /// Pull requests sent.
    pub fn pull_requests(&self) -> u64 {
        self.pull_requests.load(Ordering::Relaxed)
    }

    /// Parks that waited in this process, still held from the server (see
    /// [`NatsParking`](crate::NatsParking)); a park that went back to the
    /// server is counted in [`naks`](Self::naks).
    pub fn parked_here(&self) -> u64 {
        self.parked_here.load(Ordering::Relaxed)
    }

    pub(crate) fn add_progress_reports(&self, count: usize) {
        self.progress_reports
            .fetch_add(count as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_naks(&self, count: usize) {
        self.naks.fetch_add(count as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_term(&self) {
        self.terms.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add_source_dead_letter(&self) {
        self.source_dead_letters.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add_not_delivery(&self) {
        self.not_deliveries.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add_parked_here(&self, count: usize) {
        self.parked_here.fetch_add(count as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_pull_request(&self) {
        self.pull_requests.fetch_add(1, Ordering::Relaxed);
    }
}
