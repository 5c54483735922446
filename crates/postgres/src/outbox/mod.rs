//! The outbox: outputs written in the exactly-once transaction, published
//! later by an [`OutboxRelay`].
//!
//! A handler that runs in an exactly-once transaction ([`Tx`](crate::Tx))
//! and must also publish cannot publish from inside the transaction: the
//! output would be out even if the transaction then rolled back, and a
//! redelivery after a crash would publish it again. Instead it writes its
//! [`Output`]s into an [`OutboxTable`] through the same `Tx`, so they commit
//! together with its own writes and the processed-marker: a handler that
//! fails adds none, and a redelivered message, skipped by its marker, adds
//! none. An [`OutboxRelay`] then publishes the rows with any
//! [`Publisher`](intake_core::publish::Publisher), in id order, and deletes
//! them once the broker confirmed them.
//!
//! Effects are exactly once; publishing is at least once. A relay killed
//! after the broker confirmed a batch and before its `COMMIT` publishes the
//! batch again when it restarts. Every output carries its row id in the
//! header [`OUTBOX_ID_HEADER`] (`intake.outbox-id`), so a consumer
//! downstream drops the copies it has seen (with a processed-marker keyed
//! by [`MessageId::header`](crate::MessageId::header), for one).
//!
//! A row the broker refuses (too large, no such destination, not allowed)
//! does not hold up the rows after it: the relay moves it to the
//! [failed table](OutboxTable#the-failed-table) next to the outbox, logs it
//! at `error` and counts it ([`OutboxRelayHandle::failed_rows`]); an
//! operator fixes the cause and re-queues it with
//! [`OutboxTable::requeue_sql`]. Rows of one key reach the broker in id
//! order, also after a failure ([order](OutboxRelay#order)).
//!
//! ```no_run
//! use intake_core::publish::Output;
//! use intake_core::Payload;
//! use intake_postgres::{exactly_once, OutboxRelay, OutboxTable, RelaySettings, Tx};
//!
//! # async fn run(pool: sqlx::PgPool, publisher: intake_core::memory::MemoryPublisher)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! let outbox = OutboxTable::default();
//! outbox.migrate(&pool).await?;
//!
//! // The handler writes its effects and its outputs in one transaction.
//! let writes = outbox.clone();
//! let handler = exactly_once(
//!     pool.clone(),
//!     "billing",
//!     async move |mut tx: Tx, Payload(body): Payload| -> Result<(), sqlx::Error> {
//!         sqlx::query("INSERT INTO invoices (body) VALUES ($1)")
//!             .bind(body.as_ref())
//!             .execute(&mut *tx)
//!             .await?;
//!         writes.write(&mut tx, Output::new("invoices", body)).await?;
//!         Ok(())
//!     },
//! )?;
//! # drop(handler);
//!
//! // The relay publishes what committed, in order, until stopped.
//! let relay = OutboxRelay::spawn(pool, outbox, publisher, RelaySettings::default())?;
//! // ... run the consumer ...
//! relay.stop().await;
//! # Ok(())
//! # }
//! ```

mod relay;

use std::fmt;
use std::sync::Arc;

use intake_core::publish::{Output, Outputs};
use intake_core::{ConfigError, Headers};
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, PgPool, SqlSafeStr, SqlStr};

use crate::marker_table::quoted_table_name;

pub use self::relay::{
    FAILING_BATCHES_NOT_READY, OutboxRelay, OutboxRelayHandle, RelaySettings, RelayedBatch,
};

/// The header that carries an output's outbox row id (decimal ASCII), the
/// same on every copy the relay publishes.
pub const OUTBOX_ID_HEADER: &str = "intake.outbox-id";

/// Longest table name accepted, so that the names derived from it stay
/// within PostgreSQL's 63-byte identifiers (the failed table's
/// `{table}_failed` and its `{table}_failed_pkey` included).
const MAX_TABLE_NAME_LEN: usize = 63 - "_headers_check".len();

/// What the name of the failed table adds to the outbox's.
const FAILED_SUFFIX: &str = "_failed";

