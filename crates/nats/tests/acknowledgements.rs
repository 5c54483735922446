//! One confirmation per ack batch: the acker sends a batch's acks as plain
//! publishes and only the last with a reply subject, and takes that one
//! reply as the confirmation of all of them (`src/confirm.rs` says why the
//! server makes that sound). These tests hold it to that on the real
//! nats-server: once the acker returns, the server has applied every ack
//! of the batch, not only the last.

mod support;

use std::time::Duration;

use intake_core::Message;
use intake_core::backend::{AckBatch, Acker, PartitionAck, Source};
use intake_nats::async_nats::jetstream;
use support::NatsBackend;

/// Enough acks that the server's ack queue is still busy with the early
/// ones when the last arrives, were they not applied in order.
const MESSAGES: usize = 5_000;

/// Pulls until `count` deliveries arrived.
async fn pull(source: &mut intake_nats::NatsSource, count: usize) -> Vec<Message> {
    let mut delivered = Vec::with_capacity(count);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while delivered.len() < count {
        let wanted = count - delivered.len();
        let pulled = tokio::time::timeout_at(deadline, source.next(&mut delivered, wanted))
            .await
            .expect("the deliveries within a minute");
        pulled.expect("pull");
    }
    delivered
}

/// The batch the commit engine would send for `messages`, all completed,
/// in delivery order.
fn completed(messages: &[Message]) -> AckBatch {
    let mut partitions: Vec<PartitionAck> = Vec::new();
    for message in messages {
        let key = message.metadata().partition_key();
        let index = match partitions.iter().position(|ack| ack.partition == key) {
            Some(index) => index,
            None => {
                partitions.push(PartitionAck::new(key));
                partitions.len() - 1
            }
        };
        partitions[index]
            .completed
            .push(message.metadata().position());
    }
    AckBatch {
        partitions,
        sync: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_applied_in_full_when_its_one_confirmation_arrives() {
    let Some(backend) = NatsBackend::new("one confirmation per batch").await else {
        return;
    };
    let stream = support::unique("batchconfirm");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    support::produce(backend.client(), &stream, support::numbered("m", MESSAGES))
        .await
        .expect("produce");
    let mut source = backend
        .source(&stream, "confirm")
        // No redelivery while the test pulls.
        .ack_wait(Duration::from_secs(120))
        .max_ack_pending(2 * MESSAGES as i64)
        .build()
        .await
        .expect("source");
    let mut acker = source.acker();
    let delivered = pull(&mut source, MESSAGES).await;
    let handle = jetstream::new(backend.client().clone())
        .get_stream(&stream)
        .await
        .expect("stream handle");
    let before = handle.consumer_info("confirm").await.expect("info");
    assert_eq!(
        before.num_ack_pending, MESSAGES,
        "all delivered, none acked"
    );

    acker
        .ack(&completed(&delivered))
        .await
        .expect("the batch confirmed");

    // Immediately: no wait, no retry. The server answered the last ack
    // only after applying every ack before it.
    let after = handle.consumer_info("confirm").await.expect("info");
    assert_eq!(after.num_ack_pending, 0, "every ack of the batch applied");
    assert_eq!(after.ack_floor.stream_sequence, MESSAGES as u64);
    assert_eq!(after.num_pending, 0);
    source.close().await.expect("close");
}
