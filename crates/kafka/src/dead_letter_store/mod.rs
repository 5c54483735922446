//! [`KafkaDeadLetters`]: a Kafka dead-letter topic as a [`DeadLetterLog`],
//! the log of [`KafkaDeadLetterStore`].
//!
//! A Kafka topic cannot delete one record, only a prefix of a partition
//! (`DeleteRecords`). So a letter removed from the front of its partition
//! is deleted, and one removed out of order is marked in a compacted side
//! topic, `<dlq>.removed` ([`REMOVED_SUFFIX`]: key `PARTITION:OFFSET`,
//! value the time of the removal), which every read skips; once the letters
//! before the marked ones are removed too, the prefix is deleted and the
//! marks below the new low watermark are tombstoned.

mod builder;
mod error;
mod read;
mod removal;
mod snapshot;

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
#[cfg(doc)]
use intake_core::dead_letter::store::Replay;
use intake_core::dead_letter::store::{
    DeadLetterLog, LetterId, LogStore, StoreError, StoredLetter,
};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Message as _};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{Offset, TopicPartitionList};

use crate::dead_letter::DEFAULT_TOPIC_TEMPLATE;
use crate::error::Error;
use crate::parking::DEFAULT_RETURN_TEMPLATE;
use crate::publisher::KafkaPublisher;
use crate::settings::KafkaSettings;
use crate::topic_admin::create_topic;

pub use self::builder::KafkaDeadLettersBuilder;
pub use self::error::DeadLetterLogError;
use self::error::{Failure, KafkaErrorOrTimeout};
use self::read::{read_range, stored};
use self::snapshot::{Id, Partition, Snapshot, id_of};

/// The dead-letter store of a Kafka dead-letter topic.
pub type KafkaDeadLetterStore = LogStore<KafkaDeadLetters, KafkaPublisher>;

/// What the side topic of removed letters is called: the dead-letter
/// topic's name with this appended (`orders.billing.dlq.removed`).
pub const REMOVED_SUFFIX: &str = ".removed";

