//! Messages per second through the consumer runtime on the memory broker,
//! into PostgreSQL: the exactly-once handler against a plain handler that
//! does the same insert without a marker.
//!
//! `cargo bench -p intake-postgres --bench exactly_once [-- --messages N --rounds R]`
//!
//! Variants, interleaved round by round so that drift (autovacuum, the
//! checkpointer, other load) hits each alike; each reports the median round:
//! - `plain`: one auto-committed `INSERT` per message;
//! - `exactly-once`: `BEGIN`, marker, the same `INSERT`, `COMMIT`.
//!
//! Needs PostgreSQL (`INTAKE_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use intake_core::consumer::{Consumer, Ordering};
use intake_core::memory::{MemoryBroker, Record};
use intake_core::{HandlerError, Message, Payload};
use intake_postgres::{ExactlyOnce, MarkerTable, PoolConfig, Tx, handler_error};
use sqlx::{AssertSqlSafe, PgPool};
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceExt};

const PARTITIONS: u32 = 8;
const IN_FLIGHT: usize = 32;

struct Args {
    messages: u64,
    rounds: usize,
}

fn args() -> Args {
    let mut args = Args {
        messages: 20_000,
        rounds: 5,
    };
    let words: Vec<String> = std::env::args().skip(1).collect();
    for pair in words.windows(2) {
        let value = pair[1].parse().ok();
        match (pair[0].as_str(), value) {
            ("--messages", Some(value)) => args.messages = value,
            ("--rounds", Some(value)) => args.rounds = value as usize,
            // `cargo bench` passes `--bench`.
            _ => {}
        }
    }
    args
}

fn main() {
    let args = args();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    runtime.block_on(run(args));
}

async fn run(args: Args) {
    let url = std::env::var("INTAKE_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let pool = match PoolConfig::new(&url)
        .expect("a postgres:// URL")
        .max_connections(IN_FLIGHT as u32)
        .connect()
        .await
    {
        Ok(pool) => pool,
        Err(error) => {
            println!("skipped: no PostgreSQL: {error}");
            return;
        }
    };
    let markers = MarkerTable::new("bench_intake_processed").expect("a valid name");
    markers.migrate(&pool).await.expect("the marker table");
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS bench_effects; \
         CREATE TABLE bench_effects (id bigint NOT NULL, body bytea NOT NULL)",
    )
    .execute(&pool)
    .await
    .expect("the effects table");

    println!(
        "{} messages a round, {PARTITIONS} partitions, {IN_FLIGHT} in flight, \
         {IN_FLIGHT} connections, {} rounds",
        args.messages, args.rounds
    );
    let mut plain = Vec::new();
    let mut exactly_once = Vec::new();
    for round in 0..args.rounds {
        reset(&pool, &markers).await;
        plain.push(measure(args.messages, plain_handler(&pool)).await);
        reset(&pool, &markers).await;
        let group = format!("bench-{round}");
        exactly_once
            .push(measure(args.messages, exactly_once_handler(&pool, &markers, &group)).await);
        println!(
            "round {round}: plain {:.0}/s, exactly-once {:.0}/s",
            plain[round], exactly_once[round]
        );
    }
    let (plain, exactly_once) = (median(plain), median(exactly_once));
    println!("plain (1 auto-committed INSERT a message): {plain:.0} messages/s");
    println!("exactly-once (BEGIN, marker, INSERT, COMMIT): {exactly_once:.0} messages/s");
    println!("exactly-once / plain: {:.2}", exactly_once / plain);
}

async fn reset(pool: &PgPool, markers: &MarkerTable) {
    sqlx::raw_sql(AssertSqlSafe(format!(
        "TRUNCATE bench_effects; TRUNCATE {}",
        markers.name()
    )))
    .execute(pool)
    .await
    .expect("truncate");
}

/// The id a message carries, as its payload.
fn id_of(payload: &[u8]) -> Result<i64, HandlerError> {
    std::str::from_utf8(payload)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| HandlerError::permanent("not an id"))
}

const INSERT: &str = "INSERT INTO bench_effects (id, body) VALUES ($1, $2)";

fn plain_handler(
    pool: &PgPool,
) -> impl Service<Message, Response = (), Error = HandlerError, Future: Send> + Send + 'static {
    let pool = pool.clone();
    tower::service_fn(move |message: Message| {
        let pool = pool.clone();
        async move {
            let id = id_of(message.payload())?;
            sqlx::query(INSERT)
                .bind(id)
                .bind(message.payload().as_ref())
                .execute(&pool)
                .await
                .map_err(handler_error)?;
            Ok(())
        }
    })
}

fn exactly_once_handler(
    pool: &PgPool,
    markers: &MarkerTable,
    group: &str,
) -> impl Service<Message, Response = (), Error = HandlerError, Future: Send> + Send + 'static {
    ExactlyOnce::builder(pool.clone(), group)
        .table(markers.clone())
        .handler(async |mut tx: Tx, Payload(payload): Payload| {
            let id = id_of(&payload)?;
            sqlx::query(INSERT)
                .bind(id)
                .bind(payload.as_ref())
                .execute(&mut *tx)
                .await?;
            Ok::<_, intake_core::BoxError>(())
        })
        .expect("valid settings")
}

/// Messages per second for `messages` messages through one consumer.
async fn measure<H>(messages: u64, handler: H) -> f64
where
    H: Service<Message, Response = (), Error = HandlerError, Future: Send> + Send + 'static,
{
    let broker = MemoryBroker::new();
    broker
        .create_topic("orders", PARTITIONS)
        .expect("create the topic");
    broker
        .send_batch(
            "orders",
            (0..messages).map(|id| {
                Record::new(id.to_string()).to_partition((id % u64::from(PARTITIONS)) as u32)
            }),
        )
        .expect("prefill");
    let (source, acker) = broker.consumer("orders", "bench").expect("join");

    let done = CancellationToken::new();
    let finished = Arc::new(AtomicU64::new(0));
    let counted = {
        let (done, finished) = (done.clone(), Arc::clone(&finished));
        handler.map_result(move |result| {
            if result.is_ok() && finished.fetch_add(1, AtomicOrdering::Relaxed) + 1 == messages {
                done.cancel();
            }
            result
        })
    };
    let consumer = Consumer::builder()
        .max_in_flight(IN_FLIGHT)
        .ordering(Ordering::Unordered)
        .shutdown_deadline(Duration::from_secs(60))
        .build(source, acker, counted)
        .expect("valid settings");
    let started = Instant::now();
    let report = consumer.run(done).await.expect("the run succeeds");
    let elapsed = started.elapsed();
    assert_eq!(
        finished.load(AtomicOrdering::Relaxed),
        messages,
        "every message succeeded ({report:?})"
    );
    messages as f64 / elapsed.as_secs_f64()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
