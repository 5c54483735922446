//! [`RedisDeadLetters`]: a Redis dead-letter stream as a [`DeadLetterLog`],
//! the log of [`RedisDeadLetterStore`].
//!
//! The parts: `builder.rs` ([`RedisDeadLettersBuilder`]), `read.rs`
//! (counting, listing and reading the letters, a page at a time, a scoped
//! log's own only), `removal.rs` (deleting letters, a scoped log's own only,
//! checked on the server), `replay.rs` (the group's way back in for a
//! replay), `reply.rs` (the parsing of range replies) and `ids.rs` (letter
//! ids as entry ids, and the ids next to one).

mod builder;
mod ids;
mod read;
mod removal;
mod replay;
mod reply;

use std::fmt;
use std::sync::Arc;

use intake_core::dead_letter::store::{
    DeadLetterLog, LetterId, LogStore, StoreError, StoredLetter,
};

pub use self::builder::RedisDeadLettersBuilder;
use crate::connection::SharedConnection;
use crate::publisher::RedisStreamsPublisher;
use crate::settings::RedisSettings;

/// The dead-letter store of a Redis dead-letter stream.
pub type RedisDeadLetterStore = LogStore<RedisDeadLetters, RedisStreamsPublisher>;

/// A Redis dead-letter stream as a [`DeadLetterLog`] (its ids are entry
/// ids, `1700000000000-0`), so that [`RedisDeadLetterStore`] (a
/// [`LogStore`] replaying through a [`RedisStreamsPublisher`]) counts,
/// lists, reads, replays and purges what a
/// [`RedisDeadLetterSink`](crate::RedisDeadLetterSink) wrote. Build one with
/// [`RedisDeadLetters::builder`]; it is cheap to clone.
///
/// | store operation | Redis |
/// |---|---|
/// | count everything | `XLEN` |
/// | count with a filter, summary, list | `XRANGE` a page at a time after a cursor (the entry id) |
/// | read | `XRANGE id id` |
/// | replay | `XADD` to the origin through the publisher, then `XDEL` of the confirmed letters |
/// | purge | `XDEL` |
///
/// The letters of every consumer group of a stream share its dead-letter
/// stream (`intake.origin.group` tells them apart). A log scoped to a group
/// ([`group`](RedisDeadLettersBuilder::group)) counts, lists, reads,
/// replays and purges that group's letters only, and knows the group's way
/// back in: its return stream, when the group reads one
/// ([`DeadLetterLog::way_back_to_group`], for
/// [`Replay::to_group`](intake_core::dead_letter::store::Replay::to_group)).
/// Without a scope it takes every letter of the stream, and a replay can
/// only go to the origin, where every group reads it again. A count of a
/// scoped log is a scan (`XLEN` counts every group's).
///
/// An entry is read back as the sink wrote it: the payload field is the
/// payload, every other field a header or an envelope field, and the key
/// the envelope's `intake.origin.key`. A replayed message goes back as the
/// publisher writes any output (payload field, key field, headers as
/// fields), so give the publisher the source's
/// [`payload_field`](crate::RedisStreamsPublisherBuilder::payload_field)
/// and [`key_field`](crate::RedisStreamsPublisherBuilder::key_field).
///
/// ```no_run
/// use intake_core::dead_letter::store::{DeadLetterStore, Filter, Replay, Selection};
/// use intake_redis_streams::{RedisDeadLetters, RedisStreamsPublisher};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let url = "redis://127.0.0.1:6379";
/// let store = RedisDeadLetters::builder(url)
///     .dead_letters_of("orders") // the stream `orders:dlq`
///     .build()
///     .await?
///     .store(RedisStreamsPublisher::builder(url).build().await?);
/// println!("{} dead letters", store.count(&Filter::all()).await?);
/// let report = store
///     .replay(&Selection::Matching(Filter::all()), &Replay::to_origin())
///     .await?;
/// println!("{} back in `orders`, {} skipped", report.replayed, report.skipped.len());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisDeadLetters {
    connection: SharedConnection,
    stream: Arc<str>,
    payload_field: Arc<str>,
    /// The consumer group whose letters alone this log holds.
    group: Option<Arc<str>>,
    /// Return streams set by hand: (origin, return stream).
    returns: Arc<[(String, String)]>,
}

impl fmt::Debug for RedisDeadLetters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisDeadLetters")
            .field("endpoint", self.connection.connector().endpoint())
            .field("stream", &self.stream)
            .field("payload_field", &self.payload_field)
            .field("group", &self.group)
            .finish()
    }
}

impl RedisDeadLetters {
    /// A builder of the dead-letter stream's reader on a connection of its
    /// own to the server of `settings` (a [`RedisSettings`], or just the
    /// URL). Every store operation is a sequence of commands, each bounded
    /// by the settings' [`command_timeout`](RedisSettings::command_timeout).
    pub fn builder(settings: impl Into<RedisSettings>) -> RedisDeadLettersBuilder {
        RedisDeadLettersBuilder::new(settings.into())
    }

    /// The store of this stream, replaying through `publisher`.
    pub fn store(self, publisher: RedisStreamsPublisher) -> RedisDeadLetterStore {
        LogStore::new(self, publisher)
    }

    /// The dead-letter stream.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The consumer group whose letters alone this log holds, if scoped.
    pub fn group(&self) -> Option<&str> {
        self.group.as_deref()
    }

    fn failed(
        &self,
        operation: &'static str,
        command: &'static str,
        error: redis::RedisError,
    ) -> StoreError {
        let error = self
            .connection
            .connector()
            .key_error(error, command, &self.stream);
        StoreError::broker(operation, &*self.stream, error)
    }
}

#[async_trait::async_trait]
impl DeadLetterLog for RedisDeadLetters {
    fn name(&self) -> &str {
        &self.stream
    }

    async fn entries(&self) -> Result<u64, StoreError> {
        self.count().await
    }

    async fn last(&self) -> Result<Option<LetterId>, StoreError> {
        self.newest().await
    }

    async fn scan(
        &self,
        after: Option<&LetterId>,
        through: Option<&LetterId>,
        max: usize,
    ) -> Result<Vec<StoredLetter>, StoreError> {
        self.list(after, through, max).await
    }

    async fn get(&self, id: &LetterId) -> Result<Option<StoredLetter>, StoreError> {
        self.read(id).await
    }

    async fn remove(&self, ids: &[LetterId]) -> Result<u64, StoreError> {
        self.delete(ids).await
    }

    async fn way_back_to_group(&self, origin: &str) -> Result<Option<Arc<str>>, StoreError> {
        self.way_back(origin).await
    }
}
