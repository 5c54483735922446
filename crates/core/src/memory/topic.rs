//! A topic: partition logs, the consumer groups reading them, and (for a
//! dead-letter topic) the records written through a sink. One mutex guards
//! all of it, so a fetch takes one lock per batch.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use bytes::Bytes;

use super::broker::BrokerConfig;
use super::error::MemoryError;
use super::group::Group;
use super::partitioner::partition_for_key;
use super::record::{Produced, Record};
use crate::message::{Message, Metadata, Position, SourceName};

/// The most partitions a topic may have. Each partition is a log and a slot
/// in every group's bookkeeping, so an absurd count is refused up front.
pub(crate) const MAX_PARTITIONS: u32 = 1 << 16;

/// A topic of the memory broker.
pub(crate) struct Topic {
    pub(crate) name: SourceName,
    pub(crate) partitions: u32,
    pub(crate) config: BrokerConfig,
    state: Mutex<TopicState>,
}

/// Everything about a topic that changes.
pub(crate) struct TopicState {
    /// One log per partition; a message's offset is its index.
    pub(crate) logs: Vec<Vec<Message>>,
    /// Consumer groups, by index; a group is never removed, so sources and
    /// ackers keep the index instead of hashing the name on every call.
    pub(crate) groups: Vec<Group>,
    group_index: HashMap<Arc<str>, usize>,
    /// Where the next record without key or partition goes.
    next_unkeyed: u32,
    /// Offsets of partition 0 a dead-letter store removed (replayed or
    /// purged): the log stays append-only, so offsets keep their meaning.
    pub(crate) removed: BTreeSet<usize>,
    /// Per partition, the offsets of parked copies given back to one group:
    /// hidden from every other group, including groups created later.
    pub(crate) private: Vec<BTreeSet<usize>>,
}

impl Topic {
    /// An empty topic, or why it cannot exist.
    pub(crate) fn new(
        name: &str,
        partitions: u32,
        config: BrokerConfig,
    ) -> Result<Self, MemoryError> {
        if name.is_empty() {
            return Err(MemoryError::EmptyName { what: "topic" });
        }
        if partitions == 0 || partitions > MAX_PARTITIONS {
            return Err(MemoryError::InvalidPartitionCount {
                topic: name.to_owned(),
                partitions,
            });
        }
        Ok(Self {
            name: name.into(),
            partitions,
            config,
            state: Mutex::new(TopicState {
                logs: (0..partitions).map(|_| Vec::new()).collect(),
                groups: Vec::new(),
                group_index: HashMap::new(),
                next_unkeyed: 0,
                removed: BTreeSet::new(),
                private: (0..partitions).map(|_| BTreeSet::new()).collect(),
            }),
        })
    }

    /// Locks the topic. A panic while the lock was held cannot leave the
    /// state half-updated in a way that loses messages (every update is a
    /// push or a single field store), so a poisoned lock is used as is.
    pub(crate) fn lock(&self) -> MutexGuard<'_, TopicState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The partition `record` goes to.
    fn route(&self, state: &mut TopicState, record: &Record) -> Result<u32, MemoryError> {
        match (record.partition, &record.key) {
            (Some(partition), _) if partition < self.partitions => Ok(partition),
            (Some(partition), _) => Err(MemoryError::UnknownPartition {
                topic: self.name.to_string(),
                partition,
                partitions: self.partitions,
            }),
            (None, Some(key)) => Ok(partition_for_key(key, self.partitions)),
            (None, None) => {
                let partition = state.next_unkeyed;
                state.next_unkeyed = (partition + 1) % self.partitions;
                Ok(partition)
            }
        }
    }

    /// Checks that every explicit partition exists, so a batch is stored
    /// whole or not at all.
    pub(crate) fn validate(&self, record: &Record) -> Result<(), MemoryError> {
        match record.partition {
            Some(partition) if partition >= self.partitions => Err(MemoryError::UnknownPartition {
                topic: self.name.to_string(),
                partition,
                partitions: self.partitions,
            }),
            _ => Ok(()),
        }
    }

    /// Appends `record` and wakes the consumers that own its partition.
    pub(crate) fn append(
        &self,
        state: &mut TopicState,
        record: Record,
    ) -> Result<Produced, MemoryError> {
        let partition = self.route(state, &record)?;
        let log = &mut state.logs[partition as usize];
        let offset = log.len() as i64;
        let metadata = Metadata::new(self.name.clone(), partition, Position::Offset(offset))
            .with_timestamp(record.timestamp.unwrap_or_else(SystemTime::now));
        let message = Message::from_parts(
            shared(record.payload),
            record.key.map(shared),
            record.headers,
            metadata,
        );
        log.push(message);
        for group in &state.groups {
            group.wake_owner(partition);
        }
        Ok(Produced { partition, offset })
    }

    /// Appends `record` for group `audience` alone (a parked copy given
    /// back): every other group of the topic, now or later, passes over it.
    pub(crate) fn append_for(
        &self,
        state: &mut TopicState,
        record: Record,
        audience: usize,
    ) -> Result<Produced, MemoryError> {
        let produced = self.append(state, record)?;
        let offset = produced.offset as usize;
        for (index, group) in state.groups.iter_mut().enumerate() {
            if index != audience {
                group.hide(produced.partition, offset);
            }
        }
        state.private[produced.partition as usize].insert(offset);
        Ok(produced)
    }
}

impl TopicState {
    /// The index of group `name`, created empty if it does not exist yet.
    pub(crate) fn group_or_create(
        &mut self,
        topic: &Topic,
        name: &str,
    ) -> Result<usize, MemoryError> {
        if name.is_empty() {
            return Err(MemoryError::EmptyName { what: "group" });
        }
        if let Some(&index) = self.group_index.get(name) {
            return Ok(index);
        }
        let name: Arc<str> = name.into();
        let index = self.groups.len();
        let mut group = Group::new(
            topic.name.clone(),
            name.clone(),
            topic.partitions,
            topic.config,
        );
        // Copies parked so far went back to other groups.
        for (partition, offsets) in (0..).zip(&self.private) {
            for &offset in offsets {
                group.hide(partition, offset);
            }
        }
        self.groups.push(group);
        self.group_index.insert(name, index);
        Ok(index)
    }

    /// Group `name`, if any consumer or fault injection ever used it.
    pub(crate) fn group(&self, name: &str) -> Option<usize> {
        self.group_index.get(name).copied()
    }
}

/// `bytes` in a form whose clones never allocate.
///
/// `Bytes::from(Vec<u8>)` is "promotable": its first clone allocates the
/// shared reference count. Cloning once here, at produce time, promotes it in
/// place, so every delivery's clone is a reference-count increment.
fn shared(bytes: Bytes) -> Bytes {
    drop(bytes.clone());
    bytes
}
