//! A consumer group that vanishes while its source runs (`XGROUP DESTROY`,
//! the stream deleted): the source creates it again where it had read to,
//! not at the beginning of the stream (L8), and not in a hot loop.

mod support;

use std::time::Duration;

use redis::aio::MultiplexedConnection;

use support::*;

async fn destroy_group(redis: &mut MultiplexedConnection, stream: &str, group: &str) {
    redis::cmd("XGROUP")
        .arg("DESTROY")
        .arg(stream)
        .arg(group)
        .query_async::<()>(redis)
        .await
        .expect("XGROUP DESTROY");
}

/// Everything read and acknowledged stays done: after the group is
/// destroyed, the source reads only what came after.
#[tokio::test]
async fn a_destroyed_group_is_created_again_after_what_was_read_not_at_the_beginning() {
    let Some(mut redis) = redis_or_skip("a_destroyed_group_is_created_again").await else {
        return;
    };
    let stream = unique("l8");
    let group = unique("group");
    produce(&mut redis, &stream, "old", 100).await;
    let mut source = group_builder(&stream, &group, "c1")
        .build()
        .await
        .expect("connect");
    let mut acker = source.acker();
    let read = receive(&mut source, 100, 100, Duration::from_secs(5)).await;
    assert_eq!(read.len(), 100);
    ack(&mut acker, &read).await;

    destroy_group(&mut redis, &stream, &group).await;
    produce(&mut redis, &stream, "new", 10).await;
    // At most what a replay from the beginning would bring, within 3 s.
    let again = receive(&mut source, 110, 110, Duration::from_secs(3)).await;
    let mut names = payloads(&again);
    names.sort();
    let mut expected: Vec<String> = (0..10).map(|n| format!("new{n}")).collect();
    expected.sort();
    assert_eq!(names, expected, "only the entries after those read");
    assert_eq!(source.counters().groups_created_again(), 1);
    ack(&mut acker, &again).await;
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

/// A stream deleted and written again is read from its first new entry.
#[tokio::test]
async fn a_stream_deleted_and_written_again_is_read_from_its_first_new_entry() {
    let Some(mut redis) = redis_or_skip("a_stream_deleted_and_written_again").await else {
        return;
    };
    let stream = unique("l8-del");
    let group = unique("group");
    produce(&mut redis, &stream, "old", 10).await;
    let mut source = group_builder(&stream, &group, "c1")
        .build()
        .await
        .expect("connect");
    let mut acker = source.acker();
    let read = receive(&mut source, 10, 10, Duration::from_secs(5)).await;
    ack(&mut acker, &read).await;

    redis::cmd("DEL")
        .arg(&stream)
        .query_async::<()>(&mut redis)
        .await
        .expect("DEL");
    // Entry ids are times: the new ones come after the old ones.
    tokio::time::sleep(Duration::from_millis(5)).await;
    produce(&mut redis, &stream, "new", 10).await;
    let again = receive(&mut source, 10, 10, Duration::from_secs(5)).await;
    let mut names = payloads(&again);
    names.sort();
    let mut expected: Vec<String> = (0..10).map(|n| format!("new{n}")).collect();
    expected.sort();
    assert_eq!(names, expected);
    ack(&mut acker, &again).await;
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

/// A group that keeps vanishing is created again with the reconnect
/// policy's waits between (100 ms doubling here), not as fast as Redis
/// answers.
#[tokio::test]
async fn a_group_that_keeps_vanishing_is_created_again_with_backoff() {
    let Some(mut redis) = redis_or_skip("a_group_that_keeps_vanishing").await else {
        return;
    };
    let stream = unique("l8-loop");
    let group = unique("group");
    produce(&mut redis, &stream, "m", 1).await;
    let mut source = group_builder(&stream, &group, "c1")
        .build()
        .await
        .expect("connect");
    let counters = source.counters();
    // An operator's script destroys the group whenever it exists, for
    // about a second.
    let destroyer = tokio::spawn({
        let mut redis = redis.clone();
        let (stream, group) = (stream.clone(), group.clone());
        async move {
            for _ in 0..1_000 {
                let _ = redis::cmd("XGROUP")
                    .arg("DESTROY")
                    .arg(&stream)
                    .arg(&group)
                    .query_async::<i64>(&mut redis)
                    .await;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    });
    let _ = receive(&mut source, 1_000_000, 10, Duration::from_millis(1500)).await;
    destroyer.abort();
    let created = counters.groups_created_again();
    assert!(
        (1..30).contains(&created),
        "created again {created} times in 1.5 s"
    );
}