/// Longest error text kept in the failed table: a broker's message is a
/// line or two; this bounds one that is not.
const MAX_ERROR_TEXT: usize = 4096;

/// A failure of the outbox: creating its table, reading or deleting its
/// rows, or publishing them.
///
/// As with [`Error`](crate::Error), `Display` says this level only and the
/// cause is the [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// Creating the outbox table failed, for instance for a missing
    /// `CREATE` privilege.
    #[error("cannot create the outbox table {table}")]
    Migrate {
        /// The table.
        table: String,
        /// The database's error.
        #[source]
        source: sqlx::Error,
    },
    /// A statement of the relay's transaction failed (`step` says which);
    /// the batch rolled back and its rows stay.
    #[error(
        "cannot {step} in the outbox table {table} (if it does not exist, run \
         OutboxTable::migrate)"
    )]
    Database {
        /// The table.
        table: String,
        /// What the relay was doing: `begin`, `read rows`, `delete rows`,
        /// `move refused rows to the failed table`, `commit`.
        step: &'static str,
        /// The database's error.
        #[source]
        source: sqlx::Error,
    },
    /// The publisher did not take or confirm row `id`, for a reason that
    /// may pass (the broker unreachable, the publisher closed): the row
    /// stays and is published again, with the same [`OUTBOX_ID_HEADER`].
    /// (A row the broker refuses is no error of the batch: it is moved to
    /// the [failed table](OutboxTable#the-failed-table).)
    #[error("outbox row {id} was not published")]
    Publish {
        /// The row.
        id: i64,
        /// The publisher's error.
        #[source]
        source: intake_core::publish::PublishError,
    },
    /// Row `id` could not be sent, or its confirmation did not come, within
    /// the relay's [`confirm_timeout`](RelaySettings::confirm_timeout); it
    /// stays and is published again.
    #[error("outbox row {id} was not sent and confirmed within {timeout:?}; publishing it again")]
    Unconfirmed {
        /// The row.
        id: i64,
        /// The timeout.
        timeout: std::time::Duration,
    },
}

impl OutboxError {
    /// Whether trying again may succeed: every failure but a rejected
    /// output and a database error an operator must fix (bad data,
    /// constraints, credentials, a missing table or privilege).
    pub fn is_transient(&self) -> bool {
        match self {
            OutboxError::Migrate { source, .. } | OutboxError::Database { source, .. } => {
                !lasting_database_error(source)
            }
            OutboxError::Publish { source, .. } => source.is_transient(),
            OutboxError::Unconfirmed { .. } => true,
        }
    }
}

/// Whether `error` is one the same statement meets again: bad data,
/// constraints, credentials, schema or privileges (SQLSTATE classes `22`,
/// `23`, `28`, `42`).
fn lasting_database_error(error: &sqlx::Error) -> bool {
    const LASTING: [&str; 4] = ["22", "23", "28", "42"];
    matches!(
        error,
        sqlx::Error::Database(database)
            if database.code().is_some_and(|code| LASTING.iter().any(|class| code.starts_with(class)))
    )
}

