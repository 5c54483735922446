//! The [`DeadLetterStore`] trait, and its impls for boxes and `Arc`s.

use std::sync::Arc;

use super::{
    Filter, LetterId, Page, Replay, ReplayReport, Selection, StoreError, StoredLetter, Summary,
};

/// What an operator does with the letters in a dead-letter destination.
/// Object safe: hold a `Box<dyn DeadLetterStore>` across backends.
#[async_trait::async_trait]
pub trait DeadLetterStore: Send + Sync {
    /// The dead-letter destination it reads (a topic, a stream, a queue).
    fn destination(&self) -> &str;

    /// How many letters `filter` selects.
    async fn count(&self, filter: &Filter) -> Result<u64, StoreError>;

    /// Counts per error class and the oldest letter, of those `filter`
    /// selects.
    async fn summary(&self, filter: &Filter) -> Result<Summary, StoreError>;

    /// Up to `limit` letters `filter` selects, oldest first, after the
    /// cursor `after` (a [`Page::next`], or `None` from the start), without
    /// their payloads.
    async fn list(
        &self,
        filter: &Filter,
        limit: usize,
        after: Option<&LetterId>,
    ) -> Result<Page, StoreError>;

    /// Letter `id`, with its payload.
    async fn read(&self, id: &LetterId) -> Result<StoredLetter, StoreError>;

    /// Publishes the original message of each selected letter as `replay`
    /// says and removes the letter once the publish is confirmed. A crash
    /// between the two leaves a letter that was published: replaying it
    /// again publishes a duplicate (at least once, as everywhere).
    async fn replay(
        &self,
        selection: &Selection,
        replay: &Replay,
    ) -> Result<ReplayReport, StoreError>;

    /// Removes the selected letters for good; returns how many were removed.
    async fn purge(&self, selection: &Selection) -> Result<u64, StoreError>;
}

#[async_trait::async_trait]
impl<S: DeadLetterStore + ?Sized> DeadLetterStore for Box<S> {
    fn destination(&self) -> &str {
        (**self).destination()
    }
    async fn count(&self, filter: &Filter) -> Result<u64, StoreError> {
        (**self).count(filter).await
    }
    async fn summary(&self, filter: &Filter) -> Result<Summary, StoreError> {
        (**self).summary(filter).await
    }
    async fn list(
        &self,
        filter: &Filter,
        limit: usize,
        after: Option<&LetterId>,
    ) -> Result<Page, StoreError> {
        (**self).list(filter, limit, after).await
    }
    async fn read(&self, id: &LetterId) -> Result<StoredLetter, StoreError> {
        (**self).read(id).await
    }
    async fn replay(
        &self,
        selection: &Selection,
        replay: &Replay,
    ) -> Result<ReplayReport, StoreError> {
        (**self).replay(selection, replay).await
    }
    async fn purge(&self, selection: &Selection) -> Result<u64, StoreError> {
        (**self).purge(selection).await
    }
}

#[async_trait::async_trait]
impl<S: DeadLetterStore + ?Sized> DeadLetterStore for Arc<S> {
    fn destination(&self) -> &str {
        (**self).destination()
    }
    async fn count(&self, filter: &Filter) -> Result<u64, StoreError> {
        (**self).count(filter).await
    }
    async fn summary(&self, filter: &Filter) -> Result<Summary, StoreError> {
        (**self).summary(filter).await
    }
    async fn list(
        &self,
        filter: &Filter,
        limit: usize,
        after: Option<&LetterId>,
    ) -> Result<Page, StoreError> {
        (**self).list(filter, limit, after).await
    }
    async fn read(&self, id: &LetterId) -> Result<StoredLetter, StoreError> {
        (**self).read(id).await
    }
    async fn replay(
        &self,
        selection: &Selection,
        replay: &Replay,
    ) -> Result<ReplayReport, StoreError> {
        (**self).replay(selection, replay).await
    }
    async fn purge(&self, selection: &Selection) -> Result<u64, StoreError> {
        (**self).purge(selection).await
    }
}
