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

mod context;
mod discovery;
mod record;
mod supervisor;
mod wait;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::oneshot;

use self::context::{MoverContext, Rebalanced};
pub(super) use self::discovery::{RetryPattern, Route};
use self::record::{ParkedRecord, copy_headers, due_of, origin_partition, wake_at};
pub(super) use self::supervisor::MoverShared;
use self::supervisor::supervise;
use self::wait::{delivered, later};
use super::tiers::Tiers;
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
