//! The retry topics known to exist, shared by the parking side (which
//! creates them on demand) and the mover (which subscribes to them).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rdkafka::client::Client;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// Retry topics that exist, with their partition counts.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    known: Mutex<BTreeMap<String, i32>>,
    /// Counts additions, so the mover subscribes again only when the set grew.
    generation: AtomicU64,
}

impl Registry {
    /// The partition count of `topic`, if it is known to exist.
    pub(crate) fn partitions(&self, topic: &str) -> Option<i32> {
        self.lock().get(topic).copied()
    }

    /// Records that `topic` exists with `partitions` partitions.
    pub(crate) fn insert(&self, topic: &str, partitions: i32) {
        if self.lock().insert(topic.to_owned(), partitions).is_none() {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Every retry topic known to exist.
    pub(crate) fn topics(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, i32>> {
        self.known
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

/// How many partitions `topic` has, `None` when it does not exist. Blocks
/// for a metadata round trip of at most `timeout`. The client must not ask
/// the broker to create topics (`allow.auto.create.topics=false`), or the
/// lookup itself would create one with the broker's default layout.
pub(crate) fn partition_count<C: rdkafka::ClientContext>(
    client: &Client<C>,
    topic: &str,
    timeout: Duration,
) -> Result<Option<i32>, KafkaError> {
    let metadata = client.fetch_metadata(Some(topic), timeout)?;
    let Some(found) = metadata.topics().iter().find(|found| found.name() == topic) else {
        return Ok(None);
    };
    let count = i32::try_from(found.partitions().len())
        .ok()
        .filter(|count| *count > 0);
    match found.error().map(RDKafkaErrorCode::from) {
        None => Ok(count),
        Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic) => {
            Ok(None)
        }
        // A topic created a moment ago may have no leader yet: it exists.
        Some(_) if count.is_some() => Ok(count),
        Some(code) => Err(KafkaError::MetadataFetch(code)),
    }
}
