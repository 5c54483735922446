//! Consumer throughput against the RabbitMQ on 127.0.0.1:5672: raw lapin
//! versus intake with a no-op handler, on the same queue contents.
//!
//! Each round fills a queue with 100,000 messages of 100 bytes, then drains
//! it with one contender; the contenders alternate, and their order flips
//! every round, so neither always runs on a warmer broker. Both consume with
//! prefetch 1000 and stop when all messages are acknowledged and the channel
//! is closed.
//!
//! - raw: lapin, `basic.ack(multiple)` every 100 messages;
//! - intake: `AmqpSource` + `Consumer` with `max_in_flight(1000)` (which
//!   the consumer gives the source as its prefetch), unordered, and a
//!   no-op handler (acks as the commit engine batches them);
//! - intake-ordered: the same in partition order (the default ordering: one
//!   message at a time per channel).
//!
//! Two relays consume the queue and publish each payload to a second queue
//! (default exchange, persistent, `mandatory`), acknowledging an input only
//! after its output is confirmed:
//!
//! - relay-raw: lapin, publishes on a confirm-mode channel of a second
//!   connection, and a task awaits the confirms in order and sends
//!   `basic.ack(multiple)` every 100 inputs, or at once when no confirm is
//!   waiting;
//! - relay-intake: the consumer above, unordered, with a handler returning
//!   an `Output` under `PublishLayer` with an `AmqpPublisher` (its
//!   defaults: 1,000 unconfirmed at most).
//!
//! `INTAKE_BENCH_RELAY=0` leaves the relays out.
//!
//! Besides msg/s it reports the client process's CPU time per message
//! (`/proc/self/stat`), which a busy machine disturbs far less.
//!
//! ```text
//! cargo bench -p intake-amqp --bench throughput
//! INTAKE_BENCH_MESSAGES=20000 INTAKE_BENCH_ROUNDS=5 cargo bench -p intake-amqp --bench throughput
//! INTAKE_BENCH_ONLY=intake perf record -g target/release/deps/throughput-…
//! INTAKE_BENCH_COMMIT_BATCH=100 cargo bench -p intake-amqp --bench throughput
//! ```
//!
//! Skips (exit 0, with a reason) when no broker answers, unless
//! `INTAKE_REQUIRE_BROKERS=1`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use intake_amqp::lapin::PublisherConfirm;
use intake_amqp::lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions, QueuePurgeOptions,
};
use intake_amqp::lapin::types::FieldTable;
use intake_amqp::lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use intake_amqp::{AmqpPublisher, AmqpSource};
use intake_core::publish::{Output, PublishLayer};
use intake_core::{Consumer, DeliveryOrder, HandlerError, Message, handler_fn};
use tokio_util::sync::CancellationToken;

const PREFETCH: u16 = 1000;
const RAW_ACK_EVERY: u64 = 100;
const PAYLOAD_BYTES: usize = 100;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Contender {
    Raw,
    Intake,
    IntakeOrdered,
    RelayRaw,
    RelayIntake,
}

impl Contender {
    const ALL: [Contender; 5] = [
        Contender::Raw,
        Contender::Intake,
        Contender::IntakeOrdered,
        Contender::RelayRaw,
        Contender::RelayIntake,
    ];

    fn name(self) -> &'static str {
        match self {
            Contender::Raw => "raw",
            Contender::Intake => "intake",
            Contender::IntakeOrdered => "intake-ordered",
            Contender::RelayRaw => "relay-raw",
            Contender::RelayIntake => "relay-intake",
        }
    }

    fn is_relay(self) -> bool {
        matches!(self, Contender::RelayRaw | Contender::RelayIntake)
    }

    /// What its rate is compared with.
    fn baseline(self) -> Contender {
        if self.is_relay() {
            Contender::RelayRaw
        } else {
            Contender::Raw
        }
    }
}

/// One contender's run.
struct Sample {
    contender: Contender,
    rate: f64,
    cpu_per_message: Option<Duration>,
}

fn main() -> Result<(), BoxError> {
    // Skip `cargo bench` filter arguments such as `--bench`.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run())
}

