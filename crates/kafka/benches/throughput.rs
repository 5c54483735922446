//! Consume throughput against a real broker: raw rdkafka, the intake Kafka
//! adapter alone, and the full intake runtime with a no-op handler, on the
//! same topic and data, interleaved over several rounds (the order rotates
//! each round).
//!
//! ```text
//! crates/kafka/benches/run.sh          # starts a broker, runs this, stops it
//! KAFKA_BROKERS=127.0.0.1:9092 BENCH_MESSAGES=1000000 BENCH_ROUNDS=3 \
//!     cargo bench -p intake-kafka --bench throughput
//! ```
//!
//! Each loop reads the whole topic from the start with a consumer group of
//! its own, and its time runs from the first message it sees to the last.
//! Besides msg/s it reports the process's CPU time per message
//! (`/proc/self/stat`, librdkafka's threads included), which a busy machine
//! disturbs less than wall-clock throughput.
//!
//! - `raw`: `BaseConsumer::poll`, read the payload, `store_offset_from_message`,
//!   librdkafka's auto-commit of stored offsets every 100 ms.
//! - `adapter`: `KafkaSource::next` in batches of up to 1024, read each
//!   payload, track the watermark per partition, and commit through
//!   `KafkaAcker` every 100 ms (one commit under way at a time, overlapping
//!   the reads, as the runtime does).
//! - `intake`: `Consumer` with a no-op `handler_fn`, `max_in_flight(1024)`,
//!   `fetch_batch(1024)`, in partition order (Kafka's default guarantee),
//!   committing every 100 ms.
//!
//! Two relay loops consume the topic, publish each message (payload and
//! key) to a new topic of the loop's own (4 partitions), and acknowledge
//! each input only after its output's delivery report, with at most 1024
//! inputs in flight (`BENCH_RELAY_WINDOW`) and the same producer settings
//! (idempotent, `linger.ms` 5, `murmur2_random`); their time runs from the
//! first confirmed output to the last:
//!
//! - `raw-relay`: `BaseConsumer::poll`, `ThreadedProducer::send` with the
//!   input's partition and offset as the delivery opaque, the delivery
//!   callback passing them back over a channel; per input partition the
//!   confirmed prefix is stored (`store_offset`) for librdkafka's auto-commit
//!   every 100 ms.
//! - `intake-relay`: `Consumer` in key order (`BENCH_RELAY_ORDER` picks
//!   `partition` or `unordered` instead; `max_in_flight` the window,
//!   `fetch_batch(1024)`) with `PublishLayer` over a `KafkaPublisher` and a
//!   `handler_fn` returning `Output::forward`, committing every 100 ms.
//!
//! - `txn-relay`: the exactly-once relay, `Consumer` as `intake-relay` but
//!   with the source built `exactly_once` and `KafkaTransactions::layer`
//!   keeping each input's `Output::forward` for the transaction that
//!   commits the input's offset (one transaction per commit, every 100 ms);
//!   its time runs from the first handled input to the moment every output
//!   is committed (looked at every 10 ms).
//!
//! Two produce loops publish 100-byte outputs with keys to a new topic, at
//! most the relay window unconfirmed, timed from the first send to the last
//! confirmation: `raw-produce` with `ThreadedProducer` and the relay's
//! delivery callback, `publisher` with `KafkaPublisher::send` and its
//! receipts.

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use intake_core::publish::{Output, PublishLayer};
use intake_core::{
    Consumer, DeliveryOrder, Message, PartitionKey, Payload, Position,
    backend::{AckBatch, Acker, PartitionAck, Source, SourceEvent},
    handler_fn,
};
use intake_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use intake_kafka::rdkafka::client::DefaultClientContext;
use intake_kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
use intake_kafka::rdkafka::error::{KafkaError, RDKafkaErrorCode};
use intake_kafka::rdkafka::producer::{
    BaseRecord, DefaultProducerContext, DeliveryResult, Producer, ProducerContext, ThreadedProducer,
};
use intake_kafka::rdkafka::{ClientConfig, ClientContext, Message as _};
use intake_kafka::{KafkaPublisher, KafkaSettings, KafkaSource, KafkaTransactions};
use tokio_util::sync::CancellationToken;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const PAYLOAD: usize = 100;
const PARTITIONS: i32 = 4;
const BATCH: usize = 1024;
const COMMIT_INTERVAL: Duration = Duration::from_millis(100);
/// A loop that sees no message for this long has stalled: the bench fails
/// rather than waiting forever.
const STALL: Duration = Duration::from_secs(30);

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.as_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{nanos}", std::process::id())
}

