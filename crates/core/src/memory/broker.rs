//! [`MemoryBroker`]: topics, producing, consumer groups and inspection.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::acker::MemoryAcker;
use super::assignment::AssignmentStrategy;
use super::consumer::MemoryConsumerBuilder;
use super::control_channel::LogState;
use super::dead_letter::{MemoryDeadLetterSink, dead_letter_topic};
use super::dead_letter_store::{MemoryDeadLetterStore, MemoryDeadLetters};
use super::error::MemoryError;
use super::faults::Faults;
use super::record::{Produced, Record};
use super::snapshot::{GroupSnapshot, PartitionState};
use super::source::MemorySource;
use super::topic::Topic;
use crate::dead_letter::DeadLetter;
use crate::group_control::ControlLog;
use crate::message::{Message, SourceName};

/// Settings of a [`MemoryBroker`], shared by all its topics and groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BrokerConfig {
    /// How long a rebalance waits for a member to release a partition that
    /// moves away from it before handing it over anyway.
    pub rebalance_timeout: Duration,
    /// How groups spread partitions over their members.
    pub assignment: AssignmentStrategy,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            rebalance_timeout: Duration::from_secs(30),
            assignment: AssignmentStrategy::Range,
        }
    }
}

/// Builds a [`MemoryBroker`] with non-default settings.
#[derive(Clone, Debug, Default)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct MemoryBrokerBuilder {
    config: BrokerConfig,
}

impl MemoryBrokerBuilder {
    /// How long a rebalance waits for the old owner of a partition to
    /// release it (default 30 s). Past it, the partition goes to its new
    /// owner and the old owner's commits of it are refused.
    pub fn rebalance_timeout(mut self, timeout: Duration) -> Self {
        self.config.rebalance_timeout = timeout;
        self
    }

    /// How groups spread partitions over members (default
    /// [`AssignmentStrategy::Range`]).
    pub fn assignment(mut self, strategy: AssignmentStrategy) -> Self {
        self.config.assignment = strategy;
        self
    }

    /// The broker.
    pub fn build(self) -> MemoryBroker {
        MemoryBroker {
            inner: Arc::new(BrokerInner {
                config: self.config,
                topics: Mutex::new(HashMap::new()),
                parked_copies: Mutex::new(HashSet::new()),
                parked_waiting: Mutex::new(HashMap::new()),
                control_logs: Mutex::new(HashMap::new()),
            }),
        }
    }
}

/// A topic and a consumer group of it.
type TopicGroup = (SourceName, Arc<str>);

struct BrokerInner {
    config: BrokerConfig,
    topics: Mutex<HashMap<SourceName, Arc<Topic>>>,
    /// Where the copies its parkings gave back were stored: the broker's
    /// own record of a park, which no producer can forge.
    parked_copies: Mutex<HashSet<(SourceName, u32, i64)>>,
    /// Per topic and group, the messages its parkings hold and have not
    /// given back yet: shared by the group's parkings of the topic and read
    /// by its lag probes.
    parked_waiting: Mutex<HashMap<TopicGroup, Arc<AtomicUsize>>>,
    /// Each group's control logs (`group_control`).
    control_logs: Mutex<HashMap<(String, ControlLog), Arc<LogState>>>,
}

/// An in-process broker with Kafka's model: topics of partitions, consumer
/// groups with committed offsets, rebalances, dead-letter topics.
///
/// A cheap handle: clones share the same topics. See the
/// [module documentation](super) for an example.
#[derive(Clone)]
pub struct MemoryBroker {
    inner: Arc<BrokerInner>,
}

impl Default for MemoryBroker {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBroker")
            .field("config", &self.inner.config)
            .field("topics", &self.topic_names())
            .finish()
    }
}

impl MemoryBroker {
    /// A broker with default settings and no topics.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A builder for non-default settings.
    pub fn builder() -> MemoryBrokerBuilder {
        MemoryBrokerBuilder::default()
    }

