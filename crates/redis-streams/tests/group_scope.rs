//! The dead-letter store scoped to one consumer group (R6, Redis part): the
//! letters of every group of a stream share `<stream>:dlq`, and what
//! `intake dlq … --group G` does must touch group G's letters only; a
//! replay to the group goes to its return stream, which no other group
//! reads.

mod support;

use std::time::Duration;

use intake_core::DeadLetter;
use intake_core::backend::DeadLetterSink as _;
use intake_core::dead_letter::envelope;
use intake_core::dead_letter::store::{
    DeadLetterLog as _, DeadLetterStore, Filter, Replay, Selection, StoreError,
};
use intake_core::parking::{ORIGIN, ORIGIN_PARTITION, ORIGIN_POSITION};
use intake_redis_streams::{RedisDeadLetterStore, RedisDeadLetters, RedisParking};
use intake_redis_streams::{RedisStreamsPublisher, RedisStreamsSource};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

use support::*;

/// Dead-letters every entry of `stream` (`count` of them) as group `group`
/// would: read by a member of the group, written by its sink; returns the
/// source, whose entries are now acknowledged.
async fn dead_letter_all(stream: &str, group: &str, count: usize) -> RedisStreamsSource {
    let mut source = group_builder(stream, group, "c1")
        .key_field("key")
        .build()
        .await
        .expect("connect");
    let received = receive(&mut source, count, count, Duration::from_secs(5)).await;
    assert_eq!(received.len(), count);
    let sink = source.dead_letter_sink().build().await.expect("sink");
    for message in received {
        sink.write(&DeadLetter::new(message, "bad", 1))
            .await
            .expect("written");
    }
    source
}

async fn store(stream: &str, group: Option<&str>) -> RedisDeadLetterStore {
    let log = RedisDeadLetters::builder(redis_url()).dead_letters_of(stream);
    let log = match group {
        Some(group) => log.group(group),
        None => log,
    };
    log.build().await.expect("log").store(
        RedisStreamsPublisher::builder(redis_url())
            .build()
            .await
            .expect("publisher"),
    )
}

/// `stream` with `count` keyed entries dead-lettered by `billing` and by
/// `shipping` each, letters interleaved in the dead-letter stream.
async fn two_groups_letters(
    redis: &mut MultiplexedConnection,
    count: usize,
) -> (String, String, String) {
    let stream = unique("scope");
    let billing = unique("billing");
    let shipping = unique("shipping");
    for n in 0..count {
        let _: String = redis
            .xadd(
                &stream,
                "*",
                &[("payload", format!("m{n}")), ("key", format!("k{n}"))],
            )
            .await
            .expect("XADD");
    }
    dead_letter_all(&stream, &billing, count).await;
    dead_letter_all(&stream, &shipping, count).await;
    (stream, billing, shipping)
}

