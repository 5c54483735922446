//! Exactly-once effects on the memory broker: consumers crash between the
//! database commit and the acknowledgement, the broker redelivers, and each
//! message's effect is still in the ledger once.

mod common;

use std::sync::Arc;

use common::crashes::{Form, ID_HEADER, ROUNDS, batches, check};
use common::database;
use intake_core::backend::testkit::harness::{Running, numbered};
use intake_core::backend::testkit::memory_backend::MemoryBackend;
use intake_core::backend::testkit::{Backend, TestMessage};
use intake_core::{Consumer, DeliveryOrder, Payload};
use intake_postgres::{ExactlyOnce, MessageId, Tx};
use sqlx::AssertSqlSafe;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_effect_is_written_once_when_consumers_crash_between_commit_and_ack() {
    let backend = MemoryBackend::new();
    let test = "memory redelivery";
    check(
        &backend,
        test,
        MessageId::Position,
        Form::PerMessage,
        &ROUNDS,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_batched_effect_is_written_once_when_consumers_crash_between_commit_and_ack() {
    let backend = MemoryBackend::new();
    let test = "memory redelivery, batches";
    check(
        &backend,
        test,
        MessageId::Position,
        Form::Batch(batches()),
        &ROUNDS,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_effect_is_written_once_when_messages_are_identified_by_a_header() {
    let backend = MemoryBackend::new();
    let id = MessageId::header(ID_HEADER);
    let test = "memory redelivery, header ids";
    check(&backend, test, id.clone(), Form::PerMessage, &ROUNDS).await;
    let test = "memory redelivery, header ids, batches";
    check(&backend, test, id, Form::Batch(batches()), &ROUNDS).await;
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
    let counters = Arc::clone(handler.counters());
    let running = Running::start(
        &backend,
        &source,
        "ledger",
        Consumer::builder().ordering(DeliveryOrder::Unordered),
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
    assert_eq!((counters.processed(), counters.duplicates()), (100, 100));
}