/// CPU time (user + system) of this process so far, every thread included.
fn process_cpu() -> Duration {
    // Fields 14 and 15 of /proc/self/stat, after the parenthesised name.
    let ticks = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            let fields: Vec<u64> = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|field| field.parse().ok())
                .collect();
            (fields.len() == 2).then(|| fields[0] + fields[1])
        })
        .unwrap_or(0);
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

/// The window a loop is timed over: from its first message to its last.
#[derive(Clone, Copy)]
struct Mark {
    at: Instant,
    cpu: Duration,
}

impl Mark {
    fn now() -> Self {
        Self {
            at: Instant::now(),
            cpu: process_cpu(),
        }
    }
}

/// What one loop measured.
#[derive(Clone, Copy)]
struct Measure {
    rate: f64,
    cpu_ns_per_message: f64,
    /// From the loop's start to its first message (joining the group).
    startup: Duration,
}

impl Measure {
    fn between(started: Instant, first: Mark, last: Mark, messages: usize) -> Self {
        let elapsed = last.at.duration_since(first.at).as_secs_f64();
        let cpu = last.cpu.saturating_sub(first.cpu).as_nanos() as f64;
        Self {
            rate: messages as f64 / elapsed,
            cpu_ns_per_message: cpu / messages as f64,
            startup: first.at.duration_since(started),
        }
    }
}

