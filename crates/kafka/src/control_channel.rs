//! [`KafkaControlChannel`]: one of a consumer group's control logs (core's
//! [`group_control`](intake_core::group_control)) as a Kafka topic of one
//! partition.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use intake_core::group_control::{ControlChannel, ControlError, ControlFeed, ControlLog};
use intake_core::publish::{Output, PublishError, PublishErrorKind, Publisher};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message as _;
use rdkafka::util::Timeout;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;

use crate::error::{Error, is_unreachable, passes};
use crate::parking::partition_count;
use crate::publisher::KafkaPublisher;
use crate::settings::KafkaSettings;
use crate::topic_admin::{LazyAdmin, create_topic};

/// The longest one step may take: a metadata lookup, a topic's creation,
/// an append's delivery, a check of the log's end.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Added to [`TIMEOUT`] around a step whose librdkafka calls are bounded
/// by it themselves: the outer bound only catches a busy blocking pool.
const MARGIN: Duration = Duration::from_secs(1);

/// How long a feed waits for a record before it checks that the broker
/// still answers and that it is not behind the log's end.
const IDLE_CHECK: Duration = Duration::from_secs(5);

/// How many idle checks in a row may find records the feed has not
/// received before it ends as stalled.
const STALLED_CHECKS: u32 = 2;

/// The `group.id` of every reader: librdkafka refuses an assignment without
/// one, though a reader never joins a group nor commits.
const READER_GROUP: &str = "intake-control-reader";

/// Kafka's longest topic name.
const NAME_LIMIT: usize = 249;

/// The room for the group's part of a name, the same for both logs (the
/// longer suffix), so that a group's two topics share their prefix.
const GROUP_ROOM: usize = NAME_LIMIT - ".intake-control".len();

/// How many records a feed's reader runs ahead of its follower.
const FEED_BUFFER: usize = 64;

/// One of a consumer group's control logs on Kafka (see
/// [`group_control`](intake_core::group_control)): from
/// [`KafkaBroker::control_channel`](crate::KafkaBroker::control_channel).
/// Clones share the clients.
///
/// | log | topic | retention |
/// |---|---|---|
/// | [commands](ControlLog::Commands) | `{group}.intake-control` | `retention.ms=-1`: kept until deleted |
/// | [status](ControlLog::Status) | `{group}.intake-status` | `retention.ms=3600000` and `segment.ms=3600000`: deleted after one to two hours |
///
/// Each topic has one partition, so its records have one order, and is
/// created on first use (an append or a follow) with `cleanup.policy=delete`
/// and the broker's `default.replication.factor`, as every topic this crate
/// creates by default; a topic that exists already is used as it is (only
/// its partition 0 is read and written).
///
/// **Names.** Kafka takes `[a-zA-Z0-9._-]`, up to 249 characters. A group
/// name made of those alone and at most 234 long is used as it is. Any
/// other has each other character replaced by `-`, is cut to 225
/// characters, and gets `-` and 8 hex digits of its FNV-1a hash (32 bits,
/// of the name's UTF-8 bytes) appended: `billing/eu` is
/// `billing-eu-50c23263.intake-control` (see [`topic`](Self::topic)), and
/// two groups that differ only in such characters get topics of their own.
///
/// An append is produced to partition 0 by an idempotent producer
/// ([`KafkaPublisher`]: `acks=all`), confirmed by its delivery report. A
/// follow assigns a reader (a consumer that joins no group and commits
/// nothing) to partition 0 from its start and hands over each record's
/// value in order (a record without a value as an empty one). librdkafka
/// keeps trying a broker that is down rather than failing, so a feed that
/// received nothing for 5 s, or whose reader reports a lost connection,
/// asks for the log's end: when that fails (at most 10 s), or when twice in
/// a row it finds records the feed did not receive, the feed ends with an
/// error and its follower opens a new one; any other error of the reader
/// ends it at once. Measured with a broker of the test's own killed under
/// an idle feed: the feed ended 8 s later (`tests/broker_restart.rs`).
///
/// Dropping a feed stops its reader, whose consumer is closed on Tokio's
/// blocking pool (a feed keeps the channel's clients alive). Dropping the
/// last clone of a channel no feed holds closes its producer where it is
/// dropped, which blocks for up to about 0.6 s (see [`KafkaPublisher`]).
///
/// Every step is bounded (10 s): a broker that does not answer fails it
/// with [`ControlError::TimedOut`] or [`ControlError::Unavailable`]; a
/// refusal that lasts (rights, an invalid name, settings) is
/// [`ControlError::Refused`]. The cause is a [`ControlTopicError`]; no
/// error and no `Debug` shows a secret of the settings.
#[derive(Clone)]
pub struct KafkaControlChannel {
    inner: Arc<Inner>,
}

