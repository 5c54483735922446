//! A producer that keeps producing while consumers come and go: ids `0, 1,
//! 2, …` at a steady rate into a source that `ledger produce --count 0`
//! created, in the formats `ledger produce` uses (examples/ledger/*.rs:
//! payload the decimal id, key `id % 64`; AMQP with `message-id` = the id;
//! NATS on `ledger.<stream>.<id % 64>`). `ledger produce` sends a fixed
//! backlog and exits, which a consumer group drains within seconds, before
//! a rolling restart gets to its second instance.
//!
//! It runs on a thread of its own with its own runtime (the suite has
//! none), and every batch is confirmed by the broker before it counts as
//! produced.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use intake::amqp::lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use intake::amqp::lapin::types::{AMQPValue, FieldTable, ShortString};
use intake::amqp::lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use intake::kafka::KafkaSettings;
use intake::kafka::rdkafka::ClientConfig;
use intake::kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use intake::nats::async_nats::{self, jetstream};
use intake::redis_streams::redis;

use super::backends::Backend;

/// Batches per second: the rate is spread over them.
const BATCHES_PER_SECOND: u64 = 50;

/// The running producer; [`Trickle::stop`] ends it.
pub struct Trickle {
    stop: Arc<AtomicBool>,
    confirmed: Arc<AtomicU64>,
    thread: Option<JoinHandle<Result<u64, String>>>,
}

impl Trickle {
    /// Starts producing into `source` on the broker at `url`, about
    /// `per_second` ids a second.
    pub fn start(backend: Backend, url: &str, source: &str, per_second: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let confirmed = Arc::new(AtomicU64::new(0));
        let (url, source) = (url.to_owned(), source.to_owned());
        let thread = {
            let (stop, confirmed) = (stop.clone(), confirmed.clone());
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|error| format!("the producer's runtime: {error}"))?;
                runtime.block_on(produce(
                    backend, &url, &source, per_second, &stop, &confirmed,
                ))
            })
        };
        Self {
            stop,
            confirmed,
            thread: Some(thread),
        }
    }

    /// Ids produced and confirmed so far; `Err` if the producer failed.
    pub fn confirmed(&mut self) -> Result<u64, String> {
        if self.thread.as_ref().is_some_and(JoinHandle::is_finished) {
            // It only ends on its own by failing.
            return self.stop();
        }
        Ok(self.confirmed.load(Ordering::Acquire))
    }

    /// Stops after the batch in progress; returns how many ids were
    /// produced and confirmed (ids `0..count`).
    pub fn stop(&mut self) -> Result<u64, String> {
        self.stop.store(true, Ordering::Release);
        match self.thread.take() {
            Some(thread) => thread
                .join()
                .map_err(|_| "the producer thread panicked".to_owned())?,
            None => Err("the producer was already stopped".to_owned()),
        }
    }
}

impl Drop for Trickle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One backend's confirmed publisher.
enum Sink {
    Kafka(FutureProducer),
    Redis(redis::aio::MultiplexedConnection),
    Amqp {
        /// Closing it would end the channel.
        _connection: Connection,
        channel: Channel,
    },
    Nats(jetstream::Context),
}