/// The table of outputs waiting to be published, and next to it the table
/// of the rows the broker refused.
///
/// One row per [`Output`], in the order written: `id` (a `bigserial`, the
/// publishing order and the [`OUTBOX_ID_HEADER`]), `destination`, `key`
/// (null without one), `payload`, the headers as two arrays of the same
/// length (`header_names`, `header_values`: order and repeated names kept,
/// values as raw bytes) and `created_at`. Create both tables with
/// [`migrate`](Self::migrate) (idempotent), or put
/// [`migration_sql`](Self::migration_sql) into your own migrations:
///
/// ```text
/// CREATE TABLE IF NOT EXISTS "intake_outbox" (
///     id bigserial PRIMARY KEY,
///     destination text NOT NULL,
///     key bytea,
///     payload bytea NOT NULL,
///     header_names text[] NOT NULL,
///     header_values bytea[] NOT NULL,
///     created_at timestamptz NOT NULL DEFAULT now(),
///     CONSTRAINT "intake_outbox_headers_check"
///         CHECK (cardinality(header_names) = cardinality(header_values))
/// );
/// CREATE TABLE IF NOT EXISTS "intake_outbox_failed" (
///     id bigint PRIMARY KEY,
///     destination text NOT NULL,
///     key bytea,
///     payload bytea NOT NULL,
///     header_names text[] NOT NULL,
///     header_values bytea[] NOT NULL,
///     created_at timestamptz NOT NULL,
///     failed_at timestamptz NOT NULL DEFAULT now(),
///     attempts integer NOT NULL,
///     error_kind text NOT NULL,
///     error text NOT NULL
/// );
/// ```
///
/// A destination or header name that contains a NUL character cannot be
/// stored (PostgreSQL's `text` refuses it, SQLSTATE `22021`): the write
/// fails and the handler's message takes the permanent path.
///
/// # The failed table
///
/// A row the broker refuses ([`PublishErrorKind::Rejected`]: larger than
/// the broker takes, no such topic or queue, not allowed, a Redis key of
/// another type), or one the relay cannot read (a header array with a
/// `NULL` in it, written by hand), would be refused every time. The
/// [`OutboxRelay`] moves it, in the transaction that deletes its batch's
/// published rows, to `{table}_failed` ([`failed_name`](Self::failed_name)),
/// the row as it was plus `failed_at`, `attempts` (how many times this
/// relay sent it, the refused time included), `error_kind` (`rejected` or
/// `unreadable`) and `error` (the publisher's error and its causes). It
/// logs each at `error` and counts it
/// ([`OutboxRelayHandle::failed_rows`]); the rows after it are published
/// as usual.
///
/// An operator fixes the cause (creates the queue, raises the size limit,
/// or updates the row's `destination` or `payload` in the failed table),
/// then moves the row back with [`requeue_sql`](Self::requeue_sql), which
/// keeps its id (and so its [`OUTBOX_ID_HEADER`]):
///
/// ```text
/// WITH requeued AS (
///     DELETE FROM "intake_outbox_failed" WHERE id = $1
///     RETURNING id, destination, key, payload, header_names, header_values, created_at
/// )
/// INSERT INTO "intake_outbox"
///     (id, destination, key, payload, header_names, header_values, created_at)
/// SELECT id, destination, key, payload, header_names, header_values, created_at
/// FROM requeued;
/// ```
///
/// (With `WHERE true` in place of `WHERE id = $1`, all of them.) Its id is lower than the rows
/// published since, so it is the relay's next row: it reaches the broker
/// after rows of its key that were written after it.
///
/// [`PublishErrorKind::Rejected`]: intake_core::publish::PublishErrorKind::Rejected
/// [`OutboxRelay`]: crate::OutboxRelay
/// [`OutboxRelayHandle::failed_rows`]: crate::OutboxRelayHandle::failed_rows
#[derive(Clone)]
pub struct OutboxTable {
    inner: Arc<Inner>,
}

struct Inner {
    /// As given: `table` or `schema.table`.
    name: String,
    /// Quoted for SQL.
    quoted: String,
    /// The quoted constraint name.
    check: String,
    /// The failed table's name, `{name}_failed`.
    failed_name: String,
    /// The failed table's name, quoted.
    failed_quoted: String,
    insert: SqlStr,
    select_batch: SqlStr,
    delete_batch: SqlStr,
    move_failed: SqlStr,
    count: SqlStr,
    count_failed: SqlStr,
}

impl OutboxTable {
    /// The default table name.
    pub const DEFAULT_NAME: &'static str = "intake_outbox";

