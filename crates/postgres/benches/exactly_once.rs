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
//!   statement for the batch, the same `INSERT`, check, `COMMIT`;
//! - `direct publish`: no database; each message is forwarded to a second
//!   memory broker through `PublishLayer` (acknowledged once confirmed);
//! - `exactly-once + outbox`: the batch-of-1 exactly-once transaction writes
//!   the same forward into an outbox table instead of the effects table, and
//!   an `OutboxRelay` publishes the rows to the second broker; the round
//!   ends when the relay has published every one.
//!
//! The effects table is `bench_effects (id bigint PRIMARY KEY, body bytea)`
//! and the body is the message's id in decimal.
//!
//! Besides messages per second, each round reports CPU per message: this
//! process's (`/proc/self/stat`) and that of the PostgreSQL backends serving
//! its pool (found by their `application_name`). Where other work shares the
//! machine, CPU per message moves far less than throughput does.
//!
//! Needs PostgreSQL (`INTAKE_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`) on this machine (the backends'
//! CPU is read from `/proc`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use intake_core::batch::{BatchLayer, BatchSettings};
use intake_core::consumer::{Consumer, DeliveryOrder};
use intake_core::memory::{MemoryBroker, MemoryPublisher, Record};
use intake_core::publish::{Output, PublishLayer};
use intake_core::{HandlerError, Message, Payload, handler_fn};
use intake_postgres::{
    ExactlyOnce, MarkerTable, OutboxRelay, OutboxTable, PoolConfig, RelaySettings, Tx,
    handler_error,
};
use sqlx::{AssertSqlSafe, Connection, PgPool};
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
    // Its own application name, so that the server processes serving this
    // bench can be told from any others.
    let application = format!("intake-bench-{}", std::process::id());
    let pool = match PoolConfig::new(&url)
        .expect("a postgres:// URL")
        .max_connections(CONNECTIONS)
        .application_name(application.clone())
        .connect()
        .await
    {
        Ok(pool) => pool,
        Err(error) => {
            println!("skipped: no PostgreSQL: {error}");
            return;
        }
    };
    let mut monitor = sqlx::PgConnection::connect(&url)
        .await
        .expect("a monitoring connection");
    let markers = MarkerTable::new("bench_intake_processed").expect("a valid name");
    sqlx::raw_sql("DROP TABLE IF EXISTS bench_intake_processed")
        .execute(&pool)
        .await
        .expect("the old marker table is dropped");
    markers.migrate(&pool).await.expect("the marker table");
    sqlx::raw_sql(
        "DROP TABLE IF EXISTS bench_effects; \
         CREATE TABLE bench_effects (id bigint PRIMARY KEY, body bytea NOT NULL)",
    )
    .execute(&pool)
    .await
    .expect("the effects table");
    let outbox = OutboxTable::new("bench_outbox").expect("a valid name");
    sqlx::raw_sql("DROP TABLE IF EXISTS bench_outbox")
        .execute(&pool)
        .await
        .expect("the old outbox is dropped");
    outbox.migrate(&pool).await.expect("the outbox table");

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
        "direct publish",
        "exactly-once + outbox",
    ];
    let mut samples: [Vec<Sample>; 6] = Default::default();
    for round in 0..args.rounds {
        let group = format!("bench-{round}");
        for (variant, samples) in samples.iter_mut().enumerate() {
            reset(&pool, &markers).await;
            let before = Cpu::now(&mut monitor, &application).await;
            let started = Instant::now();
            match variant {
                0 => consume(args.messages, in_flight, plain(&pool)).await,
                1 => {
                    let handler = exactly_once(&pool, &markers, &group);
                    consume(args.messages, in_flight, handler).await;
                }
                2 => {
                    let handler = batches().layer(plain_batch(&pool));
                    consume(args.messages, in_flight, handler).await;
                }
                3 => {
                    let handler = batches().layer(exactly_once_batch(&pool, &markers, &group));
                    consume(args.messages, in_flight, handler).await;
                }
                4 => {
                    let handler = PublishLayer::new(destination()).layer(handler_fn(
                        |message: Message| async move {
                            Ok::<_, HandlerError>(Output::forward(&message, RELAYED))
                        },
                    ));
                    consume(args.messages, in_flight, handler).await;
                }
                _ => {
                    let relay = OutboxRelay::spawn(
                        pool.clone(),
                        outbox.clone(),
                        destination(),
                        RelaySettings {
                            batch_size: 500,
                            poll_interval: Duration::from_millis(5),
                            ..RelaySettings::default()
                        },
                    )
                    .expect("valid relay settings");
                    let handler = exactly_once_outbox(&pool, &markers, &group, &outbox);
                    consume(args.messages, in_flight, handler).await;
                    let patience = Instant::now();
                    while relay.published() < args.messages {
                        assert!(
                            patience.elapsed() < Duration::from_secs(120),
                            "the outbox relay published {} of {}",
                            relay.published(),
                            args.messages
                        );
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    relay.stop().await;
                }
            }
            let elapsed = started.elapsed();
            let cpu = Cpu::now(&mut monitor, &application).await.since(&before);
            samples.push(Sample::new(args.messages, elapsed, cpu));
        }
        let line: Vec<String> = names
            .iter()
            .zip(&samples)
            .map(|(name, samples)| format!("{name} {}", samples[round]))
            .collect();
        println!("round {round}: {}", line.join("; "));
    }

    println!("medians over {} rounds:", args.rounds);
    let medians: Vec<Sample> = samples
        .iter()
        .map(|samples| Sample::median(samples))
        .collect();
    for (name, sample) in names.iter().zip(&medians) {
        println!("  {name}: {sample}");
    }
    for (size, plain, exactly_once) in [
        (1, &medians[0], &medians[1]),
        (100, &medians[2], &medians[3]),
    ] {
        println!(
            "exactly-once / plain, batch of {size}: throughput {:.2}, CPU per message {:.2}",
            exactly_once.rate / plain.rate,
            exactly_once.cpu_per_message() / plain.cpu_per_message(),
        );
    }
    // Publishing to a memory broker costs next to nothing, so the outbox is
    // compared with the exactly-once transaction it rides in: what the row
    // and the relay add.
    let (exactly_once, outbox) = (&medians[1], &medians[5]);
    println!(
        "exactly-once + outbox / exactly-once, batch of 1: throughput {:.2}, CPU per message {:.2} \
         (direct publish, no database: {:.0} msg/s)",
        outbox.rate / exactly_once.rate,
        outbox.cpu_per_message() / exactly_once.cpu_per_message(),
        medians[4].rate,
    );
}