/// The default of [`KafkaDeadLettersBuilder::timeout`].
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// A Kafka dead-letter topic as a [`DeadLetterLog`], so that
/// [`KafkaDeadLetterStore`] (a [`LogStore`] replaying through a
/// [`KafkaPublisher`]) counts, lists, reads, replays and purges what a
/// [`KafkaDeadLetterSink`](crate::KafkaDeadLetterSink) wrote. Build one
/// with [`KafkaDeadLetters::builder`]; it is cheap to clone.
///
/// A letter's id is `PARTITION:OFFSET` in the dead-letter topic (`0:41`);
/// letters are in the order of their partition, then their offset.
///
/// | store operation | Kafka |
/// |---|---|
/// | count everything | the partitions' high minus low watermarks, minus the ids marked removed |
/// | count with a filter, summary, list | a consumer assigned (never subscribed: it joins no group and commits nothing) from the cursor's offset, the marked ids skipped |
/// | read | the same consumer at the id's offset |
/// | replay | a produce through the publisher, confirmed, then a removal: [to the group](Replay::to_group) into its return topic `{topic}.{group}.returned` (only when it exists), [to the origin](Replay::to_origin) into the origin topic; either into the letter's origin partition |
/// | purge | a removal: `DeleteRecords` of the prefix of a partition it completes, a mark in `<dlq>.removed` for the rest |
///
/// Removal: Kafka deletes only a prefix of a partition. Letters that,
/// with those marked before, make up the front of their partition are
/// deleted with `DeleteRecords`, never marked; a replay or purge of
/// everything thus leaves an empty topic and writes no mark. A letter
/// removed out of order (a purge by id, a filter that skips the oldest) is
/// marked in the compacted side topic `<dlq>.removed`
/// ([`REMOVED_SUFFIX`], created with `cleanup.policy=compact` on the first
/// mark, never left to the broker's auto-creation), before any deletion,
/// and every operation skips the ids marked there. When the letters before
/// it are removed, the prefix is deleted and the marks below the new low
/// watermark are tombstoned. A prefix the broker does not delete (no
/// `DELETE` permission on the topic, a compacted dead-letter topic, no
/// answer in time) is marked instead, logged at warn level: the store
/// works on marks alone.
///
/// The cost: every primitive the store runs on reads the partitions'
/// watermarks and whatever the side topic gained since this log last read
/// it (read once from its start, then incrementally), a few round trips.
/// The side topic holds at most one mark per letter removed out of order
/// that is still in the dead-letter topic, tombstones aside (compaction
/// drops them after the topic's `delete.retention.ms`). Measured on a
/// local broker (debug build, 2 busy cores): `intake dlq count` (a
/// summary, so a scan) of 5,000 letters in 0.5 s, a purge of one by id in
/// 0.4 s, a replay of the 4,999 left in 0.8 s, leaving an empty topic and
/// two records in the side topic (the one mark and its tombstone).
///
/// Limits, stated: the dead-letter topic's own retention (the broker's
/// default, 7 days, unless the topic was created otherwise) deletes letters
/// too, and the stale marks of such letters are tombstoned by the next
/// removal. A dead-letter topic deleted and created again starts its offsets
/// anew: delete its side topic with it, or its marks hide new letters. A
/// side topic that exists already is used as it is: made by hand, it must
/// be compacted (or keep its records at least as long as the dead-letter
/// topic keeps letters), or removed letters come back when their marks
/// expire. On a
/// dead-letter topic of several partitions (the sink creates one), a
/// replay by filter stops at the newest letter of the last partition when
/// it starts, so a letter written meanwhile to an earlier partition (a
/// replay that failed again) can be met by the same replay; the loop guard
/// bounds how often. The count of everything is the watermarks' difference,
/// so on a topic written by a transactional producer (no intake sink is
/// one) it includes the transactions' control records, which no listing
/// shows.
///
/// Every wait is bounded by the [timeout](KafkaDeadLettersBuilder::timeout):
/// each librdkafka call, each poll for the next record, each delivery and
/// admin request. librdkafka's calls block, so reads run on Tokio's
/// blocking pool.
///
/// ```no_run
/// use intake_core::dead_letter::store::{DeadLetterStore, Filter, Replay, Selection};
/// use intake_kafka::{KafkaDeadLetters, KafkaPublisher, KafkaSettings};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let settings = KafkaSettings::new("127.0.0.1:9092");
/// let store = KafkaDeadLetters::builder(settings.clone())
///     .dead_letters_of("orders", "billing") // the topic `orders.billing.dlq`
///     .build()?
///     .store(KafkaPublisher::builder(settings).build()?);
/// println!("{} dead letters", store.count(&Filter::all()).await?);
/// // Back to `billing` alone, through `orders.billing.returned`.
/// let report = store
///     .replay(&Selection::Matching(Filter::all()), &Replay::to_group())
///     .await?;
/// println!("{} back to billing, {} skipped", report.replayed, report.skipped.len());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct KafkaDeadLetters {
    inner: Arc<Inner>,
}

struct Inner {
    topic: String,
    removed_topic: String,
    /// The consumer group whose letters these are, if known: its return
    /// topics are the way back to it alone.
    group: Option<String>,
    return_template: String,
    brokers: String,
    timeout: Duration,
    /// The consumer and what it knows of the side topic; held by one
    /// blocking read at a time.
    reader: Mutex<Reader>,
    producer: FutureProducer,
    admin: AdminClient<DefaultClientContext>,
    /// Whether the side topic is known to exist.
    side_topic_ready: Mutex<bool>,
}

/// The assign-only consumer, and the marks of the side topic read so far.
struct Reader {
    consumer: BaseConsumer,
    /// Every id marked removed (tombstoned ones taken out).
    marks: BTreeSet<Id>,
    /// The side topic's next offset to read.
    marks_next: i64,
}

impl fmt::Debug for KafkaDeadLetters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaDeadLetters")
            .field("brokers", &self.inner.brokers)
            .field("topic", &self.inner.topic)
            .field("removed_topic", &self.inner.removed_topic)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