struct Inner {
    group: String,
    log: ControlLog,
    topic: Arc<str>,
    /// `bootstrap.servers`, credentials hidden.
    brokers: String,
    /// The readers' settings.
    reader: ClientConfig,
    publisher: KafkaPublisher,
    /// Looks the topic up and the log's end; never assigned.
    probe: Arc<BaseConsumer>,
    admin: LazyAdmin,
    /// Whether the topic is known to exist.
    ready: AtomicBool,
}

impl fmt::Debug for KafkaControlChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaControlChannel")
            .field("group", &self.inner.group)
            .field("log", &self.inner.log)
            .field("topic", &self.inner.topic)
            .field("brokers", &self.inner.brokers)
            .finish_non_exhaustive()
    }
}

/// Why a step on a group's control topic failed: the
/// [`source`](std::error::Error::source) of the [`ControlError`] of a
/// [`KafkaControlChannel`]. librdkafka's or the publisher's error is this
/// one's source; none shows a secret.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlTopicError {
    /// The client or the broker failed a step.
    #[error("cannot {step} the control topic `{topic}` on {brokers}")]
    Client {
        /// What was asked (`look up`, `create`, `read`, ...).
        step: &'static str,
        /// The control topic.
        topic: String,
        /// The brokers (credentials hidden).
        brokers: String,
        /// librdkafka's error.
        #[source]
        source: Box<KafkaError>,
    },
    /// A reader could not be made (its settings).
    #[error("cannot make a reader of the control topic `{topic}`")]
    Reader {
        /// The control topic.
        topic: String,
        /// The client's error, secrets redacted.
        #[source]
        source: Error,
    },
    /// A record was not stored.
    #[error("cannot append to the control topic `{topic}`")]
    Append {
        /// The control topic.
        topic: String,
        /// The publisher's error.
        #[source]
        source: PublishError,
    },
    /// The reader received nothing while the partition held records past
    /// what it received.
    #[error(
        "the reader of the control topic `{topic}` on {brokers} stalled before offset {next} while the log ends at {end}"
    )]
    Stalled {
        /// The control topic.
        topic: String,
        /// The brokers (credentials hidden).
        brokers: String,
        /// The offset the reader waits for.
        next: i64,
        /// The partition's high watermark.
        end: i64,
    },
    /// A blocking call's task ended without an answer (the runtime is
    /// shutting down).
    #[error("the blocking call to {step} the control topic `{topic}` ended without an answer")]
    Interrupted {
        /// What was asked.
        step: &'static str,
        /// The control topic.
        topic: String,
        /// Why the task ended.
        #[source]
        source: tokio::task::JoinError,
    },
}

impl KafkaControlChannel {
    /// Group `group`'s `log` on the brokers of `settings`. Makes the
    /// clients, which connect on first use.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for settings librdkafka refuses (a secret's value
    /// never shown).
    pub(crate) fn new(
        settings: &KafkaSettings,
        group: &str,
        log: ControlLog,
    ) -> Result<Self, Error> {
        let brokers = settings.endpoint();
        let failed = |error| Error::from_kafka(error, &brokers, Duration::ZERO);
        let reader = reader_config(settings);
        let probe: BaseConsumer = reader.create().map_err(failed)?;
        // Commands are rare and each is awaited alone: no lingering.
        let publisher = KafkaPublisher::builder(settings.clone())
            .linger(Duration::ZERO)
            .send_timeout(TIMEOUT)
            .delivery_timeout(TIMEOUT)
            .build()?;
        Ok(Self {
            inner: Arc::new(Inner {
                group: group.to_owned(),
                log,
                topic: topic_name(group, log).into(),
                brokers,
                reader,
                publisher,
                probe: Arc::new(probe),
                admin: LazyAdmin::new(settings.clone()),
                ready: AtomicBool::new(false),
            }),
        })
    }