/// One variant's round: throughput and CPU per message.
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    rate: f64,
    /// Microseconds of this process's CPU per message.
    client_us: f64,
    /// Microseconds of the serving PostgreSQL backends' CPU per message.
    server_us: f64,
}

impl Sample {
    fn new(messages: u64, elapsed: Duration, cpu: Cpu) -> Self {
        let per_message = |spent: Duration| spent.as_secs_f64() * 1e6 / messages as f64;
        Self {
            rate: messages as f64 / elapsed.as_secs_f64(),
            client_us: per_message(cpu.client),
            server_us: per_message(cpu.server),
        }
    }

    fn cpu_per_message(&self) -> f64 {
        self.client_us + self.server_us
    }

    /// The median of each figure on its own.
    fn median(samples: &[Sample]) -> Sample {
        let median = |figure: fn(&Sample) -> f64| {
            let mut values: Vec<f64> = samples.iter().map(figure).collect();
            values.sort_by(f64::total_cmp);
            values[values.len() / 2]
        };
        Sample {
            rate: median(|sample| sample.rate),
            client_us: median(|sample| sample.client_us),
            server_us: median(|sample| sample.server_us),
        }
    }
}

impl std::fmt::Display for Sample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.0} msg/s, CPU/msg {:.0} us client + {:.0} us server",
            self.rate, self.client_us, self.server_us
        )
    }
}

