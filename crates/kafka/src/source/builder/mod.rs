//! [`KafkaSourceBuilder`]: settings, checks and start-up of a [`KafkaSource`].

mod returns;
mod settings;

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
use crate::parking::{DEFAULT_RETURN_TEMPLATE, KafkaParking, unwired, warn_unless_co_located};
use crate::settings::KafkaSettings;
use crate::transaction::KafkaTransactions;

use self::settings::{BROADCAST_GROUP, max_poll_interval};

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
    /// the header count through a buffer it allocates). The source looks at
    /// that count itself where it can (with the bundled librdkafka, for
    /// records with a non-empty value), so a record without headers costs
    /// no parse either way; this saves the parse of records that have
    /// headers, and the look (`BENCHMARKS.md`). Dead letters still get their
    /// origin headers; only the producer's own headers are left out.
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
    /// A parking parks the messages of a topic only once a source of its
    /// group reads their return topic: built this way, or built after the
    /// parking naming the return topic among its topics. Before, nobody would read the copies
    /// back (see the parking's docs); for the same reason
    /// [`build`](Self::build) refuses a source of a parking's group, built
    /// after the parking in this process, that reads a topic the parking
    /// serves but not its return topic.
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

    /// Creates the consumer, checks that the brokers answer and that every
    /// topic exists (within the connect timeout), subscribes, and starts
    /// the polling thread.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for settings that cannot work (a parking of the
    /// group built before whose return topic this source does not read
    /// among them, see [`parking`](Self::parking)),
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
        // A parking of the group built before: its copies must be read.
        let named_by_hand = match (&self.group, self.broadcast) {
            (Some(group), false) => {
                unwired(&brokers, group, &returns.topics, self.parking.as_ref())?
            }
            _ => Vec::new(),
        };
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
        // Only now does the group read the return topics: the parking parks
        // their origins' messages from here on.
        for parking in self.parking.iter().chain(&named_by_hand) {
            parking.read_by_source(&self.topics);
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

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn builder() -> KafkaSourceBuilder {
        KafkaSourceBuilder::new(KafkaSettings::new("127.0.0.1:9"))
    }
}
