//! Exactly-once effects on the memory broker: consumers crash between the
//! database commit and the acknowledgement, the broker redelivers, and each
//! message's effect is still in the ledger once.

mod common;

use common::crashes::{Acks, Round, effects_once_despite_crashes};
use common::database;
use intake_core::testkit::memory_backend::MemoryBackend;
use intake_postgres::MessageId;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_effect_is_written_once_when_consumers_crash_between_commit_and_ack() {
    let Some(pool) = database("memory redelivery", 16).await else {
        return;
    };
    let outcome = effects_once_despite_crashes(
        &MemoryBackend::new(),
        &pool,
        MessageId::Position,
        300,
        &[
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
        ],
    )
    .await;
    println!(
        "memory: 300 messages, each effect once; {} redeliveries of committed messages skipped",
        outcome.duplicates
    );
}
