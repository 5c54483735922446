//! [`Carrier`]: what a sink adds to the letters it writes.

use std::sync::Arc;

use super::Broker;

/// What a sink adds to the letters it writes: the broker its letters come
/// from, whether its records have a key slot, and the group (and consumer)
/// it writes for. Built once per sink.
#[derive(Clone, Debug)]
pub struct Carrier {
    broker: Broker,
    key_slot: bool,
    group: Option<Arc<str>>,
    consumer: Option<Arc<str>>,
}

impl Carrier {
    /// A carrier whose records have a key slot (a Kafka topic, a
    /// memory-broker topic): the letter's record key is the original key,
    /// not repeated in a field.
    pub fn keyed(broker: Broker) -> Self {
        Self {
            broker,
            key_slot: true,
            group: None,
            consumer: None,
        }
    }

    /// A carrier without a key slot (a Redis stream, an AMQP exchange,
    /// whose routing key routes the letter): the original key is carried
    /// in [`ORIGIN_KEY`](super::ORIGIN_KEY).
    pub fn keyless(broker: Broker) -> Self {
        Self {
            key_slot: false,
            ..Self::keyed(broker)
        }
    }

    /// Names the consumer group whose letters the sink writes.
    pub fn with_group(mut self, group: impl Into<Arc<str>>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Names the consumer whose letters the sink writes.
    pub fn with_consumer(mut self, consumer: impl Into<Arc<str>>) -> Self {
        self.consumer = Some(consumer.into());
        self
    }

    /// The broker the sink's letters come from.
    pub fn broker(&self) -> Broker {
        self.broker
    }

    /// Whether the carrier's records have a key slot.
    pub fn has_key_slot(&self) -> bool {
        self.key_slot
    }

    /// The group the sink writes for.
    pub fn group(&self) -> Option<&Arc<str>> {
        self.group.as_ref()
    }

    /// The consumer the sink writes for.
    pub fn consumer(&self) -> Option<&Arc<str>> {
        self.consumer.as_ref()
    }
}
