//! Consumer throughput against the nats-server on 127.0.0.1:4222: raw
//! async-nats loops versus intake with a no-op handler, on the same stream.
//!
//! The bench fills one stream with 200,000 messages of 100 bytes
//! (acknowledged by JetStream, not timed); each loop then reads all of it
//! from the start through a durable pull consumer of its own, and stops
//! once every message is acknowledged. The loops alternate over the
//! rounds, their order rotating, so none always runs first.
//!
//! - raw: async-nats alone: pull a batch of 1000 (`consumer.batch()`),
//!   touch each payload, ack each message (`+ACK`, not confirmed), pull
//!   the next batch;
//! - raw-async-acks: the same, with each batch's acks sent by a task of
//!   their own while the next batch is pulled;
//! - raw-confirmed-acks: the same, the last ack of each batch sent with a
//!   reply subject and the server's one confirmation awaited by that task,
//!   as intake's acker does (the raw loops above never learn whether an
//!   ack arrived: a lost one is a redelivery after `ack_wait`);
//! - intake: `NatsSource` + `Consumer` with `max_in_flight(1000)`,
//!   unordered, a no-op handler; acks as the commit engine batches them,
//!   each batch confirmed by the server. Its consumer has the raw loops'
//!   `max_ack_pending` (10,000); `INTAKE_BENCH_MAX_ACK_PENDING=default`
//!   leaves the library's default (the budget, 1,000), `=<n>` sets another;
//! - intake-ordered: the same in partition order (the default ordering:
//!   one message at a time, as a stream is one partition).
//!
//! Two relay loops read the stream the same way, publish each payload to
//! a stream of the bench's own (subject `relayed.<pid>.<loop>.<token>`, the
//! token the input's subject with its dots replaced: what
//! `NatsPublisher` makes of a key), and acknowledge each input only after
//! its output's JetStream publish ack:
//!
//! - raw-relay: async-nats alone: pull a batch of 1000, publish each
//!   payload (`jetstream::Context::publish`, pipelined), then a task awaits
//!   the batch's publish acks in order, acking each input after its output
//!   (`+ACK`, not confirmed) while the next batch is pulled and published;
//! - intake-relay: `NatsSource` + `Consumer` with `max_in_flight(1000)` in
//!   key order (the subject; `INTAKE_BENCH_RELAY_ORDER=unordered` or
//!   `partition` instead), `PublishLayer` over a `NatsPublisher`
//!   (`max_unconfirmed(1000)`) and a handler returning `Output::forward`;
//!   acks confirmed in batches as always.
//!
//! Each relay run checks that the output stream grew by the messages
//! relayed, then purges it.
//!
//! Besides msg/s it reports the client process's CPU time per message
//! (`/proc/self/stat`), which a busy machine disturbs far less.
//!
//! ```text
//! cargo bench -p intake-nats --bench throughput
//! INTAKE_BENCH_MESSAGES=100000 INTAKE_BENCH_ROUNDS=5 cargo bench -p intake-nats --bench throughput
//! INTAKE_BENCH_ONLY=intake perf record -g target/release/deps/throughput-…
//! INTAKE_BENCH_ONLY=raw,raw-async-acks,intake,intake-ordered cargo bench -p intake-nats --bench throughput
//! ```
//!
//! Skips (exit 0, with a reason) when no server answers, unless
//! `INTAKE_REQUIRE_BROKERS=1`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use intake_core::publish::{Output, PublishLayer};
use intake_core::{Consumer, DeliveryOrder, HandlerError, Message, handler_fn};
use intake_nats::async_nats::{self, jetstream};
use intake_nats::{NatsPublisher, NatsSource};
use tokio_util::sync::CancellationToken;

const BATCH: usize = 1000;
const PAYLOAD_BYTES: usize = 100;
const ACK: bytes::Bytes = bytes::Bytes::from_static(b"+ACK");

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
    RawAsyncAcks,
    RawConfirmedAcks,
    Intake,
    IntakeOrdered,
    RawRelay,
    IntakeRelay,
}

/// How a raw loop acknowledges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Acks {
    /// `+ACK` per message, in the loop.
    Inline,
    /// A batch's `+ACK`s from a task of their own.
    Async,
    /// The same, the last with a reply subject, its confirmation awaited.
    AsyncConfirmed,
}

impl Contender {
    const ALL: [Contender; 7] = [
        Contender::Raw,
        Contender::RawAsyncAcks,
        Contender::RawConfirmedAcks,
        Contender::Intake,
        Contender::IntakeOrdered,
        Contender::RawRelay,
        Contender::IntakeRelay,
    ];

