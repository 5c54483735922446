//! Issue 12, item 15 on Redis Streams: an exactly-once marker keyed by
//! position (`MessageId::Position`: stream, partition, entry id) against a
//! stream that is deleted and created again.
//!
//! Redis gives entries added with `*` ids from its clock, after the last
//! id of the stream. A deleted stream forgets its last id, but the clock
//! has moved on, so the new entries get new ids and nothing is skipped
//! (first test). The hazard is real where ids repeat: producers that set
//! ids themselves (or `<ms>-*` within the same millisecond, or a failover
//! to a server whose clock is behind). Then the new entries are skipped as
//! duplicates of the old ones and their effects are lost under position
//! markers, while ids carried in a header keep them (second test).

mod common;

#[path = "../../redis-streams/tests/support/mod.rs"]
mod redis_support;

use std::time::Duration;

use intake_core::Message;
use intake_postgres::{ExactlyOnceCounters, MessageId, Tx};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tower::ServiceExt;

use common::{Fixture, id_of, insert_effect};

/// Adds entries `payload = <id>, id = <note>-<id>` with explicit or automatic
/// (`*`) entry ids.
async fn add(redis: &mut MultiplexedConnection, stream: &str, entries: &[(&str, i64)], note: &str) {
    for (entry_id, id) in entries {
        let _: String = redis::cmd("XADD")
            .arg(stream)
            .arg(*entry_id)
            .arg("payload")
            .arg(id.to_string())
            .arg("id")
            .arg(format!("{note}-{id}"))
            .query_async(redis)
            .await
            .expect("XADD");
    }
}

/// Consumes `count` entries of `stream` as group `group`, runs each through
/// an exactly-once handler that inserts its payload id into the fixture's
/// effects table, and acknowledges them.
async fn consume(
    fixture: &Fixture,
    stream: &str,
    group: &str,
    count: usize,
    message_id: MessageId,
) -> (Vec<Message>, std::sync::Arc<ExactlyOnceCounters>) {
    let mut source = redis_support::group_builder(stream, group, "c1")
        .build()
        .await
        .expect("connect");
    let mut acker = source.acker();
    let received = redis_support::receive(&mut source, count, 10, Duration::from_secs(5)).await;
    assert_eq!(received.len(), count);
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
    for message in &received {
        handler
            .clone()
            .oneshot(message.clone())
            .await
            .expect("processed or skipped");
    }
    redis_support::ack(&mut acker, &received).await;
    (received, counters)
}

#[tokio::test]
async fn a_recreated_stream_with_clock_based_ids_keeps_every_effect_under_position_markers() {
    let test = "recreated stream, clock-based ids";
    let Some(fixture) = Fixture::new(test).await else {
        return;
    };
    let Some(mut redis) = redis_support::redis_or_skip(test).await else {
        return;
    };
    let stream = redis_support::unique("recreated");
    let group = redis_support::unique("group");
    add(
        &mut redis,
        &stream,
        &[("*", 1), ("*", 2), ("*", 3)],
        "first",
    )
    .await;
    let (before, _) = consume(&fixture, &stream, &group, 3, MessageId::Position).await;

    redis.del::<_, ()>(&stream).await.expect("DEL");
    add(
        &mut redis,
        &stream,
        &[("*", 4), ("*", 5), ("*", 6)],
        "second",
    )
    .await;
    let (after, counters) = consume(&fixture, &stream, &group, 3, MessageId::Position).await;

    let newest_before = before.iter().map(|m| m.metadata().position()).max();
    let oldest_after = after.iter().map(|m| m.metadata().position()).min();
    assert!(
        oldest_after > newest_before,
        "Redis gave the new entries later ids"
    );
    assert_eq!(counters.duplicates(), 0);
    assert_eq!(fixture.effects().await, 6, "every effect is there");
}

#[tokio::test]
async fn a_recreated_stream_that_repeats_ids_loses_effects_under_position_markers_not_under_header_ids()
 {
    let test = "recreated stream, repeated ids";
    let Some(mut redis) = redis_support::redis_or_skip(test).await else {
        return;
    };
    for (message_id, expected_effects, expected_duplicates) in
        [(MessageId::Position, 3, 3), (MessageId::header("id"), 6, 0)]
    {
        let Some(fixture) = Fixture::new(test).await else {
            return;
        };
        let stream = redis_support::unique("recreated");
        let group = redis_support::unique("group");
        let ids = [("1000-1", 1), ("1000-2", 2), ("1000-3", 3)];
        add(&mut redis, &stream, &ids, "first").await;
        consume(&fixture, &stream, &group, 3, message_id.clone()).await;

        redis.del::<_, ()>(&stream).await.expect("DEL");
        let ids = [("1000-1", 4), ("1000-2", 5), ("1000-3", 6)];
        add(&mut redis, &stream, &ids, "second").await;
        let (_, counters) = consume(&fixture, &stream, &group, 3, message_id.clone()).await;

        assert_eq!(
            counters.duplicates(),
            expected_duplicates,
            "{message_id:?}: new entries skipped as duplicates"
        );
        assert_eq!(
            fixture.effects().await,
            expected_effects,
            "{message_id:?}: effects in the database"
        );
    }
}
