//! Exactly-once effects on the memory broker: consumers crash between the
//! database commit and the acknowledgement, the broker redelivers, and each
//! message's effect is still in the ledger once.

mod common;

use common::crashes::{Acks, Form, Round, batches, effects_once_despite_crashes};
use common::database;
use intake_core::testkit::memory_backend::MemoryBackend;
use intake_postgres::MessageId;

/// Three consumers crash (two of them before acknowledging anything), then
/// a fourth drains the topic.
const ROUNDS: [Round; 3] = [
    Round {
        acks: Acks::Never,
        crash_after_processed: 100,
    },
    Round {
        acks: Acks::Often,
        crash_after_processed: 180,
    },
    Round {
        acks: Acks::Never,
        crash_after_processed: 240,
    },
];

async fn run(test: &str, form: Form) {
    let Some(pool) = database(test, 16).await else {
        return;
    };
    let outcome = effects_once_despite_crashes(
        &MemoryBackend::new(),
        &pool,
        MessageId::Position,
        form,
        300,
        &ROUNDS,
    )
    .await;
    println!(
        "memory, {form:?}: 300 messages, each effect once; {} redeliveries of committed \
         messages skipped",
        outcome.duplicates
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_effect_is_written_once_when_consumers_crash_between_commit_and_ack() {
    run("memory redelivery", Form::PerMessage).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_batched_effect_is_written_once_when_consumers_crash_between_commit_and_ack() {
    run("memory redelivery, batches", Form::Batch(batches())).await;
}