    fn name(self) -> &'static str {
        match self {
            Contender::Raw => "raw",
            Contender::RawAsyncAcks => "raw-async-acks",
            Contender::RawConfirmedAcks => "raw-confirmed-acks",
            Contender::Intake => "intake",
            Contender::IntakeOrdered => "intake-ordered",
            Contender::RawRelay => "raw-relay",
            Contender::IntakeRelay => "intake-relay",
        }
    }

    fn relays(self) -> bool {
        matches!(self, Contender::RawRelay | Contender::IntakeRelay)
    }
}

/// One loop's run.
struct Sample {
    contender: Contender,
    rate: f64,
    cpu_per_message: Option<Duration>,
}

fn main() -> Result<(), BoxError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run())
}

async fn run() -> Result<(), BoxError> {
    let url = std::env::var("INTAKE_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let messages = setting("INTAKE_BENCH_MESSAGES", 200_000);
    let rounds = setting("INTAKE_BENCH_ROUNDS", 3);
    // A comma-separated list of loops to run (all when unset).
    let only: Option<Vec<Contender>> = std::env::var("INTAKE_BENCH_ONLY").ok().map(|only| {
        only.split(',')
            .filter_map(|name| Contender::ALL.into_iter().find(|c| c.name() == name.trim()))
            .collect()
    });
    let client = match async_nats::connect(&url).await {
        Ok(client) => client,
        Err(error) if intake_core::backend::testkit::brokers_required() => {
            return Err(format!("NATS is required but: {error}").into());
        }
        Err(error) => {
            println!("skipped: no NATS server at {url}: {error}");
            return Ok(());
        }
    };
    let context = jetstream::new(client.clone());
    let stream = format!("intake_bench_{}", std::process::id());
    context
        .create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("bench.{stream}.>")],
            ..Default::default()
        })
        .await?;
    fill(&context, &stream, messages).await?;
    let relayed = format!("intake_bench_relayed_{}", std::process::id());
    let relayed_prefix = format!("relayed.{}", std::process::id());
    context
        .create_stream(jetstream::stream::Config {
            name: relayed.clone(),
            subjects: vec![format!("{relayed_prefix}.>")],
            ..Default::default()
        })
        .await?;
    let relay_order = match std::env::var("INTAKE_BENCH_RELAY_ORDER").as_deref() {
        Ok("unordered") => DeliveryOrder::Unordered,
        Ok("partition") => DeliveryOrder::Partition,
        _ => DeliveryOrder::Key,
    };
    println!("{messages} messages of {PAYLOAD_BYTES} bytes, batches of {BATCH}, {rounds} rounds");
    let mut samples = Vec::new();
    for round in 0..rounds {
        let mut order = Contender::ALL;
        order.rotate_left(round % Contender::ALL.len());
        for contender in order {
            if only.as_ref().is_some_and(|only| !only.contains(&contender)) {
                continue;
            }
            let consumer = format!("{}_{round}", contender.name().replace('-', "_"));
            let cpu_before = process_cpu();
            let elapsed = match contender {
                Contender::Raw => raw(&context, &stream, &consumer, messages, Acks::Inline).await?,
                Contender::RawAsyncAcks => {
                    raw(&context, &stream, &consumer, messages, Acks::Async).await?
                }
                Contender::RawConfirmedAcks => {
                    raw(&context, &stream, &consumer, messages, Acks::AsyncConfirmed).await?
                }
                Contender::Intake => {
                    intake(&url, &stream, &consumer, messages, DeliveryOrder::Unordered).await?
                }
                Contender::IntakeOrdered => {
                    intake(&url, &stream, &consumer, messages, DeliveryOrder::Partition).await?
                }
                Contender::RawRelay => {
                    let output = format!("{relayed_prefix}.{consumer}");
                    raw_relay(&context, &stream, &consumer, &output, messages).await?
                }
                Contender::IntakeRelay => {
                    let output = format!("{relayed_prefix}.{consumer}");
                    let ordering = relay_order;
                    intake_relay(&url, &stream, &consumer, &output, messages, ordering).await?
                }
            };
            let cpu_per_message = process_cpu()
                .zip(cpu_before)
                .map(|(after, before)| (after - before) / messages as u32);
            all_acknowledged(&context, &stream, &consumer).await?;
            if contender.relays() {
                all_relayed(&context, &relayed, messages).await?;
            }
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
    context.delete_stream(&stream).await?;
    context.delete_stream(&relayed).await?;
    summarize(&samples);
    Ok(())
}

/// Publishes `count` messages, every JetStream ack awaited, in windows.
async fn fill(context: &jetstream::Context, stream: &str, count: usize) -> Result<(), BoxError> {
    let payload = bytes::Bytes::from(vec![b'x'; PAYLOAD_BYTES]);
    let mut acks = Vec::with_capacity(1000);
    for index in 0..count {
        acks.push(
            context
                .publish(format!("bench.{stream}.{}", index % 64), payload.clone())
                .await?,
        );
        if acks.len() == 1000 || index + 1 == count {
            for ack in acks.drain(..) {
                ack.await?;
            }
        }
    }
    Ok(())
}

/// Fails unless `consumer` has nothing pending and nothing unacknowledged
/// (raw acks are not confirmed: waits up to 10 s for the server to count
/// them).
async fn all_acknowledged(
    context: &jetstream::Context,
    stream: &str,
    consumer: &str,
) -> Result<(), BoxError> {
    let handle = context.get_stream(stream).await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = handle.consumer_info(consumer).await?;
        if info.num_ack_pending == 0 && info.num_pending == 0 {
            handle.delete_consumer(consumer).await?;
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{consumer}: {} unacknowledged, {} not delivered",
                info.num_ack_pending, info.num_pending
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Raw async-nats: a durable pull consumer, batches of 1000, an ack per
/// message; with [`Acks::Async`], a batch's acks go out from a task of
/// their own while the next batch is pulled; with [`Acks::AsyncConfirmed`]
/// that task also waits for the server's confirmation of the batch.
async fn raw(
    context: &jetstream::Context,
    stream: &str,
    name: &str,
    count: usize,
    acks: Acks,
) -> Result<Duration, BoxError> {
    let started = Instant::now();
    let consumer: jetstream::consumer::PullConsumer = context
        .get_stream(stream)
        .await?
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some(name.to_owned()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            max_ack_pending: 10 * BATCH as i64,
            ..Default::default()
        })
        .await?;
    let mut received = 0;
    let mut acking: Option<tokio::task::JoinHandle<Result<(), BoxError>>> = None;
    let mut touched = 0usize;
    // Confirmations: one subscription, lent to the batch's ack task and
    // given back when it is done.
    let confirm_inbox = context.client().new_inbox();
    let mut confirmations = Some(
        context
            .client()
            .subscribe(format!("{confirm_inbox}.*"))
            .await?,
    );
    let mut returning: Option<tokio::sync::oneshot::Receiver<async_nats::Subscriber>> = None;
    let mut round = 0u64;
    while received < count {
        let mut batch = consumer
            .batch()
            .max_messages(BATCH.min(count - received))
            .expires(Duration::from_secs(5))
            .messages()
            .await?;
        let mut ackers = Vec::with_capacity(BATCH);
        let mut subjects = Vec::with_capacity(BATCH);
        while let Some(message) = batch.next().await {
            let message = message?;
            touched = touched.wrapping_add(message.payload.len());
            received += 1;
            match acks {
                Acks::Inline => message.ack().await?,
                Acks::Async => ackers.push(message.split().1),
                Acks::AsyncConfirmed => subjects.push(
                    message
                        .reply
                        .clone()
                        .ok_or("a delivery without an ack subject")?,
                ),
            }
        }
        if acks != Acks::Inline {
            if let Some(previous) = acking.take() {
                previous.await??;
            }
            if let Some(returned) = returning.take() {
                confirmations = Some(returned.await?);
            }
            acking = Some(match acks {
                Acks::AsyncConfirmed => {
                    round += 1;
                    let reply = async_nats::Subject::from(format!("{confirm_inbox}.{round}"));
                    let client = context.client();
                    let mut replies = confirmations.take().ok_or("the confirmation task failed")?;
                    let (give_back, returned) = tokio::sync::oneshot::channel();
                    returning = Some(returned);
                    tokio::spawn(async move {
                        // All but the last plain, the last with the reply
                        // subject: one confirmation for the batch, as
                        // intake's acker does (see `src/confirm.rs`).
                        let mut subjects = subjects;
                        let Some(last) = subjects.pop() else {
                            let _ = give_back.send(replies);
                            return Ok(());
                        };
                        for subject in subjects {
                            client.publish(subject, ACK.clone()).await?;
                        }
                        client
                            .publish_with_reply(last, reply.clone(), ACK.clone())
                            .await?;
                        loop {
                            let answer =
                                tokio::time::timeout(Duration::from_secs(10), replies.next())
                                    .await?
                                    .ok_or("the confirmation subscription ended")?;
                            if answer.subject == reply {
                                break;
                            }
                        }
                        let _ = give_back.send(replies);
                        Ok(())
                    })
                }
                _ => tokio::spawn(async move {
                    for acker in ackers {
                        acker.ack().await?;
                    }
                    Ok(())
                }),
            });
        }
    }
    if let Some(last) = acking.take() {
        last.await??;
    }
    context.client().flush().await?;
    std::hint::black_box(touched);
    Ok(started.elapsed())
}

/// Fails unless the output stream holds `count` messages; purges it.
async fn all_relayed(
    context: &jetstream::Context,
    relayed: &str,
    count: usize,
) -> Result<(), BoxError> {
    let mut handle = context.get_stream(relayed).await?;
    let stored = handle.info().await?.state.messages;
    handle.purge().await?;
    if stored != count as u64 {
        return Err(format!("{stored} outputs stored of {count} relayed").into());
    }
    Ok(())
}

/// The output subject of an input on `subject`: what `NatsPublisher` makes
/// of `Output::forward` (the key, the input's subject, as the last token).
fn relay_subject(output: &str, subject: &str) -> String {
    let mut relayed = String::with_capacity(output.len() + 1 + subject.len());
    relayed.push_str(output);
    relayed.push('.');
    relayed.extend(subject.chars().map(|c| match c {
        '.' | '*' | '>' => '_',
        c => c,
    }));
    relayed
}

/// Raw async-nats relay: batches of 1000; each payload published at once
/// (pipelined), then a task awaits the batch's publish acks in order and
/// acks each input after its output while the next batch is pulled.
async fn raw_relay(
    context: &jetstream::Context,
    stream: &str,
    name: &str,
    output: &str,
    count: usize,
) -> Result<Duration, BoxError> {
    let started = Instant::now();
    let consumer: jetstream::consumer::PullConsumer = context
        .get_stream(stream)
        .await?
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some(name.to_owned()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            max_ack_pending: 10 * BATCH as i64,
            ..Default::default()
        })
        .await?;
    let mut received = 0;
    let mut acking: Option<tokio::task::JoinHandle<Result<(), BoxError>>> = None;
    while received < count {
        let mut batch = consumer
            .batch()
            .max_messages(BATCH.min(count - received))
            .expires(Duration::from_secs(5))
            .messages()
            .await?;
        let mut pending = Vec::with_capacity(BATCH);
        while let Some(message) = batch.next().await {
            let (message, acker) = message?.split();
            received += 1;
            let subject = relay_subject(output, &message.subject);
            let ack = context.publish(subject, message.payload).await?;
            pending.push((ack, acker));
        }
        if let Some(previous) = acking.take() {
            previous.await??;
        }
        acking = Some(tokio::spawn(async move {
            for (ack, acker) in pending {
                ack.await?;
                acker.ack().await?;
            }
            Ok(())
        }));
    }
    if let Some(last) = acking.take() {
        last.await??;
    }
    context.client().flush().await?;
    Ok(started.elapsed())
}

/// intake relay: `NatsSource`, `Consumer`, `PublishLayer` over a
/// `NatsPublisher`, a handler forwarding each input.
async fn intake_relay(
    url: &str,
    stream: &str,
    name: &str,
    output: &str,
    count: usize,
    ordering: DeliveryOrder,
) -> Result<Duration, BoxError> {
    let started = Instant::now();
    let source = NatsSource::builder(url)
        .stream(stream)
        .consumer(name)
        .build()
        .await?;
    let acker = source.acker();
    let publisher = NatsPublisher::builder(url)
        .max_unconfirmed(BATCH)
        .build()
        .await?;
    let shutdown = CancellationToken::new();
    let relayed = Arc::new(AtomicUsize::new(0));
    let destination: Arc<str> = output.into();
    let handler = tower::ServiceBuilder::new()
        .map_result({
            let (relayed, shutdown) = (relayed.clone(), shutdown.clone());
            move |result: Result<(), HandlerError>| {
                if result.is_ok() && relayed.fetch_add(1, AtomicOrdering::Relaxed) + 1 == count {
                    shutdown.cancel();
                }
                result
            }
        })
        .layer(PublishLayer::new(publisher))
        .service(handler_fn(move |message: Message| {
            std::future::ready(Output::forward(&message, Arc::clone(&destination)))
        }));
    let report = Consumer::builder()
        .max_in_flight(BATCH)
        .ordering(ordering)
        .build(source, acker, handler)?
        .run(shutdown)
        .await?;
    let elapsed = started.elapsed();
    if report.succeeded < count as u64 {
        return Err(format!("intake relayed {} of {count}", report.succeeded).into());
    }
    Ok(elapsed)
}

/// intake: `NatsSource` and `Consumer` with a no-op handler.
async fn intake(
    url: &str,
    stream: &str,
    name: &str,
    count: usize,
    ordering: DeliveryOrder,
) -> Result<Duration, BoxError> {
    let started = Instant::now();
    let mut builder = NatsSource::builder(url).stream(stream).consumer(name);
    // The raw loops' consumer setting, unless asked for another or for the
    // library's default (`default`: the budget, 1000 here).
    match std::env::var("INTAKE_BENCH_MAX_ACK_PENDING").as_deref() {
        Ok("default") => {}
        Ok(pending) => builder = builder.max_ack_pending(pending.parse()?),
        Err(_) => builder = builder.max_ack_pending(10 * BATCH as i64),
    }
    let source = builder.build().await?;
    let built = started.elapsed();
    let acker = source.acker();
    let counters = source.counters();
    let shutdown = CancellationToken::new();
    let handled = Arc::new(AtomicUsize::new(0));
    // When the first message was handled, and the last.
    let first = Arc::new(std::sync::OnceLock::new());
    let last = Arc::new(std::sync::OnceLock::new());
    let handler = {
        let (handled, shutdown) = (handled.clone(), shutdown.clone());
        let (first, last) = (first.clone(), last.clone());
        tower::service_fn(move |message: Message| {
            std::hint::black_box(message.payload().len());
            let done = handled.fetch_add(1, AtomicOrdering::Relaxed) + 1;
            if done == 1 {
                let _ = first.set(Instant::now());
            }
            if done == count {
                let _ = last.set(Instant::now());
                shutdown.cancel();
            }
            std::future::ready(Ok::<_, HandlerError>(()))
        })
    };
    let report = Consumer::builder()
        .max_in_flight(BATCH)
        .ordering(ordering)
        .build(source, acker, handler)?
        .run(shutdown)
        .await?;
    let elapsed = started.elapsed();
    if report.succeeded < count as u64 {
        return Err(format!("intake handled {} of {count}", report.succeeded).into());
    }
    let ms = |duration: Duration| duration.as_secs_f64() * 1000.0;
    let since = |from: Option<&Instant>, to: Option<&Instant>| {
        from.zip(to)
            .map_or(0.0, |(from, to)| ms(to.duration_since(*from)))
    };
    println!(
        "         {name}: {} pull requests, {:.0} messages per request; build {:.0} ms, to the first message {:.0} ms, first to last {:.0} ms, stop {:.0} ms",
        counters.pull_requests(),
        count as f64 / counters.pull_requests().max(1) as f64,
        ms(built),
        since(Some(&(started + built)), first.get()),
        since(first.get(), last.get()),
        since(last.get(), Some(&(started + elapsed))),
    );
    Ok(elapsed)
}

fn median<T: Copy>(sorted: &[T]) -> Option<T> {
    sorted.get(sorted.len() / 2).copied()
}

/// Best, median and worst rate per loop, against the better raw loop.
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
    // The better raw loop, by median, is the reference.
    let reference = [Contender::Raw, Contender::RawAsyncAcks]
        .into_iter()
        .max_by(|a, b| {
            median(&rates(*a))
                .unwrap_or(0.0)
                .total_cmp(&median(&rates(*b)).unwrap_or(0.0))
        })
        .unwrap_or(Contender::Raw);
    let best_raw = rates(reference);
    let (raw_best, raw_median) = (best_raw.last().copied(), median(&best_raw));
    let raw_cpu = cpu(reference);
    println!();
    println!(
        "reference: the better raw loop by median, {}",
        reference.name()
    );
    println!("relay loops against raw-relay");
    println!(
        "| loop | best msg/s | median msg/s | worst msg/s | best / raw best | median / raw median | median ns CPU/msg | CPU / raw CPU |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let relay_rates = rates(Contender::RawRelay);
    let (relay_best, relay_median) = (relay_rates.last().copied(), median(&relay_rates));
    let relay_cpu = cpu(Contender::RawRelay);
    for contender in Contender::ALL {
        // Relays against the raw relay, the others against the raw loop.
        let (raw_best, raw_median, raw_cpu) = match contender.relays() {
            true => (relay_best, relay_median, relay_cpu),
            false => (raw_best, raw_median, raw_cpu),
        };
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
/// `/proc/self/stat` (Linux; 10 ms resolution, fine over seconds).
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let user: u64 = fields.get(11)?.parse().ok()?;
    let system: u64 = fields.get(12)?.parse().ok()?;
    const TICKS_PER_SECOND: u64 = 100;
    Some(Duration::from_millis(
        (user + system) * 1000 / TICKS_PER_SECOND,
    ))
}
