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
//! **Nothing is parked where nobody reads.** A parked message's original
//! is acknowledged; its copy is handled again only by a source of the
//! group that reads its return topic. So a source of the parking's group,
//! built after it in this process, that reads a served topic but not its
//! return topic is **refused at build time** ([`Error::Config`], setting
//! `parking`): build it with
//! [`KafkaSourceBuilder::parking`](crate::KafkaSourceBuilder::parking) (or
//! name the return topic among its topics). And the parking parks the
//! messages of a served topic only once a source of its group was built
//! with it, or built after it naming the return topic (one rebuilt later
//! reads on from the group's offsets): before, [`park`](Parking::park)
//! refuses with [`ParkingError::ReturnTopicUnread`], which names the fix,
//! and writes nothing, so the parking layer retries the message the
//! ordinary way and logs the refusal. [`KafkaBroker::route`](crate::KafkaBroker) derives the
//! two together and needs nothing.
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

mod assignment;
mod backlog;
mod builder;
mod error;
mod health;
mod mover;
mod park;
mod parked;
mod tiers;
mod topics;
mod wiring;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
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

pub(crate) use self::assignment::warn_unless_co_located;
use self::backlog::BacklogClients;
pub use self::backlog::ParkedBacklog;
pub use self::builder::KafkaParkingBuilder;
pub use self::error::ParkingError;
pub use self::health::MoverHealth;
use self::mover::{MoverConfig, MoverShared, RetryPattern, Route};
use self::park::TopicAdmin;
pub(crate) use self::parked::ParkedCounter;
pub use self::tiers::DEFAULT_TIERS;
use self::tiers::{Tiers, resolve};
use self::topics::Registry;
pub(crate) use self::topics::partition_count;
pub(crate) use self::wiring::unwired;
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
    /// Per served topic (in the order of `topics`): whether a source of the
    /// group was built to read its return topic. Parks of a topic wait for
    /// it, so that no copy comes back where nobody reads.
    read: Box<[AtomicBool]>,
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

impl Drop for Inner {
    fn drop(&mut self) {
        self.mover.stop.store(true, Ordering::Release);
    }
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
    /// which the source reads besides `topic` when built with
    /// [`KafkaSourceBuilder::parking`](crate::KafkaSourceBuilder::parking)
    /// (the parking parks nothing of `topic` before, see the
    /// [module docs](self)); `topic` itself when the
    /// [return template](KafkaParkingBuilder::return_topic_template) is
    /// `{topic}`. A message consumed from the return topic is parked as one
    /// of `topic`.
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
}
/// The consumer group of the movers of `group`'s parking.
fn mover_group(group: &str) -> String {
    format!("{group}.parking")
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Until a source of the group was built with `.parking(&parking)`,
    /// nobody reads the copies back: a park is refused before anything is
    /// written, and `read_by_source` lifts it for the topics it names only.
    #[tokio::test]
    async fn a_park_before_a_source_reads_the_copies_back_is_refused() {
        let parking = builder()
            .topics(["payments"])
            .build()
            .await
            .expect("no broker needed to build");
        let message = |topic: &str| {
            Message::new(
                "payload",
                intake_core::Metadata::new(topic.into(), 0, intake_core::Position::Offset(3)),
            )
        };
        let refused = parking
            .park(&message("orders"), Duration::from_secs(1))
            .await
            .expect_err("no source reads the copies");
        assert!(
            matches!(
                refused.0.downcast_ref::<ParkingError>(),
                Some(ParkingError::ReturnTopicUnread { topic, group, .. })
                    if topic == "orders" && group == "billing"
            ),
            "{refused:?}"
        );
        assert!(!parking.is_read("orders"));
        parking.read_by_source(&["orders".to_owned(), "other".to_owned()]);
        assert!(parking.is_read("orders"));
        assert!(!parking.is_read("payments"), "another served topic");
        parking
            .shutdown(Duration::from_secs(10))
            .await
            .expect("the mover stops");
    }
}