async fn run() -> Result<(), BoxError> {
    let url = std::env::var("INTAKE_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let messages = setting("INTAKE_BENCH_MESSAGES", 100_000);
    let rounds = setting("INTAKE_BENCH_ROUNDS", 3);
    // For profiling one loop: INTAKE_BENCH_ONLY=raw, intake or intake-ordered.
    let only = std::env::var("INTAKE_BENCH_ONLY")
        .ok()
        .and_then(|only| Contender::ALL.into_iter().find(|c| c.name() == only));
    let relays = std::env::var("INTAKE_BENCH_RELAY").map_or(true, |relay| relay != "0");
    let admin = match Connection::connect(&url, ConnectionProperties::default()).await {
        Ok(connection) => connection,
        Err(error) if intake_core::backend::testkit::brokers_required() => {
            return Err(format!("RabbitMQ is required but: {error}").into());
        }
        Err(error) => {
            println!("skipped: no RabbitMQ at 127.0.0.1:5672: {error}");
            return Ok(());
        }
    };
    let channel = admin.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let queue = format!("intake-bench-{}", std::process::id());
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let relayed = format!("{queue}-relayed");
    channel
        .queue_declare(
            relayed.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await?;

    println!("{messages} messages of {PAYLOAD_BYTES} bytes, prefetch {PREFETCH}, {rounds} rounds");
    let mut samples: Vec<Sample> = Vec::new();
    for round in 0..rounds {
        // Rotate the order so that no loop always runs first.
        let mut order = Contender::ALL;
        order.rotate_left(round % Contender::ALL.len());
        for contender in order {
            if only.is_some_and(|only| only != contender) || (contender.is_relay() && !relays) {
                continue;
            }
            fill(&channel, &queue, messages).await?;
            let cpu_before = process_cpu();
            let elapsed = match contender {
                Contender::Raw => raw(&url, &queue, messages).await?,
                Contender::Intake => {
                    intake(&url, &queue, messages, DeliveryOrder::Unordered).await?
                }
                Contender::IntakeOrdered => {
                    intake(&url, &queue, messages, DeliveryOrder::Partition).await?
                }
                Contender::RelayRaw => relay_raw(&url, &queue, &relayed, messages).await?,
                Contender::RelayIntake => relay_intake(&url, &queue, &relayed, messages).await?,
            };
            if contender.is_relay() {
                let purged = channel
                    .queue_purge(relayed.as_str().into(), QueuePurgeOptions::default())
                    .await?;
                if purged as usize != messages {
                    return Err(format!(
                        "{} left {purged} outputs for {messages} inputs",
                        contender.name()
                    )
                    .into());
                }
            }
            let cpu_per_message = process_cpu()
                .zip(cpu_before)
                .map(|(after, before)| (after - before) / messages as u32);
            let rate = messages as f64 / elapsed.as_secs_f64();
            println!(
                "round {}: {:<15} {:>9.0} msg/s ({:.2} s), client CPU {}/msg",
                round + 1,
                contender.name(),
                rate,
                elapsed.as_secs_f64(),
                cpu_per_message
                    .map_or_else(|| "n/a".to_owned(), |cpu| format!("{} ns", cpu.as_nanos())),
            );
            samples.push(Sample {
                contender,
                rate,
                cpu_per_message,
            });
        }
    }
    for queue in [&queue, &relayed] {
        channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await?;
    }
    admin.close(200, "bench done".into()).await?;
    summarize(&samples);
    Ok(())
}

fn median<T: Copy>(sorted: &[T]) -> Option<T> {
    sorted.get(sorted.len() / 2).copied()
}

/// Best, median and worst rate per loop, against raw lapin (the relays
/// against the raw relay).
fn summarize(samples: &[Sample]) {
    let rates = |who: Contender| {
        let mut rates: Vec<f64> = samples
            .iter()
            .filter(|sample| sample.contender == who)
            .map(|sample| sample.rate)
            .collect();
        rates.sort_by(f64::total_cmp);
        rates
    };
    let cpu = |who: Contender| {
        let mut cpu: Vec<Duration> = samples
            .iter()
            .filter(|sample| sample.contender == who)
            .filter_map(|sample| sample.cpu_per_message)
            .collect();
        cpu.sort();
        median(&cpu)
    };
    println!();
    println!(
        "| loop | best msg/s | median msg/s | worst msg/s | best / raw best | median / raw median | median ns CPU/msg | CPU / raw CPU |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for contender in Contender::ALL {
        let raw = rates(contender.baseline());
        let (raw_best, raw_median) = (raw.last().copied(), median(&raw));
        let raw_cpu = cpu(contender.baseline());
        let rates = rates(contender);
        let (Some(best), Some(middle), Some(worst)) = (
            rates.last().copied(),
            median(&rates),
            rates.first().copied(),
        ) else {
            continue;
        };
        let ratio = |value: f64, raw: Option<f64>| {
            raw.map_or_else(|| "–".to_owned(), |raw| format!("{:.3}", value / raw))
        };
        let cpu = cpu(contender);
        println!(
            "| {} | {best:.0} | {middle:.0} | {worst:.0} | {} | {} | {} | {} |",
            contender.name(),
            ratio(best, raw_best),
            ratio(middle, raw_median),
            cpu.map_or_else(|| "–".to_owned(), |cpu| cpu.as_nanos().to_string()),
            cpu.zip(raw_cpu).map_or_else(
                || "–".to_owned(),
                |(cpu, raw)| format!("{:.2}", cpu.as_secs_f64() / raw.as_secs_f64())
            ),
        );
    }
}

/// CPU time (user + system) this process used so far, from
/// `/proc/self/stat` (Linux; 10 ms resolution, fine over seconds). The
/// publisher runs between measurements, so only consumption is counted.
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let user: u64 = fields.get(11)?.parse().ok()?;
    let system: u64 = fields.get(12)?.parse().ok()?;
    const TICKS_PER_SECOND: u64 = 100;
    Some(Duration::from_millis(
        (user + system) * 1000 / TICKS_PER_SECOND,
    ))
}

/// Publishes `count` messages to `queue`, confirmed, in windows of 1000.
async fn fill(channel: &Channel, queue: &str, count: usize) -> Result<(), BoxError> {
    let payload = vec![b'x'; PAYLOAD_BYTES];
    let mut confirms = Vec::with_capacity(1000);
    for index in 0..count {
        confirms.push(
            channel
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    &payload,
                    BasicProperties::default(),
                )
                .await?,
        );
        if confirms.len() == 1000 || index + 1 == count {
            for confirm in confirms.drain(..) {
                if !confirm.await?.is_ack() {
                    return Err("the broker refused a message".into());
                }
            }
        }
    }
    Ok(())
}

