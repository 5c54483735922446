//! [`Tx`]: the open transaction a handler writes its effects in.

use std::fmt;
use std::ops::{Deref, DerefMut};

use sqlx::postgres::{PgConnection, Postgres};
use tokio::sync::oneshot;

/// A transaction, checked out from the pool.
pub(crate) type Transaction = sqlx::Transaction<'static, Postgres>;

/// The server's id of a transaction (`txid_current()`), taken when the
/// marker is inserted and checked again just before `COMMIT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TransactionId(pub(crate) i64);

/// The transaction a handler runs in: the processed-marker of its message is
/// already inserted, and whatever the handler writes through the `Tx` commits
/// together with it, after the handler returns `Ok`. If the handler fails,
/// all of it rolls back and the marker with it, so the message can run
/// again.
///
/// Use it as a connection: it dereferences to [`PgConnection`], so any sqlx
/// query runs in the transaction with `.execute(&mut *tx)`,
/// `.fetch_one(&mut *tx)`, and so on. A savepoint is
/// `sqlx::Connection::begin(&mut *tx)`.
///
/// The handler owns its `Tx` (so a closure can move it into an `async move`
/// block), and gives it back by dropping it when it finishes. Do not move it
/// into a spawned task or keep it: the commit waits for it, and a `Tx` that
/// outlives its handler fails the message with
/// [`Error::TransactionEscaped`](crate::Error::TransactionEscaped).
/// There is no `commit` on a `Tx`: the framework commits, so that the message
/// is acknowledged only after its effects are durable. Do not run `COMMIT` or
/// `ROLLBACK` in SQL either, and propagate database errors (`?`) rather than
/// ignore them: a handler that ends the transaction or lets it fail gets an
/// [`Error::TransactionEnded`](crate::Error::TransactionEnded)
/// or [`Error::Aborted`](crate::Error::Aborted) error
/// and its message is retried.
pub struct Tx {
    transaction: Option<Transaction>,
    home: Option<oneshot::Sender<Transaction>>,
}

/// The framework's side of a lent [`Tx`]: the transaction comes back here
/// when the handler drops its `Tx`.
pub(crate) struct Lent(oneshot::Receiver<Transaction>);

impl Tx {
    /// Lends `transaction` to a handler.
    pub(crate) fn lend(transaction: Transaction) -> (Tx, Lent) {
        let (home, back) = oneshot::channel();
        (
            Tx {
                transaction: Some(transaction),
                home: Some(home),
            },
            Lent(back),
        )
    }

    fn transaction(&self) -> &Transaction {
        // Only `Drop` takes the transaction out.
        self.transaction
            .as_ref()
            .expect("a Tx holds its transaction until it is dropped")
    }

    fn transaction_mut(&mut self) -> &mut Transaction {
        self.transaction
            .as_mut()
            .expect("a Tx holds its transaction until it is dropped")
    }
}

impl Lent {
    /// The transaction, if the handler's `Tx` has been dropped.
    pub(crate) fn take_back(mut self) -> Option<Transaction> {
        self.0.try_recv().ok()
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        if let (Some(transaction), Some(home)) = (self.transaction.take(), self.home.take()) {
            // If the framework is gone (its future was dropped: a timeout, a
            // shutdown), the transaction drops here and sqlx rolls it back.
            let _ = home.send(transaction);
        }
    }
}

impl Deref for Tx {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.transaction()
    }
}

impl DerefMut for Tx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.transaction_mut()
    }
}

impl fmt::Debug for Tx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tx").finish_non_exhaustive()
    }
}
