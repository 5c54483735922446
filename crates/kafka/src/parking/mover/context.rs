//! The mover consumer's context: the rebalances of the mover group, kept
//! for the poll loop to apply.

use std::sync::Mutex;

use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance};
use rdkafka::{ClientContext, TopicPartitionList};

use super::PartitionOf;

/// A rebalance of the mover's group, as the poll loop applies it.
pub(super) enum Rebalanced {
    Assigned(Vec<PartitionOf>),
    Revoked(Vec<PartitionOf>),
}

/// Records the mover group's rebalances for the poll loop.
#[derive(Default)]
pub(super) struct MoverContext {
    events: Mutex<Vec<Rebalanced>>,
}

impl MoverContext {
    pub(super) fn take(&self) -> Vec<Rebalanced> {
        std::mem::take(
            &mut *self
                .events
                .lock()
                .unwrap_or_else(|poison| poison.into_inner()),
        )
    }
}

impl ClientContext for MoverContext {}

impl ConsumerContext for MoverContext {
    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let partitions = |list: &TopicPartitionList| {
            list.elements()
                .iter()
                .map(|element| (element.topic().to_owned(), element.partition()))
                .collect()
        };
        let event = match rebalance {
            Rebalance::Assign(list) => Rebalanced::Assigned(partitions(list)),
            Rebalance::Revoke(list) => Rebalanced::Revoked(partitions(list)),
            Rebalance::Error(error) => {
                tracing::warn!(%error, "the parking mover's group failed to rebalance");
                return;
            }
        };
        self.events
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .push(event);
    }
}
