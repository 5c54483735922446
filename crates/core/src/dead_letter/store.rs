//! Dead letters as data: a [`DeadLetterStore`] counts, lists, reads,
//! redrives and purges what a [`DeadLetterSink`](super::DeadLetterSink)
//! wrote, on the one [envelope](super::envelope).
//!
//! Every backend's store has the same shape, so an operator tool (the
//! `intake` command) holds a `Box<dyn DeadLetterStore>` whatever the broker:
//!
//! - [`count`](DeadLetterStore::count) and
//!   [`summary`](DeadLetterStore::summary) (counts per error class and the
//!   oldest letter, what a dry run shows and what
//!   `metrics::DeadLetterExporter` exports);
//! - [`list`](DeadLetterStore::list), a page at a time after a cursor,
//!   filtered by error class, time of failure and key;
//! - [`read`](DeadLetterStore::read), one letter with its payload;
//! - [`redrive`](DeadLetterStore::redrive): each letter's original message
//!   (payload, key, headers, with [`REPLAYS`] one higher) published through
//!   a [`Publisher`] to its origin or another destination, and removed from
//!   the store only once the publish is confirmed. A letter replayed
//!   [`max_replays`](Redrive::max_replays) times already is not redriven
//!   again but [skipped](SkipReason::ReplayLimit): a message that fails on
//!   every replay does not circle for ever;
//! - [`purge`](DeadLetterStore::purge).
//!
//! A backend whose dead-letter destination is an ordered log addressed by
//! id (a memory-broker topic, a Redis stream) implements the few
//! primitives of [`DeadLetterLog`] and gets the whole store from
//! [`LogStore`].
//!
//! ```
//! use intake_core::dead_letter::store::{DeadLetterStore, Filter, Redrive, Selection};
//! use intake_core::memory::{MemoryBroker, Record};
//! use intake_core::{DeadLetter, ErrorClass, Message, Metadata, Position};
//! use intake_core::backend::DeadLetterSink;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = MemoryBroker::new();
//! broker.create_topic("orders", 1)?;
//! let poison = Message::new("{not json", Metadata::new("orders".into(), 0, Position::Offset(0)));
//! broker
//!     .dead_letter_sink("orders", "billing")?
//!     .write(&DeadLetter::new(poison, "expected value", 1))
//!     .await?;
//!
//! let store: Box<dyn DeadLetterStore> = Box::new(broker.dead_letter_store("orders", "billing")?);
//! let permanent = Filter::all().with_class(ErrorClass::Permanent);
//! assert_eq!(store.count(&permanent).await?, 1);
//!
//! // A dry run says what would move, and moves nothing.
//! let dry = store.redrive(&Selection::Matching(permanent.clone()), &Redrive::to_origin().dry_run(true)).await?;
//! assert_eq!((dry.redriven, store.count(&permanent).await?), (1, 1));
//!
//! let done = store.redrive(&Selection::Matching(permanent.clone()), &Redrive::to_origin()).await?;
//! assert_eq!(done.redriven, 1);
//! assert_eq!(store.count(&Filter::all()).await?, 0);
//! let replayed = &broker.messages("orders", 0, 0)?[0];
//! assert_eq!(replayed.headers().get_str("intake.replays"), Some("1"));
//! # Ok(())
//! # }
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::DeadLetter;
use super::envelope::{EnvelopeError, FAILED_FIRST, REPLAYS};
use crate::error::{BoxError, ErrorClass};
use crate::message::{Headers, Message, SourceName};
use crate::publish::{Output, PublishError, Publisher};

/// How a store names one stored letter, and the cursor of
/// [`list`](DeadLetterStore::list): the text its broker uses (a memory or
/// Kafka offset `41`, a Redis entry id `1700000000000-0`). An operator
/// copies it from a listing into a [`read`](DeadLetterStore::read).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LetterId(Arc<str>);

