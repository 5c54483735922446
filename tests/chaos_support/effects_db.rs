//! The exactly-once effects of `ledger consume --effects-db`: each handled
//! message inserts `(grp, source, id)` into `ledger_effects` inside the
//! transaction that also records it as processed. The table has no unique
//! constraint, so a row count of exactly one per id is the exactly-once
//! guarantee itself, not the database's.

use std::collections::HashMap;
use std::time::Duration;

use intake::postgres::sqlx::{self, Connection, PgConnection};

/// The test database: `INTAKE_POSTGRES_URL`, else the local one (trust
/// auth), as in the postgres crate's tests.
pub fn url() -> String {
    std::env::var("INTAKE_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// `Err(why)` unless the database accepts a connection.
pub fn reachable() -> Result<(), String> {
    block_on(async {
        connect()
            .await?
            .close()
            .await
            .map_err(|error| error.to_string())
    })
    .map_err(|error| format!("PostgreSQL is not reachable at {}: {error}", url()))
}

/// How many rows `ledger_effects` holds per id for one group and source.
pub fn rows_per_id(group: &str, source: &str) -> Result<HashMap<String, i64>, String> {
    block_on(async {
        let mut connection = connect().await?;
        // `id::text`: whatever type the program gave the column, the ids
        // compare as the payload text "0" … "N-1".
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT id::text, count(*) FROM ledger_effects \
             WHERE grp = $1 AND source = $2 GROUP BY id",
        )
        .bind(group)
        .bind(source)
        .fetch_all(&mut connection)
        .await
        .map_err(|error| format!("reading ledger_effects: {error}"))?;
        let _ = connection.close().await;
        Ok(rows.into_iter().collect())
    })
}

/// Removes a passed scenario's effects and processed-markers, so that the
/// tables do not grow by every run of the suite. Best effort.
pub fn remove_rows(group: &str, source: &str) {
    let removed = block_on(async {
        let mut connection = connect().await?;
        for statement in [
            "DELETE FROM ledger_effects WHERE grp = $1 AND source = $2",
            "DELETE FROM intake_processed_messages WHERE consumer_group = $1 AND source = $2",
        ] {
            sqlx::query(statement)
                .bind(group)
                .bind(source)
                .execute(&mut connection)
                .await
                .map_err(|error| format!("{statement}: {error}"))?;
        }
        let _ = connection.close().await;
        Ok(())
    });
    if let Err(why) = removed {
        eprintln!("chaos: leaving the effects of {group}/{source} behind: {why}");
    }
}

async fn connect() -> Result<PgConnection, String> {
    tokio::time::timeout(Duration::from_secs(10), PgConnection::connect(&url()))
        .await
        .map_err(|_| "no connection within 10 s".to_owned())?
        .map_err(|error| error.to_string())
}

/// These checks are a few queries; a current-thread runtime per call keeps
/// the rest of the suite free of async.
fn block_on<T>(future: impl Future<Output = Result<T, String>>) -> Result<T, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| format!("tokio runtime: {error}"))?
        .block_on(future)
}

/// What the table says about ids `0..produced`.
#[derive(Debug)]
pub struct EffectsStats {
    /// All rows of the group and source.
    pub rows: i64,
    /// Produced ids without a row, first few.
    pub missing: Vec<u64>,
    pub missing_count: u64,
    /// Ids with more than one row (the exactly-once failures), first few.
    pub repeated: Vec<(String, i64)>,
    pub repeated_count: u64,
    /// Rows whose id was never produced.
    pub foreign: u64,
}

impl EffectsStats {
    pub fn from_rows(rows_per_id: &HashMap<String, i64>, produced: u64) -> Self {
        let mut stats = Self {
            rows: rows_per_id.values().sum(),
            missing: Vec::new(),
            missing_count: 0,
            repeated: Vec::new(),
            repeated_count: 0,
            foreign: 0,
        };
        for id in 0..produced {
            if !rows_per_id.contains_key(&id.to_string()) {
                stats.missing_count += 1;
                if stats.missing.len() < 20 {
                    stats.missing.push(id);
                }
            }
        }
        for (id, &count) in rows_per_id {
            if !id.parse::<u64>().is_ok_and(|id| id < produced) {
                stats.foreign += 1;
            }
            if count > 1 {
                stats.repeated_count += 1;
                if stats.repeated.len() < 20 {
                    stats.repeated.push((id.clone(), count));
                }
            }
        }
        stats
    }

    /// Every produced id exactly once, nothing else.
    pub fn exactly_once(&self) -> bool {
        self.missing_count == 0 && self.repeated_count == 0 && self.foreign == 0
    }
}