/// Raw lapin: prefetch 1000, `ack multiple` every 100 messages.
async fn raw(url: &str, queue: &str, count: usize) -> Result<Duration, BoxError> {
    let started = Instant::now();
    let connection = Connection::connect(url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await?;
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut received = 0u64;
    while let Some(delivery) = consumer.next().await {
        let delivery = delivery?;
        received += 1;
        if received.is_multiple_of(RAW_ACK_EVERY) || received == count as u64 {
            channel
                .basic_ack(delivery.delivery_tag, BasicAckOptions { multiple: true })
                .await?;
        }
        if received == count as u64 {
            break;
        }
    }
    channel.close(200, "done".into()).await?;
    connection.close(200, "done".into()).await?;
    Ok(started.elapsed())
}

/// intake: `AmqpSource` and `Consumer` with a no-op handler.
async fn intake(
    url: &str,
    queue: &str,
    count: usize,
    ordering: DeliveryOrder,
) -> Result<Duration, BoxError> {
    let started = Instant::now();
    // The consumer's max_in_flight becomes the prefetch (set_limits).
    let source = AmqpSource::builder(url).queue(queue).build().await?;
    let acker = source.acker();
    let shutdown = CancellationToken::new();
    let handled = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (handled, shutdown) = (handled.clone(), shutdown.clone());
        tower::service_fn(move |_message: Message| {
            if handled.fetch_add(1, AtomicOrdering::Relaxed) + 1 == count {
                shutdown.cancel();
            }
            std::future::ready(Ok::<_, HandlerError>(()))
        })
    };
    let mut builder = Consumer::builder();
    if let Some(batch) = std::env::var("INTAKE_BENCH_COMMIT_BATCH")
        .ok()
        .and_then(|value| value.parse().ok())
    {
        builder = builder.commit_batch(batch);
    }
    let report = builder
        .max_in_flight(usize::from(PREFETCH))
        .ordering(ordering)
        .build(source, acker, handler)?
        .run(shutdown)
        .await?;
    if report.succeeded < count as u64 {
        return Err(format!("intake handled {} of {count}", report.succeeded).into());
    }
    Ok(started.elapsed())
}