impl LetterId {
    /// The id written `text`; the store that reads it checks its form.
    pub fn new(text: impl Into<Arc<str>>) -> Self {
        Self(text.into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LetterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LetterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<&str> for LetterId {
    fn from(text: &str) -> Self {
        Self::new(text)
    }
}

impl From<String> for LetterId {
    fn from(text: String) -> Self {
        Self::new(text)
    }
}

/// One entry of a dead-letter destination: its id, its payload's size, and
/// the letter read back from it, or why it cannot be (something other than
/// an intake sink wrote it, or a newer intake did).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct StoredLetter {
    /// Its id in the store.
    pub id: LetterId,
    /// The size of the original payload in bytes (also when
    /// [`list`](DeadLetterStore::list) leaves the payload out).
    pub payload_bytes: usize,
    /// The letter: the original message (payload, key, producer headers,
    /// origin), error, class, attempts, times, replays. In a
    /// [`list`](DeadLetterStore::list)ing its message has an empty payload;
    /// [`read`](DeadLetterStore::read) has the payload.
    pub letter: Result<DeadLetter, EnvelopeError>,
}

impl StoredLetter {
    /// The entry `id` as its carrier holds it: the record's key slot (`None`
    /// on a carrier without one), the payload, and the headers or fields
    /// besides the payload. See [`DeadLetter::read`].
    pub fn read(id: LetterId, key_slot: Option<Bytes>, payload: Bytes, headers: &Headers) -> Self {
        Self {
            id,
            payload_bytes: payload.len(),
            letter: DeadLetter::read(key_slot, payload, headers),
        }
    }

    /// An entry read back by other means than [`read`](Self::read): its
    /// id, its payload's size and the letter, or why it is none.
    pub fn new(
        id: LetterId,
        payload_bytes: usize,
        letter: Result<DeadLetter, EnvelopeError>,
    ) -> Self {
        Self {
            id,
            payload_bytes,
            letter,
        }
    }

    /// The same entry with its payload left out, as a listing holds it.
    pub fn without_payload(mut self) -> Self {
        if let Ok(letter) = &mut self.letter {
            let message = &letter.message;
            let mut bare = Message::new(Bytes::new(), message.metadata().clone())
                .with_headers(message.headers().clone());
            if let Some(key) = message.key() {
                bare = bare.with_key(key.clone());
            }
            letter.message = bare;
        }
        self
    }
}

/// Which letters an operation applies to: every condition set must hold.
/// [`Filter::all`] (the default) matches everything, unreadable entries
/// included; a filter with any condition matches only letters that can be
/// read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Filter {
    /// The class of the last failure.
    pub class: Option<ErrorClass>,
    /// Given up at or after this time ([`DeadLetter::failed_at`]).
    pub failed_from: Option<SystemTime>,
    /// Given up before this time.
    pub failed_until: Option<SystemTime>,
    /// The original message's key, byte for byte.
    pub key: Option<Bytes>,
}

impl Filter {
    /// Every letter.
    pub fn all() -> Self {
        Self::default()
    }

    /// Only letters whose last failure was of `class`.
    pub fn with_class(mut self, class: ErrorClass) -> Self {
        self.class = Some(class);
        self
    }

    /// Only letters given up at or after `from` and before `until` (either
    /// bound `None`: open).
    pub fn failed_between(mut self, from: Option<SystemTime>, until: Option<SystemTime>) -> Self {
        self.failed_from = from;
        self.failed_until = until;
        self
    }

    /// Only letters of messages with key `key`.
    pub fn with_key(mut self, key: impl Into<Bytes>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Whether it sets no condition.
    pub fn is_all(&self) -> bool {
        *self == Self::default()
    }

    /// Whether `stored` is one of the letters it selects.
    pub fn matches(&self, stored: &StoredLetter) -> bool {
        match &stored.letter {
            Ok(letter) => self.matches_letter(letter),
            Err(_) => self.is_all(),
        }
    }

    /// Whether `letter` meets every condition.
    pub fn matches_letter(&self, letter: &DeadLetter) -> bool {
        self.class.is_none_or(|class| letter.class == class)
            && self.failed_from.is_none_or(|from| letter.failed_at >= from)
            && self
                .failed_until
                .is_none_or(|until| letter.failed_at < until)
            && self
                .key
                .as_ref()
                .is_none_or(|key| letter.message.key() == Some(key))
    }
}

/// What a store holds, for a dry run's counts and the depth metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Summary {
    /// Letters (and unreadable entries) selected.
    pub total: u64,
    /// Readable letters per class of their last failure, by
    /// [`ErrorClass::as_str`].
    pub by_class: BTreeMap<&'static str, u64>,
    /// Entries that cannot be read as dead letters.
    pub unreadable: u64,
    /// When the longest-waiting letter was given up
    /// ([`DeadLetter::failed_at`]); `None` when no readable letter is
    /// selected.
    pub oldest_failed_at: Option<SystemTime>,
}

impl Summary {
    /// Adds `stored` to the counts.
    pub fn add(&mut self, stored: &StoredLetter) {
        self.total += 1;
        match &stored.letter {
            Ok(letter) => {
                *self.by_class.entry(letter.class.as_str()).or_default() += 1;
                self.oldest_failed_at = Some(match self.oldest_failed_at {
                    Some(oldest) => oldest.min(letter.failed_at),
                    None => letter.failed_at,
                });
            }
            Err(_) => self.unreadable += 1,
        }
    }

    /// How long the oldest letter has waited at `now` (zero for a letter
    /// stamped later than `now`: clocks of different hosts disagree).
    pub fn oldest_age(&self, now: SystemTime) -> Option<Duration> {
        self.oldest_failed_at
            .map(|oldest| now.duration_since(oldest).unwrap_or_default())
    }
}

/// A page of a [`list`](DeadLetterStore::list)ing.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Page {
    /// The letters selected, oldest first, without payloads.
    pub letters: Vec<StoredLetter>,
    /// The cursor of the next page (the last entry looked at), `None` when
    /// the store was read to its end.
    pub next: Option<LetterId>,
}

