//! The dead-letter store of each broker, for `intake dlq`: every scheme
//! `--broker` takes has one. A broker added without one must be answered
//! with `Failure::Unsupported` (exit code 4), never with an empty store:
//! "0 dead letters" from a store that cannot look would be a lie a script
//! acts on.

use std::collections::HashSet;
use std::time::Duration;

use intake_amqp::{AmqpDeadLetterStore, AmqpPublisher, AmqpSettings};
use intake_core::dead_letter::store::{
    DeadLetterLog, DeadLetterStore, LetterId, LogStore, Selection, StoreError,
};
use intake_core::publish::Publisher;
use intake_kafka::{KafkaDeadLetters, KafkaPublisher, KafkaSettings};
use intake_nats::{NatsDeadLetters, NatsPublisher, NatsSettings};
use intake_redis_streams::{RedisDeadLetters, RedisSettings, RedisStreamsPublisher};

use crate::broker::Broker;
use crate::failure::Failure;

/// A dead-letter store as `intake dlq` uses it: what every
/// [`DeadLetterStore`] does, and a purge of exactly the letters a listing
/// showed (what a person said yes to), which the trait has no operation
/// for that is cheap on every backend.
#[async_trait::async_trait]
pub trait Letters: DeadLetterStore {
    /// Removes the letters `ids`, as a [`list`](DeadLetterStore::list)ing
    /// gave them (oldest first), and no other; returns how many it removed.
    async fn purge_listed(&self, ids: &[LetterId]) -> Result<u64, StoreError>;
}

/// Entries a listed purge reads per round trip.
const PURGE_SCAN: usize = 1_000;

/// A log is scanned once, through the newest letter listed, and only the
/// listed ids are removed: a purge by [`Selection::Ids`] reads each letter
/// by id instead, which on Kafka took 32.7 s for 5,000 letters (a snapshot
/// and a fetch each) where one scan takes under a second.
#[async_trait::async_trait]
impl<L: DeadLetterLog, P: Publisher + Send + Sync + 'static> Letters for LogStore<L, P> {
    async fn purge_listed(&self, ids: &[LetterId]) -> Result<u64, StoreError> {
        let Some(through) = ids.last() else {
            return Ok(0);
        };
        let listed: HashSet<&LetterId> = ids.iter().collect();
        let mut removed = 0;
        let mut after: Option<LetterId> = None;
        loop {
            let entries = self
                .log()
                .scan(after.as_ref(), Some(through), PURGE_SCAN)
                .await?;
            let Some(last) = entries.last() else {
                return Ok(removed);
            };
            after = Some(last.id.clone());
            let full = entries.len() == PURGE_SCAN;
            let taken: Vec<LetterId> = entries
                .into_iter()
                .map(|stored| stored.id)
                .filter(|id| listed.contains(id))
                .collect();
            if !taken.is_empty() {
                removed += self.log().remove(&taken).await?;
            }
            if !full {
                return Ok(removed);
            }
        }
    }
}

/// One pass takes the listed ids (every other letter is put back).
#[async_trait::async_trait]
impl Letters for AmqpDeadLetterStore {
    async fn purge_listed(&self, ids: &[LetterId]) -> Result<u64, StoreError> {
        self.purge(&Selection::Ids(ids.to_vec())).await
    }
}

