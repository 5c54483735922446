//! The memory broker's [`DeadLetterStore`](crate::dead_letter::DeadLetterStore):
//! a [`LogStore`] over a dead-letter topic, replaying through the broker's
//! [`MemoryPublisher`].
//!
//! A topic of the memory broker is an append-only log, as a Kafka topic is;
//! a letter the store removes (replayed or purged) is marked removed in its
//! topic rather than cut out, so offsets stay offsets. The store and
//! [`MemoryBroker::dead_letters`](super::MemoryBroker::dead_letters) no
//! longer see it; a consumer of the dead-letter topic still does.

use std::fmt;
use std::sync::Arc;

use super::publisher::MemoryPublisher;
use super::topic::Topic;
use crate::dead_letter::store::{DeadLetterLog, LetterId, LogStore, StoreError, StoredLetter};

/// The memory broker's dead-letter store: see
/// [`MemoryBroker::dead_letter_store`](super::MemoryBroker::dead_letter_store).
pub type MemoryDeadLetterStore = LogStore<MemoryDeadLetters, MemoryPublisher>;

/// A dead-letter topic of the memory broker as a [`DeadLetterLog`]: ids are
/// the records' offsets in its one partition.
#[derive(Clone)]
pub struct MemoryDeadLetters {
    topic: Arc<Topic>,
}

impl MemoryDeadLetters {
    pub(crate) fn new(topic: Arc<Topic>) -> Self {
        Self { topic }
    }
}

impl fmt::Debug for MemoryDeadLetters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryDeadLetters")
            .field("topic", &self.topic.name)
            .finish()
    }
}

fn offset_of(id: &LetterId) -> Result<i64, StoreError> {
    id.as_str()
        .parse::<i64>()
        .ok()
        .filter(|offset| *offset >= 0)
        .ok_or_else(|| StoreError::InvalidId {
            id: id.as_str().to_owned(),
            expected: "an offset of the dead-letter topic, such as 41",
        })
}

fn stored(offset: usize, record: &crate::message::Message) -> StoredLetter {
    StoredLetter::read(
        LetterId::new(offset.to_string()),
        record.key().cloned(),
        record.payload().clone(),
        record.headers(),
    )
}

#[async_trait::async_trait]
impl DeadLetterLog for MemoryDeadLetters {
    fn name(&self) -> &str {
        &self.topic.name
    }

    async fn entries(&self) -> Result<u64, StoreError> {
        let state = self.topic.lock();
        Ok((state.logs[0].len() - state.removed.len()) as u64)
    }

    async fn last(&self) -> Result<Option<LetterId>, StoreError> {
        let state = self.topic.lock();
        Ok((0..state.logs[0].len())
            .rev()
            .find(|offset| !state.removed.contains(offset))
            .map(|offset| LetterId::new(offset.to_string())))
    }

    async fn scan(
        &self,
        after: Option<&LetterId>,
        through: Option<&LetterId>,
        max: usize,
    ) -> Result<Vec<StoredLetter>, StoreError> {
        let from = after
            .map(offset_of)
            .transpose()?
            .map_or(0, |after| after + 1);
        let through = through.map(offset_of).transpose()?;
        let state = self.topic.lock();
        let log = &state.logs[0];
        let end = through.map_or(log.len(), |through| {
            usize::try_from(through).map_or(log.len(), |through| log.len().min(through + 1))
        });
        let from = usize::try_from(from).unwrap_or(usize::MAX).min(end);
        Ok((from..end)
            .filter(|offset| !state.removed.contains(offset))
            .take(max)
            .map(|offset| stored(offset, &log[offset]))
            .collect())
    }

    async fn get(&self, id: &LetterId) -> Result<Option<StoredLetter>, StoreError> {
        let offset = offset_of(id)?;
        let state = self.topic.lock();
        Ok(usize::try_from(offset)
            .ok()
            .filter(|offset| !state.removed.contains(offset))
            .and_then(|offset| {
                state.logs[0]
                    .get(offset)
                    .map(|record| stored(offset, record))
            }))
    }

    async fn remove(&self, ids: &[LetterId]) -> Result<u64, StoreError> {
        let offsets = ids.iter().map(offset_of).collect::<Result<Vec<_>, _>>()?;
        let mut state = self.topic.lock();
        let len = state.logs[0].len();
        let mut removed = 0;
        for offset in offsets {
            if let Ok(offset) = usize::try_from(offset)
                && offset < len
                && state.removed.insert(offset)
            {
                removed += 1;
            }
        }
        Ok(removed)
    }
}