    /// The broker's settings.
    pub fn config(&self) -> BrokerConfig {
        self.inner.config
    }

    /// Creates `topic` with `partitions` partitions (1 to 65,536).
    pub fn create_topic(&self, topic: &str, partitions: u32) -> Result<(), MemoryError> {
        let mut topics = self.topics();
        if let Some(existing) = topics.get(topic) {
            return Err(MemoryError::TopicExists {
                topic: topic.to_owned(),
                partitions: existing.partitions,
            });
        }
        let created = Topic::new(topic, partitions, self.inner.config)?;
        topics.insert(created.name.clone(), Arc::new(created));
        Ok(())
    }

    /// The names of all topics, sorted.
    pub fn topic_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.topics().keys().map(|name| name.to_string()).collect();
        names.sort_unstable();
        names
    }

    /// The partition count of `topic`.
    pub fn partitions(&self, topic: &str) -> Result<u32, MemoryError> {
        Ok(self.topic(topic)?.partitions)
    }

    /// Stores `record` at the end of its partition and wakes the consumers
    /// of that partition. Returns where it was stored.
    pub fn send(&self, topic: &str, record: Record) -> Result<Produced, MemoryError> {
        let topic = self.topic(topic)?;
        let mut state = topic.lock();
        topic.append(&mut state, record)
    }

    /// Stores `record`, a parked copy given back, like [`send`](Self::send)
    /// but for `group` alone (the other groups of the topic pass over it),
    /// and remembers that it is one.
    pub(super) fn send_parked_copy(
        &self,
        topic: &str,
        group: &str,
        record: Record,
    ) -> Result<Produced, MemoryError> {
        let topic = self.topic(topic)?;
        let mut state = topic.lock();
        let audience = state.group_or_create(&topic, group)?;
        let produced = topic.append_for(&mut state, record, audience)?;
        self.inner
            .parked_copies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((topic.name.clone(), produced.partition, produced.offset));
        Ok(produced)
    }

    /// Whether offset `offset` of `partition` of `topic` holds a parked copy
    /// given back.
    pub(super) fn is_parked_copy(&self, topic: &SourceName, partition: u32, offset: i64) -> bool {
        self.inner
            .parked_copies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&(topic.clone(), partition, offset))
    }

    /// Stores `records` in order, under one lock: all of them, or none if
    /// one names a partition the topic does not have.
    pub fn send_batch(
        &self,
        topic: &str,
        records: impl IntoIterator<Item = Record>,
    ) -> Result<Vec<Produced>, MemoryError> {
        let topic = self.topic(topic)?;
        let records: Vec<Record> = records.into_iter().collect();
        records
            .iter()
            .try_for_each(|record| topic.validate(record))?;
        let mut state = topic.lock();
        records
            .into_iter()
            .map(|record| topic.append(&mut state, record))
            .collect()
    }

    /// A publisher to this broker's topics, for handlers that produce (see
    /// [`publish`](crate::publish)), made at once. The
    /// [`Broker`](crate::backend::Broker) trait's `publisher()`, which every
    /// backend has, gives the same publisher asynchronously.
    pub fn memory_publisher(&self) -> super::MemoryPublisher {
        super::MemoryPublisher::new(self.clone())
    }

    /// Joins `group` on `topic` with default settings and returns the new
    /// member's source and acker. See [`MemoryConsumerBuilder::build`].
    pub fn consumer(
        &self,
        topic: &str,
        group: &str,
    ) -> Result<(MemorySource, MemoryAcker), MemoryError> {
        self.consumer_builder(topic, group).build()
    }

    /// A builder for a member of `group` on `topic`.
    pub fn consumer_builder(&self, topic: &str, group: &str) -> MemoryConsumerBuilder {
        MemoryConsumerBuilder::new(self.clone(), topic, group)
    }

    /// A sink writing dead letters of `group` consuming `topic` to the topic
    /// [`dead_letter_topic(topic, group)`](dead_letter_topic)
    /// (`<topic>.<group>.dlq`), created with one partition if needed.
    pub fn dead_letter_sink(
        &self,
        topic: &str,
        group: &str,
    ) -> Result<MemoryDeadLetterSink, MemoryError> {
        let faults = self.faults(topic, group)?;
        let dead_letters = self.dead_letter_topic_of(topic, group)?;
        Ok(MemoryDeadLetterSink::new(dead_letters, group, faults.state))
    }

    /// Parks messages `group` consumed from `topic` on timers: each is
    /// appended to `topic` again once its delay is over, for `group` alone
    /// (the topic's other groups pass over the copy, as they would not read
    /// Kafka's return topic of the group). For a
    /// [`ParkingLayer`](crate::parking::ParkingLayer).
    pub fn parking(&self, topic: &str, group: &str) -> Result<super::MemoryParking, MemoryError> {
        self.partitions(topic)?;
        if group.is_empty() {
            return Err(MemoryError::EmptyName { what: "group" });
        }
        Ok(super::MemoryParking::new(
            self.clone(),
            topic,
            group,
            self.parked_waiting(topic, group),
        ))
    }

    /// The count of messages `group` parked on `topic` and not yet back.
    pub(super) fn parked_waiting(&self, topic: &str, group: &str) -> Arc<AtomicUsize> {
        let mut waiting = self
            .inner
            .parked_waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = (SourceName::from(topic), Arc::<str>::from(group));
        Arc::clone(waiting.entry(key).or_default())
    }

    /// Group `group`'s control log `log`, created on first use.
    pub(super) fn control_log(&self, group: &str, log: ControlLog) -> Arc<LogState> {
        let mut logs = self
            .inner
            .control_logs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Arc::clone(logs.entry((group.to_owned(), log)).or_default())
    }

    /// The store of the dead letters of `group` consuming `topic` (the
    /// topic [`dead_letter_topic(topic, group)`](dead_letter_topic),
    /// created with one partition if needed): count, list, read, replay
    /// through this broker's [`publisher`](Self::memory_publisher), purge.
    pub fn dead_letter_store(
        &self,
        topic: &str,
        group: &str,
    ) -> Result<MemoryDeadLetterStore, MemoryError> {
        self.topic(topic)?;
        let dead_letters = self.dead_letter_topic_of(topic, group)?;
        Ok(MemoryDeadLetterStore::new(
            MemoryDeadLetters::new(dead_letters),
            self.memory_publisher(),
        ))
    }

    /// The dead-letter topic of `group` on `topic`, created if needed.
    fn dead_letter_topic_of(&self, topic: &str, group: &str) -> Result<Arc<Topic>, MemoryError> {
        let name = dead_letter_topic(topic, group);
        let mut topics = self.topics();
        Ok(match topics.get(name.as_str()) {
            Some(existing) => existing.clone(),
            None => {
                let created = Arc::new(Topic::new(&name, 1, self.inner.config)?);
                topics.insert(created.name.clone(), created.clone());
                created
            }
        })
    }

    /// The fault injection of `group` on `topic`.
    pub fn faults(&self, topic: &str, group: &str) -> Result<Faults, MemoryError> {
        let topic = self.topic(topic)?;
        let mut state = topic.lock();
        let group = state.group_or_create(&topic, group)?;
        Ok(Faults {
            state: state.groups[group].faults.clone(),
        })
    }

    /// `group`'s members, assignment, committed offsets and lag on `topic`.
    /// A group that never consumed has no members and committed nothing.
    pub fn group(&self, topic: &str, group: &str) -> Result<GroupSnapshot, MemoryError> {
        let topic = self.topic(topic)?;
        let mut state = topic.lock();
        let state = &mut *state;
        Ok(match state.group(group) {
            Some(index) => state.groups[index].snapshot(&state.logs),
            None => GroupSnapshot {
                topic: topic.name.to_string(),
                group: group.to_owned(),
                generation: 0,
                members: Vec::new(),
                partitions: (0..topic.partitions)
                    .zip(&state.logs)
                    .zip(&state.private)
                    .map(|((partition, log), private)| {
                        PartitionState::unconsumed(partition, log.len(), private.len())
                    })
                    .collect(),
            },
        })
    }

    /// The committed offset (next offset to consume) of each partition of
    /// `topic` for `group`; `None` where it never committed.
    pub fn committed(&self, topic: &str, group: &str) -> Result<Vec<Option<i64>>, MemoryError> {
        Ok(self.group(topic, group)?.committed())
    }

    /// Messages of `topic` that `group` has not committed, over all
    /// partitions.
    pub fn lag(&self, topic: &str, group: &str) -> Result<u64, MemoryError> {
        Ok(self.group(topic, group)?.lag())
    }

    /// The length of each partition of `topic`: the offset the next message
    /// produced to it gets.
    pub fn high_watermarks(&self, topic: &str) -> Result<Vec<i64>, MemoryError> {
        let topic = self.topic(topic)?;
        let state = topic.lock();
        Ok(state.logs.iter().map(|log| log.len() as i64).collect())
    }

    /// The messages of `partition` of `topic` from offset `from` on, as a
    /// consumer would first receive them.
    pub fn messages(
        &self,
        topic: &str,
        partition: u32,
        from: i64,
    ) -> Result<Vec<Message>, MemoryError> {
        let topic = self.topic(topic)?;
        let state = topic.lock();
        let log =
            state
                .logs
                .get(partition as usize)
                .ok_or_else(|| MemoryError::UnknownPartition {
                    topic: topic.name.to_string(),
                    partition,
                    partitions: topic.partitions,
                })?;
        let from = usize::try_from(from).unwrap_or(0).min(log.len());
        Ok(log[from..].to_vec())
    }

    /// Everything written to the dead-letter topic of `group` on `topic`
    /// and not removed by its [store](Self::dead_letter_store), oldest
    /// first (empty if nothing was), read back from the topic's
    /// records as any consumer of it would ([`DeadLetter::read`]).
    ///
    /// # Errors
    ///
    /// [`MemoryError::UnknownTopic`] for a topic never created, and
    /// [`MemoryError::MalformedDeadLetter`] for a record of the dead-letter
    /// topic that is not a dead letter (something else wrote it there).
    pub fn dead_letters(&self, topic: &str, group: &str) -> Result<Vec<DeadLetter>, MemoryError> {
        self.topic(topic)?;
        let name = dead_letter_topic(topic, group);
        let Some(dead_letters) = self.topics().get(name.as_str()).cloned() else {
            return Ok(Vec::new());
        };
        let records: Vec<(usize, Message)> = {
            let state = dead_letters.lock();
            (0..)
                .zip(&state.logs[0])
                .filter(|(offset, _)| !state.removed.contains(offset))
                .map(|(offset, record)| (offset, record.clone()))
                .collect()
        };
        records
            .iter()
            .map(|(offset, record)| {
                let offset = *offset as i64;
                DeadLetter::read(
                    record.key().cloned(),
                    record.payload().clone(),
                    record.headers(),
                )
                .map_err(|source| MemoryError::MalformedDeadLetter {
                    topic: name.clone(),
                    offset,
                    source,
                })
            })
            .collect()
    }

    pub(crate) fn topic(&self, name: &str) -> Result<Arc<Topic>, MemoryError> {
        self.topics()
            .get(name)
            .cloned()
            .ok_or_else(|| MemoryError::UnknownTopic {
                topic: name.to_owned(),
            })
    }

    fn topics(&self) -> std::sync::MutexGuard<'_, HashMap<SourceName, Arc<Topic>>> {
        self.inner
            .topics
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