/// The letters a [`redrive`](DeadLetterStore::redrive) or
/// [`purge`](DeadLetterStore::purge) takes.
#[derive(Clone, Debug)]
pub enum Selection {
    /// These letters; an id the store does not hold is skipped
    /// ([`SkipReason::NotFound`]).
    Ids(Vec<LetterId>),
    /// Every letter the filter matches, as the store holds them when the
    /// operation starts (letters written meanwhile are left for the next).
    Matching(Filter),
}

/// Where a redriven message goes.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Target {
    /// Back to the consumer group whose letter it is, alone: through the
    /// group's own way back in ([`DeadLetterLog::way_back_to_group`]: a
    /// Kafka return topic, a Redis return stream, the group's own AMQP
    /// queue), which no other group reads. A store that knows none refuses
    /// ([`StoreError::NoWayBackToGroup`]) rather than republish to every
    /// group of the origin.
    Group,
    /// The topic, stream or queue it was consumed from
    /// ([`Metadata::source`](crate::Metadata::source)), into the partition
    /// it was consumed from. Every consumer group of the origin handles it
    /// again, not only the one whose letter it is.
    Origin,
    /// Another destination, as the store's publisher names it (an
    /// [`Output`]'s destination).
    Destination(Arc<str>),
}

/// Called with the number of letters redriven so far, after each batch.
pub type Progress = Arc<dyn Fn(u64) + Send + Sync>;

/// How to [`redrive`](DeadLetterStore::redrive): where to, how often a
/// message may be replayed, and whether to move anything at all.
#[derive(Clone)]
#[must_use = "a Redrive does nothing until a store is given it"]
pub struct Redrive {
    target: Target,
    dry_run: bool,
    max_replays: u32,
    progress: Option<Progress>,
}

impl Redrive {
    /// The default loop guard: a letter already replayed 3 times is
    /// skipped.
    pub const DEFAULT_MAX_REPLAYS: u32 = 3;

    /// Each message back to its consumer group alone (see
    /// [`Target::Group`]): what an operator means by "replay these letters".
    pub fn to_group() -> Self {
        Self {
            target: Target::Group,
            dry_run: false,
            max_replays: Self::DEFAULT_MAX_REPLAYS,
            progress: None,
        }
    }

    /// Each message back to where it was consumed from, for **every**
    /// consumer group of it (see [`Target::Origin`]).
    pub fn to_origin() -> Self {
        Self {
            target: Target::Origin,
            ..Self::to_group()
        }
    }

    /// Each message to `destination` (an [`Output`]'s destination).
    pub fn to(destination: impl Into<Arc<str>>) -> Self {
        Self {
            target: Target::Destination(destination.into()),
            ..Self::to_group()
        }
    }

    /// Publishes nothing and removes nothing, only reports what would move
    /// and what would be skipped.
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// The loop guard: a letter whose message was replayed this often
    /// already is skipped ([`SkipReason::ReplayLimit`]). 0 redrives
    /// nothing.
    pub fn max_replays(mut self, max_replays: u32) -> Self {
        self.max_replays = max_replays;
        self
    }

    /// Calls `progress` with the count redriven so far after each batch
    /// (a progress bar on a long replay).
    pub fn on_progress(mut self, progress: impl Fn(u64) + Send + Sync + 'static) -> Self {
        self.progress = Some(Arc::new(progress));
        self
    }

    /// Where messages go.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Whether it is a dry run.
    pub fn is_dry_run(&self) -> bool {
        self.dry_run
    }

    /// The loop guard's limit.
    pub fn replay_limit(&self) -> u32 {
        self.max_replays
    }

    /// Why `stored` is not redriven, `None` when it is: unreadable, a
    /// reference letter, or past the loop guard.
    pub fn skips(&self, stored: &StoredLetter) -> Option<SkipReason> {
        match &stored.letter {
            Err(_) => Some(SkipReason::Unreadable),
            Ok(letter) if letter.reference.is_some() => Some(SkipReason::Reference),
            Ok(letter) if letter.replays >= self.max_replays => Some(SkipReason::ReplayLimit {
                replays: letter.replays,
            }),
            Ok(_) => None,
        }
    }

    /// Calls the [progress](Self::on_progress) callback, if any, with
    /// `redriven`.
    pub fn report_progress(&self, redriven: u64) {
        if let Some(progress) = &self.progress {
            progress(redriven);
        }
    }

