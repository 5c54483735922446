//! [`MarkerTable`]: the table of processed-markers, its migration and the
//! statements that use it.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use intake_core::ConfigError;
use sqlx::PgPool;
use sqlx::Row;
use sqlx::postgres::PgConnection;
use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use crate::error::Error;
use crate::message_id::MarkerKey;
use crate::tx::TransactionId;

/// The table that records which messages a consumer group has processed.
///
/// One row per processed message: `(consumer_group, source, partition,
/// message_id)` is the primary key, `processed_at` (the database's clock at
/// the start of the transaction) drives pruning. `message_id` is the broker
/// position in the broker's terms (`42`, `1700000000000-0`) or the value of
/// the configured id header, with `partition` -1.
///
/// Create it with [`migrate`](Self::migrate) at start-up (idempotent, safe
/// to run from many processes at once), or put
/// [`migration_sql`](Self::migration_sql) into your own migrations:
///
/// ```text
/// CREATE TABLE IF NOT EXISTS "intake_processed_messages" (
///     consumer_group text COLLATE "C" NOT NULL,
///     source text COLLATE "C" NOT NULL,
///     partition bigint NOT NULL,
///     message_id text COLLATE "C" NOT NULL,
///     processed_at timestamptz NOT NULL DEFAULT now(),
///     PRIMARY KEY (consumer_group, source, partition, message_id)
/// );
/// CREATE INDEX IF NOT EXISTS "intake_processed_messages_processed_at_idx"
///     ON "intake_processed_messages" USING brin (processed_at);
/// ```
///
/// The key columns compare bytes (`COLLATE "C"`): an id is equal only to
/// itself, and the primary key never pays for a language's sort order.
/// The `processed_at` index is a BRIN index: markers are appended in about
/// the order of their timestamps, so a BRIN index finds the old ones for
/// pruning while costing next to nothing per insert (a B-tree would be a
/// second index to update in every message's transaction).
#[derive(Clone)]
pub struct MarkerTable {
    inner: Arc<Inner>,
}

struct Inner {
    /// As given: `table` or `schema.table`.
    name: String,
    /// Quoted for SQL: `"table"` or `"schema"."table"`.
    quoted: String,
    index: String,
    insert_one: SqlStr,
    insert_many: SqlStr,
    prune: SqlStr,
    count: SqlStr,
}

/// Longest table name accepted, so that the index name derived from it stays
/// within PostgreSQL's 63-byte identifiers.
const MAX_TABLE_NAME_LEN: usize = 63 - "_processed_at_idx".len();

impl MarkerTable {
    /// The default table name.
    pub const DEFAULT_NAME: &'static str = "intake_processed_messages";

    /// The table `name`: `table` or `schema.table`, each part letters, digits
    /// and underscores, not starting with a digit (case is kept: the name is
    /// quoted in SQL).
    ///
    /// # Errors
    ///
    /// A name that is empty, too long or not a plain identifier.
    pub fn new(name: &str) -> Result<Self, ConfigError> {
        let (quoted, table) = quoted_table_name("marker_table", name, MAX_TABLE_NAME_LEN)?;
        let index = format!("\"{table}_processed_at_idx\"");
        let sql = |text: String| AssertSqlSafe(text).into_sql_str();
        Ok(Self {
            inner: Arc::new(Inner {
                // Returns the transaction's id if the marker is new, nothing
                // if the message was processed before.
                insert_one: sql(format!(
                    "INSERT INTO {quoted} (consumer_group, source, partition, message_id) \
                     VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING \
                     RETURNING txid_current()"
                )),
                // The keys of the rows that were new, with the transaction's
                // id: a conflicting row (already processed) is not returned.
                insert_many: sql(format!(
                    "INSERT INTO {quoted} (consumer_group, source, partition, message_id) \
                     SELECT $1, * FROM UNNEST($2::text[], $3::int8[], $4::text[]) \
                     ON CONFLICT DO NOTHING \
                     RETURNING source, partition, message_id, txid_current()"
                )),
                // Deletes in bounded batches, so that pruning a large backlog
                // never holds many row locks or a long transaction.
                prune: sql(format!(
                    "DELETE FROM {quoted} WHERE ctid = ANY(ARRAY(\
                         SELECT ctid FROM {quoted} \
                         WHERE processed_at < now() - make_interval(secs => $1::float8) \
                         LIMIT $2))"
                )),
                count: sql(format!(
                    "SELECT count(*) FROM {quoted} WHERE consumer_group = $1"
                )),
                name: name.to_owned(),
                quoted,
                index,
            }),
        })
    }

