//! [`OutboxRelay`]: publishes the outbox's rows, in id order, until stopped.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use intake_core::publish::Publisher;
use intake_core::{BackoffPolicy, ConfigError, Exponential};
use sqlx::{PgPool, Row};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{OutboxError, OutboxTable, output_of};

/// How an [`OutboxRelay`] runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RelaySettings {
    /// Rows published per transaction (at most).
    pub batch_size: u32,
    /// Pause before looking again when the outbox had fewer rows than a
    /// batch: the most a new row waits before it is picked up.
    pub poll_interval: Duration,
    /// The longest wait for room to send one output, and then for its
    /// confirmation, on top of the publisher's own timeouts; past it the
    /// batch rolls back and is published again.
    pub confirm_timeout: Duration,
    /// Pauses after failed batches (retry `n` after `n` failures in a row).
    /// The relay never gives up on a row: a policy that would (past its
    /// `max_retries`) keeps its longest delay.
    pub backoff: Exponential,
}

impl Default for RelaySettings {
    /// 100 rows a batch, a look every 100 ms when idle, 30 s for a
    /// confirmation, and 100 ms to 10 s between failed batches.
    fn default() -> Self {
        Self {
            batch_size: 100,
            poll_interval: Duration::from_millis(100),
            confirm_timeout: Duration::from_secs(30),
            backoff: Exponential::new(Duration::from_millis(100), Duration::from_secs(10)),
        }
    }
}

impl RelaySettings {
    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// A zero batch size, poll interval or confirmation timeout, or a
    /// backoff that [`Exponential::validate`] refuses.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.batch_size == 0 {
            return Err(ConfigError::new(
                "outbox.batch_size",
                "is 0; use at least 1",
            ));
        }
        if self.poll_interval.is_zero() {
            return Err(ConfigError::new(
                "outbox.poll_interval",
                "is zero, which would query the outbox without pause; use a few to a few \
                 hundred milliseconds",
            ));
        }
        if self.confirm_timeout.is_zero() {
            return Err(ConfigError::new(
                "outbox.confirm_timeout",
                "is zero, so no output could be confirmed; use the publisher's own timeout",
            ));
        }
        self.backoff.validate()
    }
}

/// Publishes the rows of an [`OutboxTable`] through a
/// [`Publisher`], in id order, and deletes them once confirmed.
///
/// Each batch is one transaction: it locks up to
/// [`batch_size`](RelaySettings::batch_size) rows (`FOR UPDATE SKIP
/// LOCKED`), sends them in id order, awaits every confirmation, deletes
/// them and commits. A batch that fails (the publisher, a confirmation, the
/// database) rolls back: its rows stay and are published again after a
/// backoff. Nothing is lost; a row may be published more than once, always
/// with the same [`OUTBOX_ID_HEADER`](super::OUTBOX_ID_HEADER): after a
/// relay was killed between the broker's confirmation and the `COMMIT`,
/// and after a failed output, since the batch's later outputs were already
/// sent (the whole batch is sent before any confirmation is awaited) and
/// go out again with it.
///
/// Run one relay per table for outputs in id order across batches: with
/// several, each locks different rows and their batches interleave.
///
/// ```no_run
/// use intake_postgres::{OutboxRelay, OutboxTable, RelaySettings};
///
/// # async fn run(pool: sqlx::PgPool, publisher: intake_core::memory::MemoryPublisher)
/// # -> Result<(), Box<dyn std::error::Error>> {
/// let relay = OutboxRelay::new(pool, OutboxTable::default(), publisher, RelaySettings {
///     batch_size: 500,
///     ..RelaySettings::default()
/// })?;
/// // Publish what is there now, once...
/// let published = relay.relay_batch().await?;
/// // ...or keep publishing in the background until stopped.
/// let handle = relay.start();
/// handle.stop().await;
/// # let _ = published;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct OutboxRelay<P> {
    pool: PgPool,
    table: OutboxTable,
    publisher: P,
    settings: RelaySettings,
}

impl<P: Publisher> OutboxRelay<P> {
    /// A relay of `table` through `publisher`.
    ///
    /// # Errors
    ///
    /// Settings that [`RelaySettings::validate`] refuses.
    pub fn new(
        pool: PgPool,
        table: OutboxTable,
        publisher: P,
        settings: RelaySettings,
    ) -> Result<Self, ConfigError> {
        settings.validate()?;
        Ok(Self {
            pool,
            table,
            publisher,
            settings,
        })
    }

    /// [`new`](Self::new) and [`spawn`](Self::spawn) in one.
    ///
    /// # Errors
    ///
    /// Settings that [`RelaySettings::validate`] refuses.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime, as [`tokio::spawn`] does.
    pub fn spawn(
        pool: PgPool,
        table: OutboxTable,
        publisher: P,
        settings: RelaySettings,
    ) -> Result<OutboxRelayHandle, ConfigError> {
        Ok(Self::new(pool, table, publisher, settings)?.start())
    }

    /// Runs the relay as a task on the current Tokio runtime until its
    /// handle is stopped, cancelled or dropped. A failed batch is logged
    /// (`warn`) and tried again after the backoff.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime, as [`tokio::spawn`] does.
    pub fn start(self) -> OutboxRelayHandle {
        let cancel = CancellationToken::new();
        let counters = Arc::new(Counters::default());
        let task = tokio::spawn(run(self, cancel.clone(), Arc::clone(&counters)));
        OutboxRelayHandle {
            cancel,
            task: Some(task),
            counters,
        }
    }

