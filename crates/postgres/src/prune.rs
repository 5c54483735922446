//! [`Pruner`]: deletes markers older than the retention, in the background.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use intake_core::ConfigError;
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::marker_table::MarkerTable;

/// How long markers are kept and how pruning runs.
///
/// A marker must outlive every redelivery of its message: after it is
/// pruned, a redelivered copy would run again. Redelivery happens for
/// messages that were processed but not yet acknowledged when a consumer
/// crashed, so keep markers far longer than a consumer can stay down plus
/// the broker's own retention of unacknowledged messages if you replay
/// (a Kafka topic's retention, for offset resets). The default is 7 days.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PruneSettings {
    /// Markers older than this (by the database's clock) are deleted.
    pub retention: Duration,
    /// Pause between pruning rounds.
    pub interval: Duration,
    /// Rows deleted per statement; a round repeats statements until one
    /// deletes fewer, so a backlog never becomes one long transaction.
    pub batch_size: u32,
}

impl Default for PruneSettings {
    /// 7 days of retention, a round every 5 minutes, 10,000 rows a statement.
    fn default() -> Self {
        Self {
            retention: Duration::from_secs(7 * 24 * 3600),
            interval: Duration::from_secs(300),
            batch_size: 10_000,
        }
    }
}

impl PruneSettings {
    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// A zero retention (which would delete markers of messages still being
    /// redelivered), a zero interval or a zero batch size.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.retention.is_zero() {
            return Err(ConfigError::new(
                "prune.retention",
                "is zero: markers would be deleted while their messages can still be \
                 redelivered; keep them for days",
            ));
        }
        if self.interval.is_zero() {
            return Err(ConfigError::new(
                "prune.interval",
                "is zero; prune every few minutes",
            ));
        }
        if self.batch_size == 0 {
            return Err(ConfigError::new("prune.batch_size", "is 0; use at least 1"));
        }
        Ok(())
    }
}

/// The background task that prunes a [`MarkerTable`].
///
/// ```no_run
/// use std::time::Duration;
/// use intake_postgres::{MarkerTable, PruneSettings, Pruner};
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let pruner = Pruner::spawn(pool, MarkerTable::default(), PruneSettings {
///     retention: Duration::from_secs(3 * 24 * 3600),
///     ..PruneSettings::default()
/// })?;
/// // ... run the consumer ...
/// pruner.stop().await;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Pruner;

impl Pruner {
    /// Spawns the task on the current Tokio runtime. It prunes at once, then
    /// every `interval`, until the handle is stopped, cancelled or dropped.
    /// A failed round is logged (`warn`) and tried again at the next one.
    ///
    /// # Errors
    ///
    /// Settings that [`PruneSettings::validate`] refuses.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime, as [`tokio::spawn`] does.
    pub fn spawn(
        pool: PgPool,
        table: MarkerTable,
        settings: PruneSettings,
    ) -> Result<PrunerHandle, ConfigError> {
        settings.validate()?;
        let cancel = CancellationToken::new();
        let pruned = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(run(
            pool,
            table,
            settings,
            cancel.clone(),
            Arc::clone(&pruned),
        ));
        Ok(PrunerHandle {
            cancel,
            task: Some(task),
            pruned,
        })
    }
}

/// Controls a spawned [`Pruner`]. Dropping it cancels the task.
#[derive(Debug)]
pub struct PrunerHandle {
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
    pruned: Arc<AtomicU64>,
}

impl PrunerHandle {
    /// Markers deleted so far.
    pub fn pruned(&self) -> u64 {
        self.pruned.load(Ordering::Relaxed)
    }

    /// Asks the task to stop after the statement it is running, if any.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Stops the task and waits until it has.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take()
            && let Err(error) = task.await
        {
            tracing::warn!(%error, "the marker pruner task failed");
        }
    }
}

impl Drop for PrunerHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn run(
    pool: PgPool,
    table: MarkerTable,
    settings: PruneSettings,
    cancel: CancellationToken,
    pruned: Arc<AtomicU64>,
) {
    loop {
        // Statements are not interrupted: each is bounded by `batch_size`,
        // and one dropped mid-flight would cost the connection.
        loop {
            if cancel.is_cancelled() {
                return;
            }
            match table
                .prune(&pool, settings.retention, settings.batch_size)
                .await
            {
                Ok(deleted) => {
                    pruned.fetch_add(deleted, Ordering::Relaxed);
                    if deleted > 0 {
                        tracing::debug!(table = table.name(), deleted, "pruned markers");
                    }
                    if deleted < u64::from(settings.batch_size) {
                        break;
                    }
                }
                Err(error) => {
                    tracing::warn!(
                        table = table.name(),
                        %error,
                        "pruning markers failed; trying again at the next round"
                    );
                    break;
                }
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(settings.interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_that_would_prune_live_markers_are_refused() {
        let zero_retention = PruneSettings {
            retention: Duration::ZERO,
            ..PruneSettings::default()
        };
        let error = zero_retention.validate().unwrap_err();
        assert_eq!(error.setting, "prune.retention");
        assert!(PruneSettings::default().validate().is_ok());
    }
}