#[tokio::test]
async fn a_store_scoped_to_a_group_counts_lists_reads_and_purges_only_its_letters() {
    let Some(mut redis) = redis_or_skip("a_store_scoped_to_a_group_counts").await else {
        return;
    };
    let (stream, billing, shipping) = two_groups_letters(&mut redis, 300).await;
    let dead_letters = format!("{stream}:dlq");
    let all = store(&stream, None).await;
    assert_eq!(all.count(&Filter::all()).await.expect("count"), 600);

    let scoped = store(&stream, Some(&billing)).await;
    assert_eq!(scoped.count(&Filter::all()).await.expect("count"), 300);
    let summary = scoped.summary(&Filter::all()).await.expect("summary");
    assert_eq!(summary.total, 300);
    // Listed a page at a time, each letter is billing's.
    let mut listed = 0;
    let mut after = None;
    loop {
        let page = scoped
            .list(&Filter::all(), 100, after.as_ref())
            .await
            .expect("list");
        for stored in &page.letters {
            let letter = stored.letter.as_ref().expect("a letter");
            assert_eq!(
                letter
                    .origin
                    .as_ref()
                    .and_then(|origin| origin.group.as_deref()),
                Some(billing.as_str())
            );
        }
        listed += page.letters.len();
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(listed, 300);
    // Another group's letter is not there for it.
    let theirs = store(&stream, Some(&shipping))
        .await
        .list(&Filter::all(), 1, None)
        .await
        .expect("list")
        .letters[0]
        .id
        .clone();
    assert!(matches!(
        scoped.read(&theirs).await,
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(
        scoped
            .log()
            .remove(std::slice::from_ref(&theirs))
            .await
            .expect("remove"),
        0,
        "a scoped log removes no other group's letter"
    );
    assert!(matches!(
        scoped.purge(&Selection::Ids(vec![theirs.clone()])).await,
        Ok(0)
    ));

    let purged = scoped
        .purge(&Selection::Matching(Filter::all()))
        .await
        .expect("purge");
    assert_eq!(purged, 300);
    assert_eq!(scoped.count(&Filter::all()).await.expect("count"), 0);
    let left: u64 = redis.xlen(&dead_letters).await.expect("XLEN");
    assert_eq!(left, 300, "shipping's letters are all still there");
    let left = entries(&mut redis, &dead_letters).await;
    assert!(
        left.iter()
            .all(|fields| field(fields, envelope::ORIGIN_GROUP).as_deref()
                == Some(shipping.as_str()))
    );
}

#[tokio::test]
async fn a_replay_to_the_group_lands_in_its_return_stream_only() {
    let Some(mut redis) = redis_or_skip("a_replay_to_the_group_lands_in_its_return_stream").await
    else {
        return;
    };
    let (stream, billing, shipping) = two_groups_letters(&mut redis, 5).await;
    let returned = RedisParking::return_stream(&stream, &billing);
    let scoped = store(&stream, Some(&billing)).await;

    // The group does not read a return stream yet: no way back to it alone.
    assert_eq!(
        scoped
            .log()
            .way_back_to_group(&stream)
            .await
            .expect("asked"),
        None
    );
    let refused = scoped
        .replay(&Selection::Matching(Filter::all()), &Replay::to_group())
        .await;
    assert!(
        matches!(refused, Err(StoreError::NoWayBackToGroup { .. })),
        "{refused:?}"
    );
    // A return stream another group reads is not billing's way back.
    redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&returned)
        .arg(&shipping)
        .arg("$")
        .arg("MKSTREAM")
        .query_async::<()>(&mut redis)
        .await
        .expect("XGROUP CREATE");
    assert_eq!(
        scoped
            .log()
            .way_back_to_group(&stream)
            .await
            .expect("asked"),
        None
    );

    // Once billing reads its return stream (its source creates the group
    // there), that is where a replay to the group goes.
    let mut source = group_builder(&stream, &billing, "c1")
        .stream(&returned)
        .key_field("key")
        .build()
        .await
        .expect("connect");
    assert_eq!(
        scoped
            .log()
            .way_back_to_group(&stream)
            .await
            .expect("asked")
            .as_deref(),
        Some(returned.as_str())
    );
    let origin_length: u64 = redis.xlen(&stream).await.expect("XLEN");
    let report = scoped
        .replay(&Selection::Matching(Filter::all()), &Replay::to_group())
        .await
        .expect("replay");
    assert_eq!(report.replayed, 5, "{report:?}");
    let after: u64 = redis.xlen(&stream).await.expect("XLEN");
    assert_eq!(after, origin_length, "nothing written to the origin");
    let replayed = entries(&mut redis, &returned).await;
    assert_eq!(replayed.len(), 5);
    let originals = entries(&mut redis, &stream).await;
    for (copy, original) in replayed.iter().zip(&originals) {
        assert_eq!(field(copy, "payload"), field(original, "payload"));
        assert_eq!(field(copy, "key"), field(original, "key"));
        assert_eq!(field(copy, ORIGIN).as_deref(), Some(stream.as_str()));
        assert_eq!(field(copy, ORIGIN_PARTITION).as_deref(), Some("0"));
        assert!(field(copy, ORIGIN_POSITION).is_some());
    }
    // Billing's members read them; shipping's letters are untouched.
    let back = receive(&mut source, 5, 10, Duration::from_secs(5)).await;
    assert_eq!(back.len(), 5);
    assert!(
        back.iter()
            .all(|message| **message.metadata().source() == *returned)
    );
    assert_eq!(
        store(&stream, Some(&billing))
            .await
            .count(&Filter::all())
            .await
            .ok(),
        Some(0)
    );
    assert_eq!(
        store(&stream, Some(&shipping))
            .await
            .count(&Filter::all())
            .await
            .ok(),
        Some(5)
    );
}
