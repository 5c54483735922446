//! The [`DeadLetterLog`] trait: the primitives of a dead-letter destination
//! that is an ordered log.

use std::sync::Arc;

use super::{LetterId, StoreError, StoredLetter};

/// A dead-letter destination that is an ordered log of entries addressed
/// by id (a memory-broker topic, a Redis stream): the primitives
/// [`LogStore`](super::LogStore) builds a whole [`DeadLetterStore`](super::DeadLetterStore) on.
#[async_trait::async_trait]
pub trait DeadLetterLog: Send + Sync + 'static {
    /// The destination's name.
    fn name(&self) -> &str;

    /// How many entries it holds.
    async fn entries(&self) -> Result<u64, StoreError>;

    /// The id of its newest entry, `None` when it is empty.
    async fn last(&self) -> Result<Option<LetterId>, StoreError>;

    /// Up to `max` entries in log order, after `after` (from the start when
    /// `None`) and up to `through` included (to the end when `None`).
    async fn scan(
        &self,
        after: Option<&LetterId>,
        through: Option<&LetterId>,
        max: usize,
    ) -> Result<Vec<StoredLetter>, StoreError>;

    /// Entry `id`, `None` when it holds none.
    async fn get(&self, id: &LetterId) -> Result<Option<StoredLetter>, StoreError>;

    /// Removes the entries `ids` (ids it does not hold are no error) and
    /// returns how many it removed.
    async fn remove(&self, ids: &[LetterId]) -> Result<u64, StoreError>;

    /// Where a message of `origin` goes to reach this log's consumer group
    /// alone: the group's return destination, if it has one that it reads
    /// (a replay to the [group](super::Target::Group) goes there). `None` (the
    /// default): this log knows none.
    async fn way_back_to_group(&self, origin: &str) -> Result<Option<Arc<str>>, StoreError> {
        let _ = origin;
        Ok(None)
    }
}
