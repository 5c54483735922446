//! The mover: consumes the retry topics in a group of its own, holds each
//! partition's head record (the partition paused) until it is due, then
//! produces it back to where its group reads it (the return topic of its
//! origin, or the origin itself) and commits it.
//!
//! It runs on a thread of its own under a guard: a panic (a bug, never a
//! record: headers are read without trusting their names to be UTF-8) is
//! logged at ERROR, counted, and the mover starts again after a backoff,
//! with a new consumer; the parking reports it in
//! [`KafkaParking::mover_health`](super::KafkaParking::mover_health).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use intake_core::Headers;
use intake_core::parking::{DUE, ORIGIN_PARTITION};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::{ClientContext, Message as _, Offset, TopicPartitionList};
use tokio::sync::oneshot;

use super::LEGACY_ORIGIN_PARTITION;
use super::tiers::{Tiers, label_duration};
use super::topics::Registry;
use crate::error::Error;
use crate::settings::KafkaSettings;

/// The longest the mover blocks in one poll: how soon it sees a stop, a
/// new retry topic, or a head that fell due early (a clock step).
const POLL_CAP: Duration = Duration::from_millis(200);

/// Records taken from the consumer, and moved, per round at most.
const MAX_BATCH: usize = 500;

/// How long a record whose move failed waits before the next attempt.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// How long the discovery's listing of the cluster's topics may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The first wait before a mover that panicked starts again; it doubles up
/// to [`RESTART_MAX`] while the mover keeps panicking.
const RESTART_MIN: Duration = Duration::from_secs(1);

/// The longest wait before a mover that panicked starts again. A mover that
/// ran this long before its panic starts again after [`RESTART_MIN`].
const RESTART_MAX: Duration = Duration::from_secs(60);

/// What a round of the mover may take beyond its delivery timeout (a poll,
/// a discovery, a commit) before it counts as stalled.
const ROUND_SLACK: Duration = Duration::from_secs(30);

/// How often a repeated consumer error is logged at most.
const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// Where the records of one retry topic go back to.
#[derive(Debug, Clone)]
pub(super) struct Route {
    /// The return topic of the origin (the origin itself when configured
    /// so), partitioned like the origin.
    pub(super) back_to: Arc<str>,
    pub(super) tier: usize,
}

/// The retry topics of one served topic, whatever their tier: the names
/// its template gives, `prefix` + a tier's label + `suffix`. The mover
/// drains every existing topic of that form, so records parked under tiers
/// no longer configured still come back.
#[derive(Debug, Clone)]
pub(super) struct RetryPattern {
    pub(super) prefix: String,
    pub(super) suffix: String,
    pub(super) back_to: Arc<str>,
}

impl RetryPattern {
    /// The delay of the tier `topic` is named after, if it is a retry topic
    /// of this pattern: its label is a tier's (`7s`, `1500ms`, `2h`).
    pub(super) fn tier_of(&self, topic: &str) -> Option<Duration> {
        let label = topic
            .strip_prefix(self.prefix.as_str())?
            .strip_suffix(self.suffix.as_str())?;
        label_duration(label)
    }
}

/// What the mover and the parking share.
#[derive(Debug)]
pub(super) struct MoverShared {
    pub(super) stop: AtomicBool,
    /// Records produced back (to the return topic) and committed.
    pub(super) moved: AtomicU64,
    /// Records written to the tail of their retry topic again.
    pub(super) requeued: AtomicU64,
    /// Whether a mover runs now: false before its first round, while it
    /// waits to start again after a panic, and once it stopped.
    pub(super) running: AtomicBool,
    /// Times the mover panicked and was started again.
    pub(super) restarts: AtomicU64,
    /// When the last round began, in milliseconds since `epoch` (0: none
    /// yet).
    pub(super) last_round: AtomicU64,
    pub(super) epoch: Instant,
}

