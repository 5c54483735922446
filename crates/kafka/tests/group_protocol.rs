//! KIP-848's consumer group protocol (`GroupProtocol::Consumer`) where it
//! differs from the classic one: commits refused for a stale member epoch
//! (librdkafka's mock cluster, which serves the protocol and injects the
//! refusal), and a member that passes `max.poll.interval.ms` (Apache Kafka
//! 4.1 on 127.0.0.1:9092, `.ci/services/kafka.sh`).

mod support;

use std::time::Duration;

use intake_core::backend::testkit::Backend;
use intake_core::backend::testkit::harness::numbered;
use intake_core::backend::{AckBatch, AckError, Acker, PartitionAck};
use intake_core::{PartitionKey, Position};
use intake_kafka::GroupProtocol;
use intake_kafka::rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

use support::{KafkaBackend, unique};

const PATIENCE: Duration = Duration::from_secs(30);

/// A batch committing `partition` up to `watermark`, waited for.
fn batch(partition: &PartitionKey, watermark: i64) -> AckBatch {
    let mut ack = PartitionAck::new(partition.clone());
    ack.watermark = Some(Position::Offset(watermark));
    AckBatch {
        partitions: vec![ack],
        sync: true,
    }
}

/// The offset `group` committed on partition 0 of `topic`.
async fn committed(kafka: &KafkaBackend, topic: &str, group: &str) -> Option<i64> {
    let offsets = kafka.offsets(topic, group).await.expect("offsets");
    offsets
        .into_iter()
        .find(|(partition, _, _)| *partition == 0)
        .and_then(|(_, committed, _)| committed)
}

/// Under KIP-848 the broker refuses a commit that carries an older member
/// epoch than the member's (`STALE_MEMBER_EPOCH`): the epoch moved with a
/// heartbeat the client had not read when it sent the commit. librdkafka
/// 2.12 does not send a manual commit again (it asks for the next heartbeat
/// at once, `rd_kafka_cgrp_op_handle_OffsetCommit`), so the refusal reaches
/// the acker while the partition is still this member's. The acker sends
/// it again at once, a few times, rather than wait for the runtime's next
/// batch and a backoff (and, in a revocation, rather than leave the
/// partition's finished messages to its next owner).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_refused_for_a_stale_member_epoch_is_sent_again_at_once() {
    support::init_tracing();
    let kafka = KafkaBackend::mock().with_protocol(GroupProtocol::Consumer);
    let topic = kafka.create_source(1).await.expect("topic");
    let group = unique("g");
    kafka
        .produce(&topic, numbered(0, 4))
        .await
        .expect("produce");
    let mut source = kafka.source(&topic, &group).build().await.expect("source");
    let mut acker = source.acker();
    let taken = support::take(&mut source, 4, 16, PATIENCE).await;
    assert_eq!(taken.messages.len(), 4, "assigned under KIP-848 and read");
    let partition = PartitionKey::new(topic.as_str(), 0);

    kafka.refuse_next(
        RDKafkaApiKey::OffsetCommit,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_STALE_MEMBER_EPOCH],
    );
    let outcome = acker.ack(&batch(&partition, 1)).await;
    assert!(
        outcome.is_ok(),
        "a stale member epoch is a refusal of this commit, not of the member: {outcome:?}"
    );
    assert_eq!(committed(&kafka, &topic, &group).await, Some(2));

    // Refused every time: reported as the broker's refusal, which the
    // runtime sends again with its next batch (docs/CONTRACT.md §3).
    kafka.refuse_next(
        RDKafkaApiKey::OffsetCommit,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_STALE_MEMBER_EPOCH; 8],
    );
    let outcome = acker.ack(&batch(&partition, 2)).await;
    assert!(matches!(outcome, Err(AckError::Broker(_))), "{outcome:?}");
    kafka.clear_refusals(RDKafkaApiKey::OffsetCommit);
    let outcome = acker.ack(&batch(&partition, 3)).await;
    assert!(outcome.is_ok(), "{outcome:?}");
    assert_eq!(committed(&kafka, &topic, &group).await, Some(4));
    intake_core::backend::Source::close(&mut source)
        .await
        .expect("close");
}
