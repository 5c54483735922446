//! [`KafkaParking`]: retry later without blocking, on tiered retry topics.
//!
//! **How it parks.** [`park`](Parking::park) produces the parked copy (same
//! key, payload and headers; the parking layer's park headers name the
//! first delivery, [`ORIGIN_PARTITION`] among them) to a retry topic of its
//! origin topic chosen by the delay's tier, `{topic}.{group}.retry.{tier}`
//! by default (`orders.billing.retry.10s`), and returns once the broker
//! confirmed it: an idempotent producer (`acks=all`), the delivery report
//! awaited, at most the [delivery timeout](KafkaParkingBuilder::delivery_timeout).
//! A delay goes to the largest tier not above it (the smallest tier when it
//! is below all); the default tiers are 1 s, 10 s, 1 min, 10 min and 1 h. A
//! retry topic is created on its first use, with as many partitions as its
//! origin topic, and the copy goes to the partition of the same number, so
//! the parked records of one origin partition stay in their order.
//!
//! **How it comes back.** A mover, started with the parking and stopped when
//! the last clone is dropped (or by [`shutdown`](KafkaParking::shutdown)),
//! consumes the retry topics in a group of its own, `{group}.parking`, with
//! the same settings (brokers, TLS, SASL). It does not sleep per message: it
//! holds each partition's head record and **pauses the partition until the
//! head is due** (its [`DUE`] header), so a thousand records of one tier
//! cost one timer, not a thousand. Once due, the record is produced to the
//! **return topic** of its origin, `{topic}.{group}.returned` by default, a
//! topic of the group's own that [`build`](KafkaParkingBuilder::build)
//! creates (as many partitions as the origin) and that the source reads
//! besides the origin ([`KafkaSourceBuilder::parking`](crate::KafkaSourceBuilder::parking)):
//! every other consumer group of the origin never sees a parked copy. It
//! goes to the partition of its first delivery's number (the
//! [`ORIGIN_PARTITION`] header; [`LEGACY_ORIGIN_PARTITION`] on records
//! parked by earlier versions, removed on the way back), not to one the
//! producer's partitioner picks, which may differ from the origin
//! producer's. Only after the broker confirmed that write is the
//! retry-topic offset committed: a crash between the two brings a message
//! back twice, never zero times. A copy consumed from the return topic that
//! asks for later again is parked as a message of its origin; the parking
//! layer keeps its key's order with the origin's by the
//! `intake.park.origin` header. The mover subscribes to a new retry topic
//! at once when this process creates it, and lists the cluster's topics at
//! start and every [discovery interval](KafkaParkingBuilder::discovery_interval)
//! for retry topics another process (or an earlier run) created, **of any
//! tier**: records parked under tiers no longer configured come back by
//! their due time too (after a change of the
//! [template](KafkaParkingBuilder::topic_template), name the old one with
//! [`drain_topic_template`](KafkaParkingBuilder::drain_topic_template)).
//!
//! **Reading the return topic.** The source reads a return topic from its
//! **start** when a partition has no usable offset (never committed, or
//! deleted by the retention), whatever `auto.offset.reset` says for the
//! origin: a copy reaches it whenever the mover moves it, possibly while no
//! member of the group has a position there (before the source joined, in
//! a rebalance), and its original was acknowledged when it was parked.
//! [`KafkaSourceBuilder::parking`](crate::KafkaSourceBuilder::parking) does
//! this (and so does a source that names `{topic}.{group}.returned` among
//! its topics by hand). With a return template of `{topic}` the copies come
//! back to the origin itself, read as the origin is: the source refuses
//! `auto.offset.reset=latest` there.
//!
//! **The mover's health.** Headers are read without trusting their names to
//! be UTF-8 (any producer that may write to a retry topic can write other
//! bytes). The mover runs under a guard: a panic is logged at ERROR and
//! counted, and the mover starts again with a new consumer after a backoff
//! (1 s doubling to 60 s); its held records were never committed, so
//! nothing is lost. [`KafkaParking::mover_health`] tells a health check
//! whether parked messages come back through this process
//! ([`MoverHealth::is_live`]) and counts the restarts, for a metric.
//!
//! **What is left.** A parked message is out of the source's lag while it
//! waits: [`KafkaParking::backlog`] counts what is parked and not handled
//! again (the mover group's lag over the retry topics, the group's over the
//! return topics), for a process that stops when idle to wait on.
//!
//! **What it costs.** Per park, one produce round trip (and one metadata
//! lookup per retry topic and process, a topic creation per retry topic).
//! Per served topic, a return topic, made sure of at build time.
//! Per message coming back, one produce and one asynchronous commit,
//! batched across partitions (up to 500 records per round). Per discovery
//! interval, one listing of the cluster's topics. A process holds in
//! memory at most the head record of each paused partition, plus what one
//! poll returned. The mover is one thread, one consumer and shares the
//! parking's producer.
//!
//! **Limits.**
//! - A message comes back at its due time or later: later by the poll and
//!   the round trips (milliseconds), and, when a longer delay of the same
//!   tier is ahead of it in its partition, by at most the gap to the next
//!   tier (a 9 s delay in the 1 s tier holds the 1 s records behind it for
//!   up to 9 s). Choose tiers near the delays you use.
//! - A record that would hold its partition longer than the next tier (or,
//!   in the largest tier, longer than that tier), a delay above the largest
//!   tier or a hostile due time, is written to the tail of its partition
//!   again after that long, and waits there: one write per that interval.
//!   A record without a usable due time goes back at once; one without a
//!   usable origin partition goes back to the partition of its key
//!   (librdkafka's `murmur2_random`, Java's partitioner). Both are logged.
//! - **The order per key needs the `range` assignor.** It is kept by each
//!   process (see the parking layer), so partition `p` of the origin and
//!   partition `p` of its return topic must go to the same member. The
//!   classic protocol's `range` assignor (librdkafka's default,
//!   `range,roundrobin`) does that for topics of as many partitions that
//!   every member reads; so does the consumer protocol of KIP-848
//!   (`group.protocol=consumer`) with `group.remote.assignor=range` (both
//!   tested on Kafka 4.1). `cooperative-sticky`, `roundrobin` and the
//!   broker's default `uniform` do not: a copy then comes back to another
//!   member, which runs it out of order, while the member that parked it
//!   keeps parking the key's later messages until the copy is overdue.
//!   Nothing is lost, but the order is not kept; the parking and the source
//!   log a warning at build time. Adding partitions to the origin breaks it
//!   too, until the return topic gets as many (a copy of a partition the
//!   return topic lacks goes back by its key).
//! - A copy from the return topic that fails for good is a dead letter of
//!   its first delivery: the source's dead-letter sink writes it to the
//!   origin's dead-letter topic, `{topic}.{group}.dlq`, naming the origin
//!   topic, partition and offset of the original record.
//! - A [return template](KafkaParkingBuilder::return_topic_template) of
//!   `{topic}` sends copies back to the origin topic itself, where every
//!   consumer group of the origin sees them again.
//! - A retry topic keeps a record only as long as its retention
//!   (`retention.ms`, the broker's default when the parking creates it):
//!   a delay longer than the retention loses the message.
//! - The parking serves the [topics](KafkaParkingBuilder::topics) it was
//!   built for; a message of another topic is refused (the parking layer
//!   then retries it the ordinary way), since no mover would look for it
//!   after a restart.
//!
//! ```no_run
//! use std::time::Duration;
//! use intake_core::parking::ParkingLayer;
//! use intake_core::{Consumer, HandlerError, Message};
//! use intake_kafka::{KafkaParking, KafkaSettings, KafkaSource};
//! use tokio_util::sync::CancellationToken;
//! use tower::{ServiceBuilder, service_fn};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let settings = KafkaSettings::new("127.0.0.1:9092");
//! // Parks to orders.billing.retry.{1s,10s,1m,10m,1h}; the mover runs in
//! // the group billing.parking and returns copies to orders.billing.returned
//! // (created here, before the source that reads it).
//! let parking = KafkaParking::builder(settings.clone(), "billing")
//!     .topics(["orders"])
//!     .build()
//!     .await?;
//! // Reads orders and orders.billing.returned (the latter from its start
//! // when the group has no offset there).
//! let source = KafkaSource::builder(settings)
//!     .group("billing")
//!     .topic("orders")
//!     .parking(&parking)
//!     .build()
//!     .await?;
//! let acker = source.acker();
//! let handler = ServiceBuilder::new()
//!     .layer(ParkingLayer::new(parking.clone()))
//!     .service(service_fn(|message: Message| async move {
//!         if message.payload().is_empty() {
//!             return Err(HandlerError::retry_later("not yet", Duration::from_secs(10)));
//!         }
//!         Ok::<(), HandlerError>(())
//!     }));
//! let report = Consumer::builder()
//!     .build(source, acker, handler)?
//!     .run(CancellationToken::new())
//!     .await?;
//! println!("{} parked", report.parked);
//! // What a health check reports: do parked messages still come back?
//! let mover = parking.mover_health();
//! println!("mover live: {}, restarts: {}", mover.is_live(), mover.restarts);
//! parking.shutdown(Duration::from_secs(10)).await?;
//! # Ok(())
//! # }
//! ```
//!
//! [`DUE`]: intake_core::parking::DUE
//! [`ORIGIN_PARTITION`]: intake_core::parking::ORIGIN_PARTITION

