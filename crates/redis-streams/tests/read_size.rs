//! One read asks for no more entries than fit in an eighth of the
//! consumer's byte budget (`Source::set_limits`) at the average size of the
//! entries read before: Redis has no byte limit for a read, and a reply is
//! held twice while the client parses it (its bytes and the entries), so a
//! read sized by the budget's whole room doubled what the budget allows.

mod support;

use std::time::Duration;

use intake_core::backend::{Limits, Source};
use intake_redis_streams::{RedisStreamsSource, StartFrom};
use redis::aio::MultiplexedConnection;

use support::*;

/// Bytes of each entry's payload.
const ENTRY: usize = 10_000;

/// A byte budget whose eighth holds two entries.
fn limits() -> Limits {
    Limits::new(1024, 16 * ENTRY, Duration::from_secs(10))
}

async fn produce_large(redis: &mut MultiplexedConnection, stream: &str, count: usize) {
    let payload = vec![b'x'; ENTRY];
    let mut pipe = redis::pipe();
    for _ in 0..count {
        pipe.cmd("XADD")
            .arg(stream)
            .arg("*")
            .arg("payload")
            .arg(&payload)
            .ignore();
    }
    pipe.query_async::<()>(redis).await.expect("XADD");
}

/// How many entries each call of `next` (asking for up to 100) brought,
/// until `total` arrived or 10 s passed.
async fn read_sizes(source: &mut RedisStreamsSource, total: usize) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut buffer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while sizes.iter().sum::<usize>() < total {
            buffer.clear();
            source.next(&mut buffer, 100).await.expect("next");
            if !buffer.is_empty() {
                sizes.push(buffer.len());
            }
        }
    })
    .await;
    sizes
}

#[tokio::test]
async fn a_read_brings_what_fits_in_an_eighth_of_the_byte_budget() {
    let Some(mut redis) = redis_or_skip("a_read_brings_what_fits_in_an_eighth").await else {
        return;
    };
    let stream = unique("read-size");
    // One read of one entry to learn the size, then twelve of two.
    produce_large(&mut redis, &stream, 25).await;
    let mut source = group_builder(&stream, &unique("group"), "c1")
        .build()
        .await
        .expect("connect");
    source.set_limits(limits());
    let sizes = read_sizes(&mut source, 25).await;
    assert_eq!(sizes.iter().sum::<usize>(), 25, "{sizes:?}");
    assert_eq!(sizes[0], 1, "no size known yet: one entry, {sizes:?}");
    assert!(sizes[1..].iter().all(|&size| size == 2), "{sizes:?}");
}

#[tokio::test]
async fn claims_and_broadcast_reads_keep_to_the_same_size() {
    let Some(mut redis) = redis_or_skip("claims_and_broadcast_reads_keep_to_the_same_size").await
    else {
        return;
    };
    let stream = unique("read-size");
    let group = unique("group");
    produce_large(&mut redis, &stream, 12).await;
    // A consumer that takes everything and dies: its entries are claimed.
    let mut dead = group_builder(&stream, &group, "dead")
        .build()
        .await
        .expect("connect");
    assert_eq!(read_sizes(&mut dead, 12).await.iter().sum::<usize>(), 12);
    drop(dead);
    let mut heir = group_builder(&stream, &group, "heir")
        .build()
        .await
        .expect("connect");
    heir.set_limits(limits());
    let sizes = read_sizes(&mut heir, 12).await;
    assert_eq!(sizes.iter().sum::<usize>(), 12, "claimed: {sizes:?}");
    assert!(sizes.iter().all(|&size| size <= 2), "claimed: {sizes:?}");

    let mut reader = RedisStreamsSource::builder(redis_url())
        .stream(&stream)
        .broadcast()
        .start_from(StartFrom::Beginning)
        .block(Duration::from_millis(100))
        .build()
        .await
        .expect("connect");
    reader.set_limits(limits());
    let sizes = read_sizes(&mut reader, 12).await;
    assert_eq!(sizes.iter().sum::<usize>(), 12, "broadcast: {sizes:?}");
    assert!(sizes.iter().all(|&size| size <= 2), "broadcast: {sizes:?}");
}

#[tokio::test]
async fn without_limits_a_read_brings_as_many_as_asked() {
    let Some(mut redis) = redis_or_skip("without_limits_a_read_brings_as_many_as_asked").await
    else {
        return;
    };
    let stream = unique("read-size");
    produce_large(&mut redis, &stream, 24).await;
    let mut source = group_builder(&stream, &unique("group"), "c1")
        .build()
        .await
        .expect("connect");
    assert_eq!(read_sizes(&mut source, 24).await, vec![24]);
}
