//! What the memory broker tests share: a broker with a topic, events
//! awaited within a guard time, commit batches.

use crate::acker::{AckBatch, PartitionAck};
use crate::memory::*;
use crate::message::{Message, PartitionKey, Position};
use crate::source::Source;
use crate::source::SourceEvent;
use futures_util::FutureExt;
use std::time::Duration;

pub(super) const TOPIC: &str = "orders";
pub(super) const GROUP: &str = "billing";

pub(super) fn broker_with_topic(partitions: u32) -> MemoryBroker {
    let broker = MemoryBroker::new();
    broker
        .create_topic(TOPIC, partitions)
        .expect("create topic");
    broker
}

pub(super) fn produce_to(broker: &MemoryBroker, partition: u32, count: usize) {
    for n in 0..count {
        broker
            .send(
                TOPIC,
                Record::new(format!("p{partition}-{n}")).to_partition(partition),
            )
            .expect("send");
    }
}

/// The next event, failing the test instead of hanging if none comes.
pub(super) async fn next_event(
    source: &mut MemorySource,
    buf: &mut Vec<Message>,
    max: usize,
) -> SourceEvent {
    tokio::time::timeout(Duration::from_secs(30), source.next(buf, max))
        .await
        .expect("an event within the guard time")
        .expect("no source error")
}

/// Waits for the next event, which must be a batch of deliveries.
pub(super) async fn delivered(source: &mut MemorySource, buf: &mut Vec<Message>, max: usize) {
    let event = next_event(source, buf, max).await;
    assert!(
        matches!(event, SourceEvent::Delivered),
        "expected deliveries, got {event:?}"
    );
}

/// The next event if one is ready without waiting.
pub(super) fn ready_event(
    source: &mut MemorySource,
    buf: &mut Vec<Message>,
    max: usize,
) -> Option<SourceEvent> {
    source
        .next(buf, max)
        .now_or_never()
        .map(|result| result.expect("no source error"))
}

pub(super) fn partitions_of(event: &SourceEvent) -> Vec<u32> {
    let keys = match event {
        SourceEvent::Assigned(keys) => keys.as_slice(),
        SourceEvent::Revoked(revocation) => revocation.partitions(),
        other => panic!("expected an assignment change, got {other:?}"),
    };
    let mut partitions: Vec<u32> = keys.iter().map(|key| key.partition).collect();
    partitions.sort_unstable();
    partitions
}

pub(super) async fn assigned(source: &mut MemorySource) -> Vec<u32> {
    let event = next_event(source, &mut Vec::new(), 1).await;
    assert!(
        matches!(event, SourceEvent::Assigned(_)),
        "expected Assigned, got {event:?}"
    );
    partitions_of(&event)
}

/// A new member of `GROUP` that has received its assignment.
pub(super) async fn joined(broker: &MemoryBroker) -> (MemorySource, MemoryAcker) {
    let (mut source, acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    assigned(&mut source).await;
    (source, acker)
}

pub(super) fn commit_batch(partition: u32, last_done: i64) -> AckBatch {
    let mut ack = PartitionAck::new(PartitionKey::new(TOPIC, partition));
    ack.watermark = Some(Position::Offset(last_done));
    AckBatch {
        partitions: vec![ack],
        sync: true,
    }
}

pub(super) fn offsets(buf: &[Message]) -> Vec<(u32, i64)> {
    buf.iter()
        .map(|message| {
            let Position::Offset(offset) = message.metadata().position() else {
                panic!("memory positions are offsets");
            };
            (message.metadata().partition(), offset)
        })
        .collect()
}