impl Sink {
    async fn connect(backend: Backend, url: &str) -> Result<Self, String> {
        let failed = |error: &dyn std::fmt::Display| format!("the producer's connection: {error}");
        match backend {
            Backend::Kafka(_) => {
                let bootstrap = url.trim_start_matches("kafka://");
                let settings = KafkaSettings::new(bootstrap)
                    .set("acks", "all")
                    .set("linger.ms", "5")
                    .set("message.timeout.ms", "30000");
                let producer = ClientConfig::clone(settings.client_config())
                    .create()
                    .map_err(|error| failed(&error))?;
                Ok(Self::Kafka(producer))
            }
            Backend::Redis => {
                let client = redis::Client::open(url).map_err(|error| failed(&error))?;
                let connection = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|error| failed(&error))?;
                Ok(Self::Redis(connection))
            }
            Backend::Amqp => {
                let connection = Connection::connect(url, ConnectionProperties::default())
                    .await
                    .map_err(|error| failed(&error))?;
                let channel = connection
                    .create_channel()
                    .await
                    .map_err(|error| failed(&error))?;
                channel
                    .confirm_select(ConfirmSelectOptions::default())
                    .await
                    .map_err(|error| failed(&error))?;
                Ok(Self::Amqp {
                    _connection: connection,
                    channel,
                })
            }
            Backend::Nats => {
                let client = async_nats::connect(url)
                    .await
                    .map_err(|error| failed(&error))?;
                Ok(Self::Nats(jetstream::new(client)))
            }
        }
    }

    /// Sends ids `ids` into `source` and returns once the broker confirmed
    /// each.
    async fn send(&mut self, source: &str, ids: std::ops::Range<u64>) -> Result<(), String> {
        let refused = |id: u64, error: &dyn std::fmt::Display| {
            format!("the broker did not confirm id {id}: {error}")
        };
        match self {
            Self::Kafka(producer) => {
                let mut deliveries = Vec::new();
                for id in ids {
                    let (payload, key) = (id.to_string(), (id % 64).to_string());
                    let record = FutureRecord::to(source).key(&key).payload(&payload);
                    let delivery = producer
                        .send_result(record)
                        .map_err(|(error, _)| refused(id, &error))?;
                    deliveries.push((id, delivery));
                }
                for (id, delivery) in deliveries {
                    match delivery.await {
                        Ok(Ok(_)) => {}
                        Ok(Err((error, _))) => return Err(refused(id, &error)),
                        Err(error) => return Err(refused(id, &error)),
                    }
                }
            }
            Self::Redis(connection) => {
                let mut pipe = redis::pipe();
                for id in ids.clone() {
                    pipe.xadd(source, "*", &[("payload", id), ("key", id % 64)]);
                }
                let added: Vec<String> = pipe
                    .query_async(connection)
                    .await
                    .map_err(|error| refused(ids.start, &error))?;
                if added.len() as u64 != ids.end - ids.start {
                    return Err(format!(
                        "Redis answered {} XADDs for ids {ids:?}",
                        added.len()
                    ));
                }
            }
            Self::Amqp { channel, .. } => {
                let mut confirms = Vec::new();
                for id in ids {
                    let mut headers = FieldTable::default();
                    headers.insert("key".into(), AMQPValue::LongLongInt((id % 64) as i64));
                    let properties = BasicProperties::default()
                        .with_delivery_mode(2)
                        .with_message_id(ShortString::from(id.to_string()))
                        .with_headers(headers);
                    let confirm = channel
                        .basic_publish(
                            "".into(),
                            source.into(),
                            BasicPublishOptions {
                                mandatory: true,
                                ..BasicPublishOptions::default()
                            },
                            id.to_string().as_bytes(),
                            properties,
                        )
                        .await
                        .map_err(|error| refused(id, &error))?;
                    confirms.push((id, confirm));
                }
                for (id, confirm) in confirms {
                    let confirmation = confirm.await.map_err(|error| refused(id, &error))?;
                    if !confirmation.is_ack() || confirmation.take_message().is_some() {
                        return Err(refused(id, &"nacked or returned"));
                    }
                }
            }
            Self::Nats(context) => {
                let mut acks = Vec::new();
                for id in ids {
                    let ack = context
                        .publish(
                            format!("ledger.{source}.{}", id % 64),
                            id.to_string().into(),
                        )
                        .await
                        .map_err(|error| refused(id, &error))?;
                    acks.push((id, ack));
                }
                for (id, ack) in acks {
                    ack.await.map_err(|error| refused(id, &error))?;
                }
            }
        }
        Ok(())
    }
}

async fn produce(
    backend: Backend,
    url: &str,
    source: &str,
    per_second: u64,
    stop: &AtomicBool,
    confirmed: &AtomicU64,
) -> Result<u64, String> {
    let mut sink = Sink::connect(backend, url).await?;
    let batch = (per_second / BATCHES_PER_SECOND).max(1);
    let mut tick = tokio::time::interval(Duration::from_millis(1000 / BATCHES_PER_SECOND));
    // A slow confirmation delays the next batch instead of bunching them.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next = 0;
    while !stop.load(Ordering::Acquire) {
        tick.tick().await;
        sink.send(source, next..next + batch).await?;
        next += batch;
        confirmed.store(next, Ordering::Release);
    }
    Ok(next)
}
