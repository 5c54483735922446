//! [`BrokerDeadLetterSink`]: dead-letter by `basic.reject(requeue=false)`,
//! letting the broker route the message to the queue's own dead-letter
//! exchange.

use intake_core::{
    DeadLetter, Position, SourceName,
    backend::{DeadLetterError, DeadLetterSink},
};
use lapin::options::BasicRejectOptions;

use crate::live_channel::ChannelSlot;

/// Dead-letters a message by rejecting it without requeue, so that RabbitMQ
/// moves it to the queue's dead-letter exchange (`x-dead-letter-exchange`,
/// see [`Queue::dead_letter_exchange`](crate::Queue::dead_letter_exchange)).
/// Get it from [`AmqpSource::broker_dead_letter_sink`](crate::AmqpSource::broker_dead_letter_sink).
///
/// Compared with [`AmqpDeadLetterSink`](crate::AmqpDeadLetterSink), which
/// publishes a copy with publisher confirms:
///
/// - **No extra round trip or connection**, and the message leaves the queue
///   in the same step that dead-letters it.
/// - **Less context.** The broker adds an `x-death` header (queue, reason
///   `rejected`, count, time, exchange, routing keys) but not the handler's
///   error text or intake's attempt count.
/// - **The queue must have a dead-letter exchange.** Without one, RabbitMQ
///   drops the rejected message and this sink cannot tell.
/// - **Delivery guarantee is the broker's.** Classic queues and quorum
///   queues by default dead-letter at most once; declare the quorum queue
///   with [`Queue::at_least_once_dead_lettering`](crate::Queue::at_least_once_dead_lettering)
///   for at least once.
///
/// A message whose channel was lost cannot be rejected any more: the write
/// fails, and the broker redelivers the message.
#[derive(Debug)]
pub struct BrokerDeadLetterSink {
    slot: std::sync::Arc<ChannelSlot>,
    source: SourceName,
}

impl BrokerDeadLetterSink {
    pub(crate) fn new(slot: std::sync::Arc<ChannelSlot>, source: SourceName) -> Self {
        Self { slot, source }
    }
}

#[async_trait::async_trait]
impl DeadLetterSink for BrokerDeadLetterSink {
    async fn write(&self, letter: &DeadLetter) -> Result<(), DeadLetterError> {
        let metadata = letter.message.metadata();
        if metadata.source() != &self.source {
            return Err(DeadLetterError(
                format!(
                    "message from `{}` given to the broker dead-letter sink of `{}`",
                    metadata.source(),
                    self.source
                )
                .into(),
            ));
        }
        let Position::Tag(tag) = metadata.position() else {
            return Err(DeadLetterError(
                format!(
                    "position {} is not an AMQP delivery tag",
                    metadata.position()
                )
                .into(),
            ));
        };
        let channel = self.slot.settle_one(metadata.partition(), tag).map_err(|_| {
            DeadLetterError(
                format!(
                    "the channel that delivered tag {tag} (epoch {}) is gone; the broker redelivers the message",
                    metadata.partition()
                )
                .into(),
            )
        })?;
        channel
            .basic_reject(tag, BasicRejectOptions { requeue: false })
            .await
            .map_err(|error| DeadLetterError(Box::new(error)))
    }
}