impl Default for MoverShared {
    fn default() -> Self {
        Self {
            stop: AtomicBool::new(false),
            moved: AtomicU64::new(0),
            requeued: AtomicU64::new(0),
            running: AtomicBool::new(false),
            restarts: AtomicU64::new(0),
            last_round: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

impl MoverShared {
    fn round_began(&self) {
        let millis = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        // 0 means "no round yet".
        self.last_round.store(millis.max(1), Ordering::Relaxed);
    }

    /// How long ago the last round began, `None` before the first.
    pub(super) fn since_last_round(&self) -> Option<Duration> {
        match self.last_round.load(Ordering::Relaxed) {
            0 => None,
            millis => Some(
                self.epoch
                    .elapsed()
                    .saturating_sub(Duration::from_millis(millis)),
            ),
        }
    }

    /// How long a round may take before the mover counts as stalled.
    pub(super) fn stall_after(delivery_timeout: Duration) -> Duration {
        delivery_timeout
            .saturating_add(Duration::from_secs(5))
            .saturating_add(ROUND_SLACK)
    }
}

/// Everything the mover thread needs.
pub(super) struct MoverConfig {
    pub(super) settings: KafkaSettings,
    pub(super) group: String,
    pub(super) producer: FutureProducer,
    pub(super) routes: HashMap<String, Route>,
    pub(super) patterns: Vec<RetryPattern>,
    pub(super) tiers: Tiers,
    pub(super) registry: Arc<Registry>,
    pub(super) shared: Arc<MoverShared>,
    pub(super) delivery_timeout: Duration,
    pub(super) discovery_interval: Duration,
    pub(super) brokers: Arc<str>,
}

/// Starts the mover's consumer and thread; the receiver resolves once the
/// thread ended and the consumer left its group.
pub(super) fn spawn(config: MoverConfig) -> Result<oneshot::Receiver<()>, Error> {
    // The first consumer here: settings librdkafka refuses fail the build.
    let first = Mover::new(&config)?;
    let (done, stopped) = oneshot::channel();
    std::thread::Builder::new()
        .name("intake-kafka-park".into())
        .spawn(move || {
            supervise(
                &config.shared,
                &config.group,
                first,
                || Mover::new(&config),
                Mover::run,
                (RESTART_MIN, RESTART_MAX),
            );
            let _ = done.send(());
        })
        .map_err(Error::Spawn)?;
    Ok(stopped)
}

/// Runs `first`, and after a panic a new mover from `make`, until asked to
/// stop: a panic is logged and counted, then the mover starts again after
/// a backoff (`min` doubling up to `max`; back to `min` after a run of at
/// least `max`). Held records were never committed: the new mover fetches
/// them again.
fn supervise<M>(
    shared: &MoverShared,
    group: &str,
    first: M,
    mut make: impl FnMut() -> Result<M, Error>,
    run: impl Fn(M),
    (min, max): (Duration, Duration),
) {
    let mut next = Some(first);
    let mut backoff = min;
    while !shared.stop.load(Ordering::Acquire) {
        let mover = match next.take() {
            Some(mover) => mover,
            None => match make() {
                Ok(mover) => {
                    tracing::info!(
                        group,
                        restarts = shared.restarts.load(Ordering::Relaxed),
                        "kafka parking mover started again"
                    );
                    mover
                }
                Err(error) => {
                    tracing::error!(group, error = %intake_core::ErrorChain::new(&error), retry_in = ?backoff, "the kafka parking mover could not start again");
                    if wait_unless_stopped(shared, backoff) {
                        break;
                    }
                    backoff = backoff.saturating_mul(2).min(max);
                    continue;
                }
            },
        };
        shared.running.store(true, Ordering::Release);
        let started = Instant::now();
        // Unwinding drops the mover's consumer, which leaves the group: its
        // partitions go to the other movers of the group meanwhile.
        let ran = catch_unwind(AssertUnwindSafe(|| run(mover)));
        shared.running.store(false, Ordering::Release);
        let Err(panic) = ran else {
            break;
        };
        let restarts = shared.restarts.fetch_add(1, Ordering::Relaxed) + 1;
        if started.elapsed() >= max {
            backoff = min;
        }
        tracing::error!(
            group,
            panic = %panic_text(panic.as_ref()),
            restarts,
            retry_in = ?backoff,
            "the kafka parking mover panicked; parked messages do not come back until it runs again"
        );
        if wait_unless_stopped(shared, backoff) {
            break;
        }
        backoff = backoff.saturating_mul(2).min(max);
    }
    shared.running.store(false, Ordering::Release);
}

/// Sleeps `wait` in short steps; true when a stop was asked meanwhile.
fn wait_unless_stopped(shared: &MoverShared, wait: Duration) -> bool {
    let until = later(wait);
    while Instant::now() < until {
        if shared.stop.load(Ordering::Acquire) {
            return true;
        }
        std::thread::sleep(POLL_CAP.min(until.saturating_duration_since(Instant::now())));
    }
    shared.stop.load(Ordering::Acquire)
}

/// A panic's message, as far as it has one.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// A partition of a retry topic: its topic and partition.
type PartitionOf = (String, i32);

/// The records of one partition taken from the consumer and not moved yet.
struct Held {
    records: VecDeque<ParkedRecord>,
    /// When the head is looked at again: its due time, or earlier when it
    /// would hold the partition longer than its tier allows.
    wake: SystemTime,
    paused: bool,
    /// The offset after the last record taken: a record below it is one
    /// taken already.
    next_offset: i64,
}

/// A record taken from a retry topic. Its headers are read through
/// librdkafka's C accessors ([`read_headers`](crate::record_headers::read_headers)):
/// rdkafka's own header iterator panics on a name that is not UTF-8, which
/// any producer with write access to a retry topic can write.
struct ParkedRecord {
    topic: String,
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    /// Names lossily (bytes that are not UTF-8 become U+FFFD), values as
    /// they are (a header without a value as an empty one).
    headers: Headers,
}

impl ParkedRecord {
    fn of(message: &BorrowedMessage<'_>) -> Self {
        Self {
            topic: message.topic().to_owned(),
            partition: message.partition(),
            offset: message.offset(),
            key: message.key().map(<[u8]>::to_vec),
            payload: message.payload().map(<[u8]>::to_vec),
            headers: crate::record_headers::read_headers(message),
        }
    }
}

/// What becomes of a head record whose time came.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Action {
    /// Due: back to the return topic.
    Back,
    /// Not due, but it held its partition as long as its tier allows: to
    /// the tail of its retry topic again.
    Requeue,
}

struct Mover {
    consumer: BaseConsumer<MoverContext>,
    producer: FutureProducer,
    /// The retry topics known, with where their records go: the configured
    /// tiers' from the start, those of other tiers once discovered.
    routes: HashMap<String, Route>,
    patterns: Vec<RetryPattern>,
    /// Retry topics of tiers not configured, found by the discovery: the
    /// mover drains them too.
    found: BTreeSet<String>,
    tiers: Tiers,
    registry: Arc<Registry>,
    shared: Arc<MoverShared>,
    delivery_timeout: Duration,
    discovery_interval: Duration,
    brokers: Arc<str>,
    group: String,
    /// Held records by partition; a partition with records is paused.
    held: BTreeMap<PartitionOf, Held>,
    /// The registry generation and count of topics found subscribed to.
    subscribed: Option<(u64, usize)>,
    next_discovery: Instant,
    last_error: Option<Instant>,
}

impl Mover {
    /// A mover with a consumer of its own in the mover group.
    fn new(config: &MoverConfig) -> Result<Self, Error> {
        let mut settings = config.settings.clone();
        // Fixed: offsets are committed only after the move is confirmed, and
        // a retry topic read from its end would skip what was parked before
        // the mover joined.
        settings
            .client_config_mut()
            .set("group.id", &config.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("allow.auto.create.topics", "false")
            .set("auto.offset.reset", "earliest");
        // A retry topic created a moment ago may be missing from the
        // metadata the subscription first sees; librdkafka looks again only
        // at this interval (5 min by default), and a parked message would
        // wait as long.
        if settings.get("topic.metadata.refresh.interval.ms").is_none() {
            settings = settings.set("topic.metadata.refresh.interval.ms", "10000");
        }
        let consumer: BaseConsumer<MoverContext> = settings
            .client_config()
            .create_with_context(MoverContext::default())
            .map_err(|error| Error::from_kafka(error, &config.brokers, Duration::ZERO))?;
        Ok(Self {
            consumer,
            producer: config.producer.clone(),
            routes: config.routes.clone(),
            patterns: config.patterns.clone(),
            found: BTreeSet::new(),
            tiers: config.tiers.clone(),
            registry: Arc::clone(&config.registry),
            shared: Arc::clone(&config.shared),
            delivery_timeout: config.delivery_timeout,
            discovery_interval: config.discovery_interval,
            brokers: Arc::clone(&config.brokers),
            group: config.group.clone(),
            held: BTreeMap::new(),
            subscribed: None,
            next_discovery: Instant::now(),
            last_error: None,
        })
    }

    fn run(mut self) {
        tracing::debug!(group = %self.group, brokers = %self.brokers, "kafka parking mover started");
        while !self.shared.stop.load(Ordering::Acquire) {
            self.shared.round_began();
            self.follow_topics();
            let timeout = self.poll_timeout();
            self.take(timeout);
            self.move_due();
            self.pause_or_resume();
        }
        tracing::debug!(group = %self.group, "kafka parking mover stopping");
        // Dropping the consumer closes it (it leaves the group) here, on
        // this thread; held records are uncommitted, so the next owner of
        // their partitions takes them.
    }

    /// Looks for retry topics created elsewhere, now and then, and
    /// subscribes again when the known set grew.
    fn follow_topics(&mut self) {
        if Instant::now() >= self.next_discovery {
            self.discover();
            self.next_discovery = later(self.discovery_interval);
        }
        let generation = (self.registry.generation(), self.found.len());
        if self.subscribed == Some(generation) {
            return;
        }
        let mut topics: BTreeSet<String> = self.registry.topics().into_iter().collect();
        topics.extend(self.found.iter().cloned());
        if topics.is_empty() {
            self.subscribed = Some(generation);
            return;
        }
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        match self.consumer.subscribe(&names) {
            Ok(()) => {
                tracing::debug!(group = %self.group, topics = ?topics, "kafka parking mover subscribed");
                self.subscribed = Some(generation);
            }
            Err(error) => {
                // Tried again on the next round.
                self.log_error("subscribing to the retry topics failed", &error);
            }
        }
    }

    /// Lists the cluster's topics and takes every retry topic of the served
    /// topics: those of the configured tiers that another instance, or an
    /// earlier run, created, and those of tiers no longer configured (a
    /// deploy changed the tiers), whose records would otherwise wait there
    /// until the retention deletes them.
    fn discover(&mut self) {
        let metadata = match self.consumer.fetch_metadata(None, LOOKUP_TIMEOUT) {
            Ok(metadata) => metadata,
            Err(error) => {
                // The brokers do not answer: the next discovery asks again.
                self.log_error("listing the topics for retry topics failed", &error);
                return;
            }
        };
        for topic in metadata.topics() {
            let name = topic.name();
            let partitions = i32::try_from(topic.partitions().len()).unwrap_or(i32::MAX);
            if topic.error().is_some() || partitions == 0 {
                continue;
            }
            if self.routes.contains_key(name) {
                if self.registry.partitions(name).is_none() && !self.found.contains(name) {
                    self.registry.insert(name, partitions);
                }
                continue;
            }
            let Some((pattern, delay)) = self
                .patterns
                .iter()
                .filter_map(|pattern| Some((pattern, pattern.tier_of(name)?)))
                // The most specific: a served topic's name may begin with
                // another's.
                .max_by_key(|(pattern, _)| pattern.prefix.len() + pattern.suffix.len())
            else {
                continue;
            };
            let route = Route {
                back_to: Arc::clone(&pattern.back_to),
                tier: self.tiers.index_for(delay),
            };
            tracing::info!(
                group = %self.group,
                retry_topic = name,
                return_topic = %route.back_to,
                "found a retry topic of a tier not configured (the tiers changed); its records are moved back when due"
            );
            self.routes.insert(name.to_owned(), route);
            self.found.insert(name.to_owned());
        }
    }

    /// Until the earliest held head is due, at most [`POLL_CAP`].
    fn poll_timeout(&self) -> Duration {
        let now = SystemTime::now();
        self.held
            .values()
            .filter(|held| !held.records.is_empty())
            .map(|held| held.wake.duration_since(now).unwrap_or(Duration::ZERO))
            .min()
            .unwrap_or(POLL_CAP)
            .min(POLL_CAP)
    }

    /// Takes what the consumer has, waiting at most `timeout` for the first.
    fn take(&mut self, timeout: Duration) {
        let mut wait = timeout;
        for _ in 0..MAX_BATCH {
            let polled = self
                .consumer
                .poll(wait)
                .map(|polled| polled.map(|message| ParkedRecord::of(&message)));
            // Rebalances are served inside the poll, before any record of
            // the new assignment.
            self.apply_rebalances();
            match polled {
                None => break,
                Some(Ok(record)) => self.hold(record),
                Some(Err(error)) => {
                    self.log_error("the retry-topic consumer reported an error", &error);
                    break;
                }
            }
            wait = Duration::ZERO;
        }
    }

    /// Drops what was held of partitions assigned anew or revoked: their
    /// records are fetched again from the committed offset, by this mover
    /// or the next owner.
    fn apply_rebalances(&mut self) {
        let events = self.consumer.context().take();
        for event in events {
            let (partitions, assigned) = match event {
                Rebalanced::Assigned(partitions) => (partitions, true),
                Rebalanced::Revoked(partitions) => (partitions, false),
            };
            for partition in &partitions {
                self.held.remove(partition);
            }
            if assigned && !partitions.is_empty() {
                // A partition paused before a revocation may keep its pause
                // across the assignment; nothing is held of it any more.
                let mut list = TopicPartitionList::new();
                for (topic, partition) in &partitions {
                    list.add_partition(topic, *partition);
                }
                if let Err(error) = self.consumer.resume(&list) {
                    self.log_error("resuming assigned retry partitions failed", &error);
                }
            }
        }
    }

    fn hold(&mut self, record: ParkedRecord) {
        let Some(route) = self.routes.get(&record.topic) else {
            // Subscriptions name routed topics only.
            tracing::warn!(
                topic = %record.topic,
                "a record of a topic the mover does not serve; left alone"
            );
            return;
        };
        let now = SystemTime::now();
        let key = (record.topic.clone(), record.partition);
        let offset = record.offset;
        let held = self.held.entry(key).or_insert_with(|| Held {
            records: VecDeque::new(),
            wake: now,
            paused: false,
            next_offset: offset,
        });
        if offset < held.next_offset {
            return;
        }
        held.next_offset = offset.saturating_add(1);
        if held.records.is_empty() {
            held.wake = wake_at(&record, &self.tiers, route.tier, now);
        }
        held.records.push_back(record);
    }

    /// Moves every head whose time came (and the heads behind it whose time
    /// came too), confirmed by the broker, then commits them.
    fn move_due(&mut self) {
        let now = SystemTime::now();
        let mut batch: Vec<(PartitionOf, ParkedRecord, Action)> = Vec::new();
        for (key, held) in &mut self.held {
            let Some(route) = self.routes.get(&key.0) else {
                continue;
            };
            while batch.len() < MAX_BATCH && held.wake <= now {
                let Some(record) = held.records.pop_front() else {
                    break;
                };
                let action = match due_of(&record) {
                    Some(due) if due > now => Action::Requeue,
                    _ => Action::Back,
                };
                batch.push((key.clone(), record, action));
                if let Some(next) = held.records.front() {
                    held.wake = wake_at(next, &self.tiers, route.tier, now);
                }
            }
        }
        if batch.is_empty() {
            return;
        }
        let deadline = later(self.delivery_timeout.saturating_add(Duration::from_secs(5)));
        let sent: Vec<Result<DeliveryFuture, KafkaError>> = batch
            .iter()
            .map(|(_, record, action)| self.send(record, *action, true))
            .collect();
        let mut outcomes = Vec::with_capacity(batch.len());
        for ((_, record, action), sent) in batch.iter().zip(sent) {
            let mut outcome = sent.and_then(|delivery| delivered(delivery, deadline));
            if *action == Action::Back
                && matches!(
                    outcome,
                    Err(KafkaError::MessageProduction(
                        RDKafkaErrorCode::UnknownPartition
                    ))
                )
            {
                tracing::warn!(
                    topic = %record.topic,
                    partition = record.partition,
                    offset = record.offset,
                    "a parked record names a partition its return topic does not have; moved back by its key"
                );
                outcome = self
                    .send(record, Action::Back, false)
                    .and_then(|delivery| delivered(delivery, deadline));
            }
            outcomes.push(outcome);
        }
        self.settle(batch, outcomes);
    }

    /// Commits each partition up to its first failed record; that one and
    /// the ones after it are held again and tried after [`RETRY_AFTER`].
    fn settle(
        &mut self,
        batch: Vec<(PartitionOf, ParkedRecord, Action)>,
        outcomes: Vec<Result<(), KafkaError>>,
    ) {
        let mut commits: BTreeMap<PartitionOf, i64> = BTreeMap::new();
        let mut failed: BTreeMap<PartitionOf, Vec<ParkedRecord>> = BTreeMap::new();
        for ((key, record, action), outcome) in batch.into_iter().zip(outcomes) {
            if let Some(kept) = failed.get_mut(&key) {
                // Behind a failed record of its partition: not committed
                // past it, so tried again (a second copy if it got through).
                kept.push(record);
                continue;
            }
            match outcome {
                Ok(()) => {
                    let counter = match action {
                        Action::Back => &self.shared.moved,
                        Action::Requeue => &self.shared.requeued,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    commits.insert(key, record.offset.saturating_add(1));
                }
                Err(error) => {
                    tracing::warn!(
                        topic = %record.topic,
                        partition = record.partition,
                        offset = record.offset,
                        brokers = %self.brokers,
                        error = %error,
                        retry_after = ?RETRY_AFTER,
                        "a parked record could not be moved; held and tried again"
                    );
                    failed.insert(key, vec![record]);
                }
            }
        }
        let retry_at = SystemTime::now() + RETRY_AFTER;
        for (key, records) in failed {
            let held = self.held.entry(key).or_insert_with(|| Held {
                records: VecDeque::new(),
                wake: retry_at,
                paused: false,
                next_offset: 0,
            });
            for record in records.into_iter().rev() {
                held.next_offset = held.next_offset.max(record.offset.saturating_add(1));
                held.records.push_front(record);
            }
            held.wake = retry_at;
        }
        if commits.is_empty() {
            return;
        }
        let mut list = TopicPartitionList::new();
        for ((topic, partition), offset) in &commits {
            if let Err(error) =
                list.add_partition_offset(topic, *partition, Offset::Offset(*offset))
            {
                self.log_error("a commit offset was refused", &error);
            }
        }
        // Asynchronous: a commit lost to a rebalance or a crash moves the
        // record a second time, never loses it.
        if let Err(error) = self.consumer.commit(&list, CommitMode::Async) {
            self.log_error("committing moved records failed", &error);
        }
    }

    /// Hands `record` to the producer: back to its origin partition's number
    /// in the return topic (by its key when `to_partition` is false or no
    /// header names a usable partition), or to the tail of its own
    /// partition.
    fn send(
        &self,
        record: &ParkedRecord,
        action: Action,
        to_partition: bool,
    ) -> Result<DeliveryFuture, KafkaError> {
        let (topic, partition, headers) = match action {
            Action::Requeue => (
                record.topic.as_str(),
                Some(record.partition),
                copy_headers(record, false),
            ),
            Action::Back => {
                let back_to = self
                    .routes
                    .get(&record.topic)
                    .map(|route| &*route.back_to)
                    .ok_or(KafkaError::MessageProduction(
                        RDKafkaErrorCode::UnknownTopic,
                    ))?;
                let partition = to_partition.then(|| origin_partition(record)).flatten();
                if to_partition && partition.is_none() {
                    tracing::warn!(
                        topic = %record.topic,
                        partition = record.partition,
                        offset = record.offset,
                        "a parked record without a usable origin partition; moved back by its key"
                    );
                }
                (back_to, partition, copy_headers(record, true))
            }
        };
        let mut out = FutureRecord::<[u8], [u8]>::to(topic).headers(headers);
        if let Some(payload) = &record.payload {
            out = out.payload(payload);
        }
        if let Some(key) = &record.key {
            out = out.key(key);
        }
        if let Some(partition) = partition {
            out = out.partition(partition);
        }
        self.producer.send_result(out).map_err(|(error, _)| error)
    }

    /// Pauses the partitions that hold records, resumes the ones that no
    /// longer do.
    fn pause_or_resume(&mut self) {
        let mut pause = TopicPartitionList::new();
        let mut resume = TopicPartitionList::new();
        for ((topic, partition), held) in &mut self.held {
            let hold = !held.records.is_empty();
            if hold != held.paused {
                let list = if hold { &mut pause } else { &mut resume };
                list.add_partition(topic, *partition);
                held.paused = hold;
            }
        }
        self.held.retain(|_, held| held.paused);
        if pause.count() > 0
            && let Err(error) = self.consumer.pause(&pause)
        {
            self.log_error("pausing retry partitions failed", &error);
        }
        if resume.count() > 0
            && let Err(error) = self.consumer.resume(&resume)
        {
            self.log_error("resuming retry partitions failed", &error);
        }
    }

    fn log_error(&mut self, what: &str, error: &KafkaError) {
        let now = Instant::now();
        if self
            .last_error
            .is_some_and(|last| now.duration_since(last) < ERROR_LOG_INTERVAL)
        {
            tracing::debug!(group = %self.group, brokers = %self.brokers, %error, "{what}");
            return;
        }
        self.last_error = Some(now);
        tracing::warn!(group = %self.group, brokers = %self.brokers, %error, "{what}");
    }
}

/// The due time a record carries, `None` when it carries none that is a
/// time (missing, not a number, beyond what the clock holds).
fn due_of(record: &ParkedRecord) -> Option<SystemTime> {
    let millis: u64 = record.headers.get_str(DUE)?.parse().ok()?;
    UNIX_EPOCH.checked_add(Duration::from_millis(millis))
}

/// When the head `record` of a partition of tier `tier` is looked at again:
/// its due time, but no later than the tier's hold from `now`, so a record
/// that asks for more never stalls the ones behind it; `now` for a record
/// without a due time, which goes back at once.
fn wake_at(record: &ParkedRecord, tiers: &Tiers, tier: usize, now: SystemTime) -> SystemTime {
    match due_of(record) {
        Some(due) => now
            .checked_add(tiers.hold(tier))
            .map_or(due, |limit| due.min(limit)),
        None => {
            tracing::warn!(
                topic = %record.topic,
                partition = record.partition,
                offset = record.offset,
                "a parked record without a due time; moved back at once"
            );
            now
        }
    }
}

/// `wait` from now; a wait beyond what the clock holds is a year.
fn later(wait: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(wait)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 86_400)))
        .unwrap_or(now)
}

/// The origin partition a record names, if it is a partition number: the
/// core's [`ORIGIN_PARTITION`] (the partition of the message's first
/// delivery, kept by every park), else [`LEGACY_ORIGIN_PARTITION`], which
/// earlier versions wrote.
fn origin_partition(record: &ParkedRecord) -> Option<i32> {
    let named = |name: &str| {
        record
            .headers
            .get_str(name)?
            .parse::<i32>()
            .ok()
            .filter(|partition| *partition >= 0)
    };
    named(ORIGIN_PARTITION).or_else(|| named(LEGACY_ORIGIN_PARTITION))
}

/// The record's headers, in order, without the old origin partition header
/// when it goes back (the message returns with the headers it was parked
/// with; the core's header stays, the parking layer reads it).
fn copy_headers(record: &ParkedRecord, back: bool) -> OwnedHeaders {
    record
        .headers
        .iter()
        .filter(|header| !(back && &*header.name == LEGACY_ORIGIN_PARTITION))
        .fold(
            OwnedHeaders::new_with_capacity(record.headers.len()),
            |copy, header| {
                copy.insert(Header {
                    key: &header.name,
                    value: Some(header.value.as_ref()),
                })
            },
        )
}

/// Waits on this thread for a delivery report, until `deadline`.
fn delivered(delivery: DeliveryFuture, deadline: Instant) -> Result<(), KafkaError> {
    match block_on(delivery, deadline) {
        Some(Ok(Ok(_))) => Ok(()),
        Some(Ok(Err((error, _)))) => Err(error),
        // The producer was dropped with the record unconfirmed.
        Some(Err(_canceled)) => Err(KafkaError::Canceled),
        None => Err(KafkaError::MessageProduction(
            RDKafkaErrorCode::MessageTimedOut,
        )),
    }
}

/// Wakes the thread that waits in [`block_on`].
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `future` on this thread until it resolves or `deadline` passes.
/// The delivery report comes from the producer's own thread, so no runtime
/// is needed here, and the mover does not depend on one staying alive.
fn block_on<F: Future + Unpin>(mut future: F, deadline: Instant) -> Option<F::Output> {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(output) = Pin::new(&mut future).poll(&mut cx) {
            return Some(output);
        }
        let left = deadline.checked_duration_since(Instant::now())?;
        if left.is_zero() {
            return None;
        }
        std::thread::park_timeout(left);
    }
}