mod error;
mod mover;
mod parked;
mod tiers;
mod topics;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use intake_core::Message;
use intake_core::app::PartHealth;
use intake_core::lag::DEFAULT_LAG_TIMEOUT;
use intake_core::parking::{DUE, ORIGIN_PARTITION, ParkError, Parked, Parking};
use rdkafka::TopicPartitionList;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;
use tokio::sync::oneshot;

pub use self::error::ParkingError;
use self::mover::{MoverConfig, MoverShared, RetryPattern, Route};
pub(crate) use self::parked::ParkedCounter;
pub use self::tiers::DEFAULT_TIERS;
use self::tiers::{Tiers, resolve};
use self::topics::{Registry, partition_count};
use crate::error::Error;
use crate::lag::{group_client, unconsumed};
use crate::settings::KafkaSettings;
use crate::topic_admin::{LazyAdmin, create_topic};

/// The default retry topic: one per origin topic, group and tier, so that
/// groups never move each other's records.
pub const DEFAULT_TOPIC_TEMPLATE: &str = "{topic}.{group}.retry.{tier}";

/// The default return topic: one per origin topic and group, read by that
/// group's consumers only, so no other group of the origin sees a parked
/// copy.
pub const DEFAULT_RETURN_TEMPLATE: &str = "{topic}.{group}.returned";

/// Header that earlier versions wrote on a parked record: the partition of
/// the origin topic it came from. Parked records now name it in the core's
/// [`ORIGIN_PARTITION`] (the partition of the message's first delivery);
/// the mover still reads this one, for records parked before, and removes
/// it when the record goes back.
pub const LEGACY_ORIGIN_PARTITION: &str = "intake.park.partition";

/// Parks messages in tiered retry topics and moves them back to their
/// origin topic and partition once due. See the [module docs](self).
///
/// Clones share the producer and the mover; the mover stops when the last
/// clone is dropped, or at [`shutdown`](Self::shutdown).
#[derive(Clone)]
pub struct KafkaParking {
    inner: Arc<Inner>,
}

struct Inner {
    producer: FutureProducer,
    brokers: Arc<str>,
    group: String,
    topics: Vec<String>,
    return_template: String,
    /// The origin topic of each return topic other than the origin itself.
    origin_of: HashMap<String, String>,
    /// The served topics whose copies return to the topic itself (a return
    /// template of `{topic}`): a copy there cannot be told from a
    /// producer's record, so the park headers of every record are believed.
    returns_to_itself: Vec<String>,
    tiers: Tiers,
    template: String,
    registry: Arc<Registry>,
    admin: TopicAdmin,
    delivery_timeout: Duration,
    mover: Arc<MoverShared>,
    stopped: Mutex<Option<oneshot::Receiver<()>>>,
    /// The settings of every client (brokers, TLS, SASL), for the backlog's.
    settings: KafkaSettings,
    /// The retry topics of the served topics, of any tier, by name.
    patterns: Vec<RetryPattern>,
    /// The backlog's clients, made on its first count.
    backlog: Mutex<Option<Arc<BacklogClients>>>,
}

/// The clients that count the backlog: one with the mover group's id and
/// one with the group's, neither of which ever joins its group.
struct BacklogClients {
    mover_group: BaseConsumer,
    group: BaseConsumer,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.mover.stop.store(true, Ordering::Release);
    }
}

/// Creates retry topics, one at a time.
struct TopicAdmin {
    replication: i32,
    /// Made on the first creation (most runs create none).
    client: LazyAdmin,
    /// Parks that find a retry topic missing create it one after another:
    /// the second finds it made.
    creating: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for KafkaParking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = &*self.inner;
        f.debug_struct("KafkaParking")
            .field("brokers", &inner.brokers)
            .field("group", &inner.group)
            .field("topics", &inner.topics)
            .field("tiers", &inner.tiers.as_slice())
            .field("template", &inner.template)
            .field("moved", &self.moved())
            .finish_non_exhaustive()
    }
}

