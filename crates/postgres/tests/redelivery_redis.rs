//! Exactly-once effects on Redis Streams: consumers crash between the
//! database commit and `XACK`, their pending entries are claimed by the next
//! consumer, and each entry's effect is still in the ledger once.

mod common;

#[path = "../../redis-streams/tests/support/mod.rs"]
mod redis_support;

use common::crashes::{Form, ROUNDS, batches, check};
use intake_postgres::MessageId;
use redis_support::RedisBackend;

async fn run(test: &str, form: Form) {
    if let Some(backend) = RedisBackend::new(test).await {
        check(&backend, test, MessageId::Position, form, &ROUNDS).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_effect_is_written_once_when_consumers_crash_between_commit_and_xack() {
    run("redis redelivery", Form::PerMessage).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_batched_effect_is_written_once_when_consumers_crash_between_commit_and_xack() {
    run("redis redelivery, batches", Form::Batch(batches())).await;
}