async fn create_topic(brokers: &str, prefix: &str) -> Result<String, BoxError> {
    let topic = unique(prefix);
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    for result in admin
        .create_topics(
            &[NewTopic::new(
                &topic,
                PARTITIONS,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new(),
        )
        .await?
    {
        result.map_err(|(name, code)| format!("create {name}: {code}"))?;
    }
    Ok(topic)
}

async fn prepare(brokers: &str, messages: usize) -> Result<String, BoxError> {
    let topic = create_topic(brokers, "intake-bench").await?;
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let payload = vec![b'x'; PAYLOAD];
    let started = Instant::now();
    for n in 0..messages {
        let key = (n % 1024).to_string();
        let mut record = BaseRecord::<str, [u8]>::to(&topic)
            .key(&key)
            .payload(&payload);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, unsent)) => {
                    record = unsent;
                    producer.poll(Duration::from_millis(10));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(300))?;
    eprintln!(
        "produced {messages} messages of {PAYLOAD} bytes to {topic} ({PARTITIONS} partitions) in {:.1?}",
        started.elapsed()
    );
    Ok(topic)
}

/// librdkafka settings every loop's consumer shares. A short session timeout
/// only makes joining the (new, empty) group faster; it changes nothing
/// once messages flow. The prefetch settings are the ones `KafkaSource`
/// applies by default (smaller bounds than librdkafka's own, and a 20 ms
/// instead of a 1 s backoff once a partition's queue is full): given to
/// every loop, so that the raw consumer prefetches exactly as the adapter's
/// does.
///
/// `BENCH_KAFKA_SET=key=value,key=value` adds librdkafka settings to every
/// loop (for comparing settings).
fn consumer_settings(brokers: &str) -> KafkaSettings {
    let settings = KafkaSettings::new(brokers)
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("queued.max.messages.kbytes", "16384")
        .set("fetch.max.bytes", "16777216")
        .set("fetch.queue.backoff.ms", "20");
    let extra: String = env_or("BENCH_KAFKA_SET", String::new());
    extra
        .split(',')
        .filter_map(|pair| pair.split_once('='))
        .fold(settings, |settings, (key, value)| settings.set(key, value))
}

fn raw(brokers: &str, topic: &str, messages: usize) -> Result<Measure, BoxError> {
    let started = Instant::now();
    let consumer: BaseConsumer = ClientConfig::clone(consumer_settings(brokers).client_config())
        .set("group.id", unique("bench-raw"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "100")
        .set("enable.auto.offset.store", "false")
        .create()?;
    consumer.subscribe(&[topic])?;
    let mut count = 0;
    let mut first = None;
    // The clock is read when a poll comes back empty, not for every
    // message: the loop measures rdkafka, not the bench.
    let mut last_progress = Instant::now();
    let mut progressed = false;
    while count < messages {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => {
                first.get_or_insert_with(Mark::now);
                black_box(message.payload().map(<[u8]>::len));
                consumer.store_offset_from_message(&message)?;
                count += 1;
                progressed = true;
            }
            Some(Err(error)) => return Err(error.into()),
            None if progressed => {
                progressed = false;
                last_progress = Instant::now();
            }
            None if last_progress.elapsed() > STALL => {
                return Err(format!("raw: stalled at {count} of {messages}").into());
            }
            None => {}
        }
    }
    let last = Mark::now();
    Ok(Measure::between(
        started,
        first.ok_or("raw: no message")?,
        last,
        messages,
    ))
}

/// The adapter's and the runtime's source; `BENCH_IGNORE_HEADERS=1` builds
/// it with `ignore_headers` (the raw loop reads no headers either).
async fn source(brokers: &str, topic: &str, group: &str) -> Result<KafkaSource, BoxError> {
    let builder = KafkaSource::builder(consumer_settings(brokers))
        .group(unique(group))
        .topic(topic);
    let builder = match env_or("BENCH_IGNORE_HEADERS", 0) {
        0 => builder,
        _ => builder.ignore_headers(),
    };
    Ok(builder.build().await?)
}

async fn adapter(brokers: &str, topic: &str, messages: usize) -> Result<Measure, BoxError> {
    let started = Instant::now();
    let mut source = source(brokers, topic, "bench-adapter").await?;
    let mut acker = Some(source.acker());
    let mut committing: Option<tokio::task::JoinHandle<_>> = None;
    let mut buffer = Vec::with_capacity(BATCH);
    // A handful of partitions: a linear search by number and name costs
    // less per message than hashing a key (and cloning its name) would.
    let mut watermarks: Vec<(PartitionKey, i64)> = Vec::new();
    let mut count = 0;
    let mut first = None;
    let mut last_commit = Instant::now();
    while count < messages {
        buffer.clear();
        let event = tokio::time::timeout(STALL, source.next(&mut buffer, BATCH))
            .await
            .map_err(|_| format!("adapter: stalled at {count} of {messages}"))??;
        if let SourceEvent::Delivered = event {
            first.get_or_insert_with(Mark::now);
            for message in buffer.drain(..) {
                black_box(message.payload().len());
                let metadata = message.metadata();
                if let Position::Offset(offset) = metadata.position() {
                    let known = watermarks.iter_mut().find(|(key, _)| {
                        key.partition == metadata.partition() && *key.source == **metadata.source()
                    });
                    match known {
                        Some((_, watermark)) => *watermark = offset,
                        None => watermarks.push((metadata.partition_key(), offset)),
                    }
                }
                count += 1;
            }
        }
        if committing.as_ref().is_some_and(|task| task.is_finished())
            && let Some(task) = committing.take()
        {
            let (returned, result): (_, Result<(), intake_core::backend::AckError>) = task.await?;
            result?;
            acker = Some(returned);
        }
        if last_commit.elapsed() >= COMMIT_INTERVAL
            && let Some(mut idle) = acker.take()
        {
            last_commit = Instant::now();
            let batch = AckBatch {
                partitions: watermarks
                    .iter()
                    .map(|(partition, offset)| {
                        let mut ack = PartitionAck::new(partition.clone());
                        ack.watermark = Some(Position::Offset(*offset));
                        ack
                    })
                    .collect(),
                sync: false,
            };
            committing = Some(tokio::spawn(async move {
                let result = idle.ack(&batch).await;
                (idle, result)
            }));
        }
    }
    let last = Mark::now();
    if let Some(task) = committing.take() {
        task.await?.1?;
    }
    source.close().await?;
    Ok(Measure::between(
        started,
        first.ok_or("adapter: no message")?,
        last,
        messages,
    ))
}

async fn intake(brokers: &str, topic: &str, messages: usize) -> Result<Measure, BoxError> {
    let started = Instant::now();
    let source = source(brokers, topic, "bench-intake").await?;
    let acker = source.acker();
    let progress = Arc::new(Progress {
        seen: AtomicUsize::new(0),
        first: Mutex::new(None),
        last: Mutex::new(None),
        done: CancellationToken::new(),
        messages,
    });
    let handler = {
        // One Arc: the fn is cloned for each message.
        let progress = progress.clone();
        handler_fn(move |Payload(payload): Payload| {
            black_box(payload.len());
            progress.record();
            std::future::ready(())
        })
    };
    let consumer = Consumer::builder()
        .max_in_flight(BATCH)
        .fetch_batch(BATCH)
        .ordering(DeliveryOrder::Partition)
        .commit_interval(COMMIT_INTERVAL)
        .build(source, acker, handler)?;
    let run = tokio::spawn(consumer.run(progress.done.clone()));
    let mut seen = 0;
    loop {
        tokio::select! {
            () = progress.done.cancelled() => break,
            () = tokio::time::sleep(STALL) => {
                let now = progress.seen.load(AtomicOrdering::Relaxed);
                if now == seen {
                    progress.done.cancel();
                    run.await??;
                    return Err(format!("intake: stalled at {now} of {messages}").into());
                }
                seen = now;
            }
        }
    }
    let report = run.await??;
    if report.succeeded < messages as u64 {
        return Err(format!("intake: {} of {messages} handled", report.succeeded).into());
    }
    let first = progress.mark(&progress.first).ok_or("intake: no message")?;
    let last = progress.mark(&progress.last).ok_or("intake: not done")?;
    Ok(Measure::between(started, first, last, messages))
}

/// The relay loops' producer settings: what `KafkaPublisher` applies by
/// default, given to the raw relay's producer too.
const RELAY_PRODUCER: [(&str, &str); 5] = [
    ("enable.idempotence", "true"),
    ("linger.ms", "5"),
    ("partitioner", "murmur2_random"),
    ("queue.buffering.max.messages", "100000"),
    ("queue.buffering.max.kbytes", "65536"),
];

/// The raw relay's producer context: each delivery report's opaque (the
/// input's partition and offset, see [`relay_opaque`]) back to the loop,
/// `None` for a failed delivery.
struct RelayContext {
    confirmed: mpsc::Sender<Option<usize>>,
}

impl ClientContext for RelayContext {}

impl ProducerContext for RelayContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        let _ = self.confirmed.send(result.is_ok().then_some(opaque));
    }
}