    /// The output that replays `letter`: its original payload, key and
    /// headers, with [`REPLAYS`] one higher and [`FAILED_FIRST`] kept, so
    /// that a failure of the replay is dead-lettered with the count and
    /// time that make the loop guard work. The park headers it carried are
    /// dropped: a replay starts with every park of its budget.
    ///
    /// `way_back_to_group` is the group's way back in, for a redrive to
    /// the [group](Target::Group): there the message is marked as the
    /// message first delivered at its origin (the parking layer's
    /// [`ORIGIN`](crate::parking::ORIGIN) headers), so its key keeps its
    /// origin's order and an exactly-once marker knows it. To the group or
    /// the origin it goes into the partition it was consumed from.
    pub fn output_of(
        &self,
        letter: &DeadLetter,
        way_back_to_group: Option<&Arc<str>>,
    ) -> Result<Output, StoreError> {
        use crate::parking::{ORIGIN, ORIGIN_PARTITION, ORIGIN_POSITION, is_park_header};
        let metadata = letter.message.metadata();
        let (destination, partition): (Arc<str>, _) = match &self.target {
            Target::Group => match way_back_to_group {
                Some(way_back) => (way_back.clone(), Some(metadata.partition())),
                None => {
                    return Err(StoreError::NoWayBackToGroup {
                        origin: metadata.source().to_string(),
                    });
                }
            },
            Target::Origin => (Arc::from(&**metadata.source()), Some(metadata.partition())),
            Target::Destination(destination) => (destination.clone(), None),
        };
        let mut headers: Headers = letter
            .message
            .headers()
            .iter()
            .filter(|header| !is_park_header(&header.name))
            .map(|header| (header.name.clone(), header.value.clone()))
            .collect();
        headers.set(REPLAYS, letter.replays.saturating_add(1).to_string());
        headers.set(
            FAILED_FIRST,
            epoch_millis(letter.first_failed_at).to_string(),
        );
        if self.target == Target::Group && destination != *metadata.source() {
            headers.set(ORIGIN, metadata.source().to_string());
            headers.set(ORIGIN_PARTITION, metadata.partition().to_string());
            headers.set(ORIGIN_POSITION, metadata.position().to_string());
        }
        let mut output =
            Output::new(destination, letter.message.payload().clone()).with_headers(headers);
        if let Some(partition) = partition {
            output = output.with_partition(partition);
        }
        Ok(match letter.message.key() {
            Some(key) => output.with_key(key.clone()),
            None => output,
        })
    }
}

impl fmt::Debug for Redrive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redrive")
            .field("target", &self.target)
            .field("dry_run", &self.dry_run)
            .field("max_replays", &self.max_replays)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// Why a letter was not redriven.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SkipReason {
    /// Its message was replayed [`Redrive::max_replays`] times already.
    ReplayLimit {
        /// How often it was replayed.
        replays: u32,
    },
    /// The letter stands in for one that could not be written (a
    /// [`PayloadReference`](super::PayloadReference)): it has no payload to
    /// replay; the original stays at its origin only while the origin keeps
    /// it (see [`DeadLetter::reference`](super::DeadLetter::reference)).
    Reference,
    /// The entry is not a dead letter this intake can read.
    Unreadable,
    /// The store holds no letter of that id.
    NotFound,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::ReplayLimit { replays } => write!(f, "replayed {replays} times already"),
            SkipReason::Reference => f.write_str("a reference letter without payload"),
            SkipReason::Unreadable => f.write_str("not a readable dead letter"),
            SkipReason::NotFound => f.write_str("no such letter"),
        }
    }
}

/// A letter a redrive left in the store, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Skipped {
    /// The letter.
    pub id: LetterId,
    /// Why.
    pub reason: SkipReason,
}

impl Skipped {
    /// Letter `id`, skipped for `reason`.
    pub fn new(id: LetterId, reason: SkipReason) -> Self {
        Self { id, reason }
    }
}

/// What a [`redrive`](DeadLetterStore::redrive) did, or in a dry run would
/// do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedriveReport {
    /// Whether it was a dry run (nothing moved).
    pub dry_run: bool,
    /// Letters published, confirmed and removed (in a dry run: that would
    /// be).
    pub redriven: u64,
    /// Of those, how many per class of their last failure.
    pub by_class: BTreeMap<&'static str, u64>,
    /// Letters left in the store, with why.
    pub skipped: Vec<Skipped>,
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The broker could not be asked (unreachable, refused the command, no
    /// answer in time); the store is unchanged by the failed step.
    #[error("the dead-letter store could not {operation} {destination:?}")]
    Broker {
        /// What was being done: `count`, `read`, `remove letters from`.
        operation: &'static str,
        /// The dead-letter destination.
        destination: String,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// An id not of the form this store's ids have.
    #[error("`{id}` is not a letter id of this store: {expected}")]
    InvalidId {
        /// The id as given.
        id: String,
        /// What an id looks like here.
        expected: &'static str,
    },
    /// [`read`](DeadLetterStore::read) of an id the store does not hold.
    #[error("the dead-letter store holds no letter {id}")]
    NotFound {
        /// The id.
        id: LetterId,
    },
    /// A redrive to the [group](Target::Group) of a letter whose store
    /// knows no way back to the group alone: redriving to the origin would
    /// reach every group of it.
    #[error(
        "this store knows no way back into `{origin}` for its consumer group alone (a return \
         destination the group reads); redrive to the origin instead if every group of it \
         should handle the messages again"
    )]
    NoWayBackToGroup {
        /// The letter's origin.
        origin: String,
    },
    /// A redriven message was not confirmed, and the redrive stopped after
    /// the batch it was in. The letters whose publish was confirmed were
    /// removed (`report` counts them); this one, and those not sent yet,
    /// are still in the store: redrive again.
    #[error("redriving letter {id} failed after {} were redriven", report.redriven)]
    Redrive {
        /// The letter whose publish failed.
        id: LetterId,
        /// What was done before.
        report: Box<RedriveReport>,
        /// Why the publish failed.
        #[source]
        source: PublishError,
    },
}

