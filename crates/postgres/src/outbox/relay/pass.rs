//! One batch of the [`OutboxRelay`]: claim the oldest rows no other relay
//! holds (`FOR UPDATE SKIP LOCKED`), send them in id order (a keyed row,
//! with key order, only once the earlier rows of its key are confirmed),
//! and await their confirmations, each bounded by the confirm timeout.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::PoisonError;
use std::time::Instant;

use intake_core::publish::{Output, PublishErrorKind, Publisher};
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::batch::{Batch, Refusal, Sent};
use super::{OutboxRelay, RelayedBatch};
use crate::outbox::{OutboxError, error_text, output_of};

impl<P: Publisher> OutboxRelay<P> {
    /// One batch: what it did, and why it stopped early if it did. `Err`
    /// when a database error rolled it all back.
    pub(super) async fn pass(&self) -> Result<Pass, OutboxError> {
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
pub(super) struct Pass {
    pub(super) done: RelayedBatch,
    /// Every row of a full batch was done, or the batch ended at its
    /// deadline: more may be waiting.
    pub(super) full: bool,
    /// Why the batch stopped sending, if it did.
    pub(super) failure: Option<OutboxError>,
}
