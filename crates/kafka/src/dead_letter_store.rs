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

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
#[cfg(doc)]
use intake_core::dead_letter::store::Redrive;
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

/// The dead-letter store of a Kafka dead-letter topic.
pub type KafkaDeadLetterStore = LogStore<KafkaDeadLetters, KafkaPublisher>;

/// What the side topic of removed letters is called: the dead-letter
/// topic's name with this appended (`orders.billing.dlq.removed`).
pub const REMOVED_SUFFIX: &str = ".removed";

/// The default of [`KafkaDeadLettersBuilder::timeout`].
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// A Kafka dead-letter topic as a [`DeadLetterLog`], so that
/// [`KafkaDeadLetterStore`] (a [`LogStore`] redriving through a
/// [`KafkaPublisher`]) counts, lists, reads, redrives and purges what a
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
/// | redrive | a produce through the publisher, confirmed, then a removal: [to the group](Redrive::to_group) into its return topic `{topic}.{group}.returned` (only when it exists), [to the origin](Redrive::to_origin) into the origin topic; either into the letter's origin partition |
/// | purge | a removal: `DeleteRecords` of the prefix of a partition it completes, a mark in `<dlq>.removed` for the rest |
///
/// Removal: Kafka deletes only a prefix of a partition. Letters that,
/// with those marked before, make up the front of their partition are
/// deleted with `DeleteRecords`, never marked; a redrive or purge of
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
/// redrive by filter stops at the newest letter of the last partition when
/// it starts, so a letter written meanwhile to an earlier partition (a
/// replay that failed again) can be met by the same redrive; the loop guard
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
/// use intake_core::dead_letter::store::{DeadLetterStore, Filter, Redrive, Selection};
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
///     .redrive(&Selection::Matching(Filter::all()), &Redrive::to_group())
///     .await?;
/// println!("{} back to billing, {} skipped", report.redriven, report.skipped.len());
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

/// Why a step of [`KafkaDeadLetters`] failed: the
/// [`source`](std::error::Error::source) of a [`StoreError::Broker`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeadLetterLogError {
    /// The broker did not answer within the timeout.
    #[error("no answer from {brokers} within {waited:?} to {step}")]
    TimedOut {
        /// The brokers (credentials hidden).
        brokers: String,
        /// What was asked.
        step: String,
        /// How long it waited.
        waited: Duration,
    },
    /// The client or the broker failed.
    #[error("the Kafka client for {brokers} could not {step}")]
    Client {
        /// The brokers (credentials hidden).
        brokers: String,
        /// What was asked.
        step: String,
        /// librdkafka's error.
        #[source]
        source: Box<KafkaError>,
    },
    /// The blocking task that talked to the broker ended without an answer
    /// (the runtime is shutting down).
    #[error("the blocking read of {topic} ended without an answer")]
    Interrupted {
        /// The dead-letter topic.
        topic: String,
        /// Why the task ended.
        #[source]
        source: tokio::task::JoinError,
    },
}

/// A letter's place: partition and offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Id {
    partition: i32,
    offset: i64,
}

impl Id {
    fn letter_id(self) -> LetterId {
        LetterId::new(self.to_string())
    }

    /// The id written `PARTITION:OFFSET`, both decimal and not negative.
    fn parse(text: &str) -> Option<Self> {
        let (partition, offset) = text.split_once(':')?;
        let digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
        if !digits(partition) || !digits(offset) {
            return None;
        }
        Some(Self {
            partition: partition.parse().ok()?,
            offset: offset.parse().ok()?,
        })
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.partition, self.offset)
    }
}

fn id_of(id: &LetterId) -> Result<Id, StoreError> {
    Id::parse(id.as_str()).ok_or_else(|| StoreError::InvalidId {
        id: id.as_str().to_owned(),
        expected: "PARTITION:OFFSET in the dead-letter topic, such as 0:41",
    })
}

/// One partition of the dead-letter topic: its low and high watermarks.
#[derive(Clone, Copy, Debug)]
struct Partition {
    id: i32,
    low: i64,
    high: i64,
}

