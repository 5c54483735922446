//! Joining a consumer group: [`MemoryConsumerBuilder`] makes a source and its
//! acker.

use super::acker::MemoryAcker;
use super::broker::MemoryBroker;
use super::error::MemoryError;
use super::source::MemorySource;

/// Where a member starts on a partition its group never committed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OffsetReset {
    /// From the first message (Kafka's `auto.offset.reset=earliest`).
    #[default]
    Earliest,
    /// From the next message produced after the partition was assigned
    /// (`latest`): what is already there is skipped.
    Latest,
}

/// Builds a consumer of one topic in one group. Get one from
/// [`MemoryBroker::consumer_builder`].
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct MemoryConsumerBuilder {
    broker: MemoryBroker,
    topic: String,
    group: String,
    offset_reset: OffsetReset,
}

impl MemoryConsumerBuilder {
    pub(crate) fn new(broker: MemoryBroker, topic: &str, group: &str) -> Self {
        Self {
            broker,
            topic: topic.to_owned(),
            group: group.to_owned(),
            offset_reset: OffsetReset::default(),
        }
    }

    /// Where to start on partitions the group never committed
    /// (default: [`OffsetReset::Earliest`]).
    pub fn offset_reset(mut self, offset_reset: OffsetReset) -> Self {
        self.offset_reset = offset_reset;
        self
    }

    /// Joins the group. The group rebalances at once: the new source's first
    /// event is the `Assigned` of its share, and partitions that move away
    /// from other members reach it once those members released them.
    pub fn build(self) -> Result<(MemorySource, MemoryAcker), MemoryError> {
        let topic = self.broker.topic(&self.topic)?;
        let (group, member, notify, faults) = {
            let mut state = topic.lock();
            let group = state.group_or_create(&topic, &self.group)?;
            let state = &mut *state;
            let (member, notify) = state.groups[group].join(self.offset_reset, &state.logs);
            (group, member, notify, state.groups[group].faults.clone())
        };
        let acker = MemoryAcker::new(topic.clone(), group, member, faults.clone());
        let source = MemorySource::new(topic, group, member, notify, faults);
        Ok((source, acker))
    }
}