impl StoreError {
    /// A failure of the broker while doing `operation` on `destination`.
    pub fn broker(
        operation: &'static str,
        destination: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Self::Broker {
            operation,
            destination: destination.into(),
            source: source.into(),
        }
    }
}

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

    /// Publishes the original message of each selected letter as `redrive`
    /// says and removes the letter once the publish is confirmed. A crash
    /// between the two leaves a letter that was published: redriving it
    /// again publishes a duplicate (at least once, as everywhere).
    async fn redrive(
        &self,
        selection: &Selection,
        redrive: &Redrive,
    ) -> Result<RedriveReport, StoreError>;

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
    async fn redrive(
        &self,
        selection: &Selection,
        redrive: &Redrive,
    ) -> Result<RedriveReport, StoreError> {
        (**self).redrive(selection, redrive).await
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
    async fn redrive(
        &self,
        selection: &Selection,
        redrive: &Redrive,
    ) -> Result<RedriveReport, StoreError> {
        (**self).redrive(selection, redrive).await
    }
    async fn purge(&self, selection: &Selection) -> Result<u64, StoreError> {
        (**self).purge(selection).await
    }
}

/// A dead-letter destination that is an ordered log of entries addressed
/// by id (a memory-broker topic, a Redis stream): the primitives
/// [`LogStore`] builds a whole [`DeadLetterStore`] on.
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
    /// (a redrive to the [group](Target::Group) goes there). `None` (the
    /// default): this log knows none.
    async fn way_back_to_group(&self, origin: &str) -> Result<Option<Arc<str>>, StoreError> {
        let _ = origin;
        Ok(None)
    }
}

/// Entries read per round trip while scanning, and letters published per
/// batch before their confirmations are awaited.
const PAGE: usize = 256;

/// The [`DeadLetterStore`] of a [`DeadLetterLog`], redriving through a
/// [`Publisher`] `P`.
///
/// A redrive reads the log a page at a time, sends every letter of the page
/// it takes before awaiting any confirmation (so a page costs about one
/// round trip), then removes the confirmed ones in one call.
pub struct LogStore<L, P> {
    log: L,
    publisher: P,
}

impl<L: DeadLetterLog, P: Publisher> LogStore<L, P> {
    /// The store of `log`, redriving through `publisher`.
    pub fn new(log: L, publisher: P) -> Self {
        Self { log, publisher }
    }

    /// The log.
    pub fn log(&self) -> &L {
        &self.log
    }