/// The dead-letter topic as one operation sees it.
#[derive(Debug, Default)]
struct Snapshot {
    /// Sorted by partition; empty when the topic does not exist.
    partitions: Vec<Partition>,
    /// Marked ids within their partition's watermarks.
    removed: BTreeSet<Id>,
    /// Marked ids below their partition's low watermark, or of a partition
    /// the topic does not have: deleted already, their marks to tombstone.
    stale: Vec<Id>,
}

impl Snapshot {
    fn partition(&self, id: i32) -> Option<Partition> {
        self.partitions.iter().find(|p| p.id == id).copied()
    }

    /// Whether `id` is a letter the topic holds and no mark removed.
    fn is_live(&self, id: Id) -> bool {
        self.partition(id.partition)
            .is_some_and(|p| p.low <= id.offset && id.offset < p.high)
            && !self.removed.contains(&id)
    }

    fn entries(&self) -> u64 {
        let held: i64 = self
            .partitions
            .iter()
            .map(|p| (p.high - p.low).max(0))
            .sum();
        u64::try_from(held)
            .unwrap_or(0)
            .saturating_sub(self.removed.len() as u64)
    }
}

/// What a blocking step failed with, before it is given its context.
enum Failure {
    TimedOut { step: String, waited: Duration },
    Client { step: String, source: KafkaError },
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

    /// The store of this topic, redriving through `publisher`: with the
    /// letter's key, into the letter's origin partition, to the group's
    /// return topic ([`Redrive::to_group`]) or to the origin topic
    /// ([`Redrive::to_origin`]).
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

    /// Creates the side topic (compacted, one partition) unless it is known
    /// to exist. Never left to the broker's `auto.create.topics.enable`:
    /// that would make it with the delete policy, and its marks would
    /// expire with the retention, bringing removed letters back.
    async fn ensure_side_topic(&self) -> Result<(), StoreError> {
        if *self
            .inner
            .side_topic_ready
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            return Ok(());
        }
        let topic = self.inner.removed_topic.as_str();
        let step = || format!("create the side topic `{topic}`");
        let new_topic =
            NewTopic::new(topic, 1, TopicReplication::Fixed(-1)).set("cleanup.policy", "compact");
        let options = AdminOptions::new()
            .request_timeout(Some(Timeout::After(self.inner.timeout)))
            .operation_timeout(Some(self.inner.timeout));
        let created = self
            .bounded(
                "remove letters from",
                step(),
                create_topic(&self.inner.admin, &new_topic, &options),
            )
            .await?
            .map_err(|source| {
                self.error(
                    "remove letters from",
                    Failure::Client {
                        step: step(),
                        source,
                    },
                )
            })?;
        if created {
            tracing::info!(topic, "created the side topic of removed dead letters");
        }
        *self
            .inner
            .side_topic_ready
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = true;
        Ok(())
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

