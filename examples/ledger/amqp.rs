//! RabbitMQ: a durable quorum queue, the confirmed publisher and the source.
//!
//! PARTITION is intake's channel epoch (1 for the first channel, higher
//! after a reconnect), POSITION the delivery tag on that channel. Tags are
//! per channel and change on redelivery, so the exactly-once markers use
//! the `message-id` property instead, which `produce` sets to the id.

use std::collections::VecDeque;

use intake::amqp::lapin::PublisherConfirm;
use intake::amqp::lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use intake::amqp::lapin::types::{AMQPValue, FieldTable, ShortString};
use intake::amqp::lapin::{BasicProperties, Connection, ConnectionProperties};
use intake::amqp::{AmqpParking, AmqpPublisher, AmqpSettings, AmqpSource, Queue, Topology};

use intake::Message;

use crate::BoxError;

/// The queue as both commands declare it: quorum queues count
/// redeliveries in `x-delivery-count`, and without `x-delivery-limit` none
/// is ever dropped, however often a consumer dies holding it.
fn topology(queue: &str) -> Topology {
    Topology::new().queue(Queue::quorum(queue))
}

/// Declares the queue, as every command does before it uses it.
pub async fn declare(url: &str, queue: &str) -> Result<(), BoxError> {
    topology(queue).declare(url).await?;
    Ok(())
}

/// The relay's publisher: one channel in confirm mode, outputs to the
/// default exchange with the queue's name as the routing key.
pub async fn publisher(url: &str) -> Result<AmqpPublisher, BoxError> {
    Ok(AmqpPublisher::builder(url).build().await?)
}

/// Publishes awaited at once; the rest wait for confirms to free room.
const MAX_UNCONFIRMED: usize = 5_000;

/// Publishes ids `0..count` (`message-id` = the id, header `key` = `id %
/// 64`), persistent, and returns once the broker confirmed every one.
/// The ledger's key of `message`: its `key` header (`id % 64`), where the
/// broker's key (the routing key) is the queue's name for every message.
pub fn key_of(message: &Message) -> Option<&[u8]> {
    message.headers().get("key").map(|key| &key[..])
}

pub async fn produce(url: &str, queue: &str, count: u64) -> Result<(), BoxError> {
    declare(url, queue).await?;
    let connection = Connection::connect(url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let mut unconfirmed: VecDeque<(u64, PublisherConfirm)> = VecDeque::new();
    for id in 0..count {
        if unconfirmed.len() >= MAX_UNCONFIRMED {
            confirm(unconfirmed.pop_front()).await?;
        }
        let mut headers = FieldTable::default();
        headers.insert("key".into(), AMQPValue::LongLongInt((id % 64) as i64));
        let properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(ShortString::from(id.to_string()))
            .with_headers(headers);
        let payload = id.to_string();
        let pending = channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                payload.as_bytes(),
                properties,
            )
            .await?;
        unconfirmed.push_back((id, pending));
    }
    while let Some(pending) = unconfirmed.pop_front() {
        confirm(Some(pending)).await?;
    }
    connection.close(200, "published".into()).await?;
    Ok(())
}

async fn confirm(pending: Option<(u64, PublisherConfirm)>) -> Result<(), BoxError> {
    let Some((id, pending)) = pending else {
        return Ok(());
    };
    let confirmation = pending.await?;
    if !confirmation.is_ack() {
        return Err(format!("the broker refused id {id} (nack)").into());
    }
    if confirmation.take_message().is_some() {
        return Err(format!("id {id} was returned: the queue is missing").into());
    }
    Ok(())
}

/// A consumer of `queue` (declared if missing); `group` only names the
/// connection, since every consumer of a queue shares its messages. The
/// consumer's `max_in_flight` becomes the prefetch.
pub async fn source(url: &str, queue: &str, group: &str) -> Result<AmqpSource, BoxError> {
    let settings = AmqpSettings::new(url)
        .connection_name(format!("ledger {group} pid {}", std::process::id()));
    let source = AmqpSource::builder(settings)
        .queue(queue)
        .declare(topology(queue))
        .build()
        .await?;
    Ok(source)
}

/// Where `--later-every` parks: quorum wait queues of `queue`, which
/// RabbitMQ dead-letters back into it once due.
pub async fn parking(url: &str, queue: &str) -> Result<AmqpParking, BoxError> {
    Ok(AmqpParking::builder(url).queue(queue).build().await?)
}
