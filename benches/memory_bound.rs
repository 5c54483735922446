//! Resident memory while consuming messages of about 1 MB, per backend: the
//! consumer's byte budget (`max_in_flight_bytes`) against what the process
//! actually grows by.
//!
//! ```text
//! cargo bench --features full --bench memory_bound
//! BENCH_BACKENDS=memory,kafka BENCH_MESSAGES=300 BENCH_BUDGET_MIB=64 cargo bench --features full --bench memory_bound
//! ```
//!
//! Each backend gets a fresh source of `BENCH_MESSAGES` messages of
//! 1,000,000 bytes (under Kafka's default 1 MiB record limit), produced by a
//! child process of this binary (so the producer's memory is not in the
//! measurement; the memory broker is produced in process, and its data is
//! in the baseline). Then a consumer with `max_in_flight(1024)` and the byte
//! budget, unordered, whose handler waits 20 ms per message (so deliveries
//! pile up as far as the budgets let them), consumes everything while a
//! sampler reads the process's resident set (`VmRSS`) every 2 ms. Reported:
//! the runtime's own peak (`RunReport::peak_in_flight_bytes`) and the peak
//! RSS growth over the baseline taken just before the consumer starts, which
//! includes every buffer of the client library.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use intake::amqp::lapin;
use intake::backend::{Acker, Source};
use intake::kafka::rdkafka::ClientConfig;
use intake::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use intake::kafka::rdkafka::client::DefaultClientContext;
use intake::kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use intake::memory::{MemoryBroker, Record};
use intake::redis_streams::redis;
use intake::{Consumer, DeliveryOrder, HandlerError, Message, RunReport};
use tokio_util::sync::CancellationToken;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const PAYLOAD: usize = 1_000_000;
const KAFKA: &str = "127.0.0.1:9092";
const REDIS: &str = "redis://127.0.0.1:6379";
const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// The process's resident set, in bytes.
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|value| {
                    value
                        .trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
        })
        .map_or(0, |kib| kib * 1024)
}