/// CPU time of this process and of the PostgreSQL backends serving it.
#[derive(Clone, Debug, Default)]
struct Cpu {
    client: Duration,
    server: Duration,
    /// Each backend's CPU, so that a later reading counts only the change.
    backends: HashMap<i32, Duration>,
}

impl Cpu {
    async fn now(monitor: &mut sqlx::PgConnection, application: &str) -> Self {
        let pids: Vec<i32> =
            sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
                .bind(application)
                .fetch_all(&mut *monitor)
                .await
                .expect("pg_stat_activity");
        let backends: HashMap<i32, Duration> = pids
            .into_iter()
            .filter_map(|pid| Some((pid, process_cpu(&pid.to_string())?)))
            .collect();
        Self {
            client: process_cpu("self").unwrap_or_default(),
            server: backends.values().sum(),
            backends,
        }
    }

    /// What was spent since `earlier` (backends that appeared since count
    /// whole).
    fn since(&self, earlier: &Cpu) -> Cpu {
        let server = self
            .backends
            .iter()
            .map(|(pid, spent)| {
                spent.saturating_sub(earlier.backends.get(pid).copied().unwrap_or_default())
            })
            .sum();
        Cpu {
            client: self.client.saturating_sub(earlier.client),
            server,
            backends: HashMap::new(),
        }
    }
}

/// User plus system CPU of process `pid` (`"self"` for this one), from
/// `/proc/<pid>/stat`, in clock ticks of 10 ms (Linux's `USER_HZ`).
fn process_cpu(pid: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold
    // spaces: state is field 3, utime 14 and stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

fn batches(parallelism: usize) -> BatchLayer {
    BatchLayer::new(BatchSettings {
        max_size: BATCH,
        max_wait: Duration::from_millis(5),
        parallelism,
    })
    .expect("valid batch settings")
}

/// Where the publishing variants forward to: a second memory broker's topic.
const RELAYED: &str = "relayed";

fn destination() -> MemoryPublisher {
    let broker = MemoryBroker::new();
    broker
        .create_topic(RELAYED, PARTITIONS)
        .expect("create the destination");
    broker.memory_publisher()
}

async fn reset(pool: &PgPool, markers: &MarkerTable) {
    sqlx::raw_sql(AssertSqlSafe(format!(
        "TRUNCATE bench_effects; TRUNCATE bench_outbox; TRUNCATE {}",
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

/// The batch-of-1 exactly-once transaction, with the message's forward
/// written to the outbox as its effect.
fn exactly_once_outbox(
    pool: &PgPool,
    markers: &MarkerTable,
    group: &str,
    outbox: &OutboxTable,
) -> impl Service<Message, Response = (), Error = HandlerError, Future: Send> + Send + 'static {
    let outbox = outbox.clone();
    ExactlyOnce::builder(pool.clone(), group)
        .table(markers.clone())
        .handler(move |mut tx: Tx, message: Message| {
            let outbox = outbox.clone();
            async move {
                outbox
                    .write(&mut tx, Output::forward(&message, RELAYED))
                    .await?;
                Ok::<_, intake_core::BoxError>(())
            }
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

/// Runs one consumer until `messages` messages succeeded.
async fn consume<H>(messages: u64, in_flight: usize, handler: H)
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
        .ordering(DeliveryOrder::Unordered)
        .shutdown_deadline(Duration::from_secs(60))
        .build(source, acker, counted)
        .expect("valid settings");
    let report = consumer.run(done).await.expect("the run succeeds");
    assert_eq!(
        finished.load(AtomicOrdering::Relaxed),
        messages,
        "every message succeeded ({report:?})"
    );
}
