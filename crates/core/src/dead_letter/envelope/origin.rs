//! [`Origin`]: where and by whom a dead-lettered message was consumed.

use std::sync::Arc;

use super::Broker;

/// Where and by whom a dead-lettered message was consumed, beyond its
/// metadata (source, partition, position).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Origin {
    /// The broker it was consumed from.
    pub broker: Broker,
    /// The consumer group that gave up on it, if the backend has groups.
    pub group: Option<Arc<str>>,
    /// The consumer that gave up on it, where the backend names one.
    pub consumer: Option<Arc<str>>,
}

impl Origin {
    /// A message consumed from `broker`, with no group or consumer named.
    pub fn new(broker: Broker) -> Self {
        Self {
            broker,
            group: None,
            consumer: None,
        }
    }

    /// Names the group that gave up on it.
    pub fn with_group(mut self, group: impl Into<Arc<str>>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Names the consumer that gave up on it.
    pub fn with_consumer(mut self, consumer: impl Into<Arc<str>>) -> Self {
        self.consumer = Some(consumer.into());
        self
    }
}