/// A rebalance of the mover's group, as the poll loop applies it.
enum Rebalanced {
    Assigned(Vec<PartitionOf>),
    Revoked(Vec<PartitionOf>),
}

/// Records the mover group's rebalances for the poll loop.
#[derive(Default)]
struct MoverContext {
    events: Mutex<Vec<Rebalanced>>,
}

impl MoverContext {
    fn take(&self) -> Vec<Rebalanced> {
        std::mem::take(
            &mut *self
                .events
                .lock()
                .unwrap_or_else(|poison| poison.into_inner()),
        )
    }
}

impl ClientContext for MoverContext {}

impl ConsumerContext for MoverContext {
    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let partitions = |list: &TopicPartitionList| {
            list.elements()
                .iter()
                .map(|element| (element.topic().to_owned(), element.partition()))
                .collect()
        };
        let event = match rebalance {
            Rebalance::Assign(list) => Rebalanced::Assigned(partitions(list)),
            Rebalance::Revoke(list) => Rebalanced::Revoked(partitions(list)),
            Rebalance::Error(error) => {
                tracing::warn!(%error, "the parking mover's group failed to rebalance");
                return;
            }
        };
        self.events
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .push(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(headers: &[(&str, &str)]) -> ParkedRecord {
        ParkedRecord {
            topic: "orders.billing.retry.1s".into(),
            partition: 0,
            offset: 7,
            key: Some(b"key".to_vec()),
            payload: Some(b"payload".to_vec()),
            headers: headers
                .iter()
                .map(|(name, value)| (*name, bytes::Bytes::copy_from_slice(value.as_bytes())))
                .collect(),
        }
    }

    fn tiers() -> Tiers {
        Tiers::new(vec![Duration::from_secs(1), Duration::from_secs(10)]).expect("valid")
    }

    #[test]
    fn a_record_without_a_usable_due_time_is_due_at_once() {
        let now = SystemTime::now();
        for headers in [vec![], vec![(DUE, "soon")], vec![(DUE, "-5")]] {
            let record = record(&headers);
            assert_eq!(due_of(&record), None);
            assert_eq!(wake_at(&record, &tiers(), 0, now), now);
        }
    }

    #[test]
    fn a_head_is_held_until_due_but_no_longer_than_its_tier_allows() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let due_in = |secs: u64| {
            let due = now + Duration::from_secs(secs);
            let millis = due.duration_since(UNIX_EPOCH).expect("after").as_millis();
            record(&[(DUE, &millis.to_string())])
        };
        assert_eq!(
            wake_at(&due_in(3), &tiers(), 0, now),
            now + Duration::from_secs(3)
        );
        // Far in the future (or hostile): held for the next tier, then
        // written to the tail again.
        assert_eq!(
            wake_at(&due_in(86_400), &tiers(), 0, now),
            now + Duration::from_secs(10)
        );
        assert_eq!(
            wake_at(&due_in(86_400), &tiers(), 1, now),
            now + Duration::from_secs(10)
        );
    }

