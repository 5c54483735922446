//! Exactly-once effects on the memory broker: consumers crash between the
//! database commit and the acknowledgement, the broker redelivers, and each
//! message's effect is still in the ledger once.

mod common;

use common::crashes::{Acks, Form, ID_HEADER, Round, batches, effects_once_despite_crashes};
use common::database;
use std::sync::Arc;

use intake_core::testkit::harness::{Running, numbered};
use intake_core::testkit::memory_backend::MemoryBackend;
use intake_core::testkit::{Backend, TestMessage};
use intake_core::{Consumer, Ordering, Payload};
use intake_postgres::{ExactlyOnce, MessageId, Tx};
use sqlx::AssertSqlSafe;

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

async fn run(test: &str, message_id: MessageId, form: Form) {
    let Some(pool) = database(test, 16).await else {
        return;
    };
    let outcome = effects_once_despite_crashes(
        &MemoryBackend::new(),
        &pool,
        message_id.clone(),
        form,
        300,
        &ROUNDS,
    )
    .await;
    println!(
        "memory, {message_id:?}, {form:?}: 300 messages, each effect once; {} redeliveries of committed \
         messages skipped",
        outcome.duplicates
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_effect_is_written_once_when_consumers_crash_between_commit_and_ack() {
    run("memory redelivery", MessageId::Position, Form::PerMessage).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_batched_effect_is_written_once_when_consumers_crash_between_commit_and_ack() {
    run(
        "memory redelivery, batches",
        MessageId::Position,
        Form::Batch(batches()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_effect_is_written_once_when_messages_are_identified_by_a_header() {
    let id = MessageId::header(ID_HEADER);
    run(
        "memory redelivery, header ids",
        id.clone(),
        Form::PerMessage,
    )
    .await;
    run(
        "memory redelivery, header ids, batches",
        id,
        Form::Batch(batches()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_a_producer_sent_twice_are_skipped_by_their_header_id() {
    let Some(pool) = database("producer copies", 8).await else {
        return;
    };
    let backend = MemoryBackend::new();
    let source = backend.create_source(4).await.unwrap();
    // Every message twice, as a producer retrying after a lost
    // acknowledgement sends it: other offsets, same id.
    let sent: Vec<TestMessage> = numbered(0, 100)
        .into_iter()
        .chain(numbered(0, 100))
        .map(|mut message| {
            message.headers.insert(ID_HEADER, message.payload.clone());
            message
        })
        .collect();
    backend.produce(&source, sent).await.unwrap();
    let markers = common::marker_table(&pool).await;
    let ledger = common::ledger_table(&pool).await;
    let insert = format!("INSERT INTO {ledger} (id) VALUES ($1)");
    let handler = ExactlyOnce::builder(pool.clone(), "ledger")
        .table(markers)
        .message_id(MessageId::header(ID_HEADER))
        .handler(async move |mut tx: Tx, Payload(payload): Payload| {
            let id: i64 = std::str::from_utf8(&payload)?.parse()?;
            sqlx::query(AssertSqlSafe(insert))
                .bind(id)
                .execute(&mut *tx)
                .await?;
            Ok::<_, intake_core::BoxError>(())
        })
        .unwrap();
    let stats = Arc::clone(handler.stats());
    let running = Running::start(
        &backend,
        &source,
        "ledger",
        Consumer::builder().ordering(Ordering::Unordered),
        16,
        handler,
    )
    .await
    .unwrap();
    while backend.unacknowledged(&source, "ledger").await.unwrap() > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    running.stop().await;

    assert_eq!(
        common::ledger_summary(&pool, &ledger).await,
        (100, 100, Some(0), Some(99))
    );
    assert_eq!((stats.processed(), stats.duplicates()), (100, 100));
}