    /// The log's topic (see the naming rule above).
    pub fn topic(&self) -> &str {
        &self.inner.topic
    }

    /// The consumer group whose log this is.
    pub fn group(&self) -> &str {
        &self.inner.group
    }

    /// Creates the topic unless it is known to exist.
    async fn ensure_topic(&self) -> Result<(), ControlError> {
        if self.inner.ready.load(Ordering::Acquire) {
            return Ok(());
        }
        let partitions = blocking(&self.inner, "look up", |inner| {
            partition_count(inner.probe.client(), &inner.topic, TIMEOUT)
        })
        .await?;
        match partitions {
            Some(1) => {}
            Some(partitions) => tracing::warn!(
                topic = %self.inner.topic,
                partitions,
                "the control topic has more than one partition; only partition 0 is read and written"
            ),
            None => self.create_topic().await?,
        }
        self.inner.ready.store(true, Ordering::Release);
        Ok(())
    }

    /// Creates the topic: one partition, the log's retention.
    async fn create_topic(&self) -> Result<(), ControlError> {
        let inner = &*self.inner;
        let retention = inner
            .log
            .retention()
            .map_or_else(|| "-1".to_owned(), |kept| kept.as_millis().to_string());
        // The broker's `default.replication.factor`, as the crate's other
        // topics unless told otherwise.
        let mut new_topic = NewTopic::new(&inner.topic, 1, TopicReplication::Fixed(-1))
            .set("retention.ms", &retention)
            .set("cleanup.policy", "delete");
        // Kafka deletes whole segments only, and the open one rolls after
        // 7 days: a segment per retention period, so that status records
        // go after one to two hours and a new follower replays no more.
        if inner.log.retention().is_some() {
            new_topic = new_topic.set("segment.ms", &retention);
        }
        let options = AdminOptions::new()
            .request_timeout(Some(Timeout::After(TIMEOUT)))
            .operation_timeout(Some(TIMEOUT));
        let admin = inner
            .admin
            .client()
            .map_err(|error| inner.failed("create", error))?;
        let created =
            tokio::time::timeout(TIMEOUT + MARGIN, create_topic(&admin, &new_topic, &options))
                .await
                .map_err(|_| ControlError::TimedOut(TIMEOUT))?
                .map_err(|error| inner.failed("create", error))?;
        if created {
            tracing::info!(topic = %inner.topic, retention_ms = %retention, "created a group control topic");
        }
        Ok(())
    }
}

impl Inner {
    /// `error` of `step`, transient or not by the crate's classification.
    fn failed(&self, step: &'static str, error: KafkaError) -> ControlError {
        let transient = passes(&error);
        ControlError::from_backend(
            ControlTopicError::Client {
                step,
                topic: self.topic.to_string(),
                brokers: self.brokers.clone(),
                source: Box::new(error),
            },
            transient,
        )
    }
}

/// Runs `call` with `inner` on the blocking pool, bounded by [`TIMEOUT`]
/// (the call's own librdkafka timeouts) and a margin.
async fn blocking<T: Send + 'static>(
    inner: &Arc<Inner>,
    step: &'static str,
    call: impl FnOnce(&Inner) -> Result<T, KafkaError> + Send + 'static,
) -> Result<T, ControlError> {
    let shared = Arc::clone(inner);
    let task = tokio::task::spawn_blocking(move || call(&shared));
    match tokio::time::timeout(TIMEOUT + MARGIN, task).await {
        Err(_) => Err(ControlError::TimedOut(TIMEOUT)),
        Ok(Err(source)) => Err(ControlError::Unavailable(Box::new(
            ControlTopicError::Interrupted {
                step,
                topic: inner.topic.to_string(),
                source,
            },
        ))),
        Ok(Ok(answer)) => answer.map_err(|error| inner.failed(step, error)),
    }
}

impl ControlChannel for KafkaControlChannel {
    fn log(&self) -> ControlLog {
        self.inner.log
    }