    #[test]
    fn going_back_drops_the_old_origin_partition_header_and_keeps_the_rest_in_order() {
        let record = record(&[
            ("a", "1"),
            (LEGACY_ORIGIN_PARTITION, "2"),
            (ORIGIN_PARTITION, "2"),
            ("b", "2"),
            ("a", "3"),
        ]);
        assert_eq!(origin_partition(&record), Some(2));
        let back = copy_headers(&record, true);
        let names: Vec<(&str, Option<&[u8]>)> = rdkafka::message::Headers::iter(&back)
            .map(|header| (header.key, header.value))
            .collect();
        assert_eq!(
            names,
            [
                ("a", Some(&b"1"[..])),
                (ORIGIN_PARTITION, Some(&b"2"[..])),
                ("b", Some(&b"2"[..])),
                ("a", Some(&b"3"[..]))
            ]
        );
        assert_eq!(
            rdkafka::message::Headers::count(&copy_headers(&record, false)),
            5
        );
    }

    #[test]
    fn the_cores_origin_partition_wins_over_the_old_header() {
        assert_eq!(
            origin_partition(&record(&[
                (LEGACY_ORIGIN_PARTITION, "1"),
                (ORIGIN_PARTITION, "2")
            ])),
            Some(2)
        );
        assert_eq!(
            origin_partition(&record(&[(LEGACY_ORIGIN_PARTITION, "1")])),
            Some(1)
        );
        assert_eq!(
            origin_partition(&record(&[
                (ORIGIN_PARTITION, "x"),
                (LEGACY_ORIGIN_PARTITION, "1")
            ])),
            Some(1),
            "an unusable core header falls back to the old one"
        );
    }

