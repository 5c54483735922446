//! Exactly-once effects on Kafka: consumers crash between the database
//! commit and the offset commit, the group rebalances, the next consumer
//! reads from the last committed offsets, and each record's effect is still
//! in the ledger once. Runs on rdkafka's mock cluster and on the real broker
//! (Apache Kafka on 127.0.0.1:9092).

mod common;

#[path = "../../kafka/tests/support/mod.rs"]
mod kafka_support;

use common::crashes::{Acks, Form, Round, batches, check};
use intake_postgres::MessageId;
use kafka_support::KafkaBackend;

/// Two crashes, not three: each costs a session timeout before the group
/// rebalances.
const ROUNDS: [Round; 2] = [
    Round {
        acks: Acks::Never,
        crash_after_processed: 100,
    },
    Round {
        acks: Acks::Often,
        crash_after_processed: 200,
    },
];

async fn run(backend: Option<KafkaBackend>, test: &str, form: Form) {
    if let Some(backend) = backend {
        check(&backend, test, MessageId::Position, form, &ROUNDS).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_effect_is_written_once_when_consumers_crash_between_commit_and_offset_commit() {
    let test = "kafka redelivery (mock cluster)";
    run(Some(KafkaBackend::mock()), test, Form::PerMessage).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_batched_effect_is_written_once_when_consumers_crash() {
    let test = "kafka redelivery (mock cluster), batches";
    run(Some(KafkaBackend::mock()), test, Form::Batch(batches())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_effect_is_written_once_on_a_real_broker_when_consumers_crash() {
    let test = "kafka redelivery (Apache Kafka)";
    run(KafkaBackend::real(test), test, Form::PerMessage).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_batched_effect_is_written_once_on_a_real_broker_when_consumers_crash() {
    let test = "kafka redelivery (Apache Kafka), batches";
    run(KafkaBackend::real(test), test, Form::Batch(batches())).await;
}
