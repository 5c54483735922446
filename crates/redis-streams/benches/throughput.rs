//! Throughput of intake's Redis Streams consumer against the raw redis
//! client, on the same stream contents.
//!
//! ```text
//! cargo bench -p intake-redis-streams --bench throughput
//! ```
//!
//! One stream of `INTAKE_BENCH_ENTRIES` (default 200,000) entries with a
//! 100-byte payload is read by each loop through a consumer group of its
//! own, so every loop sees the same contents. The loops run interleaved over
//! `INTAKE_BENCH_ROUNDS` (default 3) rounds, their order rotating per round:
//!
//! - `raw`: the redis crate alone, `XREADGROUP COUNT 500` then one awaited
//!   `XACK` of the batch, the payload touched;
//! - `intake`: `Consumer` with a no-op handler, `max_in_flight` 1000,
//!   fetches of 500, unordered;
//! - `intake-ordered`: the same in partition order (the default);
//! - `raw-relay`: the redis crate alone, relaying: `XREADGROUP COUNT 500`,
//!   one pipeline of an `XADD` per payload to another stream, awaited, then
//!   one `XACK` of the batch;
//! - `intake-relay`: `Consumer` (unordered, as `intake`) with a handler that
//!   returns each payload as an `Output` to another stream, published by
//!   `PublishLayer` through a `RedisStreamsPublisher`: each input is
//!   acknowledged after its output's `XADD` reply.
//!
//! The relay loops also check that the other stream holds every entry.
//!
//! A loop's time runs from its first read to the acknowledgement of its
//! last entry; it is checked that nothing is left pending. Besides msg/s,
//! the bench reports the CPU time this process spent per message (from
//! `/proc/self/stat`), which a busy machine disturbs far less than
//! wall-clock throughput. Needs Redis on
//! `INTAKE_REDIS_URL` (default `redis://127.0.0.1:6379`); without it the
//! bench says so and exits.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use intake_core::publish::{Output, PublishLayer};
use intake_core::{Consumer, DeliveryOrder, HandlerError, Message, handler_fn};
use intake_redis_streams::{RedisStreamsPublisher, RedisStreamsSource};
use redis::Value;
use redis::aio::MultiplexedConnection;
use tokio_util::sync::CancellationToken;

const BATCH: usize = 500;
const PAYLOAD_BYTES: usize = 100;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loop {
    Raw,
    Intake,
    IntakeOrdered,
    RawRelay,
    IntakeRelay,
}

impl Loop {
    fn name(self) -> &'static str {
        match self {
            Loop::Raw => "raw",
            Loop::Intake => "intake",
            Loop::IntakeOrdered => "intake-ordered",
            Loop::RawRelay => "raw-relay",
            Loop::IntakeRelay => "intake-relay",
        }
    }
}