/// Builds a [`KafkaParking`]: [`KafkaParking::builder`], then
/// [`build`](Self::build).
#[derive(Debug, Clone)]
pub struct KafkaParkingBuilder {
    settings: KafkaSettings,
    group: String,
    topics: Vec<String>,
    tiers: Vec<Duration>,
    template: String,
    /// Templates of earlier runs whose retry topics the mover drains too.
    drained_templates: Vec<String>,
    return_template: String,
    delivery_timeout: Duration,
    replication: i32,
    discovery_interval: Duration,
}

impl KafkaParking {
    /// A parking on the brokers of `settings` (the source's: brokers, TLS,
    /// SASL) for the consumer group `group`, which names its retry topics
    /// and, as `{group}.parking`, its mover's group. Name the
    /// [topics](KafkaParkingBuilder::topics) it serves.
    pub fn builder(settings: KafkaSettings, group: impl Into<String>) -> KafkaParkingBuilder {
        KafkaParkingBuilder {
            settings,
            group: group.into(),
            topics: Vec::new(),
            tiers: DEFAULT_TIERS.to_vec(),
            template: DEFAULT_TOPIC_TEMPLATE.into(),
            drained_templates: Vec::new(),
            return_template: DEFAULT_RETURN_TEMPLATE.into(),
            delivery_timeout: Duration::from_secs(30),
            replication: -1,
            discovery_interval: Duration::from_secs(30),
        }
    }

    /// The retry topic a message of `topic` parked for `delay` goes to.
    pub fn topic_for(&self, topic: &str, delay: Duration) -> String {
        let inner = &*self.inner;
        let tier = inner.tiers.index_for(delay);
        resolve(
            &inner.template,
            topic,
            &inner.group,
            &inner.tiers.label(tier),
        )
    }

    /// The topic parked messages of `topic` come back to: its return topic,
    /// which the source must read besides `topic`
    /// (`KafkaSource::builder(..).topics([topic, return_topic])`); `topic`
    /// itself when the [return template](KafkaParkingBuilder::return_topic_template)
    /// is `{topic}`. A message consumed from the return topic is parked as
    /// one of `topic`.
    pub fn return_topic(&self, topic: &str) -> String {
        resolve(&self.inner.return_template, topic, &self.inner.group, "")
    }

    /// The tiers, ascending.
    pub fn tiers(&self) -> &[Duration] {
        self.inner.tiers.as_slice()
    }

    /// Records the mover of this process produced back to their origin
    /// (and committed, or is committing).
    pub fn moved(&self) -> u64 {
        self.inner.mover.moved.load(Ordering::Relaxed)
    }

    /// Records the mover wrote to the tail of their retry topic again,
    /// because they would have held their partition longer than their tier
    /// allows (see the [module docs](self)).
    pub fn requeued(&self) -> u64 {
        self.inner.mover.requeued.load(Ordering::Relaxed)
    }

    /// The mover's health as a part of an app's: add it with
    /// `health.add_check("parking", move || parking.part_health())`
    /// ([`MoverHealth::as_part_health`]).
    pub fn part_health(&self) -> PartHealth {
        self.mover_health().as_part_health()
    }

    /// The mover's state, for a health check or a metric: whether it runs,
    /// how often it panicked and was started again, how long ago its last
    /// round began. [`MoverHealth::is_live`] is false while parked
    /// messages cannot come back through this process: the mover stopped,
    /// waits to start again after a panic, or has not begun a round for
    /// longer than a round can take.
    pub fn mover_health(&self) -> MoverHealth {
        let shared = &*self.inner.mover;
        MoverHealth {
            running: shared.running.load(Ordering::Acquire),
            restarts: shared.restarts.load(Ordering::Relaxed),
            since_last_round: shared.since_last_round(),
            stall_after: MoverShared::stall_after(self.inner.delivery_timeout),
        }
    }

    /// What is parked and not handled again yet, counted on the brokers, so
    /// that a process about to stop for idleness (a drain, a batch job) can
    /// tell "nothing left" from "nothing due yet": messages wait in a retry
    /// topic, out of the source's lag, for as long as their delay.
    ///
    /// [`parked`](ParkedBacklog::parked) is the lag of the mover group
    /// (`{group}.parking`) over every retry topic of the served topics
    /// (every tier, the [drained templates](KafkaParkingBuilder::drain_topic_template)
    /// too, whichever process created them): records parked and not yet
    /// moved back, due or not, held by a mover or not (a mover that died
    /// holding them is counted until another one moved them).
    /// [`returned`](ParkedBacklog::returned) is the group's lag over the
    /// return topics: copies moved back and not yet committed by the
    /// group. A source that reads the return topics
    /// ([`KafkaSourceBuilder::parking`](crate::KafkaSourceBuilder::parking))
    /// has these in its own lag too ([`KafkaSource::lag_probe`](crate::KafkaSource::lag_probe));
    /// with a return template of `{topic}` the copies are in the served
    /// topic's lag only. A record moved back whose move the mover has not
    /// committed yet is counted in both for a moment: the count errs
    /// towards unfinished work.
    ///
    /// The runtime's threads never wait on the brokers: the count runs on
    /// Tokio's blocking pool, one listing of the cluster's topics, then
    /// per group the committed offsets and the watermarks of all partitions
    /// (one request per leader broker), all within 5 s
    /// ([`DEFAULT_LAG_TIMEOUT`]).
    /// The first count makes its two clients, which stay with the parking.
    ///
    /// # Errors
    ///
    /// [`ParkingError::Backlog`] when the brokers did not answer or refused
    /// (unknown is never "nothing parked"),
    /// [`ParkingError::BacklogTimedOut`] after the timeout.
    pub async fn backlog(&self) -> Result<ParkedBacklog, ParkingError> {
        let timeout = DEFAULT_LAG_TIMEOUT;
        let parking = self.clone();
        let started = Instant::now();
        let counted = tokio::task::spawn_blocking(move || parking.count_backlog(started, timeout));
        let failed = |source: KafkaError| ParkingError::Backlog {
            group: self.inner.group.clone(),
            brokers: self.inner.brokers.to_string(),
            source: Box::new(source),
        };
        // Every librdkafka call is bounded by what is left of the timeout;
        // this bounds the wait for a blocking pool that is busy, too.
        match tokio::time::timeout(timeout.saturating_add(Duration::from_secs(1)), counted).await {
            Err(_) => Err(ParkingError::BacklogTimedOut {
                group: self.inner.group.clone(),
                brokers: self.inner.brokers.to_string(),
                waited: timeout,
            }),
            // The task did not finish: the runtime is shutting down.
            Ok(Err(_join)) => Err(failed(KafkaError::Canceled)),
            Ok(Ok(counted)) => counted.map_err(failed),
        }
    }