    /// The table `name`: `table` or `schema.table`, each part letters, digits
    /// and underscores, not starting with a digit (case is kept: the name is
    /// quoted in SQL).
    ///
    /// # Errors
    ///
    /// A name that is empty, too long or not a plain identifier.
    pub fn new(name: &str) -> Result<Self, ConfigError> {
        let (quoted, table) = quoted_table_name("outbox_table", name, MAX_TABLE_NAME_LEN)?;
        let failed_name = format!("{name}{FAILED_SUFFIX}");
        let (failed_quoted, _) = quoted_table_name(
            "outbox_table",
            &failed_name,
            MAX_TABLE_NAME_LEN + FAILED_SUFFIX.len(),
        )?;
        let sql = |text: String| AssertSqlSafe(text).into_sql_str();
        let columns = "id, destination, key, payload, header_names, header_values, created_at";
        Ok(Self {
            inner: Arc::new(Inner {
                insert: sql(format!(
                    "INSERT INTO {quoted} \
                     (destination, key, payload, header_names, header_values) \
                     VALUES ($1, $2, $3, $4, $5)"
                )),
                // SKIP LOCKED: a second relay on the table takes the next
                // rows instead of waiting for the first one's batch.
                select_batch: sql(format!(
                    "SELECT id, destination, key, payload, header_names, header_values \
                     FROM {quoted} ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
                )),
                delete_batch: sql(format!("DELETE FROM {quoted} WHERE id = ANY($1)")),
                // A row re-queued with its id and refused again replaces
                // its earlier failure instead of failing the batch.
                move_failed: sql(format!(
                    "WITH moved AS (DELETE FROM {quoted} WHERE id = $1 RETURNING {columns}) \
                     INSERT INTO {failed_quoted} \
                     ({columns}, attempts, error_kind, error) \
                     SELECT {columns}, $2, $3, $4 FROM moved \
                     ON CONFLICT (id) DO UPDATE SET \
                     destination = EXCLUDED.destination, key = EXCLUDED.key, \
                     payload = EXCLUDED.payload, header_names = EXCLUDED.header_names, \
                     header_values = EXCLUDED.header_values, \
                     created_at = EXCLUDED.created_at, failed_at = now(), \
                     attempts = EXCLUDED.attempts, error_kind = EXCLUDED.error_kind, \
                     error = EXCLUDED.error"
                )),
                count: sql(format!("SELECT count(*) FROM {quoted}")),
                count_failed: sql(format!("SELECT count(*) FROM {failed_quoted}")),
                check: format!("\"{table}_headers_check\""),
                name: name.to_owned(),
                quoted,
                failed_name,
                failed_quoted,
            }),
        })
    }

    /// The name as given.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The failed table's name: `{name}_failed`, in the same schema. See
    /// [the failed table](Self#the-failed-table).
    pub fn failed_name(&self) -> &str {
        &self.inner.failed_name
    }

    /// The SQL that creates the table and its failed table, idempotently
    /// (`IF NOT EXISTS`): for your own migration tool.
    pub fn migration_sql(&self) -> String {
        let Inner {
            quoted,
            check,
            failed_quoted,
            ..
        } = &*self.inner;
        format!(
            "CREATE TABLE IF NOT EXISTS {quoted} (\n    \
                 id bigserial PRIMARY KEY,\n    \
                 destination text NOT NULL,\n    \
                 key bytea,\n    \
                 payload bytea NOT NULL,\n    \
                 header_names text[] NOT NULL,\n    \
                 header_values bytea[] NOT NULL,\n    \
                 created_at timestamptz NOT NULL DEFAULT now(),\n    \
                 CONSTRAINT {check}\n        \
                     CHECK (cardinality(header_names) = cardinality(header_values))\n\
             );\n\
             CREATE TABLE IF NOT EXISTS {failed_quoted} (\n    \
                 id bigint PRIMARY KEY,\n    \
                 destination text NOT NULL,\n    \
                 key bytea,\n    \
                 payload bytea NOT NULL,\n    \
                 header_names text[] NOT NULL,\n    \
                 header_values bytea[] NOT NULL,\n    \
                 created_at timestamptz NOT NULL,\n    \
                 failed_at timestamptz NOT NULL DEFAULT now(),\n    \
                 attempts integer NOT NULL,\n    \
                 error_kind text NOT NULL,\n    \
                 error text NOT NULL\n\
             );\n"
        )
    }

