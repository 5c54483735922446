//! The end of a batch: delete its published rows, move its refused ones to
//! the [failed table](crate::OutboxTable#the-failed-table) (in a savepoint),
//! commit, and log each refused row.

use intake_core::publish::Publisher;
use sqlx::Connection;

use super::batch::Batch;
use super::pass::Pass;
use super::{OutboxRelay, RelayedBatch};
use crate::outbox::OutboxError;

impl<P: Publisher> OutboxRelay<P> {
    /// Deletes the batch's published rows, moves its refused ones, commits,
    /// and logs what was refused.
    pub(super) async fn write_down(
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
}

/// The [`OutboxError::Database`] step of moving refused rows.
const MOVE_STEP: &str = "move refused rows to the failed table";
