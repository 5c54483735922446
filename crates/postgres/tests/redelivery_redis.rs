//! Exactly-once effects on Redis Streams: consumers crash between the
//! database commit and `XACK`, their pending entries are claimed by the next
//! consumer, and each entry's effect is still in the ledger once.

mod common;

#[path = "../../redis-streams/tests/support/mod.rs"]
mod redis_support;

use common::crashes::{Acks, Form, Round, batches, effects_once_despite_crashes};
use common::database;
use intake_postgres::MessageId;
use redis_support::RedisBackend;

async fn run(test: &str, form: Form) {
    let Some(pool) = database(test, 16).await else {
        return;
    };
    let Some(backend) = RedisBackend::new(test).await else {
        return;
    };
    let outcome = effects_once_despite_crashes(
        &backend,
        &pool,
        MessageId::Position,
        form,
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
        "redis, {form:?}: 300 entries, each effect once; {} redeliveries of committed entries \
         skipped",
        outcome.duplicates
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_effect_is_written_once_when_consumers_crash_between_commit_and_xack() {
    run("redis redelivery", Form::PerMessage).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_batched_effect_is_written_once_when_consumers_crash_between_commit_and_xack() {
    run("redis redelivery, batches", Form::Batch(batches())).await;
}