/// Inputs the raw relay acknowledges at once at most (fewer when no
/// confirm is waiting).
const RAW_RELAY_ACK_EVERY: u64 = 100;

/// Raw lapin relay: consumes `queue` (prefetch 1000) and publishes each
/// payload to `relayed` on a confirm-mode channel of a second connection;
/// a task of its own awaits the confirms in order and acks the inputs
/// (multiple) every 100, or as soon as no confirm is waiting.
async fn relay_raw(
    url: &str,
    queue: &str,
    relayed: &str,
    count: usize,
) -> Result<Duration, BoxError> {
    let started = Instant::now();
    let connection = Connection::connect(url, ConnectionProperties::default()).await?;
    let publishing = Connection::connect(url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    let output = publishing.create_channel().await?;
    output
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await?;
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let (confirmed, mut confirms) =
        tokio::sync::mpsc::unbounded_channel::<(u64, PublisherConfirm)>();
    let acking = tokio::spawn({
        let channel = channel.clone();
        async move {
            let mut unacked = 0;
            while let Some((tag, confirm)) = confirms.recv().await {
                let confirmation = confirm.await?;
                if !confirmation.is_ack() || confirmation.take_message().is_some() {
                    return Err::<(), BoxError>("the broker refused an output".into());
                }
                unacked += 1;
                if unacked == RAW_RELAY_ACK_EVERY || confirms.is_empty() {
                    channel
                        .basic_ack(tag, BasicAckOptions { multiple: true })
                        .await?;
                    unacked = 0;
                }
            }
            Ok(())
        }
    });
    let mut received = 0;
    while let Some(delivery) = consumer.next().await {
        let delivery = delivery?;
        received += 1;
        let confirm = output
            .basic_publish(
                "".into(),
                relayed.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &delivery.data,
                BasicProperties::default().with_delivery_mode(2),
            )
            .await?;
        confirmed.send((delivery.delivery_tag, confirm))?;
        if received == count {
            break;
        }
    }
    drop(confirmed);
    acking.await??;
    channel.close(200, "done".into()).await?;
    connection.close(200, "done".into()).await?;
    publishing.close(200, "done".into()).await?;
    Ok(started.elapsed())
}

/// intake relay: `AmqpSource`, `Consumer` (unordered), and a handler whose
/// `Output` an `AmqpPublisher` publishes under `PublishLayer`.
async fn relay_intake(
    url: &str,
    queue: &str,
    relayed: &str,
    count: usize,
) -> Result<Duration, BoxError> {
    use tower::Service;

    let started = Instant::now();
    let source = AmqpSource::builder(url).queue(queue).build().await?;
    let acker = source.acker();
    let publisher = AmqpPublisher::builder(url).build().await?;
    let destination: Arc<str> = relayed.into();
    let relay = tower::ServiceBuilder::new()
        .layer(PublishLayer::new(publisher.clone()))
        .service(handler_fn(move |message: Message| {
            let output = Output::new(Arc::clone(&destination), message.payload().clone());
            async move { output }
        }));
    let shutdown = CancellationToken::new();
    let handled = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (handled, shutdown) = (handled.clone(), shutdown.clone());
        tower::service_fn(move |message: Message| {
            let mut relay = relay.clone();
            let (handled, shutdown) = (handled.clone(), shutdown.clone());
            async move {
                relay.call(message).await?;
                if handled.fetch_add(1, AtomicOrdering::Relaxed) + 1 == count {
                    shutdown.cancel();
                }
                Ok::<_, HandlerError>(())
            }
        })
    };
    let report = Consumer::builder()
        .max_in_flight(usize::from(PREFETCH))
        .ordering(DeliveryOrder::Unordered)
        .build(source, acker, handler)?
        .run(shutdown)
        .await?;
    publisher.close().await;
    if report.succeeded < count as u64 {
        return Err(format!("intake relayed {} of {count}", report.succeeded).into());
    }
    Ok(started.elapsed())
}
