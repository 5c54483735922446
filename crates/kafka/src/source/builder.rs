//! [`KafkaSourceBuilder`]: settings, checks and start-up of a [`KafkaSource`].

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use intake_core::BackoffPolicy;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use tokio::sync::oneshot;

// The builder and the source name each other (`KafkaSource::builder`,
// `KafkaSourceBuilder::build`): the one loop between files of this crate,
// the shape every intake adapter has.
use super::KafkaSource;
use super::context::{KafkaContext, Shared, topic_missing};
use super::convert::Converter;
use super::earliest::EarliestTopics;
use super::poller::{Poller, guard_polling};
use super::reconnect::ReconnectBackoff;
use super::stall_check::StallCheck;
use super::watchdog::{OffsetReset, Watchdog};
use crate::dead_letter::KafkaDeadLetterSink;
use crate::error::Error;
use crate::parking::{DEFAULT_RETURN_TEMPLATE, KafkaParking, warn_unless_co_located};
use crate::settings::KafkaSettings;
use crate::transaction::KafkaTransactions;

/// The group name a broadcast consumer's own group starts with when it was
/// given none.
const BROADCAST_GROUP: &str = "intake";

/// librdkafka's default `max.poll.interval.ms`.
const DEFAULT_MAX_POLL_INTERVAL: Duration = Duration::from_secs(300);

/// librdkafka's prefetch, bounded in bytes (see [`KafkaSourceBuilder`]):
/// 16 MiB of queued messages, 16 MiB per fetch response. At 100-byte
/// messages that is still 160,000 messages ahead; at 1 MiB, sixteen.
///
/// And how long a partition whose queue reached a bound waits before it
/// fetches again: librdkafka's default, 1 s, is longer than a fast consumer
/// takes to drain a bounded queue, which then sat idle for the rest of the
/// second (half the throughput at 100-byte messages, `BENCHMARKS.md`). A
/// full queue is checked 50 times a second instead, which costs nothing
/// measurable.
const PREFETCH_BOUNDS: [(&str, &str); 3] = [
    ("queued.max.messages.kbytes", "16384"),
    ("fetch.max.bytes", "16777216"),
    ("fetch.queue.backoff.ms", "20"),
];

/// Builds a [`KafkaSource`]. Every setting has a default except the group
/// (or broadcast mode) and the topics.
///
/// Defaults intake applies unless the settings say otherwise:
/// `auto.offset.reset=earliest` (a new group reads what was produced before
/// it started; broadcast mode uses `latest`). Always applied:
/// `enable.auto.commit=false` and `enable.auto.offset.store=false` (offsets
/// are committed only from the commit engine's watermark) and
/// `enable.partition.eof=false`.
///
/// librdkafka's prefetch is bounded in bytes too, smaller than its own
/// defaults (64 MiB queued, 50 MiB per fetch), unless the settings say
/// otherwise: `queued.max.messages.kbytes=16384` (16 MiB of prefetched
/// messages) and `fetch.max.bytes=16777216` (16 MiB per fetch response),
/// and a partition whose queue reached a bound fetches again after
/// `fetch.queue.backoff.ms=20` (librdkafka waits 1 s, long enough for a fast
/// consumer to drain the bounded queue and sit idle).
/// With the runtime's byte budget and the hand-over queue (half of it),
/// that bounds the consumer's message memory; `docs/ARCHITECTURE.md` lists
/// every buffer.
///
/// The consumer's budget is set once, on the consumer
/// ([`ConsumerBuilder`](intake_core::ConsumerBuilder)): its
/// `max_in_flight`, `max_in_flight_bytes` and `revoke_timeout` size the
/// source's hand-over queue and its rebalance callback's wait (see
/// [`KafkaSource`]'s [`set_limits`](intake_core::backend::Source::set_limits)).
#[derive(Debug, Clone)]
pub struct KafkaSourceBuilder {
    settings: KafkaSettings,
    group: Option<String>,
    topics: Vec<String>,
    broadcast: bool,
    /// The policy given to [`reconnect_backoff`](Self::reconnect_backoff),
    /// as librdkafka's schedule, or what is wrong with it.
    reconnect: Option<Result<ReconnectBackoff, String>>,
    connect_timeout: Duration,
    close_timeout: Duration,
    watchdog_interval: Duration,
    min_commit_interval: Duration,
    read_headers: bool,
    exactly_once: Option<KafkaTransactions>,
    parking: Option<KafkaParking>,
}