/// An input's partition (below 256) and offset in one word, so the raw
/// relay allocates nothing per message for its opaque.
fn relay_opaque(partition: i32, offset: i64) -> usize {
    ((offset as usize) << 8) | (partition as usize & 0xff)
}

/// Inputs of one partition in flight, in offset order, with whether each
/// one's output is confirmed.
#[derive(Default)]
struct InFlight {
    inputs: VecDeque<(i64, bool)>,
}

impl InFlight {
    /// Marks `offset` confirmed; returns the last offset of the confirmed
    /// prefix it released, if any.
    fn confirm(&mut self, offset: i64) -> Option<i64> {
        let front = self.inputs.front()?.0;
        // Offsets of a fresh topic without transactions are contiguous.
        let index = usize::try_from(offset - front).ok()?;
        match self.inputs.get_mut(index) {
            Some(entry) if entry.0 == offset => entry.1 = true,
            _ => self.inputs.iter_mut().find(|entry| entry.0 == offset)?.1 = true,
        }
        let mut released = None;
        while let Some(&(offset, true)) = self.inputs.front() {
            released = Some(offset);
            self.inputs.pop_front();
        }
        released
    }
}

fn raw_relay(
    brokers: &str,
    topic: &str,
    output: &str,
    messages: usize,
) -> Result<Measure, BoxError> {
    let started = Instant::now();
    let consumer: BaseConsumer = ClientConfig::clone(consumer_settings(brokers).client_config())
        .set("group.id", unique("bench-raw-relay"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "100")
        .set("enable.auto.offset.store", "false")
        .create()?;
    consumer.subscribe(&[topic])?;
    let (confirmed_tx, confirmed) = mpsc::channel();
    let producer: ThreadedProducer<RelayContext> = RELAY_PRODUCER
        .iter()
        .fold(
            ClientConfig::clone(KafkaSettings::new(brokers).client_config()),
            |mut config, (key, value)| {
                config.set(*key, *value);
                config
            },
        )
        .create_with_context(RelayContext {
            confirmed: confirmed_tx,
        })?;
    let mut pending: Vec<InFlight> = (0..PARTITIONS).map(|_| InFlight::default()).collect();
    let mut released: Vec<Option<i64>> = vec![None; PARTITIONS as usize];
    let window = relay_window();
    let (mut received, mut done, mut in_flight) = (0, 0, 0);
    let mut first = None;
    let mut last_progress = Instant::now();
    while done < messages {
        // Confirmations: wait for one when the window is full or nothing
        // is left to read, else take what has come.
        let mut next = if in_flight >= window || (received == messages && in_flight > 0) {
            match confirmed.recv_timeout(STALL) {
                Ok(opaque) => Some(opaque),
                Err(_) => return Err(format!("raw-relay: stalled at {done} of {messages}").into()),
            }
        } else {
            confirmed.try_recv().ok()
        };
        while let Some(opaque) = next {
            let opaque = opaque.ok_or("raw-relay: an output was not delivered")?;
            let (partition, offset) = (opaque & 0xff, (opaque >> 8) as i64);
            let in_partition = pending.get_mut(partition).ok_or("raw-relay: partition")?;
            if let Some(offset) = in_partition.confirm(offset) {
                released[partition] = Some(offset);
            }
            first.get_or_insert_with(Mark::now);
            in_flight -= 1;
            done += 1;
            next = confirmed.try_recv().ok();
        }
        for (partition, offset) in released.iter_mut().enumerate() {
            if let Some(offset) = offset.take() {
                consumer.store_offset(topic, partition as i32, offset)?;
            }
        }
        if received == messages || in_flight >= window {
            continue;
        }
        // With outputs in flight, a short poll: a confirmation may be due.
        let wait = match in_flight {
            0 => Duration::from_millis(100),
            _ => Duration::from_millis(1),
        };
        match consumer.poll(wait) {
            Some(Ok(message)) => {
                let partition = message.partition();
                let mut record = BaseRecord::<[u8], [u8], usize>::with_opaque_to(
                    output,
                    relay_opaque(partition, message.offset()),
                )
                .payload(message.payload().unwrap_or_default());
                if let Some(key) = message.key() {
                    record = record.key(key);
                }
                loop {
                    match producer.send(record) {
                        Ok(()) => break,
                        Err((
                            KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull),
                            unsent,
                        )) => {
                            record = unsent;
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        Err((error, _)) => return Err(error.into()),
                    }
                }
                pending
                    .get_mut(partition as usize)
                    .ok_or("raw-relay: partition")?
                    .inputs
                    .push_back((message.offset(), false));
                in_flight += 1;
                received += 1;
                last_progress = Instant::now();
            }
            Some(Err(error)) => return Err(error.into()),
            None if in_flight == 0 && last_progress.elapsed() > STALL => {
                return Err(format!("raw-relay: stalled at {received} of {messages}").into());
            }
            None => {}
        }
    }
    let last = Mark::now();
    Ok(Measure::between(
        started,
        first.ok_or("raw-relay: no message")?,
        last,
        messages,
    ))
}

/// Publishes `messages` outputs of 100 bytes (keys as in [`prepare`]) to a
/// new topic with librdkafka alone, at most the relay window unconfirmed.
fn raw_produce(brokers: &str, output: &str, messages: usize) -> Result<Measure, BoxError> {
    let started = Instant::now();
    let (confirmed_tx, confirmed) = mpsc::channel();
    let producer: ThreadedProducer<RelayContext> = RELAY_PRODUCER
        .iter()
        .fold(
            ClientConfig::clone(KafkaSettings::new(brokers).client_config()),
            |mut config, (key, value)| {
                config.set(*key, *value);
                config
            },
        )
        .create_with_context(RelayContext {
            confirmed: confirmed_tx,
        })?;
    let window = relay_window();
    let payload = vec![b'x'; PAYLOAD];
    let first = Mark::now();
    let (mut sent, mut done) = (0, 0);
    while done < messages {
        if sent < messages && sent - done < window {
            let key = (sent % 1024).to_string();
            let mut record = BaseRecord::<[u8], [u8], usize>::with_opaque_to(output, sent)
                .key(key.as_bytes())
                .payload(&payload);
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), unsent)) => {
                        record = unsent;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err((error, _)) => return Err(error.into()),
                }
            }
            sent += 1;
            while let Ok(delivered) = confirmed.try_recv() {
                delivered.ok_or("raw-produce: an output was not delivered")?;
                done += 1;
            }
        } else {
            confirmed
                .recv_timeout(STALL)
                .map_err(|_| format!("raw-produce: stalled at {done} of {messages}"))?
                .ok_or("raw-produce: an output was not delivered")?;
            done += 1;
        }
    }
    Ok(Measure::between(started, first, Mark::now(), messages))
}