    /// Redrives one page: skips what the loop guard and the letter's form
    /// rule out, sends the rest, awaits every confirmation, removes the
    /// confirmed ones.
    async fn redrive_page(
        &self,
        page: Vec<Result<StoredLetter, LetterId>>,
        redrive: &Redrive,
        report: &mut RedriveReport,
    ) -> Result<(), StoreError> {
        let mut taken = Vec::with_capacity(page.len());
        for entry in page {
            let stored = match entry {
                Ok(stored) => stored,
                Err(id) => {
                    report.skipped.push(Skipped {
                        id,
                        reason: SkipReason::NotFound,
                    });
                    continue;
                }
            };
            match (redrive.skips(&stored), stored.letter) {
                (Some(reason), _) => report.skipped.push(Skipped {
                    id: stored.id,
                    reason,
                }),
                (None, Ok(letter)) => taken.push((stored.id, letter)),
                (None, Err(_)) => {}
            }
        }
        // Every output of the page is made before any is sent, in a dry run
        // too: a letter with no way back to its group stops the redrive
        // before the page is half published, and a dry run says so rather
        // than promise what the real run refuses.
        let mut ways_back: HashMap<SourceName, Option<Arc<str>>> = HashMap::new();
        let mut outputs = Vec::with_capacity(taken.len());
        for (_, letter) in &taken {
            let way_back = match redrive.target() {
                Target::Group => {
                    let origin = letter.message.metadata().source();
                    match ways_back.get(origin) {
                        Some(way_back) => way_back.clone(),
                        None => {
                            let way_back = self.log.way_back_to_group(origin).await?;
                            ways_back.insert(origin.clone(), way_back.clone());
                            way_back
                        }
                    }
                }
                Target::Origin | Target::Destination(_) => None,
            };
            outputs.push(redrive.output_of(letter, way_back.as_ref())?);
        }
        if redrive.dry_run {
            for (_, letter) in &taken {
                report.redriven += 1;
                *report.by_class.entry(letter.class.as_str()).or_default() += 1;
            }
            redrive.report_progress(report.redriven);
            return Ok(());
        }

        // Send the whole page first, then await: the publisher keeps the
        // send order, and a page costs one round trip instead of one each.
        let mut receipts = Vec::with_capacity(taken.len());
        let mut failure: Option<(LetterId, PublishError)> = None;
        for ((id, letter), output) in taken.iter().zip(outputs) {
            match self.publisher.send(output).await {
                Ok(receipt) => receipts.push((id, letter.class, receipt)),
                Err(error) => {
                    failure = Some((id.clone(), error));
                    break;
                }
            }
        }
        let mut confirmed = Vec::with_capacity(receipts.len());
        let mut classes = Vec::with_capacity(receipts.len());
        for (id, class, receipt) in receipts {
            match receipt.await {
                Ok(_) => {
                    confirmed.push(id.clone());
                    classes.push(class);
                }
                Err(error) => {
                    if failure.is_none() {
                        failure = Some((id.clone(), error));
                    }
                }
            }
        }
        if !confirmed.is_empty() {
            self.log.remove(&confirmed).await?;
        }
        report.redriven += confirmed.len() as u64;
        for class in classes {
            *report.by_class.entry(class.as_str()).or_default() += 1;
        }
        redrive.report_progress(report.redriven);
        match failure {
            None => Ok(()),
            Some((id, source)) => Err(StoreError::Redrive {
                id,
                report: Box::new(std::mem::take(report)),
                source,
            }),
        }
    }
}

/// The entries a [`Selection`] takes, a page at a time: ids the log does
/// not hold come as `Err(id)`. A filter's scan stops at the entry newest
/// when it started, so letters written meanwhile (a replay that failed
/// again) are left for the next operation.
struct Pages<'s, L> {
    log: &'s L,
    selection: &'s Selection,
    /// Ids handed over so far (a selection of ids).
    next_id: usize,
    /// Ids already handed over: an id named twice is taken once (a
    /// redrive would otherwise publish it twice).
    seen: HashSet<LetterId>,
    /// The scan's end: unset before the first page, `Some(None)` for an
    /// empty log.
    through: Option<Option<LetterId>>,
    after: Option<LetterId>,
    done: bool,
}

impl<'s, L: DeadLetterLog> Pages<'s, L> {
    fn new(log: &'s L, selection: &'s Selection) -> Self {
        Self {
            log,
            selection,
            next_id: 0,
            seen: HashSet::new(),
            through: None,
            after: None,
            done: false,
        }
    }

    async fn next(&mut self) -> Result<Option<Vec<Result<StoredLetter, LetterId>>>, StoreError> {
        if self.done {
            return Ok(None);
        }
        match self.selection {
            Selection::Ids(ids) => {
                let chunk = ids.get(self.next_id..).unwrap_or_default();
                let chunk = &chunk[..chunk.len().min(PAGE)];
                if chunk.is_empty() {
                    self.done = true;
                    return Ok(None);
                }
                self.next_id += chunk.len();
                let mut page = Vec::with_capacity(chunk.len());
                for id in chunk {
                    if self.seen.insert(id.clone()) {
                        page.push(self.log.get(id).await?.ok_or_else(|| id.clone()));
                    }
                }
                Ok(Some(page))
            }
            Selection::Matching(filter) => {
                let through = match &self.through {
                    Some(through) => through.clone(),
                    None => {
                        let last = self.log.last().await?;
                        self.through = Some(last.clone());
                        last
                    }
                };
                let Some(through) = through else {
                    self.done = true;
                    return Ok(None);
                };
                let entries = self
                    .log
                    .scan(self.after.as_ref(), Some(&through), PAGE)
                    .await?;
                let Some(last) = entries.last() else {
                    self.done = true;
                    return Ok(None);
                };
                self.after = Some(last.id.clone());
                self.done = entries.len() < PAGE;
                Ok(Some(
                    entries
                        .into_iter()
                        .filter(|stored| filter.matches(stored))
                        .map(Ok)
                        .collect(),
                ))
            }
        }
    }
}

#[async_trait::async_trait]
impl<L: DeadLetterLog, P: Publisher> DeadLetterStore for LogStore<L, P> {
    fn destination(&self) -> &str {
        self.log.name()
    }

