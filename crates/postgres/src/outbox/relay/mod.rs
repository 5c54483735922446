//! [`OutboxRelay`]: publishes the outbox's rows, in id order, until stopped.
//!
//! The relay's parts: [`RelaySettings`] (`settings.rs`); one batch, from
//! claiming its rows to sending them and awaiting their confirmations
//! (`pass.rs`), with what it knows of its rows, key order included
//! (`batch.rs`); writing its outcome down: deleting the published rows and
//! moving the refused ones to the failed table (`write_down.rs`); and the
//! task that runs batch after batch (`run.rs`) under an
//! [`OutboxRelayHandle`] (`handle.rs`).

mod batch;
mod handle;
mod pass;
mod run;
mod settings;
mod write_down;

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::sync::{Arc, Mutex};

use intake_core::ConfigError;
use intake_core::publish::Publisher;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::{OutboxError, OutboxTable};

pub use self::handle::{FAILING_BATCHES_NOT_READY, OutboxRelayHandle};
pub use self::settings::RelaySettings;

use self::handle::Counters;
use self::run::run;

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
}
