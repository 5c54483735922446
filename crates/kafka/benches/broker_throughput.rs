//! Consume throughput against a real broker, raw rdkafka versus the intake
//! adapter, on the same topic and data, interleaved over several rounds.
//!
//! ```text
//! KAFKA_BROKERS=127.0.0.1:9092 BENCH_MESSAGES=1000000 BENCH_ROUNDS=3 \
//!     cargo bench -p intake-kafka --bench broker_throughput
//! ```
//!
//! Loops (each with a fresh group reading the topic from the start):
//! - raw: `BaseConsumer::poll`, read the payload, `store_offset`, periodic
//!   auto-commit of stored offsets;
//! - adapter: `KafkaSource::next` in batches, read the payload, the
//!   watermark per partition, `KafkaAcker::ack` every 100 ms.

use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use intake_core::{AckBatch, Acker, PartitionAck, PartitionKey, Position, Source};
use intake_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use intake_kafka::rdkafka::client::DefaultClientContext;
use intake_kafka::rdkafka::consumer::{BaseConsumer, Consumer};
use intake_kafka::rdkafka::producer::{
    BaseRecord, DefaultProducerContext, Producer, ThreadedProducer,
};
use intake_kafka::rdkafka::{ClientConfig, Message as _};
use intake_kafka::{KafkaSettings, KafkaSource};

const PAYLOAD: usize = 100;
const PARTITIONS: i32 = 4;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{nanos}", std::process::id())
}

async fn prepare(brokers: &str, messages: usize) -> Result<String, Box<dyn std::error::Error>> {
    let topic = unique("intake-bench");
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
        "produced {messages} messages of {PAYLOAD} bytes to {topic} in {:?}",
        started.elapsed()
    );
    Ok(topic)
}

fn raw(brokers: &str, topic: &str, messages: usize) -> Result<f64, Box<dyn std::error::Error>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", unique("bench-raw"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "100")
        .set("enable.auto.offset.store", "false")
        .create()?;
    consumer.subscribe(&[topic])?;
    let mut count = 0;
    let mut started = None;
    while count < messages {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => {
                started.get_or_insert_with(Instant::now);
                black_box(message.payload().map(<[u8]>::len));
                consumer.store_offset(
                    message.topic(),
                    message.partition(),
                    message.offset() + 1,
                )?;
                count += 1;
            }
            Some(Err(error)) => return Err(error.into()),
            None => {}
        }
    }
    let elapsed = started.map(|s| s.elapsed()).unwrap_or_default();
    Ok(count as f64 / elapsed.as_secs_f64())
}

async fn adapter(
    brokers: &str,
    topic: &str,
    messages: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let mut source = KafkaSource::builder(KafkaSettings::new(brokers))
        .group(unique("bench-adapter"))
        .topic(topic)
        .build()
        .await?;
    let mut acker = source.acker();
    let mut buffer = Vec::with_capacity(512);
    let mut watermarks: HashMap<PartitionKey, i64> = HashMap::new();
    let mut count = 0;
    let mut started = None;
    let mut last_ack = Instant::now();
    let mut batch = AckBatch::default();
    while count < messages {
        buffer.clear();
        if let intake_core::SourceEvent::Delivered = source.next(&mut buffer, 512).await? {
            started.get_or_insert_with(Instant::now);
            for message in buffer.drain(..) {
                black_box(message.payload().len());
                if let Position::Offset(offset) = message.metadata().position() {
                    let key = message.metadata().partition_key();
                    watermarks.insert(key, offset);
                }
                count += 1;
            }
        }
        if last_ack.elapsed() >= Duration::from_millis(100) || count >= messages {
            last_ack = Instant::now();
            batch.partitions.clear();
            batch.sync = count >= messages;
            for (partition, offset) in &watermarks {
                let mut ack = PartitionAck::new(partition.clone());
                ack.watermark = Some(Position::Offset(*offset));
                batch.partitions.push(ack);
            }
            acker.ack(&batch).await?;
        }
    }
    let elapsed = started.map(|s| s.elapsed()).unwrap_or_default();
    source.close().await?;
    Ok(count as f64 / elapsed.as_secs_f64())
}

fn summary(name: &str, rates: &mut [f64]) -> f64 {
    rates.sort_by(f64::total_cmp);
    let best = rates.last().copied().unwrap_or(0.0);
    let median = rates[rates.len() / 2];
    println!(
        "{name:<8} best {best:>12.0} msg/s   median {median:>12.0} msg/s   rounds {rates:.0?}"
    );
    median
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let brokers: String = env_or("KAFKA_BROKERS", "127.0.0.1:9092".to_string());
    let messages: usize = env_or("BENCH_MESSAGES", 1_000_000);
    let rounds: usize = env_or("BENCH_ROUNDS", 3);
    if std::net::TcpStream::connect_timeout(&brokers.parse()?, Duration::from_secs(1)).is_err() {
        println!("skipped: no Kafka broker on {brokers}");
        return Ok(());
    }
    let topic = prepare(&brokers, messages).await?;
    let mut raw_rates = Vec::new();
    let mut adapter_rates = Vec::new();
    for round in 0..rounds {
        let brokers_raw = brokers.clone();
        let topic_raw = topic.clone();
        let rate = tokio::task::spawn_blocking(move || {
            raw(&brokers_raw, &topic_raw, messages).map_err(|e| e.to_string())
        })
        .await??;
        eprintln!("round {round}: raw {rate:.0} msg/s");
        raw_rates.push(rate);
        let rate = adapter(&brokers, &topic, messages).await?;
        eprintln!("round {round}: adapter {rate:.0} msg/s");
        adapter_rates.push(rate);
    }
    println!(
        "{messages} messages of {PAYLOAD} bytes, {PARTITIONS} partitions, {rounds} interleaved rounds, brokers {brokers}"
    );
    let raw_median = summary("raw", &mut raw_rates);
    let adapter_median = summary("adapter", &mut adapter_rates);
    println!("adapter / raw (median): {:.3}", adapter_median / raw_median);
    Ok(())
}