/// The return topics a source reads: from its parking, or named by hand.
#[derive(Debug, Default)]
struct Returns {
    /// Every topic subscribed: the source's own, then the return topics
    /// added for them.
    topics: Vec<String>,
    /// The return topics, by name, with the origin whose copies come back
    /// there (an origin that is its own return topic included): what the
    /// dead-letter sink may follow a copy's origin header from.
    origins: Vec<(String, String)>,
    /// The return topics read from their start when a partition has no
    /// usable offset.
    earliest: Vec<String>,
}

impl KafkaSourceBuilder {
    pub(crate) fn new(settings: KafkaSettings) -> Self {
        Self {
            settings,
            group: None,
            topics: Vec::new(),
            broadcast: false,
            reconnect: None,
            connect_timeout: Duration::from_secs(10),
            close_timeout: Duration::from_secs(10),
            watchdog_interval: Duration::from_secs(30),
            min_commit_interval: Duration::from_millis(100),
            read_headers: true,
            exactly_once: None,
            parking: None,
        }
    }

    /// The consumer group (`group.id`). Consumers of one group share the
    /// topics' partitions.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Adds a topic to consume.
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topics.push(topic.into());
        self
    }

    /// Adds topics to consume.
    pub fn topics<I: IntoIterator<Item = S>, S: Into<String>>(mut self, topics: I) -> Self {
        self.topics.extend(topics.into_iter().map(Into::into));
        self
    }

    /// Broadcast mode: this instance gets every message. It joins a group of
    /// its own (named after [`group`](Self::group), or `intake`, plus a unique
    /// suffix), starts at the end of each partition and commits nothing.
    pub fn broadcast(mut self) -> Self {
        self.broadcast = true;
        self
    }

    /// How the client waits between attempts to reconnect to a broker it
    /// lost. Default: from 100 ms, doubling up to 10 s, forever (the same on
    /// every intake backend, and librdkafka's own defaults).
    ///
    /// librdkafka reconnects by itself, on its own schedule: it doubles the
    /// wait after each failure from `reconnect.backoff.ms` up to
    /// `reconnect.backoff.max.ms`, spreads each wait by -25 % to +50 %, and
    /// never gives up. The policy sets those two settings: an
    /// [`Exponential`](intake_core::Exponential)'s first and longest delay
    /// (its factor, jitter and retry cap are not honoured), a
    /// [`Constant`](intake_core::Constant)'s delay for both (its retry cap
    /// is not honoured). [`build`](Self::build) refuses
    /// [`Disabled`](intake_core::Disabled) (librdkafka cannot stop
    /// reconnecting), a policy of another type (librdkafka cannot follow
    /// it), an invalid one, a delay over an hour, and a policy that
    /// contradicts either setting given in the [`KafkaSettings`]. Without a
    /// policy, those settings apply as given.
    ///
    /// The consumer's own
    /// [`reconnect_backoff`](intake_core::ConsumerBuilder::reconnect_backoff)
    /// paces its retries of errors the source reports (a topic being
    /// created again), not librdkafka's reconnects.
    pub fn reconnect_backoff(mut self, policy: impl BackoffPolicy) -> Self {
        self.reconnect = Some(ReconnectBackoff::of(&policy));
        self
    }

    /// How long [`build`](Self::build) waits for the brokers (default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long closing waits to leave the group (default 10 s).
    pub fn close_timeout(mut self, timeout: Duration) -> Self {
        self.close_timeout = timeout;
        self
    }

    /// How long the consumer may yield nothing before the stall watchdog
    /// compares its positions with the brokers' high watermarks (default
    /// 30 s; zero turns the watchdog off). The brokers are asked on a
    /// thread of the watchdog's own, all partitions at once (one query per
    /// leader broker), each query bounded by 10 s: polling, rebalance
    /// callbacks and pausing never wait for the answer, and the next check
    /// comes an interval after it.
    pub fn watchdog_interval(mut self, interval: Duration) -> Self {
        self.watchdog_interval = interval;
        self
    }

    /// The shortest time between two offset commits while the consumer runs
    /// (default 100 ms; zero: no minimum).
    ///
    /// The runtime hands the acker its next batch as soon as the previous
    /// one is done, so at high rates every broker round trip would carry a
    /// commit, and each is a write on the broker that competes with
    /// fetching. With a minimum the acker waits out the rest of the interval
    /// before committing, and the runtime gathers the completions of that
    /// time into the one commit. Synchronous commits (a revocation, the
    /// shutdown) are never held back, though one may wait for a commit that
    /// is.
    pub fn min_commit_interval(mut self, interval: Duration) -> Self {
        self.min_commit_interval = interval;
        self
    }

    /// Delivers messages without their records' headers, for handlers that
    /// read none (default: headers are read).
    ///
    /// librdkafka parses a record's headers when asked for them, and asking
    /// costs an allocation of its own even for a record without any (it reads
    /// the header count through a buffer it allocates): about 60–80 ns per
    /// message on the polling thread, several percent of the consumer's CPU at
    /// small messages (`BENCHMARKS.md`). Dead letters still get their origin
    /// headers; only the producer's own headers are left out.
    pub fn ignore_headers(mut self) -> Self {
        self.read_headers = false;
        self
    }

    /// An exactly-once pipeline with `transactions` (see
    /// [`KafkaTransactions`]): the source reads with
    /// `isolation.level=read_committed`, starts the transactional producer
    /// when it is built, and its acker commits every watermark batch in a
    /// transaction with the outputs the transactions' layer kept. Its
    /// rebalance callback then commits nothing of its own: what the
    /// runtime's revocation batch did not commit is handled again by the
    /// partitions' next owner.
    ///
    /// [`build`](Self::build) refuses it in broadcast mode (nothing is
    /// committed there), with `isolation.level=read_uncommitted` (an
    /// aborted output upstream would be handled), and for transactions that
    /// already serve another source.
    pub fn exactly_once(mut self, transactions: &KafkaTransactions) -> Self {
        self.exactly_once = Some(transactions.clone());
        self
    }

    /// Reads the parked copies of `parking` too: for each of this source's
    /// topics that `parking` serves, its return topic
    /// ([`KafkaParking::return_topic`]) is subscribed as well, and the
    /// dead-letter sink of this source names a returned copy's letter after
    /// the copy's first delivery.
    ///
    /// A return topic is always read from its **start** when a partition
    /// has no usable offset (never committed, or deleted by the retention),
    /// whatever `auto.offset.reset` says for the other topics: a copy
    /// reaches it whenever the mover moves it, possibly while no member has
    /// a position there (before the source joined, during a rebalance), and
    /// its original was acknowledged when it was parked. A return topic
    /// named by hand in [`topics`](Self::topics) gets the same when it is
    /// the default return topic of another topic of this source
    /// (`{topic}.{group}.returned`).
    ///
    /// [`build`](Self::build) refuses a parking of another group, one that
    /// serves none of this source's topics, broadcast mode, and
    /// `auto.offset.reset=latest` with a parking whose copies return to the
    /// origin topic itself (`return_topic_template("{topic}")`): those
    /// would be skipped as described. It warns, loudly, when the
    /// partition assignment may give partition `p` of a topic and of its
    /// return topic to different members (see the parking's docs).
    pub fn parking(mut self, parking: &KafkaParking) -> Self {
        self.parking = Some(parking.clone());
        self
    }

    /// The topics to subscribe and which of them are return topics.
    fn returns(&self, settings: &KafkaSettings) -> Result<Returns, Error> {
        let mut returns = Returns {
            topics: self.topics.clone(),
            ..Returns::default()
        };
        let group = match (&self.group, self.broadcast) {
            (Some(group), false) => group.as_str(),
            _ => {
                if self.parking.is_some() {
                    return Err(Error::config(
                        "parking",
                        "a broadcast consumer reads every message from the end and commits nothing: it cannot read a group's parked copies; use a group",
                    ));
                }
                return Ok(returns);
            }
        };
        if let Some(parking) = &self.parking {
            if parking.group() != group {
                return Err(Error::config(
                    "parking",
                    format!(
                        "the parking parks the messages of group `{}`, this source reads as group `{group}`: build the parking with the source's group",
                        parking.group()
                    ),
                ));
            }
            let mut served = false;
            let mut sorted: Vec<(&String, &String)> = parking.return_topics().iter().collect();
            sorted.sort();
            for (back_to, origin) in sorted {
                if self.topics.contains(origin) {
                    served = true;
                    if !returns.topics.contains(back_to) {
                        returns.topics.push(back_to.clone());
                    }
                    returns.origins.push((back_to.clone(), origin.clone()));
                    returns.earliest.push(back_to.clone());
                }
            }
            let latest =
                OffsetReset::from_setting(settings.get("auto.offset.reset")) == OffsetReset::Latest;
            for origin in parking.topics_returning_to_themselves() {
                if !self.topics.contains(origin) {
                    continue;
                }
                served = true;
                if latest {
                    return Err(Error::config(
                        "auto.offset.reset",
                        format!(
                            "the parking returns the copies of `{origin}` to `{origin}` itself, which this source reads from its end when a partition has no committed offset: copies that come back before a member has a position are skipped, and their originals were acknowledged; use the default return template (`{DEFAULT_RETURN_TEMPLATE}`, read from its start) or auto.offset.reset=earliest"
                        ),
                    ));
                }
                returns.origins.push((origin.clone(), origin.clone()));
            }
            if !served {
                return Err(Error::config(
                    "parking",
                    format!(
                        "the parking serves none of this source's topics {:?}: build it with `.topics(..)` of this source",
                        self.topics
                    ),
                ));
            }
        }
        // Return topics named by hand, by the default template.
        for origin in &self.topics {
            let back_to = DEFAULT_RETURN_TEMPLATE
                .replace("{topic}", origin)
                .replace("{group}", group);
            if self.topics.contains(&back_to) && !returns.earliest.contains(&back_to) {
                returns.origins.push((back_to.clone(), origin.clone()));
                returns.earliest.push(back_to);
            }
        }
        if !returns.origins.is_empty() {
            warn_unless_co_located(settings, group);
        }
        Ok(returns)
    }

    /// The librdkafka settings of the consumer, with intake's defaults and
    /// fixed settings applied, and its group id.
    fn consumer_settings(&self) -> Result<(KafkaSettings, String), Error> {
        if self.topics.is_empty() || self.topics.iter().any(String::is_empty) {
            return Err(Error::config(
                "topics",
                "name at least one topic, none empty (`.topic(\"orders\")`)",
            ));
        }
        if self.settings.is_true("enable.auto.commit") == Some(true) {
            return Err(Error::config(
                "enable.auto.commit",
                "must be false: intake commits offsets only for finished messages; remove the setting",
            ));
        }
        let group_id = match (&self.group, self.broadcast) {
            (group, true) => format!(
                "{}.broadcast.{}",
                group.as_deref().unwrap_or(BROADCAST_GROUP),
                unique_suffix()
            ),
            (Some(group), false) if !group.is_empty() => group.clone(),
            (_, false) => {
                return Err(Error::config(
                    "group",
                    "set a consumer group (`.group(\"orders-service\")`) or choose `.broadcast()`",
                ));
            }
        };
        let mut settings = self.client_settings()?;
        let config = settings.client_config_mut();
        config.set("group.id", &group_id);
        config.set("enable.auto.commit", "false");
        config.set("enable.auto.offset.store", "false");
        config.set("enable.partition.eof", "false");
        if self.exactly_once.is_some() {
            if self.broadcast {
                return Err(Error::config(
                    "exactly_once",
                    "a broadcast consumer commits nothing, so it has no transaction to put outputs in; use a group",
                ));
            }
            if config.get("isolation.level") == Some("read_uncommitted") {
                return Err(Error::config(
                    "isolation.level",
                    "must be read_committed in an exactly-once pipeline: outputs of aborted transactions upstream would be handled; remove the setting",
                ));
            }
            config.set("isolation.level", "read_committed");
        }
        if self.broadcast {
            config.set("auto.offset.reset", "latest");
        } else if config.get("auto.offset.reset").is_none() {
            config.set("auto.offset.reset", "earliest");
        }
        for (key, value) in PREFETCH_BOUNDS {
            if config.get(key).is_none() {
                config.set(key, value);
            }
        }
        Ok((settings, group_id))
    }

    /// The settings of any client of this source's brokers (the consumer,
    /// a dead-letter producer): the given ones with the reconnect policy.
    fn client_settings(&self) -> Result<KafkaSettings, Error> {
        let mut settings = self.settings.clone();
        let (reconnect, explicit) = match &self.reconnect {
            None => (ReconnectBackoff::default(), false),
            Some(Ok(reconnect)) => (*reconnect, true),
            Some(Err(problem)) => return Err(Error::config("reconnect_backoff", problem.clone())),
        };
        reconnect.apply(&mut settings, explicit)?;
        Ok(settings)
    }

    /// Creates the consumer, checks that the brokers answer and that every
    /// topic exists (within the connect timeout), subscribes, and starts
    /// the polling thread.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for settings that cannot work,
    /// [`Error::Unreachable`] when no broker answers in time,
    /// [`Error::UnknownTopic`] for a missing topic,
    /// [`Error::Unauthorized`] when the credentials are refused,
    /// [`Error::Tls`] when the TLS handshake fails; for an
    /// [`exactly_once`](Self::exactly_once) source, the errors of starting
    /// its transactional producer too ([`Error::Client`] when
    /// `init_transactions` fails or times out).
    pub async fn build(self) -> Result<KafkaSource, Error> {
        let (settings, group_id) = self.consumer_settings()?;
        let returns = self.returns(&settings)?;
        let brokers = settings.endpoint();
        let mut shared = Shared::new(
            !self.broadcast,
            brokers.clone(),
            max_poll_interval(&settings)?,
        );
        // The producer first: a build that fails leaves no consumer in the
        // group, and the producer's start aborts what a predecessor of the
        // same transactional.id left open before anything is consumed.
        let (transactor, claim) = match &self.exactly_once {
            Some(transactions) => {
                let claim = transactions.claim()?;
                shared.exactly_once = Some(claim.store());
                (Some(transactions.start().await?), Some(claim))
            }
            None => (None, None),
        };
        let shared = Arc::new(shared);
        let context = KafkaContext {
            shared: shared.clone(),
        };
        let started = Instant::now();
        let consumer: BaseConsumer<KafkaContext> = settings
            .client_config()
            .create_with_context(context)
            .map_err(|error| Error::from_kafka(error, &brokers, started.elapsed()))?;
        let consumer = Arc::new(consumer);
        // Before any lookup names the return topics (see `earliest`).
        let earliest = EarliestTopics::hold(&consumer, &returns.earliest)?;
        let (consumer, earliest) = {
            let topics = returns.topics.clone();
            let timeout = self.connect_timeout;
            let brokers = brokers.clone();
            // On a failure the consumer is dropped on this blocking thread:
            // dropping one closes it, which waits for librdkafka.
            tokio::task::spawn_blocking(move || {
                check_topics(&consumer, &topics, timeout, &brokers)?;
                let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
                consumer
                    .subscribe(&topics)
                    .map_err(|error| Error::from_kafka(error, &brokers, started.elapsed()))?;
                Ok((consumer, earliest))
            })
            .await
            .map_err(|error| Error::Spawn(std::io::Error::other(error)))??
        };
        let handle = Arc::downgrade(&consumer);
        let stall_check = match self.watchdog_interval.is_zero() {
            true => None,
            false => Some(StallCheck::spawn(handle.clone(), shared.clone()).map_err(Error::Spawn)?),
        };

        let (stopped_tx, stopped) = oneshot::channel();
        // The polling thread holds the only lasting strong reference, so the
        // consumer is dropped (and librdkafka's instance destroyed) there,
        // or on the blocking thread of an acker's commit or on the stall
        // checker's thread, which hold it for one call: never on a tokio
        // worker.
        let poller = Poller {
            consumer,
            shared: shared.clone(),
            watchdog: Watchdog::new(self.watchdog_interval),
            stall_check,
            assignment_epoch: 0,
            close_timeout: self.close_timeout,
            batch: Vec::with_capacity(512),
            converter: Converter::new(self.read_headers),
            paused: false,
            reported_missing: Vec::new(),
            reset: OffsetReset::from_setting(settings.get("auto.offset.reset")),
            earliest,
            last_reachability_probe: Instant::now(),
        };
        std::thread::Builder::new()
            .name("intake-kafka-poll".into())
            .spawn(move || {
                let shared = poller.shared.clone();
                let consumer = guard_polling(&shared, || poller.run());
                let _ = stopped_tx.send(());
                // Destroying the instance may wait for the brokers; nobody
                // waits for that.
                drop(consumer);
            })
            .map_err(Error::Spawn)?;
        if let Some(claim) = claim {
            claim.keep();
        }
        tracing::info!(group = %group_id, topics = ?returns.topics, %brokers, "kafka source started");
        Ok(KafkaSource {
            shared,
            consumer: handle,
            min_commit_interval: self.min_commit_interval,
            dead_letters: KafkaDeadLetterSink::builder(
                self.client_settings()?,
                self.group.as_deref().unwrap_or(BROADCAST_GROUP),
            )
            .consumed_topics(returns.topics)
            .copies_returning_to(returns.origins),
            group_id,
            stopped: Some(stopped),
            taken: Vec::new(),
            transactor,
        })
    }
}

