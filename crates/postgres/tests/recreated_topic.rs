//! Issue 12, item 15 on Kafka: an exactly-once marker keyed by position
//! (`MessageId::Position`: group, topic, partition, offset) against a topic
//! that is deleted and created again. A new topic's offsets start at 0
//! again, so its records take the old records' markers: they are skipped as
//! duplicates and their effects lost. Ids carried in a header keep them.
//!
//! Kafka names each incarnation of a topic with a topic id, but rdkafka does
//! not hand it to consumers, so the position key cannot include it; the
//! header id is the recommended key where topics may be recreated
//! (`MessageId` says so).

mod common;

#[path = "../../kafka/tests/support/mod.rs"]
mod kafka_support;

use std::time::Duration;

use bytes::Bytes;
use intake_core::backend::testkit::{Backend, TestMessage};
use intake_core::{Headers, Message};
use intake_postgres::{ExactlyOnceCounters, MessageId, Tx};
use kafka_support::{KafkaBackend, unique};
use tower::ServiceExt;

use common::{Fixture, id_of, insert_effect};

/// Records with payload `<id>` and header `id = <note>-<id>`.
fn records(ids: std::ops::Range<i64>, note: &str) -> Vec<TestMessage> {
    ids.map(|id| {
        let mut headers = Headers::new();
        headers.insert("id", Bytes::from(format!("{note}-{id}")));
        let mut message = TestMessage::new("k", id.to_string());
        message.headers = headers;
        message
    })
    .collect()
}

/// Reads `count` records of `topic` as `group` and runs each through an
/// exactly-once handler that inserts its payload id into the effects table.
async fn consume(
    kafka: &KafkaBackend,
    fixture: &Fixture,
    topic: &str,
    group: &str,
    count: usize,
    message_id: MessageId,
) -> std::sync::Arc<ExactlyOnceCounters> {
    let mut source = kafka.source(topic, group).build().await.expect("source");
    let taken = kafka_support::take(&mut source, count, 16, Duration::from_secs(30)).await;
    assert_eq!(taken.messages.len(), count);
    let effects = fixture.effects.clone();
    let handler = fixture
        .billing()
        .message_id(message_id)
        .handler(async move |mut tx: Tx, message: Message| {
            let id = id_of(message.payload())?;
            insert_effect(&mut tx, &effects, id).await?;
            Ok::<_, intake_core::BoxError>(())
        })
        .expect("handler");
    let counters = handler.counters().clone();
    for message in taken.messages {
        handler
            .clone()
            .oneshot(message)
            .await
            .expect("processed or skipped");
    }
    intake_core::backend::Source::close(&mut source)
        .await
        .expect("close");
    counters
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_topic_loses_effects_under_position_markers_not_under_header_ids() {
    let test = "recreated topic";
    let Some(kafka) = KafkaBackend::real(test) else {
        return;
    };
    for (message_id, expected_effects, expected_duplicates) in
        [(MessageId::Position, 3, 3), (MessageId::header("id"), 6, 0)]
    {
        let Some(fixture) = Fixture::new(test).await else {
            return;
        };
        let topic = kafka.create_source(1).await.expect("topic");
        let group = unique("g");
        kafka
            .produce(&topic, records(1..4, "first"))
            .await
            .expect("produce");
        consume(&kafka, &fixture, &topic, &group, 3, message_id.clone()).await;

        kafka.delete_topic(&topic).await.expect("delete");
        let created = tokio::time::timeout(Duration::from_secs(60), async {
            // Kafka removes a deleted topic in the background.
            while kafka.create_topic(&topic, 1).await.is_err() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        assert!(created.is_ok(), "the topic is created again within 60 s");
        kafka
            .produce(&topic, records(4..7, "second"))
            .await
            .expect("produce to the new topic");
        let counters = consume(&kafka, &fixture, &topic, &group, 3, message_id.clone()).await;

        assert_eq!(
            counters.duplicates(),
            expected_duplicates,
            "{message_id:?}: new records skipped as duplicates"
        );
        assert_eq!(
            fixture.effects().await,
            expected_effects,
            "{message_id:?}: effects in the database"
        );
    }
}
