//! What a destination accepts, for an exactly-once pipeline's outputs.
//!
//! A record the broker refuses (larger than the topic's
//! `max.message.bytes`, no key for a compacted topic) fails the whole
//! transaction that carries it, and the transaction also carries every
//! other input's outputs and offsets. By the time a transaction runs, its
//! inputs are complete, and the runtime cannot run one again to fail it to
//! the dead-letter path. So the [layer](super::TransactionalLayer) checks
//! each output against what its destination accepts before it keeps it,
//! and an output refused by that check fails its own input, permanently,
//! while its handler's outcome is still the input's: the same way
//! [`KafkaPublisher`](crate::KafkaPublisher) fails it, and the user's
//! dead-letter layer takes it. The check is the broker's own rule for a
//! record alone in its batch, uncompressed (librdkafka's `message.max.bytes`
//! check is uncompressed too): an output that fits only once compressed is
//! refused.
//!
//! An output that names a partition ([`Output::partition`]) the topic does
//! not have is refused the same way: librdkafka would fail the whole
//! transaction with "unknown partition", every time it is tried again.
//! Kafka only ever adds partitions, so before refusing one past the count
//! read, the count is read again (at most once per input).
//!
//! What each topic accepts is read from the broker (`DescribeConfigs`, and
//! its metadata for the partition count) the first time an output goes
//! there, again every [`REFRESH`], and again soon after a transaction the
//! broker refused for a record's sake. An output to a topic whose
//! configuration cannot be read (it does not exist yet and may be created
//! on first use, or this client may not describe it) is checked against
//! the producer's `message.max.bytes` only.

use std::sync::Arc;
use std::time::Duration;

use intake_core::publish::Output;
use rdkafka::admin::{AdminOptions, ResourceSpecifier};
use tokio::sync::OnceCell;

use crate::settings::KafkaSettings;
use crate::topic_admin::LazyAdmin;

/// How long what a topic accepts is believed before it is read again.
pub(crate) const REFRESH: Duration = Duration::from_secs(300);

/// How long a topic whose configuration could not be read is checked
/// against the producer's limit alone before it is tried again.
pub(crate) const RETRY_UNKNOWN: Duration = Duration::from_secs(10);

/// How long reading what a topic accepts may take.
pub(crate) const DESCRIBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes a record batch (format v2) adds to its records.
pub(crate) const BATCH_OVERHEAD: usize = 61;

/// librdkafka's bound on a record's framing (`RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD`),
/// which its `message.max.bytes` check adds to the key, payload and headers.
const RECORD_MAX_OVERHEAD: usize = 36;

/// librdkafka's default `message.max.bytes` and `batch.size`.
const LIBRDKAFKA_DEFAULT_MAX: usize = 1_000_000;

/// What a topic accepts, from its configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TopicLimits {
    /// `max.message.bytes`: the largest record batch the broker appends.
    pub(crate) max_batch: usize,
    /// `cleanup.policy` includes `compact`: a record without a key is
    /// refused.
    pub(crate) compacted: bool,
    /// How many partitions the topic has, if the broker said: an output
    /// naming one at or past it is refused.
    pub(crate) partitions: Option<u32>,
}

impl TopicLimits {
    /// Whether the topic, as read, lacks the partition `output` names.
    #[inline]
    pub(crate) fn lacks_partition_of(&self, output: &Output) -> bool {
        output
            .partition()
            .zip(self.partitions)
            .is_some_and(|(named, count)| named >= count)
    }
}

/// What the producer itself accepts, from its settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProducerLimits {
    /// `message.max.bytes`: librdkafka refuses a larger record when it is
    /// produced, and builds no larger batch.
    pub(crate) max_record: usize,
    /// The largest batch librdkafka builds: `min(message.max.bytes,
    /// batch.size)`. A topic that accepts batches at least this large
    /// never refuses one for its size.
    pub(crate) max_batch: usize,
}

impl ProducerLimits {
    /// The limits of a producer with `settings`.
    pub(crate) fn of(settings: &KafkaSettings) -> Self {
        let read = |name: &str| {
            settings
                .get(name)
                .and_then(|value| value.trim().parse::<usize>().ok())
                .unwrap_or(LIBRDKAFKA_DEFAULT_MAX)
        };
        let max_record = read("message.max.bytes");
        Self {
            max_record,
            max_batch: max_record.min(read("batch.size")),
        }
    }
}