    async fn append(&self, record: Bytes) -> Result<(), ControlError> {
        self.ensure_topic().await?;
        let output = Output::new(Arc::clone(&self.inner.topic), record).with_partition(0);
        let stored = async {
            let receipt = self.inner.publisher.send(output).await?;
            receipt.await
        };
        match tokio::time::timeout(TIMEOUT + MARGIN, stored).await {
            Err(_) => Err(ControlError::TimedOut(TIMEOUT)),
            Ok(Ok(_confirmation)) => Ok(()),
            Ok(Err(source)) => {
                // A producer that gave up for good (`Closed`) fails every
                // append of this channel: a refusal until it is made anew.
                let transient = source.kind() == PublishErrorKind::Unavailable;
                let error = ControlTopicError::Append {
                    topic: self.inner.topic.to_string(),
                    source,
                };
                Err(ControlError::from_backend(error, transient))
            }
        }
    }

    async fn follow(&self) -> Result<ControlFeed, ControlError> {
        self.ensure_topic().await?;
        let inner = &self.inner;
        let consumer: StreamConsumer = inner.reader.create().map_err(|error| {
            let source = Error::from_kafka(error, &inner.brokers, Duration::ZERO);
            let transient = source.is_transient();
            let error = ControlTopicError::Reader {
                topic: inner.topic.to_string(),
                source,
            };
            ControlError::from_backend(error, transient)
        })?;
        let consumer = Arc::new(consumer);
        let reader = Arc::clone(&consumer);
        // librdkafka's assign waits for its own thread's answer.
        blocking(inner, "assign a reader to", move |inner| {
            let mut start = TopicPartitionList::new();
            start.add_partition_offset(&inner.topic, 0, Offset::Beginning)?;
            reader.assign(&start)
        })
        .await?;
        let (sender, receiver) = mpsc::channel(FEED_BUFFER);
        tokio::spawn(read(consumer, Arc::clone(inner), sender));
        let feed = futures_util::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|record| (record, receiver))
        });
        Ok(Box::pin(feed))
    }
}

/// A feed's reader: sends each record's value to `sender` until the feed
/// is dropped, or sends the error that ends it.
async fn read(
    consumer: Arc<StreamConsumer>,
    inner: Arc<Inner>,
    sender: mpsc::Sender<Result<Bytes, ControlError>>,
) {
    let ended = tokio::select! {
        () = sender.closed() => None,
        error = pump(&consumer, &inner, &sender) => Some(error),
    };
    if let Some(error) = ended {
        tracing::debug!(topic = %inner.topic, error = %intake_core::error::ErrorChain::new(&error), "a group control feed ended");
        // The follower may be gone meanwhile: nothing left to tell.
        let _ = sender.send(Err(error)).await;
    }
    // Closing librdkafka's consumer polls until it is closed, and the last
    // channel's clients close with `inner`: not on a runtime thread.
    drop(tokio::task::spawn_blocking(move || drop((consumer, inner))));
}

/// Where a feed's reader is: the offset it waits for, and how many checks
/// in a row found records past it.
struct Progress {
    next: i64,
    behind: u32,
}

/// Reads records into `sender` until a failure, which it returns.
async fn pump(
    consumer: &Arc<StreamConsumer>,
    inner: &Arc<Inner>,
    sender: &mpsc::Sender<Result<Bytes, ControlError>>,
) -> ControlError {
    let mut progress = Progress { next: 0, behind: 0 };
    loop {
        let checked = match tokio::time::timeout(IDLE_CHECK, consumer.recv()).await {
            Ok(Ok(message)) => {
                progress.next = message.offset() + 1;
                progress.behind = 0;
                let record = message
                    .payload()
                    .map(Bytes::copy_from_slice)
                    .unwrap_or_default();
                if sender.send(Ok(record)).await.is_err() {
                    // The feed was dropped: `read` stops on its own.
                    std::future::pending::<()>().await;
                }
                continue;
            }
            // A connection lost (the brokers down, or one closing an idle
            // connection): librdkafka keeps trying, so the feed ends only
            // when the broker does not answer the check.
            Ok(Err(error)) if error.rdkafka_error_code().is_some_and(is_unreachable) => {
                tracing::debug!(topic = %inner.topic, %error, "a group control feed lost its connection; checking the broker");
                check(consumer, inner, &mut progress).await
            }
            Ok(Err(error)) => Err(inner.failed("read", error)),
            Err(_idle) => check(consumer, inner, &mut progress).await,
        };
        if let Err(error) = checked {
            return error;
        }
    }
}