    #[test]
    fn an_origin_partition_that_is_no_partition_number_is_ignored() {
        for value in ["-1", "x", "99999999999"] {
            assert_eq!(
                origin_partition(&record(&[(ORIGIN_PARTITION, value)])),
                None
            );
            assert_eq!(
                origin_partition(&record(&[(LEGACY_ORIGIN_PARTITION, value)])),
                None
            );
        }
    }

    #[test]
    fn a_retry_pattern_takes_any_tier_label_and_nothing_else() {
        let pattern = RetryPattern {
            prefix: "orders.billing.retry.".into(),
            suffix: String::new(),
            back_to: "orders.billing.returned".into(),
        };
        assert_eq!(
            pattern.tier_of("orders.billing.retry.7s"),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            pattern.tier_of("orders.billing.retry.1500ms"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            pattern.tier_of("orders.billing.retry.2h"),
            Some(Duration::from_secs(7200))
        );
        for other in [
            "orders.billing.retry.",
            "orders.billing.retry.7s.billing.dlq",
            "orders.billing.retry.s",
            "orders.billing.retry.0s",
            "orders.billing.returned",
            "orders",
            "orders.billing.retry.7x",
        ] {
            assert_eq!(pattern.tier_of(other), None, "{other}");
        }
        let infix = RetryPattern {
            prefix: "retry-".into(),
            suffix: "-orders".into(),
            back_to: "orders".into(),
        };
        assert_eq!(
            infix.tier_of("retry-10m-orders"),
            Some(Duration::from_secs(600))
        );
        assert_eq!(infix.tier_of("retry-10m-orders2"), None);
    }

    #[test]
    fn waiting_for_a_report_that_never_comes_ends_at_the_deadline() {
        let pending = std::future::pending::<()>();
        let started = Instant::now();
        assert!(block_on(pending, started + Duration::from_millis(50)).is_none());
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert_eq!(block_on(std::future::ready(7), started), Some(7));
    }

    #[test]
    fn a_stop_ends_the_wait_before_a_restart() {
        let shared = MoverShared::default();
        shared.stop.store(true, Ordering::Release);
        assert!(wait_unless_stopped(&shared, Duration::from_secs(3600)));
        let shared = MoverShared::default();
        assert!(!wait_unless_stopped(&shared, Duration::from_millis(1)));
    }

    /// A mover that panics is started again, counted, and the supervisor
    /// ends when a stop is asked: what keeps parked messages coming back
    /// after a bug, and what health reports.
    #[test]
    fn a_mover_that_panics_is_started_again_and_counted() {
        let shared = Arc::new(MoverShared::default());
        let made = std::sync::atomic::AtomicUsize::new(0);
        let runs = std::sync::atomic::AtomicUsize::new(0);
        let seen_running = AtomicBool::new(true);
        supervise(
            &shared,
            "g",
            0_usize,
            || Ok(made.fetch_add(1, Ordering::Relaxed) + 1),
            |mover: usize| {
                runs.fetch_add(1, Ordering::Relaxed);
                let running = shared.running.load(Ordering::Acquire);
                seen_running.fetch_and(running, Ordering::Relaxed);
                if mover < 2 {
                    panic!("mover {mover} fails");
                }
                // The third runs until asked to stop.
                shared.stop.store(true, Ordering::Release);
            },
            (Duration::from_millis(1), Duration::from_millis(4)),
        );
        assert_eq!(runs.load(Ordering::Relaxed), 3);
        assert_eq!(made.load(Ordering::Relaxed), 2, "two new movers");
        assert_eq!(shared.restarts.load(Ordering::Relaxed), 2);
        assert!(
            seen_running.load(Ordering::Relaxed),
            "running while it runs"
        );
        assert!(!shared.running.load(Ordering::Acquire), "not after");
    }

    #[test]
    fn a_panic_is_told_by_its_message() {
        let panic = catch_unwind(|| panic!("boom {}", 7)).expect_err("panicked");
        assert_eq!(panic_text(panic.as_ref()), "boom 7");
        let panic = catch_unwind(|| std::panic::panic_any(7_u8)).expect_err("panicked");
        assert_eq!(panic_text(panic.as_ref()), "a panic without a message");
    }
}