/// The consumer's `max.poll.interval.ms`: how long it may go between two
/// polls, a rebalance callback included, before the group evicts it.
fn max_poll_interval(settings: &KafkaSettings) -> Result<Duration, Error> {
    match settings.get("max.poll.interval.ms") {
        Some(value) => value
            .parse::<u64>()
            .map(Duration::from_millis)
            .map_err(|_| {
                Error::config(
                    "max.poll.interval.ms",
                    format!("`{value}` is not a number of milliseconds"),
                )
            }),
        None => Ok(DEFAULT_MAX_POLL_INTERVAL),
    }
}

/// Fetches each topic's metadata: proves a broker answers and the topic
/// exists.
fn check_topics(
    consumer: &BaseConsumer<KafkaContext>,
    topics: &[String],
    timeout: Duration,
    brokers: &str,
) -> Result<(), Error> {
    let started = Instant::now();
    for topic in topics {
        let remaining = timeout.saturating_sub(started.elapsed());
        let metadata = consumer
            .fetch_metadata(Some(topic), remaining)
            .map_err(|error| explain_failure(consumer, error, brokers, started.elapsed()))?;
        if topic_missing(&metadata, topic) {
            return Err(Error::UnknownTopic {
                topic: topic.clone(),
                brokers: brokers.into(),
            });
        }
    }
    Ok(())
}