    /// Writes one record per id to the side topic: a mark (the time of the
    /// removal) or, `tombstone`, its deletion; returns once every one is
    /// confirmed.
    async fn write_marks(&self, ids: &[Id], tombstone: bool) -> Result<(), KafkaErrorOrTimeout> {
        let topic = self.inner.removed_topic.as_str();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis())
            .to_string();
        let mut deliveries = Vec::with_capacity(ids.len());
        for id in ids {
            let key = id.to_string();
            let mut record = FutureRecord::<String, String>::to(topic)
                .key(&key)
                .partition(0);
            if !tombstone {
                record = record.payload(&now);
            }
            match self.inner.producer.send_result(record) {
                Ok(delivery) => deliveries.push(delivery),
                Err((error, _)) => return Err(KafkaErrorOrTimeout::Kafka(error)),
            }
        }
        let confirmed = tokio::time::timeout(self.inner.timeout, async {
            for delivery in deliveries {
                match delivery.await {
                    Ok(Ok(_)) => {}
                    Ok(Err((error, _))) => return Err(error),
                    Err(_) => return Err(KafkaError::Canceled),
                }
            }
            Ok(())
        })
        .await;
        match confirmed {
            Err(_) => Err(KafkaErrorOrTimeout::TimedOut),
            Ok(Err(error)) => Err(KafkaErrorOrTimeout::Kafka(error)),
            Ok(Ok(())) => Ok(()),
        }
    }

    /// Marks `ids` removed in the side topic (created first if need be).
    async fn mark(&self, ids: &[Id]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        self.ensure_side_topic().await?;
        self.write_marks(ids, false).await.map_err(|failed| {
            let step = format!(
                "mark {} letters removed in `{}`",
                ids.len(),
                self.inner.removed_topic
            );
            let failure = match failed {
                KafkaErrorOrTimeout::Kafka(source) => Failure::Client { step, source },
                KafkaErrorOrTimeout::TimedOut => Failure::TimedOut {
                    step,
                    waited: self.inner.timeout,
                },
            };
            self.error("remove letters from", failure)
        })
    }

    /// Deletes `prefixes` (partition and new low watermark) with
    /// `DeleteRecords`; returns the new low watermark of each partition
    /// whose prefix was deleted. A partition missing from the answer was
    /// not deleted: the caller marks its letters instead.
    async fn delete_prefixes(&self, prefixes: &[(i32, i64)]) -> Vec<(i32, i64)> {
        let mut list = TopicPartitionList::new();
        for &(partition, low) in prefixes {
            if list
                .add_partition_offset(&self.inner.topic, partition, Offset::Offset(low))
                .is_err()
            {
                return Vec::new();
            }
        }
        let options = AdminOptions::new()
            .request_timeout(Some(Timeout::After(self.inner.timeout)))
            .operation_timeout(Some(self.inner.timeout));
        let asked = tokio::time::timeout(
            self.inner.timeout,
            self.inner.admin.delete_records(&list, &options),
        )
        .await;
        let warn = |error: &dyn fmt::Display| {
            tracing::warn!(
                topic = %self.inner.topic,
                %error,
                "could not delete the removed dead letters' prefix; marking them removed instead"
            );
        };
        match asked {
            Ok(Ok(result)) => result
                .elements()
                .iter()
                .filter_map(|element| match (element.error(), element.offset()) {
                    (Ok(()), Offset::Offset(low)) => Some((element.partition(), low)),
                    (Ok(()), _) => None,
                    (Err(error), _) => {
                        warn(&error);
                        None
                    }
                })
                .collect(),
            Ok(Err(error)) => {
                warn(&error);
                Vec::new()
            }
            Err(_) => {
                warn(&format_args!("no answer within {:?}", self.inner.timeout));
                Vec::new()
            }
        }
    }
}

/// A produce that failed or was not confirmed in time.
#[derive(Debug)]
enum KafkaErrorOrTimeout {
    Kafka(KafkaError),
    TimedOut,
}

impl fmt::Display for KafkaErrorOrTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KafkaErrorOrTimeout::Kafka(error) => error.fmt(f),
            KafkaErrorOrTimeout::TimedOut => f.write_str("not confirmed within the timeout"),
        }
    }
}

impl Inner {
    /// The partitions of `topic` with their watermarks; none when the topic
    /// does not exist.
    fn partitions(&self, reader: &Reader, topic: &str) -> Result<Vec<Partition>, Failure> {
        let step = || format!("read the metadata of `{topic}`");
        let metadata = reader
            .consumer
            .fetch_metadata(Some(topic), self.timeout)
            .map_err(|source| Failure::Client {
                step: step(),
                source,
            })?;
        let Some(found) = metadata.topics().iter().find(|found| found.name() == topic) else {
            return Ok(Vec::new());
        };
        if let Some(error) = found.error() {
            let code = RDKafkaErrorCode::from(error);
            return match code {
                RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic => {
                    Ok(Vec::new())
                }
                code => Err(Failure::Client {
                    step: step(),
                    source: KafkaError::MetadataFetch(code),
                }),
            };
        }
        let mut partitions = Vec::with_capacity(found.partitions().len());
        for partition in found.partitions() {
            let (low, high) = reader
                .consumer
                .fetch_watermarks(topic, partition.id(), self.timeout)
                .map_err(|source| Failure::Client {
                    step: format!(
                        "read the watermarks of `{topic}` partition {}",
                        partition.id()
                    ),
                    source,
                })?;
            partitions.push(Partition {
                id: partition.id(),
                low,
                high,
            });
        }
        partitions.sort_by_key(|p| p.id);
        Ok(partitions)
    }

