//! [`IsolationLevel`]: the isolation of the exactly-once transaction.

/// The isolation level of each exactly-once transaction. Without one, the
/// server's `default_transaction_isolation` applies (`READ COMMITTED` unless
/// changed).
///
/// Under `REPEATABLE READ` and `SERIALIZABLE`, concurrent transactions may
/// fail with a serialization failure (`40001`); that error is retryable, so
/// the message is run again in a new transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IsolationLevel {
    /// `READ COMMITTED`.
    ReadCommitted,
    /// `REPEATABLE READ`.
    RepeatableRead,
    /// `SERIALIZABLE`.
    Serializable,
}

impl IsolationLevel {
    /// The statement that begins a transaction at this level.
    pub const fn begin_statement(self) -> &'static str {
        match self {
            IsolationLevel::ReadCommitted => "BEGIN ISOLATION LEVEL READ COMMITTED",
            IsolationLevel::RepeatableRead => "BEGIN ISOLATION LEVEL REPEATABLE READ",
            IsolationLevel::Serializable => "BEGIN ISOLATION LEVEL SERIALIZABLE",
        }
    }
}
