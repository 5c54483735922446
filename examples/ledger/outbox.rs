//! `relay --exactly-once` off Kafka: each input's forward is written to a
//! PostgreSQL outbox in the exactly-once transaction that marks the input
//! processed, and an outbox relay in the same process publishes the rows.
//!
//! The rows are exactly once: a redelivered input finds its marker and adds
//! none. Publishing is at least once: a relay killed between the broker's
//! confirmation and its `COMMIT` publishes those rows again, each copy with
//! the row's id in `intake.outbox-id`, so a reader drops the repeats.

use std::time::{Duration, Instant};

use intake::postgres::sqlx::PgPool;
use intake::postgres::{
    ExactlyOnce, MarkerTable, MessageId, OutboxRelay, OutboxRelayHandle, OutboxTable,
    RelaySettings, Tx,
};
use intake::publish::{Output, Publisher};
use intake::{HandlerError, Message};
use tower::ServiceBuilder;
use tower::util::BoxCloneService;

use crate::handler::parse_id;
use crate::{BoxError, effects};

/// Longest an idle relay waits for the outbox to empty before it exits: the
/// rows left are published by the next relay of the same destination.
const DRAIN_PATIENCE: Duration = Duration::from_secs(30);

/// The outbox of one destination and the relay that empties it.
pub struct Outbox {
    pool: PgPool,
    table: OutboxTable,
    relay: OutboxRelayHandle,
}

/// Connects to `url`, creates the marker and outbox tables, starts the
/// outbox relay through `publisher`, and returns the handler that writes
/// each input's forward to `destination` into the outbox.
pub async fn connect<P>(
    url: &str,
    group: &str,
    destination: String,
    message_id: MessageId,
    max_in_flight: usize,
    publisher: P,
) -> Result<(BoxCloneService<Message, (), HandlerError>, Outbox), BoxError>
where
    P: Publisher + Sync + 'static,
{
    let (pool, connections) = effects::pool(url, max_in_flight).await?;
    MarkerTable::default().migrate(&pool).await?;
    let table = OutboxTable::new(&table_name(&destination))?;
    table.migrate(&pool).await?;

    let writes = table.clone();
    let forward = move |mut tx: Tx, message: Message| {
        let (writes, destination) = (writes.clone(), destination.clone());
        async move {
            parse_id(message.payload())?;
            writes
                .write(&mut tx, Output::forward(&message, destination))
                .await?;
            Ok::<(), BoxError>(())
        }
    };
    let service = ExactlyOnce::builder(pool.clone(), group)
        .message_id(message_id)
        .handler(forward)?;
    // As for the effects: messages beyond the pool wait for a connection
    // here instead of timing out in the pool.
    let service = ServiceBuilder::new()
        .concurrency_limit(connections as usize)
        .service(service);
    let relay = OutboxRelay::spawn(
        pool.clone(),
        table.clone(),
        publisher,
        RelaySettings {
            poll_interval: Duration::from_millis(20),
            ..RelaySettings::default()
        },
    )?;
    let outbox = Outbox { pool, table, relay };
    Ok((BoxCloneService::new(service), outbox))
}

impl Outbox {
    /// Waits (bounded) until the relay has published every row, then stops
    /// it; returns the rows it published in this run.
    pub async fn drain(self) -> Result<u64, BoxError> {
        let since = Instant::now();
        loop {
            let left = self.table.count(&self.pool).await?;
            if left == 0 {
                break;
            }
            if since.elapsed() > DRAIN_PATIENCE {
                tracing::warn!(
                    left,
                    "the outbox is not empty; the next relay publishes the rest"
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let published = self.relay.published();
        self.relay.stop().await;
        Ok(published)
    }
}

/// One outbox table per destination, so that relays to different
/// destinations (on different brokers, too) never publish each other's
/// rows: `ledger_outbox_` and the destination's letters and digits, with a
/// hash of the whole name against collisions and overlong names.
fn table_name(destination: &str) -> String {
    let readable: String = destination
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(24)
        .collect();
    // FNV-1a: stable across runs and processes, unlike std's hasher.
    let hash = destination
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("ledger_outbox_{readable}_{:08x}", hash as u32)
}
