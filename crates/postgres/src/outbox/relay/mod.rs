//! [`OutboxRelay`]: publishes the outbox's rows, in id order, until stopped.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use intake_core::app::PartHealth;
use intake_core::publish::{Output, PublishError, PublishErrorKind, Publisher};
use intake_core::{BackoffPolicy, ConfigError, ErrorChain, Exponential};
use sqlx::postgres::PgRow;
use sqlx::{Connection, PgPool, Row};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{OutboxError, OutboxTable, error_text, output_of};

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
    /// row stays and is published again. A batch also sends no new row
    /// after this long (the rest is the next batch's), so that it ends
    /// within about twice this.
    pub confirm_timeout: Duration,
    /// Pauses after failed batches (retry `n` after `n` failures in a row).
    /// The relay never gives up on a row the broker may still take: a
    /// policy that would (past its `max_retries`) keeps its longest delay.
    /// (A row the broker refuses is not retried: it goes to the
    /// [failed table](OutboxTable#the-failed-table).)
    pub backoff: Exponential,
    /// Whether a keyed row is sent only once the rows before it with the
    /// same destination and key are confirmed (default `true`). Then a row
    /// is never stored ahead of an earlier row of its key that failed, and
    /// the first copy of each row reaches the broker in id order per key.
    /// Off, every row of a batch is sent before any confirmation is awaited
    /// (one round trip a batch where a key repeats), and after a failure a
    /// later row of its key may be stored first (see
    /// [order](OutboxRelay#order)).
    pub key_order: bool,
}