    /// The blocking count of [`backlog`](Self::backlog), each call bounded
    /// by what is left of `timeout`.
    fn count_backlog(
        &self,
        started: Instant,
        timeout: Duration,
    ) -> Result<ParkedBacklog, KafkaError> {
        let inner = &*self.inner;
        let left = || {
            timeout
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(1))
        };
        let clients = self.backlog_clients()?;
        let metadata = clients.mover_group.fetch_metadata(None, left())?;
        let mut retry = TopicPartitionList::new();
        let mut returned = TopicPartitionList::new();
        for topic in metadata.topics() {
            let name = topic.name();
            let list = if inner.origin_of.contains_key(name) {
                &mut returned
            } else if inner
                .patterns
                .iter()
                .any(|pattern| pattern.tier_of(name).is_some())
            {
                &mut retry
            } else {
                continue;
            };
            if let Some(code) = topic.error() {
                return Err(KafkaError::MetadataFetch(code.into()));
            }
            for partition in topic.partitions() {
                list.add_partition(name, partition.id());
            }
        }
        let total = |counts: Vec<(String, i32, u64)>| {
            counts
                .iter()
                .fold(0u64, |sum, (_, _, messages)| sum.saturating_add(*messages))
        };
        Ok(ParkedBacklog {
            parked: total(unconsumed(&clients.mover_group, &retry, left)?),
            returned: total(unconsumed(&clients.group, &returned, left)?),
        })
    }

    /// The backlog's clients, made on the first call.
    fn backlog_clients(&self) -> Result<Arc<BacklogClients>, KafkaError> {
        let inner = &*self.inner;
        let mut made = inner
            .backlog
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if let Some(clients) = &*made {
            return Ok(Arc::clone(clients));
        }
        let clients = Arc::new(BacklogClients {
            mover_group: group_client(&inner.settings, &mover_group(&inner.group))?,
            group: group_client(&inner.settings, &inner.group)?,
        });
        *made = Some(Arc::clone(&clients));
        Ok(clients)
    }

    /// The served topics whose copies come back to a return topic of their
    /// own, by return topic.
    pub(crate) fn return_topics(&self) -> &HashMap<String, String> {
        &self.inner.origin_of
    }

    /// The served topics whose copies come back to the topic itself.
    pub(crate) fn topics_returning_to_themselves(&self) -> &[String] {
        &self.inner.returns_to_itself
    }

    /// The consumer group whose messages it parks.
    pub(crate) fn group(&self) -> &str {
        &self.inner.group
    }

    /// Tells the mover (of every clone) to stop, without waiting: a
    /// [`shutdown`](Self::shutdown) of several parkings signals them all
    /// before it waits for any.
    pub(crate) fn request_stop(&self) {
        self.inner.mover.stop.store(true, Ordering::Release);
    }

    /// Stops the mover (of every clone) and waits up to `timeout` for it to
    /// finish its round and leave its group. Records it held stay
    /// uncommitted: the next mover of the group moves them. Parks go on
    /// working; only the moving back stops.
    ///
    /// # Errors
    ///
    /// [`ParkingError::ShutdownTimedOut`] when the mover did not stop in
    /// time (a round waits for its delivery reports up to the delivery
    /// timeout); it stops on its own afterwards.
    pub async fn shutdown(&self, timeout: Duration) -> Result<(), ParkingError> {
        self.inner.mover.stop.store(true, Ordering::Release);
        let stopped = self
            .inner
            .stopped
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .take();
        let Some(stopped) = stopped else {
            return Ok(());
        };
        match tokio::time::timeout(timeout, stopped).await {
            // Sent or dropped: either way the thread ended.
            Ok(_) => Ok(()),
            Err(_) => Err(ParkingError::ShutdownTimedOut { waited: timeout }),
        }
    }

    /// How many partitions the retry topic `topic` (for messages of
    /// `origin`) has, creating it when it is missing; the mover follows it
    /// from then on.
    async fn ensure_retry_topic(&self, topic: &str, origin: &str) -> Result<i32, ParkingError> {
        let inner = &*self.inner;
        if let Some(partitions) = inner.registry.partitions(topic) {
            return Ok(partitions);
        }
        let _turn = tokio::time::timeout(inner.delivery_timeout, inner.admin.creating.lock())
            .await
            .map_err(|_| ParkingError::TimedOut {
                topic: topic.to_owned(),
                brokers: inner.brokers.to_string(),
                waited: inner.delivery_timeout,
            })?;
        if let Some(partitions) = inner.registry.partitions(topic) {
            return Ok(partitions);
        }
        let partitions = self.ensure_topic(topic, origin).await?;
        inner.registry.insert(topic, partitions);
        Ok(partitions)
    }

    /// How many partitions `topic` has, creating it with as many as
    /// `origin` when it is missing.
    async fn ensure_topic(&self, topic: &str, origin: &str) -> Result<i32, ParkingError> {
        let inner = &*self.inner;
        let admin = &inner.admin;
        let waited = inner.delivery_timeout;
        let timed_out = || ParkingError::TimedOut {
            topic: topic.to_owned(),
            brokers: inner.brokers.to_string(),
            waited,
        };
        let partitions = match self.lookup(topic).await? {
            Some(partitions) => partitions,
            None => {
                let partitions =
                    self.lookup(origin)
                        .await?
                        .ok_or_else(|| ParkingError::OriginMissing {
                            topic: origin.to_owned(),
                            brokers: inner.brokers.to_string(),
                        })?;
                let failed = |source: KafkaError| ParkingError::TopicNotCreated {
                    topic: topic.to_owned(),
                    brokers: inner.brokers.to_string(),
                    source: Box::new(source),
                };
                let client = admin.client.client().map_err(failed)?;
                let options = AdminOptions::new().operation_timeout(Some(waited));
                let new_topic = NewTopic::new(
                    topic,
                    partitions,
                    TopicReplication::Fixed(admin.replication),
                );
                tokio::time::timeout(waited, create_topic(&client, &new_topic, &options))
                    .await
                    .map_err(|_| timed_out())?
                    .map_err(failed)?;
                tracing::info!(%topic, %origin, partitions, replication = admin.replication, "created a parking topic");
                partitions
            }
        };
        Ok(partitions)
    }

    /// The partition count of `topic`, `None` when it does not exist.
    async fn lookup(&self, topic: &str) -> Result<Option<i32>, ParkingError> {
        let inner = &*self.inner;
        let producer = inner.producer.clone();
        let name = topic.to_owned();
        let timeout = inner.delivery_timeout;
        tokio::task::spawn_blocking(move || partition_count(producer.client(), &name, timeout))
            .await
            // The lookup task did not finish: the runtime is shutting down.
            .unwrap_or(Err(KafkaError::Canceled))
            .map_err(|source| ParkingError::Lookup {
                topic: topic.to_owned(),
                brokers: inner.brokers.to_string(),
                source: Box::new(source),
            })
    }
}