/// The store of the dead letters of `source` and consumer `group` on
/// `broker` (RabbitMQ: the queue's, a queue has no groups), in
/// `dead_letters` or else where the backend's sink writes them by default
/// (Redis: the group's letters of the stream `SOURCE:dlq`; RabbitMQ:
/// the queue `SOURCE.dlq`; NATS: the subject `SOURCE.GROUP.dlq` on the
/// stream `SOURCE_dlq`; Kafka: the topic `SOURCE.GROUP.dlq`); every broker
/// call bounded by `timeout`.
pub async fn open(
    broker: &Broker,
    source: &str,
    group: &str,
    dead_letters: Option<&str>,
    amqp_max_letters: Option<u64>,
    timeout: Duration,
    command: &str,
) -> Result<Box<dyn Letters>, Failure> {
    if amqp_max_letters.is_some() && !matches!(broker, Broker::Amqp { .. }) {
        return Err(Failure::Usage(
            "--amqp-max-letters applies to an amqp:// broker only".to_owned(),
        ));
    }
    let what = format!("{command}: connecting to {}", broker.endpoint());
    match broker {
        Broker::Redis { url } => {
            let settings = RedisSettings::new(url.as_str())
                .connect_timeout(timeout)
                .command_timeout(timeout);
            let log = RedisDeadLetters::builder(&settings);
            let log = match dead_letters {
                Some(stream) => log.stream(stream),
                None => log.dead_letters_of(source),
            };
            // Every group's letters share the stream: the group's alone,
            // and a replay to the group goes to its return stream.
            let log = log
                .group(group)
                .build()
                .await
                .map_err(|error| Failure::from_client(&what, error.is_transient(), error))?;
            // The publisher's defaults are the source's (fields `payload`
            // and `key`), so a replayed message reads back as it was.
            let publisher = RedisStreamsPublisher::builder(settings)
                .build()
                .await
                .map_err(|error| Failure::from_client(&what, error.is_transient(), error))?;
            Ok(Box::new(log.store(publisher)))
        }
        Broker::Amqp { url } => {
            // The publisher on the default exchange routes a replay to the
            // queue it names: the letter's origin queue.
            let settings = AmqpSettings::new(url.as_str()).connection_name("intake cli (replay)");
            let publisher = AmqpPublisher::builder(settings)
                .confirm_timeout(timeout)
                .send_timeout(timeout)
                .build();
            let publisher = tokio::time::timeout(timeout, publisher)
                .await
                .map_err(|_| Failure::TimedOut {
                    what: what.clone(),
                    after: timeout,
                })?
                .map_err(|error| Failure::from_client(&what, error.is_transient(), error))?;
            let queue = dead_letters.map_or_else(|| default_amqp_queue(source), str::to_owned);
            let mut store = AmqpDeadLetterStore::builder(url.as_str())
                .queue(queue)
                .command_timeout(timeout);
            // Past it, an operation that needs every letter fails with
            // `intake_amqp::Error::PassLimit`, which the command reports.
            if let Some(max) = amqp_max_letters {
                store = store.max_letters(usize::try_from(max).unwrap_or(usize::MAX));
            }
            let store = store
                .build(publisher)
                .await
                .map_err(|error| Failure::from_client(&what, error.is_transient(), error))?;
            Ok(Box::new(store))
        }
        Broker::Nats { url } => {
            // Connecting is bounded by `timeout`; the client then reconnects
            // on its own, and every request is bounded by `timeout` again.
            let settings = NatsSettings::new(url.as_str()).connect_timeout(timeout);
            let log = NatsDeadLetters::builder(settings.clone().connection_name("intake cli"))
                .request_timeout(timeout);
            let log = match dead_letters {
                // A stream named on its own: every subject it stores.
                Some(stream) => log.stream(stream),
                None => log.dead_letters_of(source, group),
            };
            let log = tokio::time::timeout(timeout, log.build())
                .await
                .map_err(|_| Failure::TimedOut {
                    what: what.clone(),
                    after: timeout,
                })?
                .map_err(|error| Failure::from_client(&what, error.is_transient(), error))?;
            let publisher = NatsPublisher::builder(settings.connection_name("intake cli (replay)"))
                .ack_timeout(timeout)
                .send_timeout(timeout)
                .build();
            let publisher = tokio::time::timeout(timeout, publisher)
                .await
                .map_err(|_| Failure::TimedOut {
                    what: what.clone(),
                    after: timeout,
                })?
                .map_err(|error| Failure::from_client(&what, error.is_transient(), error))?;
            Ok(Box::new(log.store(publisher)))
        }
        Broker::Kafka { bootstrap, .. } => {
            // TLS and SASL settings too: the store's reader and side-topic
            // clients and the replay's producer all use them.
            let settings = broker
                .kafka_settings()
                .unwrap_or_else(|| KafkaSettings::new(bootstrap.as_str()));
            let log = KafkaDeadLetters::builder(settings.clone()).timeout(timeout);
            let log = match dead_letters {
                // The group's letters, whatever the topic's name: a replay
                // to the group goes to its return topic.
                Some(topic) => log.topic(topic).group(group),
                None => log.dead_letters_of(source, group),
            };
            // The clients connect on first use: building checks settings
            // only, and every later call is bounded by `timeout`.
            let log = log
                .build()
                .map_err(|error| Failure::from_client(&what, error.is_transient(), error))?;
            // A letter's origin is its topic: the publisher produces each
            // replay there with the letter's key.
            let publisher = KafkaPublisher::builder(settings)
                .send_timeout(timeout)
                .delivery_timeout(timeout)
                .build()
                .map_err(|error| Failure::from_client(&what, error.is_transient(), error))?;
            Ok(Box::new(log.store(publisher)))
        }
    }
}

/// The dead-letter queue of queue `source` unless told otherwise: the
/// examples' convention, `SOURCE.dlq` (an AMQP sink has no default: it
/// publishes where its exchange and routing key say).
fn default_amqp_queue(source: &str) -> String {
    format!("{source}.dlq")
}
