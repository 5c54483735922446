//! Messages per second through the consumer runtime on the memory broker,
//! into PostgreSQL: the exactly-once forms against plain handlers that do
//! the same insert without a marker.
//!
//! `cargo bench -p intake-postgres --bench exactly_once [-- --messages N --rounds R --parallelism P]`
//!
//! Variants, interleaved round by round so that drift (autovacuum, the
//! checkpointer, other load on the machine) hits each alike; each reports
//! its median round:
//! - batch of 1, `plain`: one auto-committed `INSERT` per message;
//! - batch of 1, `exactly-once`: `BEGIN`, marker, the same `INSERT`, check,
//!   `COMMIT`;
//! - batch of 100, `plain`: the batch layer hands 100 messages to a handler
//!   that inserts them with one auto-committed `INSERT … SELECT FROM UNNEST`;
//! - batch of 100, `exactly-once`: the batch form: `BEGIN`, one marker
//!   statement for the batch, the same `INSERT`, check, `COMMIT`.
//!
//! Needs PostgreSQL (`INTAKE_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use intake_core::batch::{BatchLayer, BatchSettings};
use intake_core::consumer::{Consumer, Ordering};
use intake_core::memory::{MemoryBroker, Record};
use intake_core::{HandlerError, Message, Payload};
use intake_postgres::{ExactlyOnce, MarkerTable, PoolConfig, Tx, handler_error};
use sqlx::{AssertSqlSafe, PgPool};
use tokio_util::sync::CancellationToken;
use tower::{Layer, Service, ServiceExt};

const PARTITIONS: u32 = 8;
/// Deliveries the runtime holds: enough to fill every running batch of 100
/// and the next ones.
/// Pool bound: per-message handlers beyond it wait for a connection.
const CONNECTIONS: u32 = 32;
const BATCH: usize = 100;

struct Args {
    messages: u64,
    rounds: usize,
    /// Batches handled at once.
    parallelism: usize,
}

fn args() -> Args {
    let mut args = Args {
        messages: 20_000,
        rounds: 5,
        parallelism: 4,
    };
    let words: Vec<String> = std::env::args().skip(1).collect();
    for pair in words.windows(2) {
        let value = pair[1].parse().ok();
        match (pair[0].as_str(), value) {
            ("--messages", Some(value)) => args.messages = value,
            ("--rounds", Some(value)) => args.rounds = value as usize,
            ("--parallelism", Some(value)) => args.parallelism = value as usize,
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
        .max_connections(CONNECTIONS)
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

    let in_flight = 2 * BATCH * args.parallelism;
    println!(
        "{} messages a round, {PARTITIONS} partitions, {in_flight} in flight, \
         {CONNECTIONS} connections, batches of {BATCH} ({} at a time), {} rounds",
        args.messages, args.parallelism, args.rounds
    );
    let batches = || batches(args.parallelism);
    let names = [
        "batch of 1, plain",
        "batch of 1, exactly-once",
        "batch of 100, plain",
        "batch of 100, exactly-once",
    ];
    let mut rates: [Vec<f64>; 4] = Default::default();
    for round in 0..args.rounds {
        let group = format!("bench-{round}");
        for (variant, rates) in rates.iter_mut().enumerate() {
            reset(&pool, &markers).await;
            let rate = match variant {
                0 => measure(args.messages, in_flight, plain(&pool)).await,
                1 => {
                    measure(
                        args.messages,
                        in_flight,
                        exactly_once(&pool, &markers, &group),
                    )
                    .await
                }
                2 => {
                    measure(
                        args.messages,
                        in_flight,
                        batches().layer(plain_batch(&pool)),
                    )
                    .await
                }
                _ => {
                    let handler = exactly_once_batch(&pool, &markers, &group);
                    measure(args.messages, in_flight, batches().layer(handler)).await
                }
            };
            rates.push(rate);
        }
        println!(
            "round {round}: {}",
            names
                .iter()
                .zip(&rates)
                .map(|(name, rates)| format!("{name} {:.0}/s", rates[round]))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let medians: Vec<f64> = rates.into_iter().map(median).collect();
    for (name, rate) in names.iter().zip(&medians) {
        println!("{name}: {rate:.0} messages/s (median)");
    }
    println!(
        "exactly-once / plain: batch of 1 {:.2}, batch of 100 {:.2}",
        medians[1] / medians[0],
        medians[3] / medians[2]
    );
}

fn batches(parallelism: usize) -> BatchLayer {
    BatchLayer::new(BatchSettings {
        max_size: BATCH,
        max_wait: Duration::from_millis(5),
        parallelism,
    })
    .expect("valid batch settings")
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
const INSERT_MANY: &str =
    "INSERT INTO bench_effects (id, body) SELECT * FROM UNNEST($1::int8[], $2::bytea[])";

/// The ids and bodies of a batch, as `INSERT_MANY` binds them.
fn columns(payloads: &[&[u8]]) -> Result<(Vec<i64>, Vec<Vec<u8>>), HandlerError> {
    let ids = payloads
        .iter()
        .map(|payload| id_of(payload))
        .collect::<Result<_, _>>()?;
    let bodies = payloads.iter().map(|payload| payload.to_vec()).collect();
    Ok((ids, bodies))
}

fn plain(
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

fn exactly_once(
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

/// A batch handler the batch layer accepts.
trait BatchHandler:
    Service<
        Vec<Message>,
        Response = Vec<Result<(), HandlerError>>,
        Error = Infallible,
        Future: Send,
    > + Send
    + 'static
{
}

impl<S> BatchHandler for S where
    S: Service<
            Vec<Message>,
            Response = Vec<Result<(), HandlerError>>,
            Error = Infallible,
            Future: Send,
        > + Send
        + 'static
{
}

fn plain_batch(pool: &PgPool) -> impl BatchHandler {
    let pool = pool.clone();
    tower::service_fn(move |batch: Vec<Message>| {
        let pool = pool.clone();
        async move {
            let payloads: Vec<&[u8]> = batch.iter().map(|message| &message.payload()[..]).collect();
            let outcome = match columns(&payloads) {
                Ok((ids, bodies)) => sqlx::query(INSERT_MANY)
                    .bind(&ids)
                    .bind(&bodies)
                    .execute(&pool)
                    .await
                    .map(drop)
                    .map_err(handler_error),
                Err(error) => Err(error),
            };
            // One outcome per message; a failed statement fails them all.
            let outcomes = match outcome {
                Ok(()) => batch.iter().map(|_| Ok(())).collect(),
                Err(error) => {
                    let text = error.to_string();
                    batch
                        .iter()
                        .map(|_| Err(HandlerError::retryable(text.clone())))
                        .collect()
                }
            };
            Ok::<_, Infallible>(outcomes)
        }
    })
}

fn exactly_once_batch(pool: &PgPool, markers: &MarkerTable, group: &str) -> impl BatchHandler {
    ExactlyOnce::builder(pool.clone(), group)
        .table(markers.clone())
        .batch_handler(async |mut tx: Tx, payloads: Vec<Payload>| {
            let payloads: Vec<&[u8]> = payloads
                .iter()
                .map(|Payload(payload)| &payload[..])
                .collect();
            let (ids, bodies) = columns(&payloads)?;
            sqlx::query(INSERT_MANY)
                .bind(&ids)
                .bind(&bodies)
                .execute(&mut *tx)
                .await?;
            Ok::<_, intake_core::BoxError>(())
        })
        .expect("valid settings")
}

/// Messages per second for `messages` messages through one consumer.
async fn measure<H>(messages: u64, in_flight: usize, handler: H) -> f64
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
        .max_in_flight(in_flight)
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