    /// Publishes one batch: the oldest unsent rows (up to the batch size)
    /// that no other relay holds, in id order, then deletes them, in one
    /// transaction. Returns how many rows it published (0: none waiting).
    ///
    /// Dropping the future before it returns (a kill) rolls the batch back:
    /// rows already confirmed are published again by the next batch.
    ///
    /// # Errors
    ///
    /// A database statement, a send or a confirmation failed; the batch
    /// rolled back and its rows stay.
    pub async fn relay_batch(&self) -> Result<u64, OutboxError> {
        let table = &self.table;
        let mut transaction = self
            .pool
            .begin()
            .await
            .map_err(table.database_error("begin"))?;
        let rows = sqlx::query(table.inner.select_batch.clone())
            .bind(i64::from(self.settings.batch_size))
            .fetch_all(&mut *transaction)
            .await
            .map_err(table.database_error("read rows"))?;
        if rows.is_empty() {
            // Nothing locked, nothing written: ending it either way is the
            // same; rolling back is the cheaper.
            drop(transaction);
            return Ok(0);
        }
        let mut ids = Vec::with_capacity(rows.len());
        let mut receipts = Vec::with_capacity(rows.len());
        // Every output is sent before any receipt is awaited, so a batch
        // costs about one round trip to the broker, not one per row.
        for row in &rows {
            let read = || -> Result<_, sqlx::Error> {
                let id = row.try_get(0)?;
                let output = output_of(
                    id,
                    row.try_get(1)?,
                    row.try_get(2)?,
                    row.try_get(3)?,
                    row.try_get(4)?,
                    row.try_get(5)?,
                );
                Ok((id, output))
            };
            let (id, output) = read().map_err(table.database_error("read rows"))?;
            // The publisher bounds its own wait for room; this bounds a
            // publisher that does not.
            let timeout = self.settings.confirm_timeout;
            let receipt = tokio::time::timeout(timeout, self.publisher.send(output))
                .await
                .map_err(|_elapsed| OutboxError::Unconfirmed { id, timeout })?
                .map_err(|source| OutboxError::Publish { id, source })?;
            ids.push(id);
            receipts.push(receipt);
        }
        for (&id, receipt) in ids.iter().zip(receipts) {
            match tokio::time::timeout(self.settings.confirm_timeout, receipt).await {
                Ok(Ok(_confirmation)) => {}
                Ok(Err(source)) => return Err(OutboxError::Publish { id, source }),
                Err(_elapsed) => {
                    return Err(OutboxError::Unconfirmed {
                        id,
                        timeout: self.settings.confirm_timeout,
                    });
                }
            }
        }
        sqlx::query(table.inner.delete_batch.clone())
            .bind(&ids)
            .execute(&mut *transaction)
            .await
            .map_err(table.database_error("delete rows"))?;
        transaction
            .commit()
            .await
            .map_err(table.database_error("commit"))?;
        tracing::debug!(
            table = table.name(),
            published = ids.len(),
            first = ids.first().copied(),
            last = ids.last().copied(),
            "published outbox rows"
        );
        Ok(ids.len() as u64)
    }
}

#[derive(Debug, Default)]
struct Counters {
    published: AtomicU64,
    failed_batches: AtomicU64,
}

/// Controls a running [`OutboxRelay`]. Dropping it cancels the task (after
/// its current batch).
#[derive(Debug)]
pub struct OutboxRelayHandle {
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
}

impl OutboxRelayHandle {
    /// Rows published and deleted so far (committed batches only).
    pub fn published(&self) -> u64 {
        self.counters.published.load(Ordering::Relaxed)
    }

    /// Batches that failed and rolled back so far.
    pub fn failed_batches(&self) -> u64 {
        self.counters.failed_batches.load(Ordering::Relaxed)
    }

    /// Asks the task to stop once its current batch, if any, has ended.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Stops the task after its current batch and waits until it has. The
    /// wait is bounded by the batch's own: its statements and
    /// [`confirm_timeout`](RelaySettings::confirm_timeout).
    pub async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take()
            && let Err(error) = task.await
        {
            tracing::warn!(%error, "the outbox relay task failed");
        }
    }
}

impl Drop for OutboxRelayHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn run<P: Publisher>(
    relay: OutboxRelay<P>,
    cancel: CancellationToken,
    counters: Arc<Counters>,
) {
    let settings = relay.settings;
    let backoff = settings.backoff;
    let mut failures: u32 = 0;
    while !cancel.is_cancelled() {
        // A batch is not interrupted by a stop: it ends on its own within
        // its statements and confirm timeout, and one dropped half-way
        // would publish its confirmed rows again for nothing.
        let pause = match relay.relay_batch().await {
            Ok(published) => {
                failures = 0;
                counters.published.fetch_add(published, Ordering::Relaxed);
                if published == u64::from(settings.batch_size) {
                    continue;
                }
                settings.poll_interval
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                counters.failed_batches.fetch_add(1, Ordering::Relaxed);
                let pause = backoff
                    .delay(failures)
                    .unwrap_or_else(|| backoff.base_delay(failures));
                tracing::warn!(
                    table = relay.table.name(),
                    error = %intake_core::ErrorChain::new(&error),
                    retry_in = ?pause,
                    "publishing outbox rows failed; they stay and are published again"
                );
                pause
            }
        };
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
    }
}
