//! [`KafkaLagProbe`]: a consumer group's lag per partition, from its
//! committed offsets and the partitions' high watermarks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use intake_core::PartitionKey;
use intake_core::lag::{DEFAULT_LAG_TIMEOUT, LagError, LagProbe, ParkedTier, PartitionLag};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Offset, TopicPartitionList};

use crate::error::Error;
use crate::parking::ParkedCounter;
use crate::settings::KafkaSettings;

/// Reports a consumer group's lag on each partition of its topics, as
/// Kafka's own tools count it: the partition's high watermark (log end)
/// minus the group's committed offset; where the group never committed a
/// partition (or the retention deleted past its offset), the high
/// watermark minus the log start (everything it still holds). Kafka tells
/// no ages here. The watermarks of all partitions come in one request per
/// leader broker.
///
/// It is a client of its own (librdkafka's consumer with the group's
/// `group.id`, which never subscribes, so it never joins the group or
/// takes a partition), made from the same [`KafkaSettings`] as the source.
/// librdkafka's calls block, so each query runs on Tokio's blocking pool,
/// every call bounded by what is left of [`timeout`](Self::timeout)
/// (5 s by default); the runtime's threads never wait on the broker.
///
/// [`LagProbe::parked`] is `None` (not counted) for a probe made with
/// [`new`](Self::new) or [`KafkaSource::lag_probe`](crate::KafkaSource::lag_probe);
/// a probe of [`KafkaBroker::lag_probe`](crate::KafkaBroker) counts the
/// group's parked backlog in its retry topics (see there).
#[derive(Clone)]
pub struct KafkaLagProbe {
    client: Arc<BaseConsumer>,
    brokers: Arc<str>,
    group: Arc<str>,
    topics: Arc<[String]>,
    /// Topics counted when they exist (a route's return topic, made by its
    /// first parking).
    optional: Arc<[String]>,
    /// Counts the group's parked backlog, when the probe was made to.
    parked: Option<Arc<ParkedCounter>>,
    timeout: Duration,
}

impl std::fmt::Debug for KafkaLagProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaLagProbe")
            .field("brokers", &self.brokers)
            .field("group", &self.group)
            .field("topics", &self.topics)
            .field("optional", &self.optional)
            .field("counts_parked", &self.parked.is_some())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl KafkaLagProbe {
    /// A probe of `group` on `topics`, with `settings` (the source's: the
    /// same brokers, TLS and SASL). The client connects at the first query.
    ///
    /// # Errors
    ///
    /// Settings librdkafka refuses ([`Error::Config`], secrets redacted).
    pub fn new<I, S>(settings: &KafkaSettings, group: &str, topics: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let brokers = settings.endpoint();
        let client = group_client(settings, group)
            .map_err(|error| Error::from_kafka(error, &brokers, Duration::ZERO))?;
        Ok(Self {
            client: Arc::new(client),
            brokers: brokers.into(),
            group: group.into(),
            topics: topics.into_iter().map(Into::into).collect(),
            optional: Arc::new([]),
            parked: None,
            timeout: DEFAULT_LAG_TIMEOUT,
        })
    }

    /// Counts `topics` too where they exist; one that does not is left out
    /// of the answer, not an error.
    pub(crate) fn optional_topics(mut self, topics: impl IntoIterator<Item = String>) -> Self {
        self.optional = topics.into_iter().collect();
        self
    }

    /// Answers [`LagProbe::parked`] with `counter`'s count.
    /// What the group parked, per tier, within the probe's timeout (one
    /// blocking count on the blocking pool); `None` without a counter.
    async fn parked_per_tier(&self) -> Result<Option<Vec<(String, u64)>>, LagError> {
        let Some(counter) = self.parked.clone() else {
            return Ok(None);
        };
        let timeout = self.timeout;
        let brokers = Arc::clone(&self.brokers);
        let started = Instant::now();
        let count = tokio::task::spawn_blocking(move || {
            let left = || {
                timeout
                    .saturating_sub(started.elapsed())
                    .max(Duration::from_millis(1))
            };
            counter
                .count_tiers(left)
                .map_err(|error| Error::from_kafka(error, &brokers, started.elapsed()))
        });
        // As for `lag`: the calls are bounded, and so is the wait for a
        // busy blocking pool.
        match tokio::time::timeout(self.timeout + Duration::from_secs(1), count).await {
            Err(_) => Err(LagError::TimedOut(self.timeout)),
            Ok(Err(join)) => Err(LagError::Unavailable(Box::new(join))),
            Ok(Ok(Ok(tiers))) => Ok(Some(tiers)),
            Ok(Ok(Err(error))) => {
                let transient = error.is_transient();
                Err(LagError::from_backend(error, transient))
            }
        }
    }

    pub(crate) fn counting_parked(mut self, counter: ParkedCounter) -> Self {
        self.parked = Some(Arc::new(counter));
        self
    }

    /// The longest a query may take, all its calls together.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The blocking query: metadata, then [`unconsumed`], each call bounded
    /// by what is left.
    fn query(&self, started: Instant) -> Result<Vec<PartitionLag>, Error> {
        let left = || {
            self.timeout
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(1))
        };
        let failed = |error: KafkaError| Error::from_kafka(error, &self.brokers, started.elapsed());
        let mut wanted = TopicPartitionList::new();
        let required = self.topics.iter().map(|topic| (topic, true));
        let optional = self.optional.iter().map(|topic| (topic, false));
        for (topic, required) in required.chain(optional) {
            let metadata = match self.client.fetch_metadata(Some(topic), left()) {
                Err(error) if !required && is_unknown_topic(&error) => continue,
                fetched => fetched.map_err(failed)?,
            };
            for found in metadata
                .topics()
                .iter()
                .filter(|found| found.name() == topic)
            {
                if let Some(code) = found.error() {
                    let error = KafkaError::MetadataFetch(code.into());
                    if !required && is_unknown_topic(&error) {
                        continue;
                    }
                    return Err(failed(error));
                }
                for partition in found.partitions() {
                    wanted.add_partition(topic, partition.id());
                }
            }
        }
        let mut lags = Vec::with_capacity(wanted.count());
        for (topic, partition, messages) in
            unconsumed(&self.client, &wanted, left).map_err(failed)?
        {
            let key = PartitionKey::new(topic, u32::try_from(partition).unwrap_or(u32::MAX));
            lags.push(PartitionLag::new(key, Some(messages)));
        }
        Ok(lags)
    }
}