/// Asks for the log's end: fails when the broker does not answer, or when
/// the reader was behind it at [`STALLED_CHECKS`] checks in a row.
async fn check(
    consumer: &Arc<StreamConsumer>,
    inner: &Arc<Inner>,
    progress: &mut Progress,
) -> Result<(), ControlError> {
    let reader = Arc::clone(consumer);
    let (low, high) = blocking(inner, "read the end of", move |inner| {
        reader.fetch_watermarks(&inner.topic, 0, TIMEOUT)
    })
    .await?;
    // Records the retention deleted are skipped by the reader
    // (`auto.offset.reset=earliest`).
    progress.behind = match high > progress.next.max(low) {
        true => progress.behind + 1,
        false => 0,
    };
    if progress.behind >= STALLED_CHECKS {
        return Err(ControlError::Unavailable(Box::new(
            ControlTopicError::Stalled {
                topic: inner.topic.to_string(),
                brokers: inner.brokers.clone(),
                next: progress.next,
                end: high,
            },
        )));
    }
    Ok(())
}

/// The readers' settings: `settings` as an assign-only consumer that joins
/// no group, commits nothing and creates no topic.
fn reader_config(settings: &KafkaSettings) -> ClientConfig {
    let mut config = settings.client_config().clone();
    config
        .set("group.id", READER_GROUP)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", "earliest")
        .set("allow.auto.create.topics", "false");
    config
}

/// `{group}.intake-{log}`, or with the group's name made safe and unique
/// (see [`KafkaControlChannel`]'s naming rule).
fn topic_name(group: &str, log: ControlLog) -> String {
    let suffix = format!(".intake-{}", log.as_str());
    if !group.is_empty() && group.len() <= GROUP_ROOM && group.chars().all(legal) {
        return format!("{group}{suffix}");
    }
    let hash = fnv1a(group.as_bytes());
    let safe: String = group
        .chars()
        .map(|c| if legal(c) { c } else { '-' })
        .take(GROUP_ROOM - 9)
        .collect();
    format!("{safe}-{hash:08x}{suffix}")
}

/// Whether Kafka takes `c` in a topic's name.
fn legal(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// FNV-1a, 32 bits: stable across Rust versions and platforms, unlike
/// std's hasher, so every instance names the topic alike.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_legal_group_names_its_topics_as_it_is() {
        assert_eq!(
            topic_name("billing", ControlLog::Commands),
            "billing.intake-control"
        );
        assert_eq!(
            topic_name("billing_v2.eu-1", ControlLog::Status),
            "billing_v2.eu-1.intake-status"
        );
        let longest = "g".repeat(GROUP_ROOM);
        assert_eq!(
            topic_name(&longest, ControlLog::Commands),
            format!("{longest}.intake-control")
        );
    }

    #[test]
    fn any_other_group_gets_a_safe_and_unique_name() {
        let slash = topic_name("billing/eu", ControlLog::Commands);
        // The example of the struct's docs.
        assert_eq!(slash, "billing-eu-50c23263.intake-control");
        assert_ne!(slash, topic_name("billing:eu", ControlLog::Commands));
        let (long, wide) = ("x".repeat(GROUP_ROOM + 1), "ü".repeat(300));
        for group in ["", "é", "a b", &long, &wide] {
            for log in [ControlLog::Commands, ControlLog::Status] {
                let name = topic_name(group, log);
                let kafka_takes = name.len() <= NAME_LIMIT && name.chars().all(legal);
                assert!(kafka_takes, "{group:?}: {name}");
            }
        }
        let long = "y".repeat(GROUP_ROOM + 1);
        assert_ne!(
            topic_name(&long, ControlLog::Commands),
            topic_name(&format!("{long}z"), ControlLog::Commands)
        );
    }

    #[test]
    fn the_hash_is_fnv1a() {
        assert_eq!(fnv1a(b""), 0x811c_9dc5);
        assert_eq!(fnv1a(b"a"), 0xe40c_292c);
    }
}
