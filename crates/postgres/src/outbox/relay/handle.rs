//! [`OutboxRelayHandle`]: controls a running relay, counts what it did,
//! and tells an app's health whether it publishes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use intake_core::app::PartHealth;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What a running relay did, shared by its task and its handle.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) published: AtomicU64,
    pub(super) failed_rows: AtomicU64,
    pub(super) failed_batches: AtomicU64,
    /// Failed batches since the last one that was not.
    pub(super) failing: AtomicU32,
}

/// Controls a running [`OutboxRelay`](super::OutboxRelay). Dropping it
/// cancels the task (after its current batch).
#[derive(Debug)]
pub struct OutboxRelayHandle {
    pub(super) cancel: CancellationToken,
    pub(super) task: Option<JoinHandle<()>>,
    pub(super) counters: Arc<Counters>,
}

impl OutboxRelayHandle {
    /// Rows published and deleted so far (committed batches only).
    pub fn published(&self) -> u64 {
        self.counters.published.load(Ordering::Relaxed)
    }

    /// Rows the broker refused (or the relay could not read), moved to the
    /// [failed table](crate::OutboxTable#the-failed-table) so far: each waits for
    /// an operator, so alert on any.
    pub fn failed_rows(&self) -> u64 {
        self.counters.failed_rows.load(Ordering::Relaxed)
    }

    /// Batches that stopped at a row not confirmed, or failed in the
    /// database, so far.
    pub fn failed_batches(&self) -> u64 {
        self.counters.failed_batches.load(Ordering::Relaxed)
    }

    /// Batches failed in a row, up to now (0: the last one succeeded). A
    /// number that keeps growing means nothing is published (the broker
    /// or the database has been unreachable since): for a readiness check
    /// of the application's own.
    pub fn consecutive_failed_batches(&self) -> u32 {
        self.counters.failing.load(Ordering::Relaxed)
    }

    /// A check for an app's health
    /// ([`Health::add_check`](intake_core::app::Health::add_check)): not
    /// ready while the last [`FAILING_BATCHES_NOT_READY`] batches or more
    /// failed (nothing reaches the broker: it or the database is
    /// unreachable), ready again with the first batch that succeeds. Rows
    /// moved to the failed table are no health problem (the rest flows):
    /// alert on [`failed_rows`](Self::failed_rows).
    ///
    /// ```no_run
    /// # fn wire(health: &intake_core::app::Health, relay: &intake_postgres::OutboxRelayHandle) {
    /// health.add_check("outbox", relay.health_check());
    /// # }
    /// ```
    pub fn health_check(&self) -> impl Fn() -> PartHealth + Send + Sync + 'static {
        let counters = Arc::clone(&self.counters);
        move || part_health(counters.failing.load(Ordering::Relaxed))
    }

    /// Asks the task to stop once its current batch, if any, has ended.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Stops the task after its current batch and waits until it has. The
    /// wait is bounded by the batch's own: its statements and about twice
    /// [`confirm_timeout`](super::RelaySettings::confirm_timeout).
    pub async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take()
            && let Err(error) = task.await
        {
            tracing::warn!(%error, "the outbox relay task failed");
        }
    }
}

/// Failed batches in a row past which an outbox relay is not ready (with
/// its backoff, about half a minute of nothing published).
pub const FAILING_BATCHES_NOT_READY: u32 = 5;

/// The health of a relay whose last `failing` batches failed.
fn part_health(failing: u32) -> PartHealth {
    if failing >= FAILING_BATCHES_NOT_READY {
        PartHealth::NotReady(format!(
            "the outbox relay failed its last {failing} batches: nothing is published"
        ))
    } else {
        PartHealth::Healthy
    }
}

impl Drop for OutboxRelayHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

#[cfg(test)]
mod health_tests {
    use super::*;

    #[test]
    fn a_relay_is_not_ready_while_its_batches_keep_failing() {
        assert_eq!(part_health(0), PartHealth::Healthy);
        assert_eq!(
            part_health(FAILING_BATCHES_NOT_READY - 1),
            PartHealth::Healthy
        );
        assert!(matches!(
            part_health(FAILING_BATCHES_NOT_READY),
            PartHealth::NotReady(reason) if reason.contains("nothing is published")
        ));
    }
}