impl LagProbe for KafkaLagProbe {
    fn group(&self) -> &str {
        &self.group
    }

    async fn lag(&self) -> Result<Vec<PartitionLag>, LagError> {
        let probe = self.clone();
        let started = Instant::now();
        let query = tokio::task::spawn_blocking(move || probe.query(started));
        // Every librdkafka call is bounded by what is left of the timeout;
        // this bounds the wait for a blocking pool that is busy, too.
        match tokio::time::timeout(self.timeout + Duration::from_secs(1), query).await {
            Err(_) => Err(LagError::TimedOut(self.timeout)),
            Ok(Err(join)) => Err(LagError::Unavailable(Box::new(join))),
            Ok(Ok(Ok(lags))) => Ok(lags),
            Ok(Ok(Err(error))) => {
                let transient = error.is_transient();
                Err(LagError::from_backend(error, transient))
            }
        }
    }

    /// The group's parked backlog in its retry topics, for a probe of
    /// [`KafkaBroker::lag_probe`](crate::KafkaBroker): records parked and
    /// not yet moved back by the group's movers (`{group}.parking`), due or
    /// not; `Some(0)` when the group has no retry topic. `None` for a
    /// probe that was not made to count it.
    async fn parked(&self) -> Result<Option<u64>, LagError> {
        Ok(self.parked_tiers().await?.as_deref().map(ParkedTier::total))
    }

    /// The same per retry topic's tier (`1s`, `5m`), shortest first; when
    /// each is due is not known without reading the records.
    async fn parked_tiers(&self) -> Result<Option<Vec<ParkedTier>>, LagError> {
        Ok(self.parked_per_tier().await?.map(|tiers| {
            tiers
                .into_iter()
                .map(|(tier, messages)| ParkedTier::new(tier, messages))
                .collect()
        }))
    }
}

/// Whether `error` says a topic does not exist.
fn is_unknown_topic(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic)
    )
}

/// A client with the group id `group` that never subscribes: it reads the
/// group's committed offsets without joining the group or taking a
/// partition, and asks for watermarks and metadata. It creates no topic it
/// looks up.
pub(crate) fn group_client(
    settings: &KafkaSettings,
    group: &str,
) -> Result<BaseConsumer, KafkaError> {
    let mut config = settings.client_config().clone();
    config
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("allow.auto.create.topics", "false");
    config.create()
}

/// The messages past the committed offsets of `client`'s group
/// (`group.id`) on each of `partitions`, in their order: the high
/// watermark minus the committed offset, or minus the log start where the
/// group never committed (or committed below what the retention left).
/// Blocks for three queries, each bounded by what `left` gives: the
/// committed offsets, then the high and the low watermarks of every
/// partition in one request per leader broker (librdkafka's
/// `offsets_for_times` with the logical offsets `END` and `BEGINNING`), not
/// one round trip per partition.
pub(crate) fn unconsumed<C: ConsumerContext>(
    client: &BaseConsumer<C>,
    partitions: &TopicPartitionList,
    left: impl Fn() -> Duration,
) -> Result<Vec<(String, i32, u64)>, KafkaError> {
    if partitions.count() == 0 {
        return Ok(Vec::new());
    }
    let committed = client.committed_offsets(partitions.clone(), left())?;
    let logical = |which: Offset| -> Result<TopicPartitionList, KafkaError> {
        let mut list = TopicPartitionList::with_capacity(partitions.count());
        for element in partitions.elements() {
            list.add_partition_offset(element.topic(), element.partition(), which)?;
        }
        client.offsets_for_times(list, left())
    };
    let highs = logical(Offset::End)?;
    let lows = logical(Offset::Beginning)?;
    let offset_in = |list: &TopicPartitionList,
                     topic: &str,
                     partition: i32|
     -> Result<Option<i64>, KafkaError> {
        let Some(element) = list.find_partition(topic, partition) else {
            return Ok(None);
        };
        element.error()?;
        Ok(match element.offset() {
            Offset::Offset(offset) => Some(offset),
            _ => None,
        })
    };
    let mut counts = Vec::with_capacity(partitions.count());
    for element in partitions.elements() {
        let (topic, partition) = (element.topic(), element.partition());
        let high = offset_in(&highs, topic, partition)?
            .ok_or(KafkaError::OffsetFetch(RDKafkaErrorCode::UnknownPartition))?;
        let low = offset_in(&lows, topic, partition)?.unwrap_or(0);
        let from =
            offset_in(&committed, topic, partition)?.map_or(low, |committed| committed.max(low));
        let messages = u64::try_from(high.saturating_sub(from)).unwrap_or(0);
        counts.push((topic.to_owned(), partition, messages));
    }
    Ok(counts)
}