/// Why the broker would refuse an output, whatever batch it went in.
pub(crate) fn refusal(
    output: &Output,
    producer: ProducerLimits,
    topic: Option<TopicLimits>,
) -> Option<String> {
    if let Some((named, count)) = output
        .partition()
        .zip(topic.and_then(|topic| topic.partitions))
        .filter(|(named, count)| named >= count)
    {
        return Some(format!(
            "the output names partition {named} and the topic has {count} (0 to {})",
            count - 1
        ));
    }
    if topic.is_some_and(|topic| topic.compacted && output.key().is_none()) {
        return Some(
            "the topic is compacted (cleanup.policy=compact) and the output has no key".into(),
        );
    }
    if fits(output, budget(producer, topic)) {
        return None;
    }
    let (data, framed) = sizes(output);
    let wire = RECORD_MAX_OVERHEAD + data;
    if wire > producer.max_record {
        return Some(format!(
            "the output is {wire} bytes as librdkafka counts it, more than the producer's message.max.bytes ({})",
            producer.max_record
        ));
    }
    let topic = topic?;
    let alone = BATCH_OVERHEAD + framed;
    if alone > topic.max_batch {
        return Some(format!(
            "the output takes {alone} bytes in a batch of its own, more than the topic's max.message.bytes ({}); the broker refuses any batch holding it",
            topic.max_batch
        ));
    }
    None
}

/// The bytes of key, payload and header names and values below which an
/// output fits whatever its framing: every limit less a batch header, the
/// longest record framing librdkafka counts, and the longest varints (5
/// bytes a length) of the key, value and header count.
pub(crate) fn budget(producer: ProducerLimits, topic: Option<TopicLimits>) -> usize {
    let limit = topic.map_or(producer.max_record, |topic| {
        topic.max_batch.min(producer.max_record)
    });
    limit.saturating_sub(BATCH_OVERHEAD + RECORD_MAX_OVERHEAD + 15)
}

/// Whether `output` fits a [`budget`]: most outputs are far below every
/// limit, and this is all that is counted of them.
#[inline]
pub(crate) fn fits(output: &Output, budget: usize) -> bool {
    let headers = output.headers();
    let mut raw = output.key().map_or(0, bytes::Bytes::len) + output.payload().len();
    if !headers.is_empty() {
        raw += headers
            .iter()
            .map(|header| 10 + header.name.len() + header.value.len())
            .sum::<usize>();
    }
    raw <= budget
}

/// The bytes an output takes in a batch (format v2, the framing of a
/// batch's first record included), for counting how much a batch holds.
pub(crate) fn batch_bytes(output: &Output) -> usize {
    sizes(output).1
}

/// An output's key, payload and headers as librdkafka counts them (the
/// headers with their length prefixes), and the whole record as the
/// broker stores it first in a batch: length, attributes, timestamp and
/// offset deltas (one byte each), key and value with their lengths, the
/// header count and the headers.
fn sizes(output: &Output) -> (usize, usize) {
    let key = output.key().map_or(0, bytes::Bytes::len);
    let value = output.payload().len();
    let headers: usize = output
        .headers()
        .iter()
        .map(|header| {
            signed_varint(header.name.len())
                + header.name.len()
                + signed_varint(header.value.len())
                + header.value.len()
        })
        .sum();
    let data = key + value + headers;
    let key_length = output.key().map_or(1, |key| signed_varint(key.len()));
    let body = 1
        + 1
        + 1
        + key_length
        + key
        + signed_varint(value)
        + value
        + signed_varint(output.headers().len())
        + headers;
    (data, signed_varint(body) + body)
}

/// Bytes of `n` (at most `i32::MAX`) as a zig-zag varint, as record
/// lengths are written.
fn signed_varint(n: usize) -> usize {
    let mut zigzag = (n as u64) << 1;
    let mut bytes = 1;
    while zigzag >= 0x80 {
        zigzag >>= 7;
        bytes += 1;
    }
    bytes
}