/// The build error for a failed metadata fetch. A timeout says little; when
/// librdkafka reported a refused certificate or refused credentials on the
/// way, that is the error. Its error events wait in the consumer's queue
/// (nothing polled it yet), so they are served first.
fn explain_failure(
    consumer: &BaseConsumer<KafkaContext>,
    error: KafkaError,
    brokers: &str,
    waited: Duration,
) -> Error {
    // `poll` answers `None` both for an empty queue and for an event it
    // served (a log line), so it cannot say when the queue is empty: the
    // loop is bounded instead (the queue holds one connect timeout's worth
    // of events, and each call returns at once).
    for _ in 0..1024 {
        if consumer.context().shared.connection_failure().is_some() {
            break;
        }
        let _ = consumer.poll(Duration::ZERO);
    }
    match consumer.context().shared.connection_failure() {
        Some((failure, account)) => failure.into_error(brokers, account.into()),
        None => Error::from_kafka(error, brokers, waited),
    }
}

/// A suffix that no other instance picks: time, process and a random seed.
fn unique_suffix() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| since.as_nanos())
        .unwrap_or(0);
    let random = RandomState::new().hash_one(nanos);
    format!("{}-{:x}", std::process::id(), random)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builder() -> KafkaSourceBuilder {
        KafkaSourceBuilder::new(KafkaSettings::new("127.0.0.1:9"))
    }

    /// A parking that returns to the origin itself, with no broker needed
    /// (it creates no return topic).
    async fn parking(group: &str, template: &str) -> KafkaParking {
        KafkaParking::builder(KafkaSettings::new("127.0.0.1:9"), group)
            .topics(["orders"])
            .return_topic_template(template)
            .build()
            .await
            .expect("no broker needed")
    }

    fn refused(returns: Result<Returns, Error>, wanted: &str) {
        assert!(
            matches!(&returns, Err(Error::Config { setting, .. }) if setting == wanted),
            "{wanted}: {returns:?}"
        );
    }

    /// What reading a parking's copies needs is checked before the
    /// consumer is made.
    #[tokio::test]
    async fn a_parking_the_source_cannot_read_copies_of_is_refused() {
        let itself = parking("billing", "{topic}").await;
        let settings =
            |reset: &str| KafkaSettings::new("127.0.0.1:9").set("auto.offset.reset", reset);
        refused(
            builder()
                .group("shipping")
                .topic("orders")
                .parking(&itself)
                .returns(&settings("earliest")),
            "parking",
        );
        refused(
            builder()
                .group("billing")
                .topic("payments")
                .parking(&itself)
                .returns(&settings("earliest")),
            "parking",
        );
        refused(
            builder()
                .group("billing")
                .broadcast()
                .topic("orders")
                .parking(&itself)
                .returns(&settings("latest")),
            "parking",
        );
        refused(
            builder()
                .group("billing")
                .topic("orders")
                .parking(&itself)
                .returns(&settings("latest")),
            "auto.offset.reset",
        );
        let returns = builder()
            .group("billing")
            .topic("orders")
            .parking(&itself)
            .returns(&settings("earliest"))
            .expect("copies in the origin, read from its start");
        assert_eq!(returns.topics, ["orders"]);
        assert!(returns.earliest.is_empty());
        assert_eq!(
            returns.origins,
            [("orders".to_owned(), "orders".to_owned())]
        );
        itself
            .shutdown(Duration::from_secs(10))
            .await
            .expect("the mover stops");
    }

    /// A return topic named by hand by the default template is read from
    /// its start too; another topic is not.
    #[test]
    fn a_default_return_topic_named_by_hand_is_read_from_its_start() {
        let settings = KafkaSettings::new("127.0.0.1:9").set("auto.offset.reset", "latest");
        let returns = builder()
            .group("billing")
            .topics([
                "orders",
                "orders.billing.returned",
                "orders.shipping.returned",
            ])
            .returns(&settings)
            .expect("valid");
        assert_eq!(returns.earliest, ["orders.billing.returned"]);
        assert_eq!(
            returns.origins,
            [("orders.billing.returned".to_owned(), "orders".to_owned())]
        );
        let broadcast = builder()
            .topics(["orders", "orders.intake.returned"])
            .broadcast()
            .returns(&settings)
            .expect("valid");
        assert!(broadcast.earliest.is_empty());
    }

    #[test]
    fn offsets_are_never_auto_committed() {
        let (settings, _) = builder()
            .group("g")
            .topic("t")
            .consumer_settings()
            .expect("valid settings");
        assert_eq!(settings.get("enable.auto.commit"), Some("false"));
        assert_eq!(settings.get("auto.offset.reset"), Some("earliest"));

        let refused = builder()
            .group("g")
            .topic("t")
            .consumer_settings_with("enable.auto.commit", "true");
        assert!(
            matches!(refused, Err(Error::Config { setting, .. }) if setting == "enable.auto.commit")
        );
    }

    /// With the prefetch bounded, librdkafka's default 1 s backoff after a
    /// full queue outlasts the queue: the consumer would drain it and then
    /// sit idle (measured: half the throughput at 100-byte messages).
    #[test]
    fn a_partition_whose_queue_was_full_fetches_again_soon_unless_told_otherwise() {
        let (settings, _) = builder()
            .group("g")
            .topic("t")
            .consumer_settings()
            .expect("valid settings");
        assert_eq!(settings.get("fetch.queue.backoff.ms"), Some("20"));
        assert_eq!(settings.get("queued.max.messages.kbytes"), Some("16384"));

        let (settings, _) = builder()
            .group("g")
            .topic("t")
            .consumer_settings_with("fetch.queue.backoff.ms", "500")
            .expect("valid settings");
        assert_eq!(settings.get("fetch.queue.backoff.ms"), Some("500"));
    }

    #[test]
    fn a_consumer_needs_a_group_or_broadcast() {
        let error = builder().topic("t").consumer_settings();
        assert!(matches!(error, Err(Error::Config { setting, .. }) if setting == "group"));
        let (settings, group) = builder()
            .topic("t")
            .broadcast()
            .consumer_settings()
            .expect("broadcast needs no group");
        assert!(group.starts_with("intake.broadcast."));
        assert_eq!(settings.get("auto.offset.reset"), Some("latest"));
    }

    #[test]
    fn broadcast_instances_get_groups_of_their_own() {
        let first = builder().topic("t").broadcast().consumer_settings();
        let second = builder().topic("t").broadcast().consumer_settings();
        let (Ok((_, first)), Ok((_, second))) = (first, second) else {
            panic!("broadcast settings are valid");
        };
        assert_ne!(first, second);
    }

    #[test]
    fn the_reconnect_policy_reaches_the_consumer_or_fails_the_build() {
        let (settings, _) = builder()
            .group("g")
            .topic("t")
            .consumer_settings()
            .expect("valid settings");
        assert_eq!(settings.get("reconnect.backoff.ms"), Some("100"));
        assert_eq!(settings.get("reconnect.backoff.max.ms"), Some("10000"));

        let (settings, _) = builder()
            .group("g")
            .topic("t")
            .reconnect_backoff(intake_core::Exponential::new(
                Duration::from_millis(500),
                Duration::from_secs(20),
            ))
            .consumer_settings()
            .expect("valid settings");
        assert_eq!(settings.get("reconnect.backoff.ms"), Some("500"));
        assert_eq!(settings.get("reconnect.backoff.max.ms"), Some("20000"));

        let refused = builder()
            .group("g")
            .topic("t")
            .reconnect_backoff(intake_core::Disabled)
            .consumer_settings();
        assert!(
            matches!(refused, Err(Error::Config { ref setting, .. }) if setting == "reconnect_backoff"),
            "{refused:?}"
        );
    }

    #[test]
    fn no_topic_is_a_configuration_error() {
        let error = builder().group("g").consumer_settings();
        assert!(matches!(error, Err(Error::Config { setting, .. }) if setting == "topics"));
    }

    /// Settings whose values are secrets, by librdkafka's account (its
    /// sensitive properties) and Java's `sasl.jaas.config`: the test's
    /// oracle, written out rather than asked of `is_secret`.
    const SECRET_KEYS: [&str; 8] = [
        "sasl.username",
        "sasl.password",
        "ssl.key.password",
        "ssl.key.pem",
        "ssl.key.location",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "sasl.jaas.config",
    ];

    /// librdkafka settings a user may write, secrets among them, and
    /// arbitrary names librdkafka does not know.
    fn any_key() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            prop::sample::select(SECRET_KEYS.to_vec()).prop_map(str::to_owned),
            prop::sample::select(vec![
                "fetch.wait.max.ms",
                "session.timeout.ms",
                "max.poll.interval.ms",
                "security.protocol",
                "sasl.mechanisms",
                "enable.auto.commit",
                "auto.offset.reset",
                "socket.timeout.ms",
                "statistics.interval.ms",
                "client.id",
            ])
            .prop_map(str::to_owned),
            "[a-z]{1,8}(\\.[a-z]{1,8}){0,3}",
        ]
    }

    fn any_value() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            "-?[0-9]{1,22}",
            prop::sample::select(vec!["true", "FALSE", "earliest", "SASL_SSL", "PLAIN", ""])
                .prop_map(str::to_owned),
            ".{0,16}",
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

        #[test]
        fn any_settings_make_a_client_or_a_typed_error_that_hides_secrets(
            settings in proptest::collection::vec((any_key(), any_value()), 0..6),
        ) {
            // Each value is marked, so a leak says which setting it came from.
            let mut builder = builder().group("g").topic("t");
            for (index, (key, value)) in settings.iter().enumerate() {
                builder.settings = builder.settings.set(key.as_str(), format!("{value}<{index}>"));
            }
            let secrets: Vec<String> = settings
                .iter()
                .enumerate()
                .filter(|(_, (key, _))| SECRET_KEYS.contains(&key.as_str()))
                .map(|(index, _)| format!("<{index}>"))
                .collect();
            let shown = format!("{:?}", builder.settings);
            let outcome = builder.consumer_settings().and_then(|(settings, _)| {
                settings
                    .client_config()
                    .create::<rdkafka::consumer::BaseConsumer>()
                    .map(drop)
                    .map_err(|error| Error::from_kafka(error, "127.0.0.1:9", Duration::ZERO))
            });
            let error = outcome.err().map(|error| error.to_string()).unwrap_or_default();
            for secret in &secrets {
                proptest::prop_assert!(!shown.contains(secret.as_str()), "{}", shown);
                proptest::prop_assert!(!error.contains(secret.as_str()), "{}", error);
            }
        }
    }

    impl KafkaSourceBuilder {
        fn consumer_settings_with(
            mut self,
            key: &str,
            value: &str,
        ) -> Result<(KafkaSettings, String), Error> {
            self.settings = self.settings.set(key, value);
            self.consumer_settings()
        }
    }
}
