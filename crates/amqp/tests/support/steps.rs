//! Steps the AMQP tests take by hand: reading a source, acknowledging and
//! requeueing through an acker, publishing straight to a queue, and waiting
//! for the broker to settle.

use std::time::Duration;

use intake_amqp::AmqpSource;
use intake_core::{
    Message, PartitionKey, Position,
    backend::{AckBatch, AckError, Acker, Limits, PartitionAck, Source, SourceEvent},
};

use super::AmqpBackend;

/// How long a step waits for the broker before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// What a source reported while a test read from it.
#[derive(Default)]
pub struct Received {
    pub messages: Vec<Message>,
    pub assigned: Vec<PartitionKey>,
    pub revoked: Vec<PartitionKey>,
}

impl Received {
    pub fn payloads(&self) -> Vec<String> {
        self.messages
            .iter()
            .map(|message| String::from_utf8_lossy(message.payload()).into_owned())
            .collect()
    }
}

/// Reads events until `count` messages arrived (asking for at most `max`
/// per call). Fails the test if they do not come.
pub async fn receive(source: &mut AmqpSource, count: usize, max: usize) -> Received {
    let mut received = Received::default();
    let mut buffer = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while received.messages.len() < count {
            let room = max.min(count - received.messages.len());
            match source.next(&mut buffer, room).await {
                Ok(SourceEvent::Delivered) => received.messages.append(&mut buffer),
                Ok(SourceEvent::Assigned(partitions)) => received.assigned.extend(partitions),
                Ok(SourceEvent::Revoked(revocation)) => {
                    received.revoked.extend_from_slice(revocation.partitions());
                }
                Ok(SourceEvent::Exhausted) => panic!("the source ended"),
                Ok(other) => panic!("unexpected source event: {other:?}"),
                Err(error) => panic!("source error: {error}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "only {} of {count} messages arrived",
            received.messages.len()
        )
    });
    received
}

/// Acknowledges everything up to and including `message` on its channel.
pub async fn ack_through(acker: &mut impl Acker, message: &Message) -> Result<(), AckError> {
    let mut ack = PartitionAck::new(message.metadata().partition_key());
    ack.watermark = Some(message.metadata().position());
    acker
        .ack(&AckBatch {
            partitions: vec![ack],
            sync: true,
        })
        .await
}

/// Hands `message` back for redelivery, and acknowledges up to `watermark`.
pub async fn requeue(
    acker: &mut impl Acker,
    message: &Message,
    watermark: Option<Position>,
) -> Result<(), AckError> {
    let mut ack = PartitionAck::new(message.metadata().partition_key());
    ack.requeue.push(message.metadata().position());
    ack.watermark = watermark;
    acker
        .ack(&AckBatch {
            partitions: vec![ack],
            sync: true,
        })
        .await
}

/// Waits until `queue` holds `expected` messages (acks are asynchronous).
pub async fn settle_at(backend: &AmqpBackend, queue: &str, expected: u64) {
    let mut last = None;
    let reached = tokio::time::timeout(PATIENCE, async {
        loop {
            let count = backend.messages_in(queue).await.ok();
            if count == Some(expected) {
                return;
            }
            last = count;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        reached.is_ok(),
        "{queue} holds {last:?} messages, expected {expected}"
    );
}

pub fn tags(received: &Received) -> Vec<u64> {
    received
        .messages
        .iter()
        .map(|message| match message.metadata().position() {
            Position::Tag(tag) => tag,
            other => panic!("not a tag: {other}"),
        })
        .collect()
}

/// Publishes straight to `queue` through the default exchange.
pub async fn publish_direct(backend: &AmqpBackend, queue: &str, payload: &[u8]) {
    let confirm = backend
        .channel()
        .basic_publish(
            "".into(),
            queue.into(),
            Default::default(),
            payload,
            Default::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(confirm.is_ack());
}

/// Limits of `max_in_flight` deliveries and `max_in_flight_bytes` bytes, as
/// a consumer tells its source.
pub fn limits(max_in_flight: usize, max_in_flight_bytes: usize) -> Limits {
    Limits::new(max_in_flight, max_in_flight_bytes, Duration::from_secs(10))
}

/// The deliveries that arrive within `wait` (asking for up to 1000 per
/// call), other events left aside: what the broker pushes without being
/// acknowledged.
pub async fn arriving_within(source: &mut AmqpSource, wait: Duration) -> Vec<Message> {
    let mut arrived = Vec::new();
    let mut buffer = Vec::new();
    let _ = tokio::time::timeout(wait, async {
        loop {
            if let Ok(SourceEvent::Delivered) = source.next(&mut buffer, 1000).await {
                arrived.append(&mut buffer);
            }
        }
    })
    .await;
    arrived
}