    /// Reads what the side topic gained since the last read.
    fn refresh_marks(&self, reader: &mut Reader) -> Result<(), Failure> {
        let topic = self.removed_topic.as_str();
        let Some(side) = self.partitions(reader, topic)?.into_iter().next() else {
            // No side topic: nothing was ever removed (or it was deleted,
            // and with it every mark).
            reader.marks.clear();
            reader.marks_next = 0;
            return Ok(());
        };
        if side.high < reader.marks_next {
            // The side topic was deleted and made again: read it anew.
            reader.marks.clear();
            reader.marks_next = 0;
        }
        let from = reader.marks_next.max(side.low);
        let mut records = Vec::new();
        read_range(
            &reader.consumer,
            topic,
            side.id,
            from,
            side.high,
            self.timeout,
            usize::MAX,
            |message| {
                let key = message.key().and_then(|key| std::str::from_utf8(key).ok());
                match key.and_then(Id::parse) {
                    Some(id) => records.push((id, message.payload().is_some())),
                    None => tracing::debug!(
                        topic,
                        offset = message.offset(),
                        "a record of the side topic that is no mark, ignored"
                    ),
                }
                true
            },
        )?;
        for (id, marked) in records {
            if marked {
                reader.marks.insert(id);
            } else {
                reader.marks.remove(&id);
            }
        }
        reader.marks_next = side.high;
        Ok(())
    }

    fn snapshot(&self, reader: &mut Reader) -> Result<Snapshot, Failure> {
        self.refresh_marks(reader)?;
        let partitions = self.partitions(reader, &self.topic)?;
        let mut snapshot = Snapshot {
            partitions,
            ..Snapshot::default()
        };
        for id in &reader.marks {
            match snapshot.partition(id.partition) {
                Some(p) if id.offset >= p.low => {
                    // A mark at or past the high watermark is kept: the
                    // letter it names cannot have been written yet, so it
                    // was marked by a store that saw a longer topic (one
                    // deleted since); it is stale only once below `low`.
                    if id.offset < p.high {
                        snapshot.removed.insert(*id);
                    }
                }
                _ => snapshot.stale.push(*id),
            }
        }
        Ok(snapshot)
    }

    /// Up to `max` letters of the topic in (partition, offset) order from
    /// `start` up to `through` included, the removed ones skipped.
    fn scan(
        &self,
        reader: &mut Reader,
        start: Option<Id>,
        through: Option<Id>,
        max: usize,
    ) -> Result<Vec<StoredLetter>, Failure> {
        let snapshot = self.snapshot(reader)?;
        let mut letters = Vec::new();
        for partition in &snapshot.partitions {
            if letters.len() >= max {
                break;
            }
            if start.is_some_and(|start| partition.id < start.partition)
                || through.is_some_and(|through| partition.id > through.partition)
            {
                continue;
            }
            let from = match start {
                Some(start) if start.partition == partition.id => start.offset.max(partition.low),
                _ => partition.low,
            };
            let end = match through {
                Some(through) if through.partition == partition.id => {
                    partition.high.min(through.offset.saturating_add(1))
                }
                _ => partition.high,
            };
            if from >= end {
                continue;
            }
            let wanted = max - letters.len();
            read_range(
                &reader.consumer,
                &self.topic,
                partition.id,
                from,
                end,
                self.timeout,
                wanted,
                |message| {
                    let id = Id {
                        partition: partition.id,
                        offset: message.offset(),
                    };
                    if snapshot.removed.contains(&id) {
                        return false;
                    }
                    letters.push(stored(id, message));
                    true
                },
            )?;
        }
        Ok(letters)
    }
}