#[async_trait::async_trait]
impl Parking for KafkaParking {
    async fn park(&self, message: &Message, delay: Duration) -> Result<Parked, ParkError> {
        let inner = &*self.inner;
        let metadata = message.metadata();
        let consumed: &str = metadata.source();
        // A copy that came back through the return topic is parked again
        // as a message of its origin: the same retry topics, partition
        // numbers and return topic.
        let origin: &str = match inner.origin_of.get(consumed) {
            Some(origin) => origin,
            None if inner.topics.iter().any(|served| served == consumed) => consumed,
            None => {
                return Err(ParkError::new(ParkingError::UnknownTopic {
                    topic: consumed.to_owned(),
                    configured: inner.topics.clone(),
                }));
            }
        };
        let origin_partition = i32::try_from(metadata.partition()).map_err(|_| {
            ParkError::new(ParkingError::BadPartition {
                topic: origin.to_owned(),
                partition: metadata.partition(),
            })
        })?;
        let topic = self.topic_for(origin, delay);
        let partitions = self
            .ensure_retry_topic(&topic, origin)
            .await
            .map_err(ParkError::new)?;

        let parked = message.headers();
        let mut headers = OwnedHeaders::new_with_capacity(parked.len() + 2);
        for header in parked
            .iter()
            .filter(|header| &*header.name != LEGACY_ORIGIN_PARTITION)
        {
            headers = headers.insert(Header {
                key: &header.name,
                value: Some(header.value.as_ref()),
            });
        }
        // The parking layer sets the due time; a caller of its own may not.
        if parked.get(DUE).is_none() {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis();
            // Saturating: a delay beyond the clock is far in the future,
            // where the mover keeps it (writing it to the tail now and
            // then), not a due time it cannot read.
            let due = u64::try_from(now.saturating_add(delay.as_millis()))
                .unwrap_or(u64::MAX)
                .to_string();
            headers = headers.insert(Header {
                key: DUE,
                value: Some(due.as_bytes()),
            });
        }
        // The parking layer names the first delivery's partition, which the
        // mover sends the copy back to; a caller of its own may not.
        if parked.get(ORIGIN_PARTITION).is_none() {
            let origin_partition_text = origin_partition.to_string();
            headers = headers.insert(Header {
                key: ORIGIN_PARTITION,
                value: Some(origin_partition_text.as_bytes()),
            });
        }
        let mut record = FutureRecord::<[u8], [u8]>::to(&topic)
            .payload(message.payload().as_ref())
            .partition(origin_partition % partitions.max(1))
            .headers(headers);
        if let Some(key) = message.key() {
            record = record.key(key.as_ref());
        }
        match inner
            .producer
            .send(record, Timeout::After(inner.delivery_timeout))
            .await
        {
            Ok(_delivery) => Ok(Parked::Moved),
            Err((source, _unsent)) => Err(ParkError::new(ParkingError::Write {
                topic,
                brokers: inner.brokers.to_string(),
                source: Box::new(source),
            })),
        }
    }

    /// A record of one of the return topics, where only the mover writes
    /// (or of a served topic whose copies return to itself).
    fn is_returned_copy(&self, message: &Message) -> bool {
        let source: &str = message.metadata().source();
        self.inner.origin_of.contains_key(source)
            || self
                .inner
                .returns_to_itself
                .iter()
                .any(|topic| topic == source)
    }
}

impl KafkaParkingBuilder {
    /// Adds topics whose messages this parking parks (the source's topics).
    /// The mover looks for their retry topics, so a message parked before a
    /// restart still comes back.
    pub fn topics<I: IntoIterator<Item = S>, S: Into<String>>(mut self, topics: I) -> Self {
        self.topics.extend(topics.into_iter().map(Into::into));
        self
    }

    /// The delay tiers (default [`DEFAULT_TIERS`]): one retry topic per
    /// origin topic and tier. Each a whole number of milliseconds, none
    /// zero.
    pub fn tiers<I: IntoIterator<Item = Duration>>(mut self, tiers: I) -> Self {
        self.tiers = tiers.into_iter().collect();
        self
    }

    /// The retry topic's name, with `{topic}`, `{group}` and `{tier}`
    /// replaced by the origin topic, the group and the tier (`1s`, `10m`,
    /// `1500ms`); default [`DEFAULT_TOPIC_TEMPLATE`]. Must name `{topic}`
    /// and `{tier}`: the mover tells by the retry topic where a record goes
    /// back to and how long it may wait.
    pub fn topic_template(mut self, template: impl Into<String>) -> Self {
        self.template = template.into();
        self
    }

    /// A [topic template](Self::topic_template) of an earlier run whose
    /// retry topics the mover drains too: after a change of template, the
    /// records parked under the old one still come back (nothing is parked
    /// there any more). Keep it until those topics are empty. Retry topics
    /// of tiers no longer configured need nothing: the mover finds every
    /// tier of a template it drains.
    pub fn drain_topic_template(mut self, template: impl Into<String>) -> Self {
        self.drained_templates.push(template.into());
        self
    }

    /// The topic parked messages come back to, with `{topic}` and `{group}`
    /// replaced by the origin topic and the group; default
    /// [`DEFAULT_RETURN_TEMPLATE`], a topic of the group's own, which the
    /// source reads besides the origin
    /// ([`KafkaParking::return_topic`] names it). `{topic}` alone sends
    /// them back to the origin topic itself, where **every** consumer group
    /// of the origin sees them again.
    pub fn return_topic_template(mut self, template: impl Into<String>) -> Self {
        self.return_template = template.into();
        self
    }