/// Reads what topics accept from the broker, each topic by one reader at a
/// time: inputs that wait for the same topic wait for the same answer.
pub(crate) struct Describer {
    admin: LazyAdmin,
    timeout: Duration,
    /// The read under way or done, per topic (replaced to read again).
    reads: std::sync::Mutex<std::collections::HashMap<Arc<str>, Arc<OnceCell<Described>>>>,
}

/// What a read found: the topic's limits, or why there are none.
#[derive(Clone, Debug)]
pub(crate) enum Described {
    Known(TopicLimits),
    /// Not read (no such topic yet, not allowed, no answer in time).
    Unknown(String),
}

impl std::fmt::Debug for Describer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Describer")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Describer {
    pub(crate) fn new(settings: KafkaSettings, timeout: Duration) -> Self {
        Self {
            admin: LazyAdmin::new(settings),
            timeout,
            reads: std::sync::Mutex::default(),
        }
    }

    /// What `topic` accepts, read now unless a read of it is under way
    /// (then its answer); `fresh` asks for a new read even if one finished.
    pub(crate) async fn describe(&self, topic: &Arc<str>, fresh: bool) -> Described {
        let cell = {
            let mut reads = self
                .reads
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let cell = reads.entry(Arc::clone(topic)).or_default();
            if fresh && cell.initialized() {
                *cell = Arc::default();
            }
            Arc::clone(cell)
        };
        cell.get_or_init(|| self.read(topic)).await.clone()
    }

    async fn read(&self, topic: &str) -> Described {
        let admin = match self.admin.client() {
            Ok(admin) => admin,
            Err(error) => return Described::Unknown(error.to_string()),
        };
        let options = AdminOptions::new().request_timeout(Some(self.timeout));
        let specifier = ResourceSpecifier::Topic(topic);
        let read = admin.describe_configs(std::iter::once(&specifier), &options);
        let results = match tokio::time::timeout(self.timeout, read).await {
            Ok(Ok(results)) => results,
            Ok(Err(error)) => return Described::Unknown(error.to_string()),
            Err(_) => return Described::Unknown(format!("no answer within {:?}", self.timeout)),
        };
        let Some(result) = results.into_iter().next() else {
            return Described::Unknown("the broker answered nothing".into());
        };
        let resource = match result {
            Ok(resource) => resource,
            Err(code) => return Described::Unknown(code.to_string()),
        };
        let max_batch = resource
            .get("max.message.bytes")
            .and_then(|entry| entry.value.as_deref())
            .and_then(|value| value.trim().parse::<usize>().ok());
        let Some(max_batch) = max_batch else {
            return Described::Unknown(
                "the topic's max.message.bytes was not in the answer".into(),
            );
        };
        let compacted = resource
            .get("cleanup.policy")
            .and_then(|entry| entry.value.as_deref())
            .is_some_and(|policy| policy.split(',').any(|part| part.trim() == "compact"));
        Described::Known(TopicLimits {
            max_batch,
            compacted,
            partitions: self.partitions(admin, topic).await,
        })
    }

    /// How many partitions `topic` has, from its metadata, or `None` when
    /// the broker does not say within the timeout (then no output is
    /// refused for the partition it names).
    async fn partitions(
        &self,
        admin: Arc<rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>>,
        topic: &str,
    ) -> Option<u32> {
        let topic = topic.to_owned();
        let timeout = self.timeout;
        // librdkafka's metadata call blocks, bounded by the timeout.
        let counted = tokio::task::spawn_blocking(move || {
            let metadata = admin.inner().fetch_metadata(Some(&topic), timeout).ok()?;
            let found = metadata
                .topics()
                .iter()
                .find(|found| found.name() == topic)?;
            if found.error().is_some() {
                return None;
            }
            u32::try_from(found.partitions().len())
                .ok()
                .filter(|count| *count > 0)
        });
        counted.await.ok().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRODUCER: ProducerLimits = ProducerLimits {
        max_record: 1_000_000,
        max_batch: 1_000_000,
    };

    fn small(max_batch: usize) -> Option<TopicLimits> {
        Some(TopicLimits {
            max_batch,
            compacted: false,
            partitions: None,
        })
    }

    #[test]
    fn a_record_alone_is_counted_as_the_broker_counts_it() {
        // A batch of one record: 61 bytes of batch header, then length (1),
        // attributes (1), timestamp delta (1), offset delta (1), key length
        // -1 (1), value length (1), value (5), header count (1).
        let output = Output::new("t", "hello");
        assert_eq!(BATCH_OVERHEAD + batch_bytes(&output), 61 + 12);
        let keyed = Output::new("t", "hello")
            .with_key("k")
            .with_header("h", "vv");
        // + key (1) and a header: name length, name, value length, value.
        assert_eq!(batch_bytes(&keyed), 12 + 1 + 1 + 1 + 1 + 2);
        // Lengths of 64 and more take two bytes as zig-zag varints: the
        // value's, and the record's (71 bytes after it).
        let long = Output::new("t", vec![0u8; 64]);
        assert_eq!(batch_bytes(&long), 2 + 1 + 1 + 1 + 1 + 2 + 64 + 1);
        // Apache Kafka 4.1 takes 1,930 payload bytes alone in a topic with
        // max.message.bytes 2,000 and refuses 1,931 (refused_outputs.rs).
        let fits = Output::new("t", vec![0u8; 1_930]);
        assert_eq!(BATCH_OVERHEAD + batch_bytes(&fits), 2_000);
    }

    #[test]
    fn an_output_over_the_topics_limit_is_refused_and_one_within_is_not() {
        let output = Output::new("t", vec![b' '; 100]);
        let alone = BATCH_OVERHEAD + batch_bytes(&output);
        assert!(refusal(&output, PRODUCER, small(alone)).is_none());
        let refused = refusal(&output, PRODUCER, small(alone - 1)).expect("refused");
        assert!(refused.contains("max.message.bytes"), "{refused}");
        assert!(refusal(&output, PRODUCER, None).is_none(), "unknown limits");
    }

    #[test]
    fn an_output_over_the_producers_limit_is_refused_whatever_the_topic() {
        let producer = ProducerLimits {
            max_record: 1_000,
            max_batch: 1_000,
        };
        let output = Output::new("t", vec![0u8; 1_000 - RECORD_MAX_OVERHEAD]);
        assert!(refusal(&output, producer, None).is_none());
        let over = Output::new("t", vec![0u8; 1_001 - RECORD_MAX_OVERHEAD]);
        assert!(refusal(&over, producer, None).is_some());
    }

    #[test]
    fn a_compacted_topic_refuses_outputs_without_a_key() {
        let compacted = Some(TopicLimits {
            max_batch: 1_000_000,
            compacted: true,
            partitions: None,
        });
        assert!(refusal(&Output::new("t", "x"), PRODUCER, compacted).is_some());
        assert!(refusal(&Output::new("t", "x").with_key("k"), PRODUCER, compacted).is_none());
    }

    #[test]
    fn an_output_naming_a_partition_the_topic_lacks_is_refused() {
        let four = Some(TopicLimits {
            max_batch: 1_000_000,
            compacted: false,
            partitions: Some(4),
        });
        let placed = |partition| Output::new("t", "x").with_partition(partition);
        assert!(refusal(&placed(3), PRODUCER, four).is_none());
        let refused = refusal(&placed(4), PRODUCER, four).expect("refused");
        assert!(refused.contains("partition 4"), "{refused}");
        assert!(refusal(&placed(u32::MAX), PRODUCER, four).is_some());
        assert!(refusal(&Output::new("t", "x"), PRODUCER, four).is_none());
        assert!(
            refusal(&placed(9), PRODUCER, small(1_000_000)).is_none(),
            "count unknown"
        );
    }

    #[test]
    fn the_producers_limits_come_from_its_settings() {
        let defaults = ProducerLimits::of(&KafkaSettings::new("127.0.0.1:9"));
        assert_eq!(defaults, PRODUCER);
        let set = ProducerLimits::of(
            &KafkaSettings::new("127.0.0.1:9")
                .set("message.max.bytes", "2000000")
                .set("batch.size", "65536"),
        );
        assert_eq!(set.max_record, 2_000_000);
        assert_eq!(set.max_batch, 65_536);
    }
}
