//! [`ParkedCounter`]: what a group has parked and its movers have not moved
//! back, counted without a [`KafkaParking`](super::KafkaParking) of this
//! process, for a lag probe ([`LagProbe::parked`](intake_core::lag::LagProbe::parked)).

use std::collections::{BTreeMap, HashMap};
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

    /// Per tier: one listing of the cluster's topics, then the movers'
    /// committed offsets and the watermarks of every retry partition, each
    /// call bounded by what `left` gives; each retry topic's label (`1s`,
    /// `5m`) with its records not moved back, shortest delay first. Blocks.
    pub(crate) fn count_tiers(
        &self,
        left: impl Fn() -> Duration,
    ) -> Result<Vec<(String, u64)>, KafkaError> {
        let metadata = self.movers.fetch_metadata(None, left())?;
        let mut retry = TopicPartitionList::new();
        let mut tiers: HashMap<String, (Duration, String)> = HashMap::new();
        for topic in metadata.topics() {
            let name = topic.name();
            let Some((delay, label)) = self.patterns.iter().find_map(|pattern| {
                let delay = pattern.tier_of(name)?;
                let label = name
                    .strip_prefix(pattern.prefix.as_str())?
                    .strip_suffix(pattern.suffix.as_str())?;
                Some((delay, label.to_owned()))
            }) else {
                continue;
            };
            if let Some(code) = topic.error() {
                return Err(KafkaError::MetadataFetch(code.into()));
            }
            tiers.insert(name.to_owned(), (delay, label));
            for partition in topic.partitions() {
                retry.add_partition(name, partition.id());
            }
        }
        let mut counts: BTreeMap<(Duration, String), u64> = BTreeMap::new();
        for (topic, _, messages) in unconsumed(&self.movers, &retry, left)? {
            if let Some(tier) = tiers.get(&topic) {
                let count = counts.entry(tier.clone()).or_default();
                *count = count.saturating_add(messages);
            }
        }
        Ok(counts
            .into_iter()
            .map(|((_, label), messages)| (label, messages))
            .collect())
    }
}