    /// The SQL that moves failed rows back into the outbox, keeping their
    /// ids, for the relay to publish: `$1` is the row's id (a `bigint`).
    /// See [the failed table](Self#the-failed-table).
    pub fn requeue_sql(&self) -> String {
        let Inner {
            quoted,
            failed_quoted,
            ..
        } = &*self.inner;
        let columns = "id, destination, key, payload, header_names, header_values, created_at";
        format!(
            "WITH requeued AS (\n    \
                 DELETE FROM {failed_quoted} WHERE id = $1\n    \
                 RETURNING {columns}\n\
             )\n\
             INSERT INTO {quoted}\n    \
                 ({columns})\n\
             SELECT {columns}\n\
             FROM requeued;\n"
        )
    }

    /// Creates the table and its failed table if they do not exist (a
    /// table made by an earlier version gets its failed table), under a
    /// transaction-scoped
    /// advisory lock (as [`MarkerTable::migrate`](crate::MarkerTable::migrate)
    /// does) so that processes starting together do not race.
    ///
    /// # Errors
    ///
    /// The database's error, for instance a missing `CREATE` privilege.
    pub async fn migrate(&self, pool: &PgPool) -> Result<(), OutboxError> {
        crate::marker_table::migrate_under_lock(pool, &self.inner.name, self.migration_sql())
            .await
            .map_err(|source| OutboxError::Migrate {
                table: self.inner.name.clone(),
                source,
            })
    }

    /// Adds `outputs` (one [`Output`], several, or none) to the outbox on
    /// `connection`, in order, and returns how many it added.
    ///
    /// In an exactly-once handler, pass its [`Tx`](crate::Tx)
    /// (`outbox.write(&mut tx, output)`): the rows then commit with the
    /// handler's writes and its processed-marker, or not at all. On any
    /// other connection they commit with whatever transaction it is in.
    ///
    /// # Errors
    ///
    /// The database's error, as the handler's `?` expects it (a
    /// `sqlx::Error`, classified by its SQLSTATE).
    pub async fn write(
        &self,
        connection: &mut PgConnection,
        outputs: impl Into<Outputs>,
    ) -> Result<u64, sqlx::Error> {
        let mut written = 0;
        // One statement per output: a handler has a few, and a multi-row
        // insert of arrays of arrays is what PostgreSQL does worst (UNNEST
        // flattens them).
        for output in outputs.into() {
            self.write_one(connection, output).await?;
            written += 1;
        }
        Ok(written)
    }

    async fn write_one(
        &self,
        connection: &mut PgConnection,
        output: Output,
    ) -> Result<(), sqlx::Error> {
        let (destination, payload, key, headers) = output.into_parts();
        let names: Vec<&str> = headers.iter().map(|header| &*header.name).collect();
        let values: Vec<&[u8]> = headers.iter().map(|header| &*header.value).collect();
        sqlx::query(self.inner.insert.clone())
            .bind(&*destination)
            .bind(key.as_deref())
            .bind(&*payload)
            .bind(&names)
            .bind(&values)
            .execute(connection)
            .await
            .map(drop)
    }