/// Reads `partition` of `topic` from offset `from` to `end` (excluded),
/// handing each record to `take`, which says whether it counted; stops
/// after `max` counted. Each wait for the next record is bounded by
/// `timeout`; the end is known by the record before it or by librdkafka's
/// end-of-partition event (a compacted topic has gaps).
#[allow(clippy::too_many_arguments)]
fn read_range(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    from: i64,
    end: i64,
    timeout: Duration,
    max: usize,
    mut take: impl FnMut(&BorrowedMessage<'_>) -> bool,
) -> Result<(), Failure> {
    if from >= end || max == 0 {
        return Ok(());
    }
    let step = || format!("read `{topic}` partition {partition} from offset {from}");
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, partition, Offset::Offset(from))
        .and_then(|()| consumer.assign(&assignment))
        .map_err(|source| Failure::Client {
            step: step(),
            source,
        })?;
    let mut next = from;
    let mut counted = 0;
    let mut last_progress = Instant::now();
    while next < end && counted < max {
        let left = timeout.saturating_sub(last_progress.elapsed());
        if left.is_zero() {
            return Err(Failure::TimedOut {
                step: step(),
                waited: timeout,
            });
        }
        match consumer.poll(left) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(eof))) if eof == partition => break,
            Some(Err(KafkaError::PartitionEOF(_))) => {}
            Some(Err(source)) => {
                return Err(Failure::Client {
                    step: step(),
                    source,
                });
            }
            Some(Ok(message)) => {
                // A record of an earlier assignment (librdkafka drops
                // those, this makes sure), or one before the start.
                if message.partition() != partition
                    || message.offset() < next
                    || message.topic() != topic
                {
                    continue;
                }
                if message.offset() >= end {
                    break;
                }
                next = message.offset() + 1;
                last_progress = Instant::now();
                if take(&message) {
                    counted += 1;
                }
            }
        }
    }
    // Nothing fetched in the background between reads: a fetch in flight
    // holds the connection the next step's requests go over.
    consumer.unassign().map_err(|source| Failure::Client {
        step: step(),
        source,
    })?;
    Ok(())
}

