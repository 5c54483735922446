//! `--effects-db`: each id's effect, a row in `ledger_effects`, committed
//! exactly once per consumer group through intake-postgres's markers.
//!
//! The table has no unique constraint on purpose: if a redelivered message
//! ran its effect again, the table would show the id twice. Only the
//! processed-markers stand between a broker redelivery and a duplicate row.

use std::sync::Arc;

use intake::Payload;
use intake::postgres::sqlx::{self, PgPool};
use intake::postgres::{ExactlyOnce, MarkerTable, MessageId, PoolConfig, Tx};
use tower::ServiceBuilder;
use tower::util::BoxCloneService;

use crate::BoxError;
use crate::handler::{Effects, parse_id};

/// Connections held at most (unless `LEDGER_PG_POOL` says otherwise): a
/// message holds one for its whole transaction, so this also bounds how many
/// run at once. Several consumers share the server's `max_connections`.
const DEFAULT_POOL: u32 = 16;
pub const POOL_ENV: &str = "LEDGER_PG_POOL";

const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS ledger_effects (
    grp text NOT NULL,
    source text NOT NULL,
    id bigint NOT NULL
)";

/// Connects, migrates the marker table, creates `ledger_effects`, and
/// returns the effects service for `group` on `source`.
pub async fn connect(
    url: &str,
    group: &str,
    source: &str,
    message_id: MessageId,
    max_in_flight: usize,
) -> Result<Effects, BoxError> {
    let (pool, connections) = pool(url, max_in_flight).await?;
    MarkerTable::default().migrate(&pool).await?;
    create_table(&pool).await?;

    let (group_name, source_name): (Arc<str>, Arc<str>) = (group.into(), source.into());
    let effect = move |mut tx: Tx, Payload(payload): Payload| {
        let (group, source) = (group_name.clone(), source_name.clone());
        async move {
            let id = parse_id(&payload)?;
            let id = i64::try_from(id).map_err(|_| format!("id {id} does not fit a bigint"))?;
            sqlx::query("INSERT INTO ledger_effects (grp, source, id) VALUES ($1, $2, $3)")
                .bind(&*group)
                .bind(&*source)
                .bind(id)
                .execute(&mut *tx)
                .await?;
            Ok::<(), BoxError>(())
        }
    };
    let service = ExactlyOnce::builder(pool, group)
        .message_id(message_id)
        .handler(effect)?;
    // Messages beyond the pool wait here for a connection, rather than time
    // out in the pool's acquire and count as failures.
    let service = ServiceBuilder::new()
        .concurrency_limit(connections as usize)
        .service(service);
    Ok(BoxCloneService::new(service))
}

/// A pool of `LEDGER_PG_POOL` connections (default [`DEFAULT_POOL`]), never
/// more than messages in flight, and how many that is.
pub async fn pool(url: &str, max_in_flight: usize) -> Result<(PgPool, u32), BoxError> {
    let connections = match std::env::var(POOL_ENV) {
        Ok(value) => value
            .parse()
            .map_err(|_| format!("{POOL_ENV}: `{value}` is not a number"))?,
        Err(_) => DEFAULT_POOL,
    }
    .min(u32::try_from(max_in_flight).unwrap_or(u32::MAX))
    .max(1);
    let pool = PoolConfig::new(url)?
        .max_connections(connections)
        .application_name("ledger")
        .connect()
        .await?;
    Ok((pool, connections))
}

/// `CREATE TABLE IF NOT EXISTS` races with itself when consumers start
/// together (one of them fails on the catalog's unique index); losing that
/// race is fine as long as the table is there afterwards.
async fn create_table(pool: &PgPool) -> Result<(), BoxError> {
    if let Err(error) = sqlx::query(CREATE_TABLE).execute(pool).await {
        let exists: Option<String> =
            sqlx::query_scalar("SELECT to_regclass('ledger_effects')::text")
                .fetch_one(pool)
                .await?;
        if exists.is_none() {
            return Err(error.into());
        }
    }
    Ok(())
}
