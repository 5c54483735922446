//! Broadcast mode: `XREAD` without a group, every reader sees every entry.

mod support;

use std::time::Duration;

use intake_core::backend::{AckBatch, AckMode, Acker, PartitionAck, Source};
use intake_redis_streams::{RedisStreamsSource, RedisStreamsSourceBuilder, StartFrom};

use support::*;

fn broadcast(stream: &str) -> RedisStreamsSourceBuilder {
    RedisStreamsSource::builder(redis_url())
        .stream(stream)
        .broadcast()
        .block(Duration::from_millis(100))
}

#[tokio::test]
async fn every_broadcast_reader_sees_every_new_entry() {
    let Some(mut redis) = redis_or_skip("every_broadcast_reader_sees_every_new_entry").await else {
        return;
    };
    let stream = unique("broadcast");
    produce(&mut redis, &stream, "old-", 3).await;
    let mut first = broadcast(&stream).build().await.expect("connect");
    let first_acker = first.acker();
    let mut second = broadcast(&stream).build().await.expect("connect");
    assert_eq!(first_acker.mode(), AckMode::Watermark);
    assert!(!first_acker.supports_requeue());

    produce(&mut redis, &stream, "new-", 5).await;
    let expected: Vec<String> = (0..5).map(|n| format!("new-{n}")).collect();
    for reader in [&mut first, &mut second] {
        let received = receive(reader, 5, 2, Duration::from_secs(5)).await;
        assert_eq!(
            payloads(&received),
            expected,
            "only entries added after connecting"
        );
    }
}

#[tokio::test]
async fn entries_added_between_two_reads_are_not_skipped() {
    let Some(mut redis) = redis_or_skip("entries_added_between_two_reads_are_not_skipped").await
    else {
        return;
    };
    let stream = unique("gap");
    let mut reader = broadcast(&stream).build().await.expect("connect");
    // Nobody is reading while these are added.
    produce(&mut redis, &stream, "m", 4).await;
    let received = receive(&mut reader, 4, 10, Duration::from_secs(5)).await;
    assert_eq!(payloads(&received), vec!["m0", "m1", "m2", "m3"]);
}

#[tokio::test]
async fn a_broadcast_reader_can_start_at_the_beginning_and_acknowledges_nothing() {
    let Some(mut redis) = redis_or_skip("a_broadcast_reader_can_start_at_the_beginning").await
    else {
        return;
    };
    let stream = unique("replay");
    produce(&mut redis, &stream, "m", 3).await;
    let mut reader = broadcast(&stream)
        .start_from(StartFrom::Beginning)
        .build()
        .await
        .expect("connect");
    let mut acker = reader.acker();
    let received = receive(&mut reader, 3, 10, Duration::from_secs(5)).await;
    assert_eq!(payloads(&received), vec!["m0", "m1", "m2"]);
    let mut batch = AckBatch::default();
    let mut ack = PartitionAck::new(partition(&stream));
    ack.watermark = received.last().map(|message| message.metadata().position());
    batch.partitions.push(ack);
    acker.ack(&batch).await.expect("a broadcast ack is a no-op");
    let groups: Vec<redis::Value> = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(&stream)
        .query_async(&mut redis)
        .await
        .expect("XINFO GROUPS");
    assert!(groups.is_empty(), "a broadcast reader creates no group");
}

#[tokio::test]
async fn an_entry_a_broadcast_reader_cannot_dead_letter_stops_the_read_instead_of_vanishing() {
    let Some(mut redis) = redis_or_skip("a broadcast dead letter that cannot be written").await
    else {
        return;
    };
    let stream = unique("bcast-poison");
    // An entry without the payload field (the source dead-letters it),
    // then a good one; the dead-letter key holds a string, so the write
    // fails with WRONGTYPE.
    let _: String = redis::cmd("XADD")
        .arg(&stream)
        .arg("*")
        .arg("other")
        .arg("x")
        .query_async(&mut redis)
        .await
        .expect("XADD");
    produce(&mut redis, &stream, "m", 1).await;
    let dead_letters = format!("{stream}:dlq");
    redis::cmd("SET")
        .arg(&dead_letters)
        .arg("occupied")
        .query_async::<()>(&mut redis)
        .await
        .expect("SET");
    let mut reader = broadcast(&stream)
        .start_from(StartFrom::Beginning)
        .build()
        .await
        .expect("connect");
    let mut buffer = Vec::new();
    // A broadcast entry has no pending list to come back from: skipped,
    // it would be gone. The read fails instead, saying why.
    let first = tokio::time::timeout(Duration::from_secs(5), reader.next(&mut buffer, 10))
        .await
        .expect("an answer");
    let error = first.expect_err("the read stops at the entry it cannot dead-letter");
    assert!(
        error.to_string().contains("XADD") || format!("{error:?}").contains("WRONGTYPE"),
        "{error:?}"
    );
    assert!(
        buffer.is_empty(),
        "nothing after it is handed out: {buffer:?}"
    );

    // Once the key is fixed, the next read writes the letter and goes on.
    redis::cmd("DEL")
        .arg(&dead_letters)
        .query_async::<()>(&mut redis)
        .await
        .expect("DEL");
    let received = receive(&mut reader, 1, 10, Duration::from_secs(5)).await;
    assert_eq!(payloads(&received), vec!["m0"]);
    assert_eq!(entries(&mut redis, &dead_letters).await.len(), 1);
}