/// What [`raw_produce`] does, through a [`KafkaPublisher`].
async fn publisher(brokers: &str, output: &str, messages: usize) -> Result<Measure, BoxError> {
    use intake_core::publish::Publisher as _;
    let started = Instant::now();
    let publisher = KafkaPublisher::builder(KafkaSettings::new(brokers)).build()?;
    let window = relay_window();
    let destination: Arc<str> = output.into();
    let payload = bytes::Bytes::from(vec![b'x'; PAYLOAD]);
    let mut receipts = VecDeque::with_capacity(window);
    let first = Mark::now();
    for n in 0..messages {
        if receipts.len() >= window
            && let Some(receipt) = receipts.pop_front()
        {
            receipt.await?;
        }
        let output =
            Output::new(Arc::clone(&destination), payload.clone()).with_key((n % 1024).to_string());
        receipts.push_back(publisher.send(output).await?);
    }
    for receipt in receipts {
        receipt.await?;
    }
    let last = Mark::now();
    publisher.close(Duration::from_secs(5)).await?;
    Ok(Measure::between(started, first, last, messages))
}

/// Inputs in flight in either relay loop: `BENCH_RELAY_WINDOW`, default
/// 1024.
fn relay_window() -> usize {
    env_or("BENCH_RELAY_WINDOW", BATCH)
}

