//! Exactly-once effects on RabbitMQ: consumers crash between the database
//! commit and `basic.ack`, the broker requeues their deliveries under new
//! delivery tags, and each message's effect is still in the ledger once
//! because messages are identified by a header, not by their tag.

mod common;

#[path = "../../amqp/tests/support/mod.rs"]
mod amqp_support;

use amqp_support::AmqpBackend;
use common::crashes::{Form, ID_HEADER, ROUNDS, batches, check};
use intake_postgres::MessageId;

async fn run(test: &str, form: Form) {
    if let Some(backend) = AmqpBackend::connect_or_skip(test).await {
        check(&backend, test, MessageId::header(ID_HEADER), form, &ROUNDS).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_effect_is_written_once_when_consumers_crash_between_commit_and_ack() {
    run("amqp redelivery", Form::PerMessage).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_batched_effect_is_written_once_when_consumers_crash_between_commit_and_ack() {
    run("amqp redelivery, batches", Form::Batch(batches())).await;
}