impl Default for RelaySettings {
    /// 100 rows a batch, a look every 100 ms when idle, 30 s for a
    /// confirmation, 100 ms to 10 s between failed batches, and key order.
    fn default() -> Self {
        Self {
            batch_size: 100,
            poll_interval: Duration::from_millis(100),
            confirm_timeout: Duration::from_secs(30),
            backoff: Exponential::new(Duration::from_millis(100), Duration::from_secs(10)),
            key_order: true,
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
/// LOCKED`), sends them in id order, awaits their confirmations, deletes
/// the confirmed rows, moves the refused ones to the failed table, and
/// commits. What becomes of a row:
///
/// - **Confirmed**: deleted.
/// - **Refused** by the broker ([`PublishErrorKind::Rejected`]: too large,
///   no such destination, not allowed), or unreadable: moved to the
///   [failed table](OutboxTable#the-failed-table), logged at `error` and
///   counted ([`failed_rows`](OutboxRelayHandle::failed_rows)); the rows
///   after it go on.
/// - **Not confirmed** for a reason that may pass (the broker unreachable,
///   no confirmation within
///   [`confirm_timeout`](RelaySettings::confirm_timeout)): the relay sends
///   no further row in this batch, keeps this one (and every row not
///   confirmed), commits what was confirmed or refused, and starts the next
///   batch, from this row, after the backoff.
///
/// A database error rolls the whole batch back: its rows stay, the
/// confirmed ones too.
///
/// Nothing is lost; a row may be published more than once, always with the
/// same [`OUTBOX_ID_HEADER`](super::OUTBOX_ID_HEADER): after a relay was
/// killed between the broker's confirmation and the `COMMIT`, after a
/// database error, and when a confirmation failed or did not come although
/// the broker stored the output.
///
/// # Order
///
/// Rows are sent in id order. With [`key_order`](RelaySettings::key_order)
/// (the default), a keyed row is sent only once the earlier rows of its
/// destination and key are confirmed, so the broker stores the rows of a
/// key in id order: a row that failed is sent again before any later row
/// of its key, and so are its copies (when the broker had stored it
/// without confirming). A reader that drops copies by
/// [`OUTBOX_ID_HEADER`](super::OUTBOX_ID_HEADER) sees each key's rows once,
/// in id order. Rows of different keys are in flight together; the rows of
/// one key in a batch cost a round trip each (`docs/PUBLISHING.md` has the
/// figures: on Kafka, with its `linger.ms`, one hot key goes from about
/// 9,000 rows a second to about 150; set `key_order: false` for it if the
/// order below will do).
///
/// Keyless rows (and keyed ones without `key_order`) are all sent before
/// any confirmation is awaited. When one of them is not confirmed, the
/// confirmed rows after it in its batch with the same destination (and
/// key) stay and are sent again after it: the *last* copies reach the
/// broker in id order, but a later row may have been stored once before
/// the failed one, and a reader that keeps the first copy of each
/// [`OUTBOX_ID_HEADER`](super::OUTBOX_ID_HEADER) sees it first.
///
/// A refused row is skipped: the rows after it are published, and if an
/// operator re-queues it, it comes after them. Run one relay per table: with
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
/// let batch = relay.relay_batch().await?;
/// println!("{} published, {} refused", batch.published, batch.failed);
/// // ...or keep publishing in the background until stopped.
/// let handle = relay.start();
/// handle.stop().await;
/// # Ok(())
/// # }
/// ```
///
/// [`PublishErrorKind::Rejected`]: intake_core::publish::PublishErrorKind::Rejected
#[derive(Debug)]
pub struct OutboxRelay<P> {
    pool: PgPool,
    table: OutboxTable,
    publisher: P,
    settings: RelaySettings,
    /// Hashes a row's destination and key for the key-order bookkeeping.
    keys: RandomState,
    /// How many times each row of the last batch was sent without a
    /// confirmation, for the failed table's `attempts`.
    attempts: Mutex<HashMap<i64, u32>>,
}

/// What one [`OutboxRelay::relay_batch`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayedBatch {
    /// Rows published and deleted.
    pub published: u64,
    /// Rows moved to the [failed table](OutboxTable#the-failed-table).
    pub failed: u64,
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
            keys: RandomState::new(),
            attempts: Mutex::new(HashMap::new()),
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
    /// (`warn`) and tried again after the backoff; a refused row is logged
    /// at `error`.
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
    /// that no other relay holds, in id order; deletes the confirmed ones
    /// and moves the refused ones to the failed table, in one transaction.
    /// Returns how many of each (both 0: none waiting).
    ///
    /// Dropping the future before it returns (a kill) rolls the batch back:
    /// rows already confirmed are published again by the next batch.
    ///
    /// # Errors
    ///
    /// A row was not confirmed for a reason that may pass (the rows
    /// confirmed or refused before the relay stopped sending were still
    /// deleted or moved), or a database statement failed (the batch rolled
    /// back and its rows stay).
    pub async fn relay_batch(&self) -> Result<RelayedBatch, OutboxError> {
        let pass = self.pass().await?;
        match pass.failure {
            Some(error) => Err(error),
            None => Ok(pass.done),
        }
    }

    /// One batch: what it did, and why it stopped early if it did. `Err`
    /// when a database error rolled it all back.
    async fn pass(&self) -> Result<Pass, OutboxError> {
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
            return Ok(Pass::default());
        }
        let mut batch = Batch::with_capacity(rows.len());
        // Rows of one key go one confirmation at a time: past this, the
        // rest of the batch is left for the next one, so that a batch (and
        // a stop) takes about two confirm timeouts at most, not one a row.
        let send_until = Instant::now() + self.settings.confirm_timeout;
        let previous =
            std::mem::take(&mut *self.attempts.lock().unwrap_or_else(PoisonError::into_inner));
        for row in &rows {
            let id: i64 = row.try_get(0).map_err(table.database_error("read rows"))?;
            if batch.failure.is_some() {
                batch.unsent.push(id);
                continue;
            }
            let output = match read_output(row, id) {
                Ok(output) => output,
                Err(error) => {
                    let attempts = previous.get(&id).copied().unwrap_or(0);
                    batch.refused.push(Refusal {
                        id,
                        destination: row.try_get::<String, _>(1).ok().map(Into::into),
                        attempts,
                        kind: UNREADABLE,
                        error: error_text(&error),
                    });
                    continue;
                }
            };
            let key = self.order_key(&output);
            let waits = self.settings.key_order && output.key().is_some();
            // A row of a key with rows in flight waits for their
            // confirmations (and those of the rows sent before them).
            while waits && batch.in_flight_keys.contains_key(&key) {
                let Some(sent) = batch.in_flight.pop_front() else {
                    break;
                };
                self.settle(&mut batch, sent, &previous).await;
            }
            if batch.failure.is_some() || Instant::now() >= send_until {
                batch.cut_short = batch.failure.is_none();
                batch.unsent.push(id);
                continue;
            }
            let destination = output.destination_shared().clone();
            // The publisher bounds its own wait for room; this bounds a
            // publisher that does not.
            let timeout = self.settings.confirm_timeout;
            match tokio::time::timeout(timeout, self.publisher.send(output)).await {
                Ok(Ok(receipt)) => {
                    *batch.in_flight_keys.entry(key).or_insert(0) += 1;
                    batch.in_flight.push_back(Sent { id, key, receipt });
                }
                Ok(Err(error)) if error.kind() == PublishErrorKind::Rejected => {
                    batch.refuse(id, Some(destination), &error, &previous);
                }
                Ok(Err(source)) => {
                    batch.fail(id, key, OutboxError::Publish { id, source }, &previous)
                }
                Err(_elapsed) => {
                    batch.fail(id, key, OutboxError::Unconfirmed { id, timeout }, &previous);
                }
            }
        }
        while let Some(sent) = batch.in_flight.pop_front() {
            self.settle(&mut batch, sent, &previous).await;
        }
        // Counts survive only for the rows that stay; an unsent row keeps
        // the count it had.
        {
            let mut attempts = self.attempts.lock().unwrap_or_else(PoisonError::into_inner);
            attempts.clone_from(&batch.unconfirmed);
            for id in &batch.unsent {
                if let Some(&count) = previous.get(id) {
                    attempts.insert(*id, count);
                }
            }
        }
        self.write_down(transaction, batch).await
    }

    /// Awaits one receipt (bounded) and files its row.
    async fn settle(
        &self,
        batch: &mut Batch<P::Receipt>,
        sent: Sent<P::Receipt>,
        previous: &HashMap<i64, u32>,
    ) {
        let Sent { id, key, receipt } = sent;
        if let Some(left) = batch.in_flight_keys.get_mut(&key) {
            *left -= 1;
            if *left == 0 {
                batch.in_flight_keys.remove(&key);
            }
        }
        let timeout = self.settings.confirm_timeout;
        match tokio::time::timeout(timeout, receipt).await {
            // A confirmed row after one of its key that stays stays too,
            // and is sent again after it, so that its last copy comes last.
            Ok(Ok(_confirmation)) if batch.stays.contains(&key) => {}
            Ok(Ok(_confirmation)) => batch.published.push(id),
            Ok(Err(error)) if error.kind() == PublishErrorKind::Rejected => {
                let destination = Some(error.destination().into());
                batch.refuse(id, destination, &error, previous);
            }
            Ok(Err(source)) => batch.fail(id, key, OutboxError::Publish { id, source }, previous),
            Err(_elapsed) => {
                batch.fail(id, key, OutboxError::Unconfirmed { id, timeout }, previous)
            }
        }
    }

    /// Deletes the batch's published rows, moves its refused ones, commits,
    /// and logs what was refused.
    async fn write_down(
        &self,
        mut transaction: sqlx::Transaction<'static, sqlx::Postgres>,
        batch: Batch<P::Receipt>,
    ) -> Result<Pass, OutboxError> {
        let table = &self.table;
        let Batch {
            published,
            refused,
            mut failure,
            cut_short,
            ..
        } = batch;
        if !published.is_empty() {
            sqlx::query(table.inner.delete_batch.clone())
                .bind(&published)
                .execute(&mut *transaction)
                .await
                .map_err(table.database_error("delete rows"))?;
        }
        let mut moved = 0;
        if !refused.is_empty() {
            // In a savepoint: a failed table that is missing (an older
            // schema) keeps the refused rows where they were, but does not
            // cost the published rows a second publish.
            let mut moves = transaction
                .begin()
                .await
                .map_err(table.database_error(MOVE_STEP))?;
            let mut result = Ok(());
            for refusal in &refused {
                result = sqlx::query(table.inner.move_failed.clone())
                    .bind(refusal.id)
                    .bind(i32::try_from(refusal.attempts.saturating_add(1)).unwrap_or(i32::MAX))
                    .bind(refusal.kind)
                    .bind(&refusal.error)
                    .execute(&mut *moves)
                    .await
                    .map(drop);
                if result.is_err() {
                    break;
                }
            }
            match result {
                Ok(()) => {
                    moves
                        .commit()
                        .await
                        .map_err(table.database_error(MOVE_STEP))?;
                    moved = refused.len();
                }
                Err(error) => {
                    moves
                        .rollback()
                        .await
                        .map_err(table.database_error(MOVE_STEP))?;
                    failure.get_or_insert((table.database_error(MOVE_STEP))(error));
                }
            }
        }
        if published.is_empty() && moved == 0 {
            drop(transaction);
        } else {
            transaction
                .commit()
                .await
                .map_err(table.database_error("commit"))?;
        }
        for refusal in refused.iter().take(moved) {
            tracing::error!(
                table = table.name(),
                failed_table = table.failed_name(),
                id = refusal.id,
                destination = refusal.destination.as_deref(),
                kind = refusal.kind,
                attempts = refusal.attempts.saturating_add(1),
                error = %refusal.error,
                "an outbox row was refused; it was moved to the failed table, where it waits \
                 for an operator to fix its cause and re-queue it (OutboxTable::requeue_sql)"
            );
        }
        if !published.is_empty() {
            tracing::debug!(
                table = table.name(),
                published = published.len(),
                first = published.first().copied(),
                last = published.last().copied(),
                "published outbox rows"
            );
        }
        let done = published.len() + moved;
        Ok(Pass {
            done: RelayedBatch {
                published: published.len() as u64,
                failed: moved as u64,
            },
            full: cut_short || done as u64 == u64::from(self.settings.batch_size),
            failure,
        })
    }

    /// What the key-order bookkeeping knows a row by: its destination and
    /// key (or its destination alone, for a keyless row). A collision only
    /// makes two keys wait for each other, or a row stay (and be sent
    /// again) behind a failed row of the other key.
    fn order_key(&self, output: &Output) -> u64 {
        self.keys
            .hash_one((output.destination(), output.key().map(|key| &key[..])))
    }
}

/// The failed table's `error_kind` of a row the relay could not read.
const UNREADABLE: &str = "unreadable";

/// The [`OutboxError::Database`] step of moving refused rows.
const MOVE_STEP: &str = "move refused rows to the failed table";

/// One row read as its output.
fn read_output(row: &PgRow, id: i64) -> Result<Output, sqlx::Error> {
    Ok(output_of(
        id,
        row.try_get(1)?,
        row.try_get(2)?,
        row.try_get(3)?,
        row.try_get(4)?,
        row.try_get(5)?,
    ))
}

/// What one batch did.
#[derive(Debug, Default)]
struct Pass {
    done: RelayedBatch,
    /// Every row of a full batch was done, or the batch ended at its
    /// deadline: more may be waiting.
    full: bool,
    /// Why the batch stopped sending, if it did.
    failure: Option<OutboxError>,
}

/// A row sent and not yet confirmed.
struct Sent<R> {
    id: i64,
    key: u64,
    receipt: R,
}

/// A row to move to the failed table.
struct Refusal {
    id: i64,
    destination: Option<Arc<str>>,
    /// Sends before this one.
    attempts: u32,
    kind: &'static str,
    error: String,
}

/// One batch's rows as they are settled.
struct Batch<R> {
    in_flight: VecDeque<Sent<R>>,
    /// How many rows of each key are in flight.
    in_flight_keys: HashMap<u64, u32>,
    /// Keys with a row that stays: their later confirmed rows stay too.
    stays: HashSet<u64>,
    published: Vec<i64>,
    refused: Vec<Refusal>,
    /// Rows not confirmed, with their sends so far.
    unconfirmed: HashMap<i64, u32>,
    /// Rows not sent, after the batch stopped sending.
    unsent: Vec<i64>,
    /// The batch stopped sending at its deadline: rows wait.
    cut_short: bool,
    failure: Option<OutboxError>,
}

impl<R> Batch<R> {
    fn with_capacity(rows: usize) -> Self {
        Self {
            in_flight: VecDeque::with_capacity(rows),
            in_flight_keys: HashMap::with_capacity(rows),
            stays: HashSet::new(),
            published: Vec::with_capacity(rows),
            refused: Vec::new(),
            unconfirmed: HashMap::new(),
            unsent: Vec::new(),
            cut_short: false,
            failure: None,
        }
    }