    /// How many rows wait to be published: for tests and reports.
    ///
    /// # Errors
    ///
    /// The database's error.
    pub async fn count(&self, pool: &PgPool) -> Result<u64, sqlx::Error> {
        let count: i64 = sqlx::query_scalar(self.inner.count.clone())
            .fetch_one(pool)
            .await?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// How many rows wait in the [failed table](Self#the-failed-table)
    /// for an operator: for tests, reports and alerts.
    ///
    /// # Errors
    ///
    /// The database's error (the failed table does not exist before
    /// [`migrate`](Self::migrate)).
    pub async fn failed_count(&self, pool: &PgPool) -> Result<u64, sqlx::Error> {
        let count: i64 = sqlx::query_scalar(self.inner.count_failed.clone())
            .fetch_one(pool)
            .await?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    fn database_error(&self, step: &'static str) -> impl Fn(sqlx::Error) -> OutboxError + '_ {
        move |source| OutboxError::Database {
            table: self.inner.name.clone(),
            step,
            source,
        }
    }
}

impl Default for OutboxTable {
    fn default() -> Self {
        Self::new(Self::DEFAULT_NAME).expect("the default outbox table name is valid")
    }
}

impl fmt::Debug for OutboxTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("OutboxTable")
            .field(&self.inner.name)
            .finish()
    }
}

/// `error`'s text for the failed table: the error and its causes, at most
/// [`MAX_ERROR_TEXT`] bytes, NUL (which `text` refuses) replaced.
fn error_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = intake_core::ErrorChain::new(error)
        .to_string()
        .replace('\0', "\u{fffd}");
    if text.len() > MAX_ERROR_TEXT {
        let mut end = MAX_ERROR_TEXT;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// One row read for publishing, as the output the relay sends.
fn output_of(
    id: i64,
    destination: String,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
    names: Vec<String>,
    values: Vec<Vec<u8>>,
) -> Output {
    // The table's CHECK keeps both arrays the same length.
    let mut headers: Headers = names.into_iter().zip(values).collect();
    headers.set(OUTBOX_ID_HEADER, id.to_string());
    let output = Output::new(destination, payload).with_headers(headers);
    match key {
        Some(key) => output.with_key(key),
        None => output,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_would_need_escaping_are_refused() {
        for name in ["", "a.b.c", "1abc", "drop table x", "a\"b", "a;b"] {
            let error = OutboxTable::new(name).unwrap_err();
            assert_eq!(error.setting, "outbox_table", "{name}");
        }
        let sql = OutboxTable::new("billing.Outbox_1")
            .unwrap()
            .migration_sql();
        assert!(
            sql.contains("CREATE TABLE IF NOT EXISTS \"billing\".\"Outbox_1\""),
            "{sql}"
        );
    }

    #[test]
    fn the_failed_table_is_next_to_the_outbox_in_its_schema() {
        let outbox = OutboxTable::new("billing.Outbox_1").unwrap();
        assert_eq!(outbox.failed_name(), "billing.Outbox_1_failed");
        let sql = outbox.migration_sql();
        assert!(
            sql.contains("CREATE TABLE IF NOT EXISTS \"billing\".\"Outbox_1_failed\""),
            "{sql}"
        );
        let requeue = outbox.requeue_sql();
        assert!(
            requeue.contains("DELETE FROM \"billing\".\"Outbox_1_failed\" WHERE id = $1"),
            "{requeue}"
        );
        assert!(
            requeue.contains("INSERT INTO \"billing\".\"Outbox_1\""),
            "{requeue}"
        );
    }

    #[test]
    fn an_error_text_is_bounded_and_has_no_nul() {
        let error = std::io::Error::other(format!("a\0b{}", "é".repeat(MAX_ERROR_TEXT)));
        let text = error_text(&error);
        assert!(text.starts_with("a\u{fffd}b"), "{text}");
        assert!(!text.contains('\0'));
        assert!(text.len() <= MAX_ERROR_TEXT + '…'.len_utf8());
        assert!(text.ends_with('…'));
    }

    #[test]
    fn a_row_becomes_its_output_with_the_id_header_replacing_any_earlier_one() {
        let output = output_of(
            42,
            "audit".to_owned(),
            Some(b"k".to_vec()),
            b"body".to_vec(),
            vec!["a".into(), OUTBOX_ID_HEADER.into(), "a".into()],
            vec![vec![0xff], b"7".to_vec(), vec![0]],
        );
        let headers: Vec<(&str, &[u8])> = output
            .headers()
            .iter()
            .map(|header| (&*header.name, &*header.value))
            .collect();
        assert_eq!(
            headers,
            [
                ("a", &[0xff][..]),
                ("a", &[0][..]),
                (OUTBOX_ID_HEADER, b"42")
            ]
        );
        assert_eq!(output.key().map(|key| &key[..]), Some(&b"k"[..]));
    }
}
