//! [`Context`]: what every exactly-once transaction of one handler shares,
//! and the transaction steps built on it.

use std::sync::Arc;

use sqlx::PgPool;

use crate::counters::ExactlyOnceCounters;
use crate::error::Error;
use crate::isolation::IsolationLevel;
use crate::marker_table::MarkerTable;
use crate::message_id::{MarkerKey, MessageId};
use crate::tx::{Transaction, TransactionId};

/// SQLSTATE `in_failed_sql_transaction`: a statement sent after an error
/// in the same transaction.
const IN_FAILED_TRANSACTION: &str = "25P02";

/// The settings of one exactly-once handler, shared by its clones.
pub(crate) struct Context {
    pub(crate) pool: PgPool,
    pub(crate) group: Arc<str>,
    pub(crate) table: MarkerTable,
    pub(crate) message_id: MessageId,
    pub(crate) isolation: Option<IsolationLevel>,
    pub(crate) counters: Arc<ExactlyOnceCounters>,
}

impl Context {
    /// Checks out a connection and begins a transaction.
    pub(crate) async fn begin(&self) -> Result<Transaction, Error> {
        let transaction = match self.isolation {
            Some(level) => self.pool.begin_with(level.begin_statement()).await,
            None => self.pool.begin().await,
        };
        transaction.map_err(Error::Begin)
    }

    /// Inserts the marker of `key`: the transaction's id if it is new,
    /// `None` if the message was processed before.
    ///
    /// A marker that another transaction inserted and has not committed yet
    /// (the same message running on a consumer that lost its partition)
    /// makes this wait for that transaction: if it commits, this one sees a
    /// duplicate; if it rolls back, this one goes on. So two copies of a
    /// message never both run their effects.
    pub(crate) async fn mark(
        &self,
        transaction: &mut Transaction,
        key: &MarkerKey,
    ) -> Result<Option<TransactionId>, Error> {
        self.table
            .insert_one(transaction, &self.group, key)
            .await
            .map_err(|source| self.marker_error(source))
    }

    /// Inserts the markers of `keys` (distinct): the indexes of the new ones,
    /// and the transaction's id if any is new.
    pub(crate) async fn mark_all(
        &self,
        transaction: &mut Transaction,
        keys: &[&MarkerKey],
    ) -> Result<(Vec<usize>, Option<TransactionId>), Error> {
        self.table
            .insert_many(transaction, &self.group, keys)
            .await
            .map_err(|source| self.marker_error(source))
    }

    fn marker_error(&self, source: sqlx::Error) -> Error {
        Error::Marker {
            table: self.table.name().to_owned(),
            source,
        }
    }

    /// Commits the transaction that inserted markers as `id`, after checking
    /// that it is still that transaction and still healthy.
    ///
    /// PostgreSQL answers `COMMIT` in a failed transaction with a silent
    /// rollback, not an error: a handler that ignored a database error and
    /// returned `Ok` would have its message acknowledged with nothing
    /// committed. And a handler that ran `COMMIT` or `ROLLBACK` itself has
    /// ended the transaction the marker was in. One statement catches both:
    /// it fails in a failed transaction, and returns another id (or none)
    /// outside the marker's transaction.
    pub(crate) async fn commit(
        &self,
        mut transaction: Transaction,
        id: TransactionId,
    ) -> Result<(), Error> {
        let current: Option<i64> = sqlx::query_scalar("SELECT txid_current_if_assigned()")
            .fetch_one(&mut *transaction)
            .await
            .map_err(|error| {
                let failed_transaction = error
                    .as_database_error()
                    .and_then(|database| database.code())
                    .is_some_and(|code| code == IN_FAILED_TRANSACTION);
                if failed_transaction {
                    Error::Aborted(error)
                } else {
                    Error::Commit(error)
                }
            })?;
        if current != Some(id.0) {
            self.roll_back(transaction).await;
            return Err(Error::TransactionEnded);
        }
        transaction.commit().await.map_err(Error::Commit)
    }

    /// Ends a transaction whose effects must not stay.
    ///
    /// A failed `ROLLBACK` needs no handling: the connection is closed (and
    /// the server rolls back) or sqlx rolls back before reusing it.
    pub(crate) async fn roll_back(&self, transaction: Transaction) {
        if let Err(error) = transaction.rollback().await {
            tracing::debug!(%error, group = %self.group, "rollback failed; the connection is discarded");
        }
    }
}