    fn refuse(
        &mut self,
        id: i64,
        destination: Option<Arc<str>>,
        error: &PublishError,
        previous: &HashMap<i64, u32>,
    ) {
        self.refused.push(Refusal {
            id,
            destination,
            attempts: previous.get(&id).copied().unwrap_or(0),
            kind: error.kind().as_str(),
            error: error_text(error),
        });
    }

    /// Row `id` was not confirmed: it stays, the rows of its key after it
    /// stay, and the batch sends nothing more (the first failure is the
    /// batch's error).
    fn fail(&mut self, id: i64, key: u64, error: OutboxError, previous: &HashMap<i64, u32>) {
        self.stays.insert(key);
        let sends = previous.get(&id).copied().unwrap_or(0).saturating_add(1);
        self.unconfirmed.insert(id, sends);
        self.failure.get_or_insert(error);
    }
}

#[derive(Debug, Default)]
struct Counters {
    published: AtomicU64,
    failed_rows: AtomicU64,
    failed_batches: AtomicU64,
    /// Failed batches since the last one that was not.
    failing: AtomicU32,
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

    /// Rows the broker refused (or the relay could not read), moved to the
    /// [failed table](OutboxTable#the-failed-table) so far: each waits for
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
        let (full, failure) = match relay.pass().await {
            Ok(pass) => {
                counters
                    .published
                    .fetch_add(pass.done.published, Ordering::Relaxed);
                counters
                    .failed_rows
                    .fetch_add(pass.done.failed, Ordering::Relaxed);
                (pass.full, pass.failure)
            }
            Err(error) => (false, Some(error)),
        };
        let pause = match failure {
            None => {
                failures = 0;
                counters.failing.store(0, Ordering::Relaxed);
                if full {
                    continue;
                }
                settings.poll_interval
            }
            Some(error) => {
                failures = failures.saturating_add(1);
                counters.failing.store(failures, Ordering::Relaxed);
                counters.failed_batches.fetch_add(1, Ordering::Relaxed);
                let pause = backoff
                    .delay(failures)
                    .unwrap_or_else(|| backoff.base_delay(failures));
                tracing::warn!(
                    table = relay.table.name(),
                    error = %ErrorChain::new(&error),
                    retry_in = ?pause,
                    "publishing outbox rows failed; the rows not confirmed stay and are \
                     published again"
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