impl KafkaDeadLetters {
    /// A builder of the dead-letter topic's reader on the brokers of
    /// `settings` (the source's: the same TLS and SASL settings).
    pub fn builder(settings: KafkaSettings) -> KafkaDeadLettersBuilder {
        KafkaDeadLettersBuilder {
            settings,
            topic: None,
            group: None,
            return_template: DEFAULT_RETURN_TEMPLATE.into(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The store of this topic, replaying through `publisher`: with the
    /// letter's key, into the letter's origin partition, to the group's
    /// return topic ([`Replay::to_group`]) or to the origin topic
    /// ([`Replay::to_origin`]).
    pub fn store(self, publisher: KafkaPublisher) -> KafkaDeadLetterStore {
        LogStore::new(self, publisher)
    }

    /// The dead-letter topic.
    pub fn topic(&self) -> &str {
        &self.inner.topic
    }

    /// The side topic of the ids removed.
    pub fn removed_topic(&self) -> &str {
        &self.inner.removed_topic
    }

    fn error(&self, operation: &'static str, failure: Failure) -> StoreError {
        let brokers = self.inner.brokers.clone();
        let cause = match failure {
            Failure::TimedOut { step, waited } => DeadLetterLogError::TimedOut {
                brokers,
                step,
                waited,
            },
            Failure::Client { step, source } => DeadLetterLogError::Client {
                brokers,
                step,
                source: Box::new(source),
            },
        };
        StoreError::broker(operation, &self.inner.topic, cause)
    }

    /// Runs `step` with the reader on the blocking pool.
    async fn blocking<T: Send + 'static>(
        &self,
        operation: &'static str,
        step: impl FnOnce(&Inner, &mut Reader) -> Result<T, Failure> + Send + 'static,
    ) -> Result<T, StoreError> {
        let inner = Arc::clone(&self.inner);
        let ran = tokio::task::spawn_blocking(move || {
            let mut reader = inner.reader.lock().unwrap_or_else(PoisonError::into_inner);
            step(&inner, &mut reader)
        })
        .await;
        match ran {
            Ok(done) => done.map_err(|failure| self.error(operation, failure)),
            Err(source) => Err(StoreError::broker(
                operation,
                &self.inner.topic,
                DeadLetterLogError::Interrupted {
                    topic: self.inner.topic.clone(),
                    source,
                },
            )),
        }
    }

    async fn snapshot(&self, operation: &'static str) -> Result<Snapshot, StoreError> {
        self.blocking(operation, |inner, reader| inner.snapshot(reader))
            .await
    }

    /// Awaits `request` within the timeout.
    async fn bounded<T>(
        &self,
        operation: &'static str,
        step: String,
        request: impl Future<Output = T>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.inner.timeout, request)
            .await
            .map_err(|_| {
                self.error(
                    operation,
                    Failure::TimedOut {
                        step,
                        waited: self.inner.timeout,
                    },
                )
            })
    }
}

#[async_trait::async_trait]
impl DeadLetterLog for KafkaDeadLetters {
    fn name(&self) -> &str {
        &self.inner.topic
    }

    /// The group's return topic of `origin`, `{origin}.{group}.returned` by
    /// the parking's default template (or the
    /// [template given](KafkaDeadLettersBuilder::return_topic_template)),
    /// when it exists: the group's source reads it, and no other group
    /// does. `None` without a [group](KafkaDeadLettersBuilder::group) or
    /// when the topic does not exist (the group does not park, or parks
    /// elsewhere): a replay to the group is then refused rather than sent
    /// to every group of the origin.
    async fn way_back_to_group(&self, origin: &str) -> Result<Option<Arc<str>>, StoreError> {
        let Some(group) = &self.inner.group else {
            return Ok(None);
        };
        let back_to = self
            .inner
            .return_template
            .replace("{topic}", origin)
            .replace("{group}", group);
        if back_to == origin {
            // Copies return to the origin itself: every group reads it.
            return Ok(None);
        }
        let name = back_to.clone();
        let partitions = self
            .blocking("replay", move |inner, reader| {
                inner.partitions(reader, &name)
            })
            .await?;
        Ok((!partitions.is_empty()).then(|| back_to.into()))
    }

    async fn entries(&self) -> Result<u64, StoreError> {
        Ok(self.snapshot("count").await?.entries())
    }