/// A record of the dead-letter topic as a stored letter: the record key is
/// the key slot.
fn stored(id: Id, message: &BorrowedMessage<'_>) -> StoredLetter {
    StoredLetter::read(
        id.letter_id(),
        message.key().map(Bytes::copy_from_slice),
        message
            .payload()
            .map(Bytes::copy_from_slice)
            .unwrap_or_default(),
        &crate::record_headers::read_headers(message),
    )
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
    /// elsewhere): a redrive to the group is then refused rather than sent
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
            .blocking("redrive", move |inner, reader| {
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

/// Builds [`KafkaDeadLetters`]; see [`KafkaDeadLetters::builder`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `.build()`"]
pub struct KafkaDeadLettersBuilder {
    settings: KafkaSettings,
    topic: Option<String>,
    group: Option<String>,
    return_template: String,
    timeout: Duration,
}

impl KafkaDeadLettersBuilder {
    /// The dead-letter topic to read, by its own name.
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }

    /// The dead letters the default sink of consumer group `group` writes
    /// for topic `topic`: `<topic>.<group>.dlq`
    /// ([`DEFAULT_TOPIC_TEMPLATE`]), letters of that [group](Self::group).
    pub fn dead_letters_of(self, topic: &str, group: &str) -> Self {
        let name = DEFAULT_TOPIC_TEMPLATE
            .replace("{topic}", topic)
            .replace("{group}", group);
        self.topic(name).group(group)
    }

    /// The consumer group whose letters the topic holds: a
    /// [redrive to the group](intake_core::dead_letter::store::Redrive::to_group)
    /// goes to its return topic (see
    /// [`KafkaDeadLetters::way_back_to_group`](DeadLetterLog::way_back_to_group)).
    /// Set by [`dead_letters_of`](Self::dead_letters_of).
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// The group's return topic, with `{topic}` and `{group}` replaced by
    /// the letter's origin and the [group](Self::group): the parking's
    /// [`return_topic_template`](crate::KafkaParkingBuilder::return_topic_template)
    /// (default [`DEFAULT_RETURN_TEMPLATE`]).
    pub fn return_topic_template(mut self, template: impl Into<String>) -> Self {
        self.return_template = template.into();
        self
    }

    /// The longest any one wait may take (default 10 s): each librdkafka
    /// call, each poll for the next record, each delivery of marks and
    /// each admin request.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Creates the consumer, producer and admin client. They connect on
    /// first use; a dead-letter topic that does not exist yet holds no
    /// letters.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for no topic, an empty one, a zero timeout, or
    /// settings librdkafka refuses (a secret's value never shown).
    pub fn build(self) -> Result<KafkaDeadLetters, Error> {
        let topic = match self.topic {
            Some(topic) if !topic.is_empty() => topic,
            Some(_) => return Err(Error::config("topic", "is empty")),
            None => {
                return Err(Error::config(
                    "topic",
                    "is not set; name the dead-letter topic (`topic`) or its source and group (`dead_letters_of`)",
                ));
            }
        };
        if self.timeout.is_zero() {
            return Err(Error::config("timeout", "must be more than zero"));
        }
        let brokers = self.settings.endpoint();
        let failed = |error| Error::from_kafka(error, &brokers, Duration::ZERO);
        let millis = self.timeout.as_millis().max(1).to_string();
        let mut consumer = self.settings.client_config().clone();
        // librdkafka refuses an assignment without a group id, though an
        // assign-only consumer never joins its group nor commits to it.
        consumer
            .set("group.id", "intake-dead-letter-store")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "true")
            // Letters deleted under a read: go on from the oldest left.
            .set("auto.offset.reset", "earliest")
            .set("allow.auto.create.topics", "false");
        // A fetch long-polls the partition's leader for up to this long
        // when it is at the end, and the metadata and watermark requests of
        // the next step queue behind it on the same connection: at
        // librdkafka's 500 ms every store step took 1.5-2.5 s. Reads go to
        // a known end, so a long poll buys nothing here.
        if consumer.get("fetch.wait.max.ms").is_none() {
            consumer.set("fetch.wait.max.ms", "10");
        }
        let consumer: BaseConsumer = consumer.create().map_err(failed)?;
        let mut producer = self.settings.client_config().clone();
        producer
            .set("acks", "all")
            .set("message.timeout.ms", &millis);
        let producer: FutureProducer = producer.create().map_err(failed)?;
        let admin: AdminClient<DefaultClientContext> =
            self.settings.client_config().create().map_err(failed)?;
        Ok(KafkaDeadLetters {
            inner: Arc::new(Inner {
                removed_topic: format!("{topic}{REMOVED_SUFFIX}"),
                topic,
                group: self.group.filter(|group| !group.is_empty()),
                return_template: self.return_template,
                brokers,
                timeout: self.timeout,
                reader: Mutex::new(Reader {
                    consumer,
                    marks: BTreeSet::new(),
                    marks_next: 0,
                }),
                producer,
                admin,
                side_topic_ready: Mutex::new(false),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_a_partition_and_an_offset() {
        for id in [
            "",
            "41",
            "0:",
            ":41",
            "-1:4",
            "0:-4",
            "0:4:1",
            "a:1",
            "0:+1",
            "99999999999:1",
        ] {
            assert!(
                matches!(id_of(&LetterId::new(id)), Err(StoreError::InvalidId { .. })),
                "{id}"
            );
        }
        let id = id_of(&LetterId::new("2:41")).expect("an id");
        assert_eq!((id.partition, id.offset), (2, 41));
        assert_eq!(id.letter_id().as_str(), "2:41");
    }

    #[test]
    fn a_snapshot_counts_the_held_records_less_the_marked_ones() {
        let snapshot = Snapshot {
            partitions: vec![
                Partition {
                    id: 0,
                    low: 3,
                    high: 10,
                },
                Partition {
                    id: 1,
                    low: 0,
                    high: 0,
                },
            ],
            removed: [Id {
                partition: 0,
                offset: 5,
            }]
            .into_iter()
            .collect(),
            stale: vec![],
        };
        assert_eq!(snapshot.entries(), 6);
        assert!(snapshot.is_live(Id {
            partition: 0,
            offset: 3
        }));
        assert!(
            !snapshot.is_live(Id {
                partition: 0,
                offset: 5
            }),
            "marked"
        );
        assert!(
            !snapshot.is_live(Id {
                partition: 0,
                offset: 2
            }),
            "deleted"
        );
        assert!(
            !snapshot.is_live(Id {
                partition: 0,
                offset: 10
            }),
            "not written"
        );
        assert!(
            !snapshot.is_live(Id {
                partition: 2,
                offset: 0
            }),
            "no partition"
        );
    }
}