    async fn count(&self, filter: &Filter) -> Result<u64, StoreError> {
        if filter.is_all() {
            return self.log.entries().await;
        }
        Ok(self.summary(filter).await?.total)
    }

    async fn summary(&self, filter: &Filter) -> Result<Summary, StoreError> {
        let mut summary = Summary::default();
        let mut after: Option<LetterId> = None;
        loop {
            let entries = self.log.scan(after.as_ref(), None, PAGE).await?;
            let Some(last) = entries.last() else {
                return Ok(summary);
            };
            after = Some(last.id.clone());
            let full = entries.len() == PAGE;
            for stored in entries.iter().filter(|stored| filter.matches(stored)) {
                summary.add(stored);
            }
            if !full {
                return Ok(summary);
            }
        }
    }

    async fn list(
        &self,
        filter: &Filter,
        limit: usize,
        after: Option<&LetterId>,
    ) -> Result<Page, StoreError> {
        let mut page = Page::default();
        let mut cursor = after.cloned();
        while page.letters.len() < limit {
            let entries = self.log.scan(cursor.as_ref(), None, PAGE).await?;
            let full = entries.len() == PAGE;
            let mut looked_at = None;
            for stored in entries {
                looked_at = Some(stored.id.clone());
                if filter.matches(&stored) {
                    page.letters.push(stored.without_payload());
                    if page.letters.len() == limit {
                        break;
                    }
                }
            }
            let Some(looked_at) = looked_at else {
                return Ok(page);
            };
            cursor = Some(looked_at);
            if !full && page.letters.len() < limit {
                return Ok(page);
            }
        }
        page.next = cursor;
        Ok(page)
    }

    async fn read(&self, id: &LetterId) -> Result<StoredLetter, StoreError> {
        self.log
            .get(id)
            .await?
            .ok_or_else(|| StoreError::NotFound { id: id.clone() })
    }

    async fn redrive(
        &self,
        selection: &Selection,
        redrive: &Redrive,
    ) -> Result<RedriveReport, StoreError> {
        let mut report = RedriveReport {
            dry_run: redrive.dry_run,
            ..RedriveReport::default()
        };
        let mut pages = Pages::new(&self.log, selection);
        while let Some(page) = pages.next().await? {
            self.redrive_page(page, redrive, &mut report).await?;
        }
        Ok(report)
    }

    async fn purge(&self, selection: &Selection) -> Result<u64, StoreError> {
        let mut removed = 0;
        let mut pages = Pages::new(&self.log, selection);
        while let Some(page) = pages.next().await? {
            let ids: Vec<LetterId> = page
                .into_iter()
                .filter_map(Result::ok)
                .map(|stored| stored.id)
                .collect();
            if !ids.is_empty() {
                removed += self.log.remove(&ids).await?;
            }
        }
        Ok(removed)
    }
}

impl<L, P> fmt::Debug for LogStore<L, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogStore").finish_non_exhaustive()
    }
}

