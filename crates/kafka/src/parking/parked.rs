//! [`ParkedCounter`]: what a group has parked and its movers have not moved
//! back, counted without a [`KafkaParking`](super::KafkaParking) of this
//! process, for a lag probe ([`LagProbe::parked`](intake_core::lag::LagProbe::parked)).

use std::sync::Arc;
use std::time::Duration;

use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;

use super::mover::RetryPattern;
use super::tiers::resolve;
use super::{DEFAULT_RETURN_TEMPLATE, DEFAULT_TOPIC_TEMPLATE, mover_group};
use crate::lag::{group_client, unconsumed};
use crate::settings::KafkaSettings;

/// Counts the records in the retry topics of one topic and group (the
/// default [topic template](super::DEFAULT_TOPIC_TEMPLATE), every tier,
/// whichever process created them) that the group's movers
/// (`{group}.parking`) have not moved back: the same count as
/// [`ParkedBacklog::parked`](super::ParkedBacklog::parked).
pub(crate) struct ParkedCounter {
    /// A client with the movers' group id that never joins the group.
    movers: BaseConsumer,
    patterns: Vec<RetryPattern>,
}

impl ParkedCounter {
    /// A counter of what `group` parked of `topic`, on the brokers of
    /// `settings`. The client connects at the first count.
    pub(crate) fn new(
        settings: &KafkaSettings,
        topic: &str,
        group: &str,
    ) -> Result<Self, KafkaError> {
        let (before, after) = DEFAULT_TOPIC_TEMPLATE
            .split_once("{tier}")
            .unwrap_or((DEFAULT_TOPIC_TEMPLATE, ""));
        let back_to: Arc<str> = resolve(DEFAULT_RETURN_TEMPLATE, topic, group, "").into();
        Ok(Self {
            movers: group_client(settings, &mover_group(group))?,
            patterns: vec![RetryPattern {
                prefix: resolve(before, topic, group, ""),
                suffix: resolve(after, topic, group, ""),
                back_to,
            }],
        })
    }

    /// The count: one listing of the cluster's topics, then the movers'
    /// committed offsets and the watermarks of every retry partition, each
    /// call bounded by what `left` gives. Blocks.
    pub(crate) fn count(&self, left: impl Fn() -> Duration) -> Result<u64, KafkaError> {
        let metadata = self.movers.fetch_metadata(None, left())?;
        let mut retry = TopicPartitionList::new();
        for topic in metadata.topics() {
            let name = topic.name();
            if !self
                .patterns
                .iter()
                .any(|pattern| pattern.tier_of(name).is_some())
            {
                continue;
            }
            if let Some(code) = topic.error() {
                return Err(KafkaError::MetadataFetch(code.into()));
            }
            for partition in topic.partitions() {
                retry.add_partition(name, partition.id());
            }
        }
        Ok(unconsumed(&self.movers, &retry, left)?
            .iter()
            .fold(0u64, |sum, (_, _, messages)| sum.saturating_add(*messages)))
    }
}