    /// How long a park may wait for the broker's acknowledgement, retries
    /// included, and each metadata lookup or topic creation (default 30 s;
    /// librdkafka's `message.timeout.ms`, unless the settings set it). The
    /// mover waits as long for the reports of the records it moves back.
    pub fn delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = timeout;
        self
    }

    /// Replication factor of a retry topic the parking creates (default
    /// `-1`, the broker's `default.replication.factor`).
    pub fn replication(mut self, replication: i32) -> Self {
        self.replication = replication;
        self
    }

    /// How often the mover asks the brokers for retry topics it does not
    /// know yet, created by another process or an earlier run (default
    /// 30 s; at start too). Those created by this process are followed at
    /// once.
    pub fn discovery_interval(mut self, interval: Duration) -> Self {
        self.discovery_interval = interval;
        self
    }

    /// Creates the producer, makes sure each served topic's
    /// [return topic](KafkaParking::return_topic) exists (creating it with
    /// as many partitions as the served topic; at most the delivery timeout
    /// per lookup and creation), and starts the mover. Retry topics are
    /// created on their first park.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for settings librdkafka refuses (an idempotent
    /// producer needs `acks=all`), no topics, an empty group, tiers that
    /// are empty, zero or finer than a millisecond, a template without
    /// `{topic}` or `{tier}` or one that names a served topic, a
    /// replication factor below 1 other than -1, a return template that
    /// names no topic of its own per served topic;
    /// [`Error::UnknownTopic`] when a served topic does not exist,
    /// [`Error::Unreachable`] (and the other client errors) when its return
    /// topic cannot be looked up or created; [`Error::Spawn`] when the
    /// mover's thread cannot start.
    pub async fn build(self) -> Result<KafkaParking, Error> {
        if self.group.trim().is_empty() {
            return Err(Error::config(
                "group",
                "name the consumer group whose messages are parked",
            ));
        }
        if self.topics.is_empty() || self.topics.iter().any(|topic| topic.trim().is_empty()) {
            return Err(Error::config(
                "topics",
                "name the topics whose messages are parked, none empty (`.topics([\"orders\"])`)",
            ));
        }
        let Some(tiers) = Tiers::new(self.tiers.clone()) else {
            return Err(Error::config(
                "tiers",
                "give at least one tier, each above zero and a whole number of milliseconds",
            ));
        };
        for (setting, template) in std::iter::once(("topic_template", &self.template)).chain(
            self.drained_templates
                .iter()
                .map(|template| ("drain_topic_template", template)),
        ) {
            if !template.contains("{topic}") || template.matches("{tier}").count() != 1 {
                return Err(Error::config(
                    setting,
                    format!(
                        "`{template}` must name `{{topic}}`, and `{{tier}}` once: the mover tells by the retry topic where a record goes back to and how long it may wait; the default is `{DEFAULT_TOPIC_TEMPLATE}`"
                    ),
                ));
            }
        }
        if self.replication < 1 && self.replication != -1 {
            return Err(Error::config(
                "replication",
                format!(
                    "{}: use a replication factor of at least 1, or -1 for the broker's default",
                    self.replication
                ),
            ));
        }
        if self.return_template.trim().is_empty() {
            return Err(Error::config(
                "return_topic_template",
                format!("must not be empty; the default is `{DEFAULT_RETURN_TEMPLATE}`"),
            ));
        }
        let mut origin_of: HashMap<String, String> = HashMap::new();
        let mut returns_to_itself = Vec::new();
        for topic in &self.topics {
            let back_to = resolve(&self.return_template, topic, &self.group, "");
            if back_to == *topic {
                returns_to_itself.push(topic.clone());
                continue;
            }
            let shared = origin_of.insert(back_to.clone(), topic.clone());
            if self.topics.contains(&back_to) || shared.is_some() {
                return Err(Error::config(
                    "return_topic_template",
                    format!(
                        "`{}` returns the messages of `{topic}` to `{back_to}`, which is another served topic or the return topic of one; name `{{topic}}` in it, such as the default `{DEFAULT_RETURN_TEMPLATE}`",
                        self.return_template
                    ),
                ));
            }
        }
        let mut routes = HashMap::new();
        for topic in &self.topics {
            let back_to = resolve(&self.return_template, topic, &self.group, "");
            for tier in 0..tiers.len() {
                let retry = resolve(&self.template, topic, &self.group, &tiers.label(tier));
                if self.topics.contains(&retry) || origin_of.contains_key(&retry) {
                    return Err(Error::config(
                        "topic_template",
                        format!(
                            "`{}` parks messages of `{topic}` in `{retry}`, a topic this parking serves or returns to: they would be parked and moved in a loop",
                            self.template
                        ),
                    ));
                }
                routes.insert(
                    retry,
                    Route {
                        back_to: back_to.as_str().into(),
                        tier,
                    },
                );
            }
        }

        let mut patterns = Vec::new();
        for topic in &self.topics {
            let back_to: Arc<str> = resolve(&self.return_template, topic, &self.group, "").into();
            for template in std::iter::once(&self.template).chain(&self.drained_templates) {
                let (before, after) = template.split_once("{tier}").unwrap_or((template, ""));
                patterns.push(RetryPattern {
                    prefix: resolve(before, topic, &self.group, ""),
                    suffix: resolve(after, topic, &self.group, ""),
                    back_to: Arc::clone(&back_to),
                });
            }
        }
        // A served topic or a return topic that reads as a retry topic of
        // some tier would be drained by the mover, in a loop.
        for topic in self.topics.iter().chain(origin_of.keys()) {
            if patterns
                .iter()
                .any(|pattern| pattern.tier_of(topic).is_some())
            {
                return Err(Error::config(
                    "topic_template",
                    format!(
                        "`{topic}` is a topic this parking serves or returns to, and reads as a retry topic of the template `{}`: the mover would move its messages in a loop",
                        self.template
                    ),
                ));
            }
        }
        warn_unless_co_located(&self.settings, &self.group);

        let brokers: Arc<str> = self.settings.endpoint().into();
        let mut producer_settings = self.settings.clone();
        {
            let config = producer_settings.client_config_mut();
            config.set("enable.idempotence", "true");
            // A lookup of a missing retry topic must not create it with the
            // broker's default layout: the parking creates it, sized.
            config.set("allow.auto.create.topics", "false");
            if config.get("message.timeout.ms").is_none() {
                config.set(
                    "message.timeout.ms",
                    self.delivery_timeout.as_millis().to_string(),
                );
            }
            // Records without a usable origin partition go back where a
            // Java producer puts their key.
            if config.get("partitioner").is_none() {
                config.set("partitioner", "murmur2_random");
            }
        }
        let producer: FutureProducer = producer_settings
            .client_config()
            .create()
            .map_err(|error| Error::from_kafka(error, &brokers, Duration::ZERO))?;
        let parking = KafkaParking {
            inner: Arc::new(Inner {
                producer,
                brokers: Arc::clone(&brokers),
                group: self.group,
                topics: self.topics,
                return_template: self.return_template,
                origin_of,
                returns_to_itself,
                tiers,
                template: self.template,
                registry: Arc::new(Registry::default()),
                admin: TopicAdmin {
                    replication: self.replication,
                    client: LazyAdmin::new(producer_settings),
                    creating: tokio::sync::Mutex::new(()),
                },
                delivery_timeout: self.delivery_timeout,
                mover: Arc::new(MoverShared::default()),
                stopped: Mutex::new(None),
                settings: self.settings.clone(),
                patterns: patterns.clone(),
                backlog: Mutex::new(None),
            }),
        };
        let inner = &*parking.inner;
        // Before the source is built: it refuses a topic that does not exist.
        let mut returns: Vec<(&String, &String)> = inner.origin_of.iter().collect();
        returns.sort();
        for (back_to, origin) in returns {
            let partitions = parking
                .ensure_topic(back_to, origin)
                .await
                .map_err(|error| {
                    tracing::warn!(return_topic = %back_to, %origin, error = %intake_core::ErrorChain::new(&error), "the return topic could not be made sure of");
                    build_error(error)
                })?;
            // Partitions added to the origin after its return topic was
            // made: copies of those go back by their key.
            if let Ok(Some(of_origin)) = parking.lookup(origin).await
                && of_origin > partitions
            {
                tracing::warn!(return_topic = %back_to, %origin, partitions, origin_partitions = of_origin, "the return topic has fewer partitions than its origin: copies of the partitions it lacks come back by their key, to another partition than their origin's; add partitions to the return topic");
            }
        }
        let stopped = mover::spawn(MoverConfig {
            settings: self.settings,
            group: mover_group(&inner.group),
            producer: inner.producer.clone(),
            routes,
            patterns,
            tiers: inner.tiers.clone(),
            registry: Arc::clone(&inner.registry),
            shared: Arc::clone(&inner.mover),
            delivery_timeout: self.delivery_timeout,
            discovery_interval: self.discovery_interval,
            brokers,
        })?;
        *inner
            .stopped
            .lock()
            .unwrap_or_else(|poison| poison.into_inner()) = Some(stopped);
        tracing::debug!(group = %inner.group, topics = ?inner.topics, brokers = %inner.brokers, "kafka parking started");
        Ok(parking)
    }
}