/// Milliseconds since the Unix epoch, as the envelope writes times.
fn epoch_millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dead_letter::DeadLetterSink;
    use crate::memory::{MemoryBroker, MemoryDeadLetters, Record, dead_letter_topic};
    use crate::message::{Metadata, Position};

    /// A broker with `count` letters of `orders` for `billing` (keys `k0`,
    /// `k1`, …, payloads `0`, `1`, …) and a store redriving through
    /// `publisher`.
    async fn letters(
        count: i64,
    ) -> (
        MemoryBroker,
        crate::memory::MemoryPublisher,
        LogStore<MemoryDeadLetters, crate::memory::MemoryPublisher>,
    ) {
        let broker = MemoryBroker::new();
        broker.create_topic("orders", 1).expect("topic");
        let sink = broker.dead_letter_sink("orders", "billing").expect("sink");
        for offset in 0..count {
            let metadata = Metadata::new("orders".into(), 0, Position::Offset(offset));
            let message = Message::new(offset.to_string(), metadata).with_key(format!("k{offset}"));
            sink.write(&DeadLetter::new(message, "bad", 1))
                .await
                .expect("write");
        }
        let topic = broker
            .topic(&dead_letter_topic("orders", "billing"))
            .expect("dead-letter topic");
        let publisher = broker.publisher();
        let store = LogStore::new(MemoryDeadLetters::new(topic), publisher.clone());
        (broker, publisher, store)
    }

    /// The memory publisher, except that its send number `fail_at` (from
    /// 0) is unavailable.
    struct FailingAt {
        inner: crate::memory::MemoryPublisher,
        sends: std::sync::atomic::AtomicU32,
        fail_at: u32,
    }

    impl Publisher for FailingAt {
        type Receipt = <crate::memory::MemoryPublisher as Publisher>::Receipt;

        async fn send(&self, output: Output) -> Result<Self::Receipt, PublishError> {
            let send = self
                .sends
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if send == self.fail_at {
                self.inner.fail_next(1);
            }
            self.inner.send(output).await
        }
    }

    #[tokio::test]
    async fn a_letter_whose_publish_fails_stays_and_the_ones_confirmed_are_removed() {
        let (broker, publisher, store) = letters(3).await;
        let store = LogStore::new(
            store.log,
            FailingAt {
                inner: publisher,
                sends: Default::default(),
                fail_at: 1,
            },
        );
        let outcome = store
            .redrive(&Selection::Matching(Filter::all()), &Redrive::to_origin())
            .await;
        let Err(StoreError::Redrive { id, report, source }) = outcome else {
            panic!("the second publish failed, yet the redrive says {outcome:?}");
        };
        assert_eq!(id.as_str(), "1");
        // The page was sent whole before its receipts were awaited: the
        // third letter went out and was confirmed, the second was not.
        assert_eq!(report.redriven, 2);
        assert_eq!(source.kind(), crate::publish::PublishErrorKind::Unavailable);
        let left = store.list(&Filter::all(), 10, None).await.expect("list");
        let left: Vec<&str> = left
            .letters
            .iter()
            .map(|stored| stored.id.as_str())
            .collect();
        assert_eq!(left, ["1"], "only the confirmed letters are removed");
        let published: Vec<Bytes> = broker
            .messages("orders", 0, 0)
            .expect("messages")
            .iter()
            .map(|message| message.payload().clone())
            .collect();
        assert_eq!(published, ["0", "2"]);
    }

    #[tokio::test]
    async fn an_entry_that_is_no_letter_is_counted_unreadable_and_never_redriven() {
        let (broker, _, store) = letters(1).await;
        broker
            .send(
                &dead_letter_topic("orders", "billing"),
                Record::new("stray").to_partition(0),
            )
            .expect("a stray record");
        assert_eq!(store.count(&Filter::all()).await.expect("count"), 2);
        let permanent = Filter::all().with_class(ErrorClass::Permanent);
        assert_eq!(store.count(&permanent).await.expect("count"), 1);
        let summary = store.summary(&Filter::all()).await.expect("summary");
        assert_eq!((summary.total, summary.unreadable), (2, 1));
        let report = store
            .redrive(
                &Selection::Ids(vec!["1".into(), "7".into()]),
                &Redrive::to_origin(),
            )
            .await
            .expect("redrive");
        assert_eq!(report.redriven, 0);
        let reasons: Vec<&SkipReason> = report.skipped.iter().map(|s| &s.reason).collect();
        assert_eq!(reasons, [&SkipReason::Unreadable, &SkipReason::NotFound]);
    }

    #[tokio::test]
    async fn an_id_named_twice_is_redriven_once() {
        let (broker, _, store) = letters(2).await;
        let report = store
            .redrive(
                &Selection::Ids(vec!["1".into(), "1".into()]),
                &Redrive::to_origin(),
            )
            .await
            .expect("redrive");
        assert_eq!(report.redriven, 1);
        assert_eq!(broker.messages("orders", 0, 0).expect("messages").len(), 1);
    }

    #[tokio::test]
    async fn an_id_of_another_form_is_a_typed_error() {
        let (_, _, store) = letters(1).await;
        for id in ["1700000000000-0", "-1", ""] {
            match store.read(&LetterId::new(id)).await {
                Err(StoreError::InvalidId { id: given, .. }) => assert_eq!(given, id),
                other => panic!("{id:?} read as {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_redrive_elsewhere_keeps_key_headers_and_the_first_failure() {
        let (broker, _, store) = letters(2).await;
        broker.create_topic("orders.retry", 1).expect("topic");
        let stored = store.read(&"1".into()).await.expect("read");
        let first = letter_of(&stored).first_failed_at;
        store
            .redrive(
                &Selection::Matching(Filter::all().with_key("k1")),
                &Redrive::to("orders.retry"),
            )
            .await
            .expect("redrive");
        let moved = broker.messages("orders.retry", 0, 0).expect("messages");
        let [moved] = &moved[..] else {
            panic!("one message moved, not {moved:?}");
        };
        assert_eq!(&moved.payload()[..], b"1");
        assert_eq!(moved.key().map(|key| &key[..]), Some(&b"k1"[..]));
        assert_eq!(moved.headers().get_str(REPLAYS), Some("1"));
        let millis = first
            .duration_since(UNIX_EPOCH)
            .expect("after the epoch")
            .as_millis()
            .to_string();
        assert_eq!(moved.headers().get_str(FAILED_FIRST), Some(millis.as_str()));
        assert_eq!(store.count(&Filter::all()).await.expect("count"), 1);
    }

    fn letter_of(stored: &StoredLetter) -> &DeadLetter {
        stored.letter.as_ref().expect("a readable letter")
    }
}