/// The intake relay's delivery order: `BENCH_RELAY_ORDER=key` (default),
/// `partition` or `unordered`.
fn relay_order() -> Result<DeliveryOrder, BoxError> {
    match env_or("BENCH_RELAY_ORDER", "key".to_string()).as_str() {
        "key" => Ok(DeliveryOrder::Key),
        "partition" => Ok(DeliveryOrder::Partition),
        "unordered" => Ok(DeliveryOrder::Unordered),
        other => {
            Err(format!("BENCH_RELAY_ORDER `{other}`: use key, partition or unordered").into())
        }
    }
}

async fn intake_relay(
    brokers: &str,
    topic: &str,
    output: &str,
    messages: usize,
) -> Result<Measure, BoxError> {
    let started = Instant::now();
    let source = source(brokers, topic, "bench-intake-relay").await?;
    let acker = source.acker();
    let publisher = KafkaPublisher::builder(KafkaSettings::new(brokers)).build()?;
    let progress = Arc::new(Progress {
        seen: AtomicUsize::new(0),
        first: Mutex::new(None),
        last: Mutex::new(None),
        done: CancellationToken::new(),
        messages,
    });
    let destination: Arc<str> = output.into();
    let handler = tower::ServiceBuilder::new()
        .map_result({
            let progress = progress.clone();
            move |result: Result<(), intake_core::HandlerError>| {
                if result.is_ok() {
                    progress.record();
                }
                result
            }
        })
        .layer(PublishLayer::new(publisher))
        .service(handler_fn(move |message: Message| {
            std::future::ready(Output::forward(&message, Arc::clone(&destination)))
        }));
    let consumer = Consumer::builder()
        .max_in_flight(relay_window())
        .fetch_batch(BATCH)
        .ordering(relay_order()?)
        .commit_interval(COMMIT_INTERVAL)
        .build(source, acker, handler)?;
    let run = tokio::spawn(consumer.run(progress.done.clone()));
    let mut seen = 0;
    loop {
        tokio::select! {
            () = progress.done.cancelled() => break,
            () = tokio::time::sleep(STALL) => {
                let now = progress.seen.load(AtomicOrdering::Relaxed);
                if now == seen {
                    progress.done.cancel();
                    run.await??;
                    return Err(format!("intake-relay: stalled at {now} of {messages}").into());
                }
                seen = now;
            }
        }
    }
    let report = run.await??;
    if report.succeeded < messages as u64 {
        return Err(format!("intake-relay: {} of {messages} relayed", report.succeeded).into());
    }
    let first = progress
        .mark(&progress.first)
        .ok_or("intake-relay: no message")?;
    let last = progress
        .mark(&progress.last)
        .ok_or("intake-relay: not done")?;
    Ok(Measure::between(started, first, last, messages))
}