/// The consumer group of the movers of `group`'s parking.
fn mover_group(group: &str) -> String {
    format!("{group}.parking")
}

/// What a [`KafkaParking`] holds that its group has not handled again yet:
/// see [`KafkaParking::backlog`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParkedBacklog {
    /// Records in the retry topics that the mover group has not moved
    /// back: parked, waiting for their due time or being moved.
    pub parked: u64,
    /// Copies in the return topics that the group has not committed: back,
    /// not handled yet.
    pub returned: u64,
}

impl ParkedBacklog {
    /// Both together: what is parked and not handled again yet.
    pub fn total(&self) -> u64 {
        self.parked.saturating_add(self.returned)
    }
}

/// The state of a [`KafkaParking`]'s mover: see
/// [`KafkaParking::mover_health`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MoverHealth {
    /// Whether a mover runs: false before its first round, while it waits
    /// to start again after a panic, and after
    /// [`shutdown`](KafkaParking::shutdown).
    pub running: bool,
    /// How often the mover panicked and was started again (each logged at
    /// ERROR): a counter for a metric.
    pub restarts: u64,
    /// How long ago its last round began, `None` before the first.
    pub since_last_round: Option<Duration>,
    /// How long a round may take (the delivery timeout, with slack) before
    /// the mover counts as stalled.
    pub stall_after: Duration,
}

impl MoverHealth {
    /// Whether parked messages come back through this process: the mover
    /// runs and began a round within [`stall_after`](Self::stall_after).
    pub fn is_live(&self) -> bool {
        self.running
            && self
                .since_last_round
                .is_some_and(|since| since <= self.stall_after)
    }

    /// As a part of an app's health
    /// ([`Health::add_check`](intake_core::app::Health::add_check)): not
    /// live once no round began for [`stall_after`](Self::stall_after) (a
    /// restart of the process is what is left), not ready while it starts or
    /// starts again after a panic.
    pub fn as_part_health(&self) -> PartHealth {
        match (self.since_last_round, self.running) {
            (Some(since), _) if since > self.stall_after => PartHealth::NotLive(format!(
                "the parking mover began no round for {since:?} ({} restarts after a panic): \
                 parked messages do not come back",
                self.restarts
            )),
            (None, _) => {
                PartHealth::NotReady("the parking mover has not begun its first round".to_owned())
            }
            (Some(_), false) => PartHealth::NotReady(format!(
                "the parking mover starts again after a panic ({} restarts)",
                self.restarts
            )),
            (Some(_), true) => PartHealth::Healthy,
        }
    }
}

/// Why the return partition `p` may go to another member than the origin
/// partition `p` under `settings`, `None` when the assignment keeps them
/// together: the classic protocol's `range` assignor (librdkafka's first
/// by default) gives partition `p` of every topic of as many partitions,
/// subscribed by every member, to one member; `roundrobin` and
/// `cooperative-sticky` do not, nor does the consumer protocol of KIP-848
/// unless the broker assigns with `range` (`group.remote.assignor`).
pub(crate) fn co_location_problem(settings: &KafkaSettings) -> Option<String> {
    if settings
        .get("group.protocol")
        .is_some_and(|protocol| protocol.trim().eq_ignore_ascii_case("consumer"))
    {
        return match settings.get("group.remote.assignor").map(str::trim) {
            Some(assignor) if assignor.eq_ignore_ascii_case("range") => None,
            assignor => Some(format!(
                "group.protocol=consumer with group.remote.assignor={} (the broker's `uniform` when unset)",
                assignor.unwrap_or("unset")
            )),
        };
    }
    let strategy = settings
        .get("partition.assignment.strategy")
        .unwrap_or("range,roundrobin");
    let first = strategy.split(',').next().unwrap_or("").trim();
    (!first.eq_ignore_ascii_case("range"))
        .then(|| format!("partition.assignment.strategy={strategy}"))
}

/// Logs, loudly, settings under which a parked key's copies may come back
/// to another member than the one that holds its later messages.
pub(crate) fn warn_unless_co_located(settings: &KafkaSettings, group: &str) {
    if let Some(problem) = co_location_problem(settings) {
        tracing::warn!(
            group,
            settings = %problem,
            "kafka parking: with these settings partition p of a topic and of its return topic may go to different members, so the order per key of parked messages is not kept and followers of a parked key are parked again and again until overdue; use the `range` assignor (librdkafka's default, partition.assignment.strategy=range) or, with group.protocol=consumer, group.remote.assignor=range"
        );
    }
}

