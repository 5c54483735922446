//! What the PostgreSQL tests share: a pool to the test database (or a
//! printed reason to skip), unique table names and messages.

#![allow(dead_code)]

pub mod crashes;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use intake_core::{Headers, Message, Metadata, Position};
use intake_postgres::{ExactlyOnce, ExactlyOnceBuilder, MarkerTable, PoolConfig};
use sqlx::{AssertSqlSafe, PgConnection, PgPool};

/// The test database: `INTAKE_POSTGRES_URL`, or the local server with trust
/// auth as user `postgres` (then `root`).
fn candidate_urls() -> Vec<String> {
    match std::env::var("INTAKE_POSTGRES_URL") {
        Ok(url) => vec![url],
        Err(_) => vec![
            "postgres://postgres@127.0.0.1:5432/test".to_owned(),
            "postgres://root@127.0.0.1:5432/test".to_owned(),
        ],
    }
}

/// A pool of `max_connections` to the test database, or `None` after
/// printing why the test is skipped. With `INTAKE_REQUIRE_BROKERS=1` a
/// missing database fails the test instead.
pub async fn database(test: &str, max_connections: u32) -> Option<PgPool> {
    let mut failures = Vec::new();
    for url in candidate_urls() {
        let config = PoolConfig::new(&url)
            .expect("the test database URL is a postgres:// URL")
            .max_connections(max_connections);
        match config.connect().await {
            Ok(pool) => return Some(pool),
            Err(error) => failures.push(error.to_string()),
        }
    }
    let why = format!("no PostgreSQL: {}", failures.join("; "));
    intake_core::backend::testkit::skip_or_fail(test, &why);
    None
}

/// A test's database: a pool, a fresh marker table and a fresh effects
/// table.
pub struct Fixture {
    pub pool: PgPool,
    pub markers: MarkerTable,
    pub effects: String,
}

impl Fixture {
    /// The fixture, or `None` after printing why the test is skipped.
    pub async fn new(test: &str) -> Option<Self> {
        let pool = database(test, 4).await?;
        Some(Self {
            markers: marker_table(&pool).await,
            effects: effects_table(&pool).await,
            pool,
        })
    }

    /// Exactly-once settings for group `billing` on this marker table.
    pub fn billing(&self) -> ExactlyOnceBuilder {
        ExactlyOnce::builder(self.pool.clone(), "billing").table(self.markers.clone())
    }

    /// Markers of group `billing`.
    pub async fn markers(&self) -> u64 {
        self.markers
            .count(&self.pool, "billing")
            .await
            .expect("markers can be counted")
    }

    /// Rows in the effects table.
    pub async fn effects(&self) -> i64 {
        rows(&self.pool, &self.effects).await
    }

    /// Inserts effect `id` outside any handler.
    pub async fn insert_effect(&self, id: i64) {
        let mut connection = self.pool.acquire().await.expect("a connection");
        insert_effect(&mut connection, &self.effects, id)
            .await
            .expect("the effect is inserted");
    }
}

/// Inserts effect `id` into `table` on `connection` (a handler's `Tx`).
pub async fn insert_effect(
    connection: &mut PgConnection,
    table: &str,
    id: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (id) VALUES ($1)"
    )))
    .bind(id)
    .execute(connection)
    .await
    .map(drop)
}

/// A name no other test (or earlier run) uses: `prefix_<pid>_<time>_<n>`.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.subsec_nanos());
    format!(
        "{prefix}_{}_{nanos}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A fresh, migrated marker table.
pub async fn marker_table(pool: &PgPool) -> MarkerTable {
    let table = MarkerTable::new(&unique("markers")).expect("a valid table name");
    table
        .migrate(pool)
        .await
        .expect("the marker table is created");
    table
}

/// A fresh effects table: `id bigint PRIMARY KEY`, one row per effect.
pub async fn effects_table(pool: &PgPool) -> String {
    let name = unique("effects");
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {name} (id bigint PRIMARY KEY, note text)"
    )))
    .execute(pool)
    .await
    .expect("the effects table is created");
    name
}

/// Rows in `table`.
pub async fn rows(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .expect("the table can be counted")
}

/// The message at `offset` of `source`/`partition` whose payload is `id`.
pub fn message(source: &str, partition: u32, offset: i64, id: i64) -> Message {
    Message::new(
        Bytes::from(id.to_string()),
        Metadata::new(source.into(), partition, Position::Offset(offset)),
    )
}

/// A message carrying `message-id: <id>` at a delivery tag (AMQP-like).
pub fn tagged_message(source: &str, tag: u64, id: &str) -> Message {
    let headers: Headers = [("message-id", id.to_owned())].into_iter().collect();
    Message::new(
        Bytes::from(id.to_owned()),
        Metadata::new(source.into(), 0, Position::Tag(tag)),
    )
    .with_headers(headers)
}

/// The payload of `message` as the id it carries.
pub fn id_of(payload: &[u8]) -> Result<i64, intake_core::HandlerError> {
    std::str::from_utf8(payload)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| intake_core::HandlerError::permanent("payload is not an id"))
}

/// A fresh table of effects without a uniqueness constraint on `id`, so a
/// message processed twice would show as two rows rather than a failure.
pub async fn ledger_table(pool: &PgPool) -> String {
    let name = unique("ledger");
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {name} (entry bigserial PRIMARY KEY, id bigint NOT NULL)"
    )))
    .execute(pool)
    .await
    .expect("the ledger table is created");
    name
}

/// `(rows, distinct ids, smallest id, largest id)` of a ledger table.
pub async fn ledger_summary(pool: &PgPool, table: &str) -> (i64, i64, Option<i64>, Option<i64>) {
    sqlx::query_as(AssertSqlSafe(format!(
        "SELECT count(*), count(DISTINCT id), min(id), max(id) FROM {table}"
    )))
    .fetch_one(pool)
    .await
    .expect("the ledger can be summarised")
}