    /// The name as given.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The SQL that creates the table and its index, idempotently
    /// (`IF NOT EXISTS`): for your own migration tool.
    pub fn migration_sql(&self) -> String {
        let Inner { quoted, index, .. } = &*self.inner;
        format!(
            "CREATE TABLE IF NOT EXISTS {quoted} (\n    \
                 consumer_group text COLLATE \"C\" NOT NULL,\n    \
                 source text COLLATE \"C\" NOT NULL,\n    \
                 partition bigint NOT NULL,\n    \
                 message_id text COLLATE \"C\" NOT NULL,\n    \
                 processed_at timestamptz NOT NULL DEFAULT now(),\n    \
                 PRIMARY KEY (consumer_group, source, partition, message_id)\n\
             );\n\
             CREATE INDEX IF NOT EXISTS {index}\n    ON {quoted} USING brin (processed_at);\n"
        )
    }

    /// Creates the table and its index if they do not exist.
    ///
    /// Runs under a transaction-scoped advisory lock, so processes that start
    /// together do not race on `CREATE TABLE IF NOT EXISTS` (which can fail
    /// with a unique violation when two run at once).
    ///
    /// # Errors
    ///
    /// The database's error, for instance a missing `CREATE` privilege.
    pub async fn migrate(&self, pool: &PgPool) -> Result<(), Error> {
        migrate_under_lock(pool, &self.inner.name, self.migration_sql())
            .await
            .map_err(|source| Error::Migrate {
                table: self.inner.name.clone(),
                source,
            })
    }

    /// Deletes up to `limit` markers older than `retention` by the database's
    /// clock, and returns how many it deleted. See [`Pruner`](crate::Pruner)
    /// for the background task that calls it.
    ///
    /// # Errors
    ///
    /// The database's error.
    pub async fn prune(
        &self,
        pool: &PgPool,
        retention: Duration,
        limit: u32,
    ) -> Result<u64, sqlx::Error> {
        let deleted = sqlx::query(self.inner.prune.clone())
            .bind(retention.as_secs_f64())
            .bind(i64::from(limit))
            .execute(pool)
            .await?;
        Ok(deleted.rows_affected())
    }

    /// How many markers `group` has: for tests and reports.
    ///
    /// # Errors
    ///
    /// The database's error.
    pub async fn count(&self, pool: &PgPool, group: &str) -> Result<u64, sqlx::Error> {
        let count: i64 = sqlx::query_scalar(self.inner.count.clone())
            .bind(group)
            .fetch_one(pool)
            .await?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// Inserts one marker in `connection`'s transaction: the transaction's
    /// id if the marker is new, `None` if the message was already processed.
    pub(crate) async fn insert_one(
        &self,
        connection: &mut PgConnection,
        group: &str,
        key: &MarkerKey,
    ) -> Result<Option<TransactionId>, sqlx::Error> {
        let inserted: Option<i64> = sqlx::query_scalar(self.inner.insert_one.clone())
            .bind(group)
            .bind(&*key.source)
            .bind(key.partition)
            .bind(key.id.as_str())
            .fetch_optional(connection)
            .await?;
        Ok(inserted.map(TransactionId))
    }

    /// Inserts the markers of `keys` in one statement: the indexes (into
    /// `keys`) of those that were new, and the transaction's id if any was.
    /// `keys` must be distinct.
    pub(crate) async fn insert_many(
        &self,
        connection: &mut PgConnection,
        group: &str,
        keys: &[&MarkerKey],
    ) -> Result<(Vec<usize>, Option<TransactionId>), sqlx::Error> {
        let sources: Vec<&str> = keys.iter().map(|key| &*key.source).collect();
        let partitions: Vec<i64> = keys.iter().map(|key| key.partition).collect();
        let ids: Vec<&str> = keys.iter().map(|key| key.id.as_str()).collect();
        let inserted = sqlx::query(self.inner.insert_many.clone())
            .bind(group)
            .bind(&sources)
            .bind(&partitions)
            .bind(&ids)
            .fetch_all(connection)
            .await?;
        // Matching returned keys back costs a map per batch; asking the
        // server for input positions instead (a join with the input) costs it
        // more than the insert itself.
        let index: HashMap<(&str, i64, &str), usize> = keys
            .iter()
            .enumerate()
            .map(|(at, key)| ((&*key.source, key.partition, key.id.as_str()), at))
            .collect();
        let mut new = Vec::with_capacity(inserted.len());
        let mut transaction = None;
        for row in &inserted {
            let key = (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
            transaction = Some(TransactionId(row.try_get(3)?));
            if let Some(&at) = index.get(&key) {
                new.push(at);
            }
        }
        Ok((new, transaction))
    }
}

impl Default for MarkerTable {
    fn default() -> Self {
        Self::new(Self::DEFAULT_NAME).expect("the default marker table name is valid")
    }
}

impl fmt::Debug for MarkerTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("MarkerTable")
            .field(&self.inner.name)
            .finish()
    }
}