/// The exactly-once relay: as [`intake_relay`], its outputs kept by the
/// transactions' layer and committed with the offsets in Kafka
/// transactions. Done when every input was handled and no output waits for
/// its transaction.
async fn txn_relay(
    brokers: &str,
    topic: &str,
    output: &str,
    messages: usize,
) -> Result<Measure, BoxError> {
    let started = Instant::now();
    let transactions = KafkaTransactions::new(KafkaSettings::new(brokers), unique("bench-txn"));
    let source = KafkaSource::builder(consumer_settings(brokers))
        .group(unique("bench-txn-relay"))
        .topic(topic)
        .exactly_once(&transactions)
        .build()
        .await?;
    let acker = source.acker();
    // Handled is not done here: `last` is marked below, once committed.
    let progress = Arc::new(Progress {
        seen: AtomicUsize::new(0),
        first: Mutex::new(None),
        last: Mutex::new(None),
        done: CancellationToken::new(),
        messages: usize::MAX,
    });
    let destination: Arc<str> = output.into();
    let handler = tower::ServiceBuilder::new()
        .map_result({
            let progress = progress.clone();
            move |result: Result<(), intake_core::HandlerError>| {
                if result.is_ok() {
                    progress.record();
                }
                result
            }
        })
        .layer(transactions.layer())
        .service(handler_fn(move |message: Message| {
            std::future::ready(Output::forward(&message, Arc::clone(&destination)))
        }));
    let consumer = Consumer::builder()
        .max_in_flight(relay_window())
        .fetch_batch(BATCH)
        .ordering(relay_order()?)
        .commit_interval(COMMIT_INTERVAL)
        .build(source, acker, handler)?;
    let run = tokio::spawn(consumer.run(progress.done.clone()));
    let mut seen = 0;
    let mut checked = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let now = progress.seen.load(AtomicOrdering::Relaxed);
        if now >= messages && transactions.outputs_held() == 0 {
            *progress.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(Mark::now());
            break;
        }
        if checked.elapsed() >= STALL {
            if now == seen {
                progress.done.cancel();
                run.await??;
                return Err(format!("txn-relay: stalled at {now} of {messages}").into());
            }
            seen = now;
            checked = Instant::now();
        }
    }
    progress.done.cancel();
    let report = run.await??;
    if report.succeeded < messages as u64 {
        return Err(format!("txn-relay: {} of {messages} relayed", report.succeeded).into());
    }
    let first = progress
        .mark(&progress.first)
        .ok_or("txn-relay: no message")?;
    let last = progress.mark(&progress.last).ok_or("txn-relay: not done")?;
    Ok(Measure::between(started, first, last, messages))
}

/// What the intake loop's handler records.
struct Progress {
    seen: AtomicUsize,
    first: Mutex<Option<Mark>>,
    last: Mutex<Option<Mark>>,
    done: CancellationToken,
    messages: usize,
}

impl Progress {
    fn record(&self) {
        let count = self.seen.fetch_add(1, AtomicOrdering::Relaxed) + 1;
        if count == 1 {
            *self.first.lock().unwrap_or_else(|p| p.into_inner()) = Some(Mark::now());
        }
        if count == self.messages {
            *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(Mark::now());
            self.done.cancel();
        }
    }

