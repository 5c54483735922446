//! Exactly-once effects on Kafka: consumers crash between the database
//! commit and the offset commit, the group rebalances, the next consumer
//! reads from the last committed offsets, and each record's effect is still
//! in the ledger once. Runs on rdkafka's mock cluster and on the real broker
//! (tansu on 127.0.0.1:9092).

mod common;

#[path = "../../kafka/tests/support/mod.rs"]
mod kafka_support;

use common::crashes::{Acks, Form, Round, batches, effects_once_despite_crashes};
use common::database;
use intake_core::testkit::Backend;
use intake_postgres::MessageId;
use kafka_support::KafkaBackend;

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

async fn run(backend: KafkaBackend, pool: sqlx::PgPool, form: Form) {
    let outcome =
        effects_once_despite_crashes(&backend, &pool, MessageId::Position, form, 300, &ROUNDS)
            .await;
    println!(
        "{}, {form:?}: 300 records, each effect once; {} redeliveries of committed records skipped",
        backend.name(),
        outcome.duplicates
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_effect_is_written_once_when_consumers_crash_between_commit_and_offset_commit() {
    let Some(pool) = database("kafka redelivery (mock cluster)", 16).await else {
        return;
    };
    run(KafkaBackend::mock(), pool, Form::PerMessage).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_batched_effect_is_written_once_when_consumers_crash() {
    let Some(pool) = database("kafka redelivery (mock cluster), batches", 16).await else {
        return;
    };
    run(KafkaBackend::mock(), pool, Form::Batch(batches())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_effect_is_written_once_on_a_real_broker_when_consumers_crash() {
    let test = "kafka redelivery (tansu)";
    let Some(pool) = database(test, 16).await else {
        return;
    };
    let Some(backend) = KafkaBackend::real(test) else {
        return;
    };
    run(backend, pool, Form::PerMessage).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_batched_effect_is_written_once_on_a_real_broker_when_consumers_crash() {
    let test = "kafka redelivery (tansu), batches";
    let Some(pool) = database(test, 16).await else {
        return;
    };
    let Some(backend) = KafkaBackend::real(test) else {
        return;
    };
    run(backend, pool, Form::Batch(batches())).await;
}