/// A return topic that could not be made sure of at build time, as the
/// build's error.
fn build_error(error: ParkingError) -> Error {
    match error {
        ParkingError::OriginMissing { topic, brokers } => Error::UnknownTopic { topic, brokers },
        ParkingError::Lookup {
            brokers, source, ..
        }
        | ParkingError::TopicNotCreated {
            brokers, source, ..
        }
        | ParkingError::Write {
            brokers, source, ..
        } => Error::from_kafka(*source, &brokers, Duration::ZERO),
        ParkingError::TimedOut {
            brokers, waited, ..
        } => Error::from_kafka(
            KafkaError::MetadataFetch(RDKafkaErrorCode::OperationTimedOut),
            &brokers,
            waited,
        ),
        other => Error::config("return_topic_template", other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mover_is_live_while_it_turns_and_not_ready_while_it_starts() {
        let mover = |running, since_last_round: Option<u64>, restarts| MoverHealth {
            running,
            restarts,
            since_last_round: since_last_round.map(Duration::from_secs),
            stall_after: Duration::from_secs(60),
        };
        assert_eq!(
            mover(true, Some(1), 0).as_part_health(),
            PartHealth::Healthy
        );
        assert!(matches!(
            mover(false, None, 0).as_part_health(),
            PartHealth::NotReady(_)
        ));
        assert!(matches!(
            mover(false, Some(2), 1).as_part_health(),
            PartHealth::NotReady(_)
        ));
        // No round for longer than a round can take: parked messages stay
        // where they are until the process is restarted.
        for running in [true, false] {
            assert!(matches!(
                mover(running, Some(61), 3).as_part_health(),
                PartHealth::NotLive(reason) if reason.contains("3 restarts")
            ));
        }
    }

    /// No broker listens: parked copies return to the origin, so the build
    /// creates no return topic.
    fn builder() -> KafkaParkingBuilder {
        KafkaParking::builder(KafkaSettings::new("127.0.0.1:9"), "billing")
            .topics(["orders"])
            .return_topic_template("{topic}")
    }

    fn refused(built: Result<KafkaParking, Error>, setting: &str) {
        assert!(
            matches!(&built, Err(Error::Config { setting: found, .. }) if found == setting),
            "{setting}: {built:?}"
        );
    }

    #[tokio::test]
    async fn retry_topics_are_per_topic_group_and_tier() {
        let parking = builder().build().await.expect("no broker needed to build");
        assert_eq!(
            parking.topic_for("orders", Duration::from_millis(1500)),
            "orders.billing.retry.1s"
        );
        assert_eq!(
            parking.topic_for("orders", Duration::from_secs(90)),
            "orders.billing.retry.1m"
        );
        assert_eq!(
            parking.topic_for("orders", Duration::from_millis(10)),
            "orders.billing.retry.1s"
        );
        assert_eq!(parking.return_topic("orders"), "orders");
        assert_eq!(
            resolve(DEFAULT_RETURN_TEMPLATE, "orders", "billing", ""),
            "orders.billing.returned"
        );
        parking
            .shutdown(Duration::from_secs(10))
            .await
            .expect("the mover stops");
    }

    #[tokio::test]
    async fn settings_that_cannot_work_are_refused_at_build_time() {
        refused(
            KafkaParking::builder(KafkaSettings::new("127.0.0.1:9"), "billing")
                .build()
                .await,
            "topics",
        );
        refused(builder().tiers([]).build().await, "tiers");
        refused(builder().tiers([Duration::ZERO]).build().await, "tiers");
        refused(
            builder().topic_template("retries.{tier}").build().await,
            "topic_template",
        );
        refused(
            builder().topic_template("{topic}.retry").build().await,
            "topic_template",
        );
        refused(
            builder().topics(["orders.billing.retry.1s"]).build().await,
            "topic_template",
        );
        // A served topic that reads as a retry topic of a tier not
        // configured: the mover would drain it.
        refused(
            builder().topics(["orders.billing.retry.7s"]).build().await,
            "topic_template",
        );
        refused(
            builder()
                .topic_template("{topic}.{tier}.{tier}")
                .build()
                .await,
            "topic_template",
        );
        refused(
            builder().drain_topic_template("old").build().await,
            "drain_topic_template",
        );
        refused(builder().replication(0).build().await, "replication");
        refused(
            builder()
                .topics(["payments"])
                .return_topic_template("returned")
                .build()
                .await,
            "return_topic_template",
        );
        refused(
            builder()
                .topics(["orders.billing.returned"])
                .return_topic_template(DEFAULT_RETURN_TEMPLATE)
                .build()
                .await,
            "return_topic_template",
        );
        refused(
            builder()
                .return_topic_template("{topic}.{group}.retry.1s")
                .build()
                .await,
            "topic_template",
        );
        refused(
            KafkaParking::builder(KafkaSettings::new("127.0.0.1:9"), " ")
                .topics(["orders"])
                .build()
                .await,
            "group",
        );
    }

    #[test]
    fn co_location_holds_under_range_only() {
        let settings = KafkaSettings::new("127.0.0.1:9");
        assert_eq!(co_location_problem(&settings), None, "librdkafka's default");
        for strategy in ["range", "range,roundrobin", " Range , cooperative-sticky"] {
            let chosen = settings
                .clone()
                .set("partition.assignment.strategy", strategy);
            assert_eq!(co_location_problem(&chosen), None, "{strategy}");
        }
        for strategy in ["cooperative-sticky", "roundrobin,range", "roundrobin"] {
            let chosen = settings
                .clone()
                .set("partition.assignment.strategy", strategy);
            assert!(co_location_problem(&chosen).is_some(), "{strategy}");
        }
        let kip_848 = settings.clone().set("group.protocol", "consumer");
        assert!(
            co_location_problem(&kip_848).is_some(),
            "the broker's uniform"
        );
        let range = kip_848.clone().set("group.remote.assignor", "range");
        assert_eq!(co_location_problem(&range), None);
        let uniform = kip_848.set("group.remote.assignor", "uniform");
        assert!(co_location_problem(&uniform).is_some());
    }

    #[tokio::test]
    async fn the_health_of_a_mover_that_was_stopped_is_not_live() {
        let parking = builder().build().await.expect("no broker needed to build");
        parking
            .shutdown(Duration::from_secs(10))
            .await
            .expect("the mover stops");
        let health = parking.mover_health();
        assert!(!health.running, "{health:?}");
        assert!(!health.is_live(), "{health:?}");
        assert_eq!(health.restarts, 0);
    }

    #[tokio::test]
    async fn a_message_of_a_topic_not_served_is_refused_without_a_round_trip() {
        let parking = builder().build().await.expect("valid");
        let message = Message::new(
            "payload",
            intake_core::Metadata::new("payments".into(), 0, intake_core::Position::Offset(3)),
        );
        let refused = parking
            .park(&message, Duration::from_secs(1))
            .await
            .expect_err("not a served topic");
        assert!(
            matches!(
                refused.0.downcast_ref::<ParkingError>(),
                Some(ParkingError::UnknownTopic { topic, .. }) if topic == "payments"
            ),
            "{refused:?}"
        );
        drop(parking);
    }
}
