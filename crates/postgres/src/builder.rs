//! [`ExactlyOnceBuilder`]: the settings of an exactly-once handler.

use std::fmt;
use std::sync::Arc;

use intake_core::ConfigError;
use sqlx::PgPool;

use crate::batch::{ExactlyOnceBatch, TxBatchHandler};
use crate::context::Context;
use crate::counters::ExactlyOnceCounters;
use crate::exactly_once::ExactlyOnce;
use crate::handler::TxHandler;
use crate::isolation::IsolationLevel;
use crate::marker_table::MarkerTable;
use crate::message_id::MessageId;

/// Longest consumer group name accepted, in bytes.
const MAX_GROUP_LEN: usize = 255;

/// Settings of an exactly-once handler; start with
/// [`ExactlyOnce::builder`], end with [`handler`](Self::handler) or
/// [`batch_handler`](Self::batch_handler).
///
/// ```no_run
/// use intake_core::Payload;
/// use intake_postgres::{ExactlyOnce, IsolationLevel, MarkerTable, MessageId, Tx};
///
/// # fn build(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let handler = ExactlyOnce::builder(pool, "ledger")
///     .table(MarkerTable::new("ledger.processed")?)
///     .message_id(MessageId::header("amqp.message-id"))
///     .isolation(IsolationLevel::Serializable)
///     .handler(async |mut tx: Tx, Payload(entry): Payload| {
///         sqlx::query("INSERT INTO ledger.entries (body) VALUES ($1)")
///             .bind(entry.as_ref())
///             .execute(&mut *tx)
///             .await
///             .map(drop)
///     })?;
/// # drop(handler);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct ExactlyOnceBuilder {
    pool: PgPool,
    group: String,
    table: MarkerTable,
    message_id: MessageId,
    isolation: Option<IsolationLevel>,
}

impl ExactlyOnceBuilder {
    pub(crate) fn new(pool: PgPool, group: impl Into<String>) -> Self {
        Self {
            pool,
            group: group.into(),
            table: MarkerTable::default(),
            message_id: MessageId::default(),
            isolation: None,
        }
    }

    /// The marker table. Default [`MarkerTable::DEFAULT_NAME`].
    pub fn table(mut self, table: MarkerTable) -> Self {
        self.table = table;
        self
    }

    /// What identifies a message. Default [`MessageId::Position`]; AMQP needs
    /// [`MessageId::Header`].
    pub fn message_id(mut self, message_id: MessageId) -> Self {
        self.message_id = message_id;
        self
    }

    /// The isolation level of the transactions. Default: the server's
    /// (`READ COMMITTED` unless changed).
    pub fn isolation(mut self, level: IsolationLevel) -> Self {
        self.isolation = Some(level);
        self
    }

    /// The exactly-once service for the per-message handler `handler`: an
    /// `async fn(Tx, extractors…)` ([`TxHandler`]).
    ///
    /// # Errors
    ///
    /// An empty or overlong group name, or an empty header name.
    pub fn handler<F, Args>(self, handler: F) -> Result<ExactlyOnce<F, Args>, ConfigError>
    where
        F: TxHandler<Args>,
    {
        Ok(ExactlyOnce::new(handler, self.context()?))
    }

    /// The exactly-once service for the batch handler `handler`: an
    /// `async fn(Tx, Vec<T>)` ([`TxBatchHandler`]) that writes a whole batch
    /// in one transaction.
    ///
    /// # Errors
    ///
    /// An empty or overlong group name, or an empty header name.
    pub fn batch_handler<F, Item>(
        self,
        handler: F,
    ) -> Result<ExactlyOnceBatch<F, Item>, ConfigError>
    where
        F: TxBatchHandler<Item>,
    {
        Ok(ExactlyOnceBatch::new(handler, self.context()?))
    }

    fn context(self) -> Result<Arc<Context>, ConfigError> {
        if self.group.is_empty() {
            return Err(ConfigError::new(
                "group",
                "is empty; name the consumer group whose processed messages are recorded",
            ));
        }
        if self.group.len() > MAX_GROUP_LEN || self.group.contains('\0') {
            return Err(ConfigError::new(
                "group",
                format!("must be at most {MAX_GROUP_LEN} bytes without NUL"),
            ));
        }
        if let MessageId::Header(name) = &self.message_id
            && name.is_empty()
        {
            return Err(ConfigError::new(
                "message_id",
                "names an empty header; give the header that carries the message id",
            ));
        }
        Ok(Arc::new(Context {
            pool: self.pool,
            group: self.group.into(),
            table: self.table,
            message_id: self.message_id,
            isolation: self.isolation,
            counters: Arc::new(ExactlyOnceCounters::default()),
        }))
    }
}

impl fmt::Debug for ExactlyOnceBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExactlyOnceBuilder")
            .field("group", &self.group)
            .field("table", &self.table)
            .field("message_id", &self.message_id)
            .field("isolation", &self.isolation)
            .finish_non_exhaustive()
    }
}