    async fn last(&self) -> Result<Option<LetterId>, StoreError> {
        let snapshot = self.snapshot("read").await?;
        for partition in snapshot.partitions.iter().rev() {
            let mut offset = partition.high - 1;
            while offset >= partition.low {
                let id = Id {
                    partition: partition.id,
                    offset,
                };
                if !snapshot.removed.contains(&id) {
                    return Ok(Some(id.letter_id()));
                }
                offset -= 1;
            }
        }
        Ok(None)
    }

    async fn scan(
        &self,
        after: Option<&LetterId>,
        through: Option<&LetterId>,
        max: usize,
    ) -> Result<Vec<StoredLetter>, StoreError> {
        let start = match after.map(id_of).transpose()? {
            None => None,
            Some(after) => match after.offset.checked_add(1) {
                Some(offset) => Some(Id { offset, ..after }),
                None => return Ok(Vec::new()),
            },
        };
        let through = through.map(id_of).transpose()?;
        if max == 0 || matches!((start, through), (Some(start), Some(through)) if through < start) {
            return Ok(Vec::new());
        }
        self.blocking("list", move |inner, reader| {
            inner.scan(reader, start, through, max)
        })
        .await
    }

    async fn get(&self, id: &LetterId) -> Result<Option<StoredLetter>, StoreError> {
        let id = id_of(id)?;
        self.blocking("read", move |inner, reader| {
            let snapshot = inner.snapshot(reader)?;
            if !snapshot.is_live(id) {
                return Ok(None);
            }
            let mut found = None;
            read_range(
                &reader.consumer,
                &inner.topic,
                id.partition,
                id.offset,
                id.offset + 1,
                inner.timeout,
                1,
                |message| {
                    found = Some(stored(id, message));
                    true
                },
            )?;
            Ok(found)
        })
        .await
    }

    /// Deletes what it can, marks the rest: the ids that, with the marks,
    /// complete a prefix of their partition are deleted with
    /// `DeleteRecords` and never marked; the others are marked first, so
    /// that a failure before the deletion leaves nothing half removed.
    /// A prefix the broker does not delete is marked instead. Marks below a
    /// new low watermark, and stale ones, are then tombstoned (a failure
    /// there only logs: a mark below the low watermark is ignored).
    async fn remove(&self, ids: &[LetterId]) -> Result<u64, StoreError> {
        let ids = ids.iter().map(id_of).collect::<Result<BTreeSet<_>, _>>()?;
        if ids.is_empty() {
            return Ok(0);
        }
        let snapshot = self.snapshot("remove letters from").await?;
        let live: Vec<Id> = ids.into_iter().filter(|id| snapshot.is_live(*id)).collect();
        let mut removed = snapshot.removed.clone();
        removed.extend(live.iter().copied());
        let mut prefixes = Vec::new();
        for partition in &snapshot.partitions {
            let mut low = partition.low;
            while low < partition.high
                && removed.contains(&Id {
                    partition: partition.id,
                    offset: low,
                })
            {
                low += 1;
            }
            if low > partition.low {
                prefixes.push((partition.id, low));
            }
        }
        let in_prefix = |id: &Id| {
            prefixes
                .iter()
                .any(|&(partition, low)| partition == id.partition && id.offset < low)
        };
        let (deletable, marked): (Vec<Id>, Vec<Id>) = live.iter().partition(|id| in_prefix(id));
        self.mark(&marked).await?;
        let mut tombstones = snapshot.stale.clone();
        if !prefixes.is_empty() {
            let deleted = self.delete_prefixes(&prefixes).await;
            let below = |id: &Id| {
                deleted
                    .iter()
                    .any(|&(partition, low)| partition == id.partition && id.offset < low)
            };
            let undeleted: Vec<Id> = deletable.into_iter().filter(|id| !below(id)).collect();
            self.mark(&undeleted).await?;
            tombstones.extend(snapshot.removed.iter().filter(|id| below(id)));
            tombstones.extend(marked.iter().filter(|id| below(id)));
        }
        if !tombstones.is_empty()
            && let Err(error) = self.write_marks(&tombstones, true).await
        {
            tracing::warn!(
                topic = %self.inner.removed_topic,
                %error,
                "could not tombstone the marks of deleted dead letters; the next removal tries again"
            );
        }
        Ok(live.len() as u64)
    }
}