/// `name` (`table` or `schema.table`) checked and quoted for SQL, and its
/// table part: each part letters, digits and underscores, not starting with
/// a digit, the table at most `max_len` bytes (what leaves room for the
/// names derived from it). `setting` names the setting in the error.
pub(crate) fn quoted_table_name<'a>(
    setting: &'static str,
    name: &'a str,
    max_len: usize,
) -> Result<(String, &'a str), ConfigError> {
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() > 2 || parts.iter().any(|part| !is_identifier(part)) {
        return Err(ConfigError::new(
            setting,
            format!(
                "`{name}` is not `table` or `schema.table` made of letters, digits and \
                 underscores (not starting with a digit)"
            ),
        ));
    }
    let table = parts[parts.len() - 1];
    if table.len() > max_len {
        return Err(ConfigError::new(
            setting,
            format!("`{table}` is longer than {max_len} bytes"),
        ));
    }
    let quoted = parts
        .iter()
        .map(|part| format!("\"{part}\""))
        .collect::<Vec<_>>()
        .join(".");
    Ok((quoted, table))
}

fn is_identifier(part: &str) -> bool {
    let mut chars = part.chars();
    chars
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Runs `sql` (a table's migration) in one transaction under an advisory
/// lock named after `table`, so that processes starting together do not
/// race; the marker table and the outbox migrate alike.
pub(crate) async fn migrate_under_lock(
    pool: &PgPool,
    table: &str,
    sql: String,
) -> Result<(), sqlx::Error> {
    let mut transaction = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('intake-postgres migrate ' || $1))")
        .bind(table)
        .execute(&mut *transaction)
        .await?;
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(&mut *transaction)
        .await?;
    transaction.commit().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_schema_qualified_names_are_accepted_and_quoted() {
        let table = MarkerTable::new("billing.Processed_1").unwrap();
        let sql = table.migration_sql();
        assert!(
            sql.contains("CREATE TABLE IF NOT EXISTS \"billing\".\"Processed_1\""),
            "{sql}"
        );
        assert!(sql.contains("\"Processed_1_processed_at_idx\""), "{sql}");
    }

    #[test]
    fn names_that_would_need_escaping_are_refused() {
        for name in ["", "a.b.c", "1abc", "drop table x", "a\"b", "a;b", "tab-le"] {
            let error = MarkerTable::new(name).unwrap_err();
            assert_eq!(error.setting, "marker_table", "{name}");
        }
        assert!(MarkerTable::new(&"t".repeat(MAX_TABLE_NAME_LEN + 1)).is_err());
    }

    #[test]
    fn the_default_table_has_the_documented_migration() {
        let sql = MarkerTable::default().migration_sql();
        assert!(sql.contains("PRIMARY KEY (consumer_group, source, partition, message_id)"));
        assert!(sql.contains("ON \"intake_processed_messages\" USING brin (processed_at)"));
    }
}