type BenchError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BenchError> {
    let url = std::env::var("INTAKE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let entries: usize = env_or("INTAKE_BENCH_ENTRIES", 200_000);
    let rounds: usize = env_or("INTAKE_BENCH_ROUNDS", 3);
    let client = redis::Client::open(url.as_str())?;
    let mut admin = match client.get_multiplexed_async_connection().await {
        Ok(connection) => connection,
        Err(error) => {
            println!("skipped: Redis is not reachable at {url}: {error}");
            return Ok(());
        }
    };
    let stream = format!(
        "intake-bench:{}:{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos())
    );
    fill(&mut admin, &stream, entries).await?;
    println!("stream {stream}: {entries} entries of {PAYLOAD_BYTES} bytes, {rounds} rounds");

    let loops = [
        Loop::Raw,
        Loop::Intake,
        Loop::IntakeOrdered,
        Loop::RawRelay,
        Loop::IntakeRelay,
    ];
    let mut rates: Vec<(Loop, Vec<f64>, Vec<f64>)> = loops
        .iter()
        .map(|&kind| (kind, Vec::new(), Vec::new()))
        .collect();
    for round in 0..rounds {
        for offset in 0..loops.len() {
            let kind = loops[(round + offset) % loops.len()];
            let group = format!("{}-{round}", kind.name());
            let cpu_before = process_cpu();
            let elapsed = match kind {
                Loop::Raw => raw(&client, &stream, &group, entries).await?,
                Loop::Intake => {
                    intake(&url, &stream, &group, entries, DeliveryOrder::Unordered).await?
                }
                Loop::IntakeOrdered => {
                    intake(&url, &stream, &group, entries, DeliveryOrder::Partition).await?
                }
                Loop::RawRelay | Loop::IntakeRelay => {
                    let relayed = format!("{stream}:{group}");
                    let elapsed = if kind == Loop::RawRelay {
                        raw_relay(&client, &stream, &relayed, &group, entries).await?
                    } else {
                        intake_relay(&url, &stream, &relayed, &group, entries).await?
                    };
                    let length: usize = redis::cmd("XLEN")
                        .arg(&relayed)
                        .query_async(&mut admin)
                        .await?;
                    redis::cmd("DEL")
                        .arg(&relayed)
                        .query_async::<()>(&mut admin)
                        .await?;
                    if length != entries {
                        return Err(format!("{} relayed {length} of {entries}", kind.name()).into());
                    }
                    elapsed
                }
            };
            let cpu = process_cpu().saturating_sub(cpu_before);
            let pending = pending(&mut admin, &stream, &group).await?;
            if pending != 0 {
                return Err(format!("{} left {pending} entries pending", kind.name()).into());
            }
            // Measured before the pending check, which is not the loop's.
            let rate = entries as f64 / elapsed.as_secs_f64();
            let cpu_per_message = cpu.as_secs_f64() * 1e9 / entries as f64;
            println!(
                "round {round} {:>15}: {:>9.0} msg/s ({elapsed:.2?}), {cpu_per_message:>6.0} ns CPU/msg",
                kind.name(),
                rate
            );
            if let Some((_, list, cpu_list)) = rates.iter_mut().find(|(k, _, _)| *k == kind) {
                list.push(rate);
                cpu_list.push(cpu_per_message);
            }
        }
    }
    redis::cmd("DEL")
        .arg(&stream)
        .query_async::<()>(&mut admin)
        .await?;

    let summary = |list: &Vec<f64>| {
        let mut sorted = list.clone();
        sorted.sort_by(f64::total_cmp);
        (
            sorted[sorted.len() - 1],
            sorted[sorted.len() / 2],
            sorted[0],
        )
    };
    let (raw_best, raw_median, _) = summary(&rates[0].1);
    let (_, raw_cpu, _) = summary(&rates[0].2);
    println!();
    println!(
        "| loop | best msg/s | median msg/s | worst msg/s | best / raw best \
         | median / raw median | median ns CPU/msg | CPU / raw CPU |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (kind, list, cpu_list) in &rates {
        let (best, median, worst) = summary(list);
        let (_, cpu, _) = summary(cpu_list);
        println!(
            "| {} | {best:.0} | {median:.0} | {worst:.0} | {:.3} | {:.3} | {cpu:.0} | {:.2} |",
            kind.name(),
            best / raw_best,
            median / raw_median,
            cpu / raw_cpu
        );
    }
    Ok(())
}

/// CPU time (user and system) this process has used, from
/// `/proc/self/stat`; zero where that file does not exist.
fn process_cpu() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the whole line, in clock ticks (100 per second
    // on Linux).
    let Some(rest) = stat.rsplit(')').next() else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |index: usize| {
        fields
            .get(index)
            .and_then(|field| field.parse::<u64>().ok())
    };
    match (ticks(11), ticks(12)) {
        (Some(user), Some(system)) => Duration::from_millis((user + system) * 10),
        _ => Duration::ZERO,
    }
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

async fn fill(
    connection: &mut MultiplexedConnection,
    stream: &str,
    entries: usize,
) -> Result<(), BenchError> {
    let mut written = 0;
    while written < entries {
        let chunk = (entries - written).min(10_000);
        let mut pipe = redis::pipe();
        for n in written..written + chunk {
            let mut payload = format!("{n:0>width$}", width = PAYLOAD_BYTES);
            payload.truncate(PAYLOAD_BYTES);
            pipe.cmd("XADD")
                .arg(stream)
                .arg("*")
                .arg("payload")
                .arg(payload)
                .ignore();
        }
        pipe.query_async::<()>(connection).await?;
        written += chunk;
    }
    Ok(())
}

async fn create_group(
    connection: &mut MultiplexedConnection,
    stream: &str,
    group: &str,
) -> Result<(), BenchError> {
    redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg(group)
        .arg("0")
        .query_async::<()>(connection)
        .await?;
    Ok(())
}

/// The redis crate alone: read a batch, touch each payload, acknowledge
/// the batch, repeat.
async fn raw(
    client: &redis::Client,
    stream: &str,
    group: &str,
    entries: usize,
) -> Result<Duration, BenchError> {
    let mut connection = client.get_multiplexed_async_connection().await?;
    create_group(&mut connection, stream, group).await?;
    let started = Instant::now();
    let mut consumed = 0;
    let mut ids: Vec<Vec<u8>> = Vec::with_capacity(BATCH);
    while consumed < entries {
        let reply: Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(group)
            .arg("raw")
            .arg("COUNT")
            .arg(BATCH)
            .arg("BLOCK")
            .arg(1000)
            .arg("STREAMS")
            .arg(stream)
            .arg(">")
            .query_async(&mut connection)
            .await?;
        ids.clear();
        for (id, payload) in raw_entries(reply) {
            black_box(payload.len());
            ids.push(id);
        }
        if ids.is_empty() {
            return Err("the raw loop ran out of entries".into());
        }
        consumed += ids.len();
        redis::cmd("XACK")
            .arg(stream)
            .arg(group)
            .arg(&ids)
            .query_async::<()>(&mut connection)
            .await?;
    }
    Ok(started.elapsed())
}

/// The redis crate alone, relaying: read a batch, add each payload to
/// `relayed` in one pipeline and wait for its replies, acknowledge the
/// batch, repeat.
async fn raw_relay(
    client: &redis::Client,
    stream: &str,
    relayed: &str,
    group: &str,
    entries: usize,
) -> Result<Duration, BenchError> {
    let mut connection = client.get_multiplexed_async_connection().await?;
    create_group(&mut connection, stream, group).await?;
    let started = Instant::now();
    let mut consumed = 0;
    let mut ids: Vec<Vec<u8>> = Vec::with_capacity(BATCH);
    let mut pipe = redis::pipe();
    while consumed < entries {
        let reply: Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(group)
            .arg("raw")
            .arg("COUNT")
            .arg(BATCH)
            .arg("BLOCK")
            .arg(1000)
            .arg("STREAMS")
            .arg(stream)
            .arg(">")
            .query_async(&mut connection)
            .await?;
        ids.clear();
        pipe.clear();
        for (id, payload) in raw_entries(reply) {
            pipe.cmd("XADD")
                .arg(relayed)
                .arg("*")
                .arg("payload")
                .arg(payload);
            ids.push(id);
        }
        if ids.is_empty() {
            return Err("the raw relay ran out of entries".into());
        }
        // The entry ids, as a confirming relay would read them.
        let added: Vec<Value> = pipe.query_async(&mut connection).await?;
        if added.len() != ids.len() {
            return Err("the raw relay lost replies".into());
        }
        consumed += ids.len();
        redis::cmd("XACK")
            .arg(stream)
            .arg(group)
            .arg(&ids)
            .query_async::<()>(&mut connection)
            .await?;
    }
    Ok(started.elapsed())
}

/// `(id, payload)` of each entry of a one-stream read reply.
fn raw_entries(reply: Value) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    let Value::Array(streams) = reply else {
        return out;
    };
    for stream in streams {
        let Value::Array(mut parts) = stream else {
            continue;
        };
        let Some(Value::Array(entries)) = parts.pop() else {
            continue;
        };
        for entry in entries {
            let Value::Array(mut entry) = entry else {
                continue;
            };
            let fields = entry.pop();
            let id = entry.pop();
            if let (Some(Value::BulkString(id)), Some(Value::Array(mut fields))) = (id, fields) {
                let payload = match fields.pop() {
                    Some(Value::BulkString(payload)) => payload,
                    _ => Vec::new(),
                };
                out.push((id, payload));
            }
        }
    }
    out
}

/// The consumer runtime with a no-op handler that stops the run at the
/// last entry; the run returns after its final acknowledgement.
async fn intake(
    url: &str,
    stream: &str,
    group: &str,
    entries: usize,
    ordering: DeliveryOrder,
) -> Result<Duration, BenchError> {
    let source = RedisStreamsSource::builder(url)
        .stream(stream)
        .group(group)
        .consumer("intake")
        .block(Duration::from_millis(100))
        .build()
        .await?;
    let acker = source.acker();
    let handled = Arc::new(AtomicUsize::new(0));
    let shutdown = CancellationToken::new();
    let handler = {
        let handled = handled.clone();
        let shutdown = shutdown.clone();
        tower::service_fn(move |message: Message| {
            black_box(message.payload().len());
            if handled.fetch_add(1, AtomicOrdering::Relaxed) + 1 == entries {
                shutdown.cancel();
            }
            std::future::ready(Ok::<_, HandlerError>(()))
        })
    };
    let consumer = Consumer::builder()
        .max_in_flight(1000)
        .fetch_batch(BATCH)
        .ordering(ordering)
        .build(source, acker, handler)?;
    let started = Instant::now();
    let report = consumer.run(shutdown).await?;
    let elapsed = started.elapsed();
    if report.succeeded as usize != entries {
        return Err(format!("intake handled {} of {entries}", report.succeeded).into());
    }
    Ok(elapsed)
}

/// The consumer runtime relaying each payload to `relayed` through
/// `PublishLayer`; the run returns after the final acknowledgement, which
/// follows the last output's confirmation.
async fn intake_relay(
    url: &str,
    stream: &str,
    relayed: &str,
    group: &str,
    entries: usize,
) -> Result<Duration, BenchError> {
    let source = RedisStreamsSource::builder(url)
        .stream(stream)
        .group(group)
        .consumer("intake")
        .block(Duration::from_millis(100))
        .build()
        .await?;
    let acker = source.acker();
    let publisher = RedisStreamsPublisher::builder(url).build().await?;
    let handled = Arc::new(AtomicUsize::new(0));
    let shutdown = CancellationToken::new();
    let destination: Arc<str> = relayed.into();
    let handler = {
        let handled = handled.clone();
        let shutdown = shutdown.clone();
        handler_fn(move |message: Message| {
            if handled.fetch_add(1, AtomicOrdering::Relaxed) + 1 == entries {
                shutdown.cancel();
            }
            let output = Output::new(Arc::clone(&destination), message.payload().clone());
            async move { output }
        })
    };
    let handler = tower::ServiceBuilder::new()
        .layer(PublishLayer::new(publisher.clone()))
        .service(handler);
    let consumer = Consumer::builder()
        .max_in_flight(1000)
        .fetch_batch(BATCH)
        .ordering(DeliveryOrder::Unordered)
        .build(source, acker, handler)?;
    let started = Instant::now();
    let report = consumer.run(shutdown).await?;
    let elapsed = started.elapsed();
    publisher.close().await;
    if report.succeeded as usize != entries {
        return Err(format!("intake relayed {} of {entries}", report.succeeded).into());
    }
    Ok(elapsed)
}

async fn pending(
    connection: &mut MultiplexedConnection,
    stream: &str,
    group: &str,
) -> Result<u64, BenchError> {
    let reply: Value = redis::cmd("XPENDING")
        .arg(stream)
        .arg(group)
        .query_async(connection)
        .await?;
    match reply {
        Value::Array(items) => match items.first() {
            Some(Value::Int(count)) => Ok(*count as u64),
            _ => Ok(0),
        },
        _ => Ok(0),
    }
}