    fn mark(&self, mark: &Mutex<Option<Mark>>) -> Option<Mark> {
        *mark.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct Results {
    name: &'static str,
    measures: Vec<Measure>,
}

impl Results {
    fn median(&self) -> Measure {
        let mut rates: Vec<f64> = self.measures.iter().map(|m| m.rate).collect();
        let mut cpu: Vec<f64> = self.measures.iter().map(|m| m.cpu_ns_per_message).collect();
        rates.sort_by(f64::total_cmp);
        cpu.sort_by(f64::total_cmp);
        Measure {
            rate: rates[rates.len() / 2],
            cpu_ns_per_message: cpu[cpu.len() / 2],
            startup: Duration::ZERO,
        }
    }

    fn best(&self) -> f64 {
        self.measures.iter().map(|m| m.rate).fold(0.0, f64::max)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let brokers: String = env_or("KAFKA_BROKERS", "127.0.0.1:9092".to_string());
    let messages: usize = env_or("BENCH_MESSAGES", 1_000_000);
    let rounds: usize = env_or("BENCH_ROUNDS", 3);
    // A comma-separated subset of the loops (for profiling one).
    let only: String = env_or(
        "BENCH_LOOPS",
        "raw,adapter,intake,raw-relay,intake-relay,raw-produce,publisher,txn-relay".to_string(),
    );
    let address: std::net::SocketAddr = brokers
        .split(',')
        .next()
        .unwrap_or_default()
        .parse()
        .map_err(|error| format!("KAFKA_BROKERS `{brokers}`: {error} (use host:port)"))?;
    if std::net::TcpStream::connect_timeout(&address, Duration::from_secs(1)).is_err() {
        println!("skipped: no Kafka broker on {brokers}");
        return Ok(());
    }
    // An existing topic of at least BENCH_MESSAGES messages may be reused
    // (for profiling one loop without the producing).
    let topic = match std::env::var("BENCH_TOPIC") {
        Ok(topic) => topic,
        Err(_) => prepare(&brokers, messages).await?,
    };
    let mut results = [
        "raw",
        "adapter",
        "intake",
        "raw-relay",
        "intake-relay",
        "raw-produce",
        "publisher",
        "txn-relay",
    ]
    .map(|name| Results {
        name,
        measures: Vec::new(),
    });
    for round in 0..rounds {
        for turn in 0..results.len() {
            let index = (round + turn) % results.len();
            if !only.split(',').any(|name| name == results[index].name) {
                continue;
            }
            let started = Instant::now();
            let measure = match index {
                0 => {
                    let (brokers, topic) = (brokers.clone(), topic.clone());
                    tokio::task::spawn_blocking(move || raw(&brokers, &topic, messages)).await??
                }
                1 => adapter(&brokers, &topic, messages).await?,
                2 => intake(&brokers, &topic, messages).await?,
                3 => {
                    let output = create_topic(&brokers, "intake-bench-raw-relayed").await?;
                    let (brokers, topic) = (brokers.clone(), topic.clone());
                    tokio::task::spawn_blocking(move || {
                        raw_relay(&brokers, &topic, &output, messages)
                    })
                    .await??
                }
                4 => {
                    let output = create_topic(&brokers, "intake-bench-relayed").await?;
                    intake_relay(&brokers, &topic, &output, messages).await?
                }
                5 => {
                    let output = create_topic(&brokers, "intake-bench-raw-produced").await?;
                    let brokers = brokers.clone();
                    tokio::task::spawn_blocking(move || raw_produce(&brokers, &output, messages))
                        .await??
                }
                6 => {
                    let output = create_topic(&brokers, "intake-bench-published").await?;
                    publisher(&brokers, &output, messages).await?
                }
                _ => {
                    let output = create_topic(&brokers, "intake-bench-txn-relayed").await?;
                    txn_relay(&brokers, &topic, &output, messages).await?
                }
            };
            eprintln!(
                "round {round}: {:<12} {:>10.0} msg/s {:>6.0} ns CPU/msg (first message after {:.1?}, loop {:.1?})",
                results[index].name,
                measure.rate,
                measure.cpu_ns_per_message,
                measure.startup,
                started.elapsed()
            );
            results[index].measures.push(measure);
        }
    }
    println!(
        "{messages} messages of {PAYLOAD} bytes, {PARTITIONS} partitions, {rounds} interleaved rounds, brokers {brokers}, BENCH_IGNORE_HEADERS={}",
        env_or("BENCH_IGNORE_HEADERS", 0)
    );
    // Each group's first loop is its baseline; a loop left out by
    // BENCH_LOOPS is left out of its table.
    for (group, baseline) in [
        (&[0, 1, 2][..], "raw"),
        (&[3, 4, 7][..], "raw-relay"),
        (&[5, 6][..], "raw-produce"),
    ] {
        let measured: Vec<&Results> = group
            .iter()
            .map(|index| &results[*index])
            .filter(|loop_results| !loop_results.measures.is_empty())
            .collect();
        if measured.len() < 2 || measured[0].name != baseline {
            continue;
        }
        let raw = measured[0].median();
        println!(
            "| loop | best msg/s | median msg/s | median / {baseline} median | median ns CPU/msg | CPU / {baseline} CPU |"
        );
        println!("|---|---|---|---|---|---|");
        for loop_results in measured {
            let median = loop_results.median();
            println!(
                "| {} | {:.0} | {:.0} | {:.3} | {:.0} | {:.2} |",
                loop_results.name,
                loop_results.best(),
                median.rate,
                median.rate / raw.rate,
                median.cpu_ns_per_message,
                median.cpu_ns_per_message / raw.cpu_ns_per_message
            );
        }
    }
    Ok(())
}