/// Samples the resident set until stopped; returns the peak.
struct Sampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl Sampler {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(rss()));
        let thread = {
            let (stop, peak) = (stop.clone(), peak.clone());
            std::thread::spawn(move || {
                while !stop.load(AtomicOrdering::Relaxed) {
                    peak.fetch_max(rss(), AtomicOrdering::Relaxed);
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        };
        Self { stop, peak, thread }
    }

    fn finish(self) -> u64 {
        self.stop.store(true, AtomicOrdering::Relaxed);
        let _ = self.thread.join();
        self.peak.load(AtomicOrdering::Relaxed)
    }
}

/// Consumes `count` messages of `source` under the byte budget, sampling the
/// resident set meanwhile.
async fn consume<S: Source, A: Acker>(
    source: S,
    acker: A,
    count: u64,
    budget: usize,
) -> Result<(RunReport, u64, u64), BoxError> {
    let handled = Arc::new(AtomicU64::new(0));
    let counter = handled.clone();
    let handler = tower::service_fn(move |message: Message| {
        let counter = counter.clone();
        async move {
            std::hint::black_box(message.payload().len());
            tokio::time::sleep(Duration::from_millis(20)).await;
            counter.fetch_add(1, AtomicOrdering::Relaxed);
            Ok::<_, HandlerError>(())
        }
    });
    let consumer = Consumer::builder()
        .max_in_flight(1024)
        .max_in_flight_bytes(budget)
        .ordering(DeliveryOrder::Unordered)
        .build(source, acker, handler)?;
    let baseline = rss();
    let sampler = Sampler::start();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(consumer.run(shutdown.clone()));
    let started = Instant::now();
    while handled.load(AtomicOrdering::Relaxed) < count {
        if started.elapsed() > Duration::from_secs(300) {
            return Err(format!(
                "only {} of {count} handled in 300 s",
                handled.load(AtomicOrdering::Relaxed)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    let report = run.await??;
    let peak = sampler.finish();
    Ok((report, baseline, peak))
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_millis())
    )
}

/// `produce BACKEND NAME COUNT`, run as a child process.
async fn produce(backend: &str, name: &str, count: u64) -> Result<(), BoxError> {
    let payload = vec![b'x'; PAYLOAD];
    match backend {
        "kafka" => {
            let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
                .set("bootstrap.servers", KAFKA)
                .create()?;
            admin
                .create_topics(
                    &[NewTopic::new(name, 4, TopicReplication::Fixed(1))],
                    &AdminOptions::new(),
                )
                .await?;
            // The producer's own limit (1,000,000 bytes by default) is below
            // one such record with its overhead; the broker's is 1 MiB.
            let producer: FutureProducer = ClientConfig::new()
                .set("bootstrap.servers", KAFKA)
                .set("message.max.bytes", "1048576")
                .create()?;
            for id in 0..count {
                let key = id.to_string();
                producer
                    .send(
                        FutureRecord::to(name).key(&key).payload(&payload),
                        Duration::from_secs(30),
                    )
                    .await
                    .map_err(|(error, _)| error)?;
            }
        }
        "redis" => {
            let client = redis::Client::open(REDIS)?;
            let mut connection = client.get_multiplexed_async_connection().await?;
            for _ in 0..count {
                let _: String = redis::cmd("XADD")
                    .arg(name)
                    .arg("*")
                    .arg("payload")
                    .arg(&payload)
                    .query_async(&mut connection)
                    .await?;
            }
        }
        "amqp" => {
            let connection =
                lapin::Connection::connect(AMQP, lapin::ConnectionProperties::default()).await?;
            let channel = connection.create_channel().await?;
            channel
                .queue_declare(
                    name.into(),
                    lapin::options::QueueDeclareOptions {
                        durable: true,
                        ..Default::default()
                    },
                    lapin::types::FieldTable::default(),
                )
                .await?;
            channel
                .confirm_select(lapin::options::ConfirmSelectOptions::default())
                .await?;
            for _ in 0..count {
                channel
                    .basic_publish(
                        "".into(),
                        name.into(),
                        lapin::options::BasicPublishOptions::default(),
                        &payload,
                        lapin::BasicProperties::default(),
                    )
                    .await?
                    .await?;
            }
        }
        other => return Err(format!("no producer for {other}").into()),
    }
    Ok(())
}

fn produce_in_child(backend: &str, name: &str, count: u64) -> Result<(), BoxError> {
    let status = std::process::Command::new(std::env::current_exe()?)
        .args(["--produce", backend, name, &count.to_string()])
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("producing to {backend} failed: {status}").into())
    }
}

/// One backend's run: the runtime's peak and the resident set's growth.
async fn measure(
    backend: &str,
    count: u64,
    budget: usize,
) -> Result<(RunReport, u64, u64), BoxError> {
    let name = unique("intake-memory-bound");
    match backend {
        "memory" => {
            let broker = MemoryBroker::new();
            broker.create_topic(&name, 4)?;
            for id in 0..count {
                broker.send(
                    &name,
                    Record::new(Bytes::from(vec![b'x'; PAYLOAD])).with_key(id.to_string()),
                )?;
            }
            let (source, acker) = broker.consumer(&name, "bench")?;
            consume(source, acker, count, budget).await
        }
        "kafka" => {
            produce_in_child(backend, &name, count)?;
            let source =
                intake::kafka::KafkaSource::builder(intake::kafka::KafkaSettings::new(KAFKA))
                    .group("bench")
                    .topic(&name)
                    .build()
                    .await?;
            let acker = source.acker();
            consume(source, acker, count, budget).await
        }
        "redis" => {
            produce_in_child(backend, &name, count)?;
            let source = intake::redis_streams::RedisStreamsSource::builder(REDIS)
                .stream(&name)
                .group("bench")
                .consumer("bench-1")
                .build()
                .await?;
            let acker = source.acker();
            consume(source, acker, count, budget).await
        }
        "amqp" => {
            produce_in_child(backend, &name, count)?;
            let source = intake::amqp::AmqpSource::builder(AMQP)
                .queue(&name)
                .max_in_flight(1024)
                .connect()
                .await?;
            let acker = source.acker();
            consume(source, acker, count, budget).await
        }
        other => Err(format!("unknown backend {other}").into()),
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--produce") {
        let count = args
            .get(4)
            .and_then(|count| count.parse().ok())
            .unwrap_or(0);
        return produce(&args[2], &args[3], count).await;
    }
    if args.iter().any(|arg| arg == "--list") {
        // `cargo test --benches` asks harness-less benches to list tests.
        return Ok(());
    }
    let backends: String = env_or("BENCH_BACKENDS", "memory,kafka,redis,amqp".to_string());
    let count: u64 = env_or("BENCH_MESSAGES", 300);
    let budget_mib: usize = env_or("BENCH_BUDGET_MIB", 64);
    let budget = budget_mib << 20;
    println!(
        "{count} messages of {PAYLOAD} bytes per backend, max_in_flight 1024, \
         max_in_flight_bytes {budget_mib} MiB, a 20 ms handler"
    );
    println!("| backend | runtime peak (MiB) | RSS growth (MiB) | RSS growth / budget |");
    println!("|---|---|---|---|");
    for backend in backends.split(',').map(str::trim).filter(|b| !b.is_empty()) {
        match measure(backend, count, budget).await {
            Ok((report, baseline, peak)) => {
                let growth = peak.saturating_sub(baseline);
                println!(
                    "| {backend} | {:.1} | {:.1} | {:.2} |",
                    report.peak_in_flight_bytes as f64 / f64::from(1 << 20),
                    growth as f64 / f64::from(1 << 20),
                    growth as f64 / budget as f64
                );
            }
            Err(error) => println!("| {backend} | failed: {error} | | |"),
        }
    }
    Ok(())
}
