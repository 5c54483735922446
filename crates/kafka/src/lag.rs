//! [`KafkaLagProbe`]: a consumer group's lag per partition, from its
//! committed offsets and the partitions' high watermarks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use intake_core::PartitionKey;
use intake_core::lag::{DEFAULT_LAG_TIMEOUT, LagError, LagProbe, PartitionLag};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use crate::error::Error;
use crate::settings::KafkaSettings;

/// Reports a consumer group's lag on each partition of its topics, as
/// Kafka's own tools count it: the partition's high watermark (log end)
/// minus the group's committed offset; where the group never committed a
/// partition, the high watermark minus the log start (everything it still
/// holds). Kafka tells no ages here.
///
/// It is a client of its own (librdkafka's consumer with the group's
/// `group.id`, which never subscribes, so it never joins the group or
/// takes a partition), made from the same [`KafkaSettings`] as the source.
/// librdkafka's calls block, so each query runs on Tokio's blocking pool,
/// every call bounded by what is left of [`timeout`](Self::timeout)
/// (5 s by default); the runtime's threads never wait on the broker.
#[derive(Clone)]
pub struct KafkaLagProbe {
    client: Arc<BaseConsumer>,
    brokers: Arc<str>,
    group: Arc<str>,
    topics: Arc<[String]>,
    timeout: Duration,
}

impl std::fmt::Debug for KafkaLagProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaLagProbe")
            .field("brokers", &self.brokers)
            .field("group", &self.group)
            .field("topics", &self.topics)
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
        let mut config = settings.client_config().clone();
        config
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        let client: BaseConsumer = config
            .create()
            .map_err(|error| Error::from_kafka(error, &brokers, Duration::ZERO))?;
        Ok(Self {
            client: Arc::new(client),
            brokers: brokers.into(),
            group: group.into(),
            topics: topics.into_iter().map(Into::into).collect(),
            timeout: DEFAULT_LAG_TIMEOUT,
        })
    }

    /// The longest a query may take, all its calls together.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The blocking query: metadata, committed offsets, then the
    /// watermarks of each partition, each bounded by what is left.
    fn query(&self, started: Instant) -> Result<Vec<PartitionLag>, Error> {
        let left = || {
            self.timeout
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(1))
        };
        let failed = |error: KafkaError| Error::from_kafka(error, &self.brokers, started.elapsed());
        let mut wanted = TopicPartitionList::new();
        for topic in self.topics.iter() {
            let metadata = self
                .client
                .fetch_metadata(Some(topic), left())
                .map_err(failed)?;
            for found in metadata
                .topics()
                .iter()
                .filter(|found| found.name() == topic)
            {
                if let Some(code) = found.error() {
                    return Err(failed(KafkaError::MetadataFetch(code.into())));
                }
                for partition in found.partitions() {
                    wanted.add_partition(topic, partition.id());
                }
            }
        }
        let committed = self
            .client
            .committed_offsets(wanted.clone(), left())
            .map_err(failed)?;
        let mut lags = Vec::with_capacity(wanted.count());
        for element in wanted.elements() {
            let (topic, partition) = (element.topic(), element.partition());
            let (low, high) = self
                .client
                .fetch_watermarks(topic, partition, left())
                .map_err(failed)?;
            let from = match committed
                .find_partition(topic, partition)
                .map(|found| found.offset())
            {
                Some(Offset::Offset(offset)) => offset,
                _ => low,
            };
            let messages = u64::try_from(high.saturating_sub(from)).unwrap_or(0);
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
}
