//! Keeping streams bounded without losing what a group has not read: the
//! return stream of a parking (R24), and `delete_acked` on a stream that
//! other groups read too (C12).

mod support;

use std::time::Duration;

use intake_core::parking::{DUE, ORIGIN};
use intake_redis_streams::{Error, RedisParking};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

use support::*;

async fn xlen(redis: &mut MultiplexedConnection, key: &str) -> u64 {
    redis.xlen(key).await.expect("XLEN")
}

/// Waits (at most 10 s) until `stream` holds `length` entries or fewer;
/// its length then.
async fn wait_for_at_most(redis: &mut MultiplexedConnection, stream: &str, length: u64) -> u64 {
    let started = tokio::time::Instant::now();
    loop {
        let now = xlen(redis, stream).await;
        if now <= length || started.elapsed() > Duration::from_secs(10) {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Copies that came back and were acknowledged leave the return stream; a
/// copy the group has not acknowledged (pending) or not read yet stays,
/// and so does every entry after it.
#[tokio::test]
async fn the_return_stream_keeps_only_what_its_group_has_not_acknowledged() {
    let Some(mut redis) = redis_or_skip("the_return_stream_keeps_only").await else {
        return;
    };
    let stream = unique("r24");
    let group = unique("group");
    let returned = RedisParking::return_stream(&stream, &group);
    let mut source = group_builder(&stream, &group, "c1")
        .stream(&returned)
        .build()
        .await
        .expect("connect");
    let mut acker = source.acker();
    let parking = source
        .parking()
        .poll_interval(Duration::from_millis(50))
        .build()
        .await
        .expect("parking");
    // Ten copies as the mover writes them (due at once), read and
    // acknowledged by the group.
    let parked = RedisParking::parked_stream(&stream, &group);
    for n in 0..10 {
        let _: String = redis
            .xadd(
                &parked,
                "*",
                &[
                    ("payload", format!("c{n}")),
                    (DUE, "0".to_owned()),
                    (ORIGIN, stream.clone()),
                ],
            )
            .await
            .expect("XADD");
    }
    let back = receive(&mut source, 10, 10, Duration::from_secs(10)).await;
    assert_eq!(back.len(), 10);
    assert_eq!(xlen(&mut redis, &returned).await, 10);
    ack(&mut acker, &back[..4]).await;
    ack(&mut acker, &back[5..]).await;
    // Acknowledged up to c3; c4 is still pending; one more copy comes back
    // unread.
    let _: String = redis
        .xadd(
            &parked,
            "*",
            &[("payload", "c10"), (DUE, "0"), (ORIGIN, &stream)],
        )
        .await
        .expect("XADD");
    let left = wait_for_at_most(&mut redis, &returned, 7).await;
    assert_eq!(
        left, 7,
        "c0..c3 trimmed; c4 (pending) and all after it kept"
    );
    let kept = entries(&mut redis, &returned).await;
    assert_eq!(field(&kept[0], "payload").as_deref(), Some("c4"));
    assert_eq!(field(&kept[6], "payload").as_deref(), Some("c10"));

    ack(&mut acker, &back[4..5]).await;
    let unread = receive(&mut source, 1, 10, Duration::from_secs(5)).await;
    assert_eq!(payloads(&unread), vec!["c10"]);
    ack(&mut acker, &unread).await;
    assert_eq!(wait_for_at_most(&mut redis, &returned, 0).await, 0);
    assert_all_acknowledged(&mut redis, &returned, &group).await;
    parking.shutdown().await;
}

/// A second group on a return stream (none should be; if one is) keeps
/// what it has not read from being trimmed.
#[tokio::test]
async fn a_return_stream_is_trimmed_only_as_far_as_every_group_on_it_has_acknowledged() {
    let Some(mut redis) = redis_or_skip("a_return_stream_is_trimmed_only_as_far").await else {
        return;
    };
    let stream = unique("r24-two");
    let group = unique("group");
    let lagging = unique("lagging");
    let returned = RedisParking::return_stream(&stream, &group);
    let mut source = group_builder(&stream, &group, "c1")
        .stream(&returned)
        .build()
        .await
        .expect("connect");
    let mut acker = source.acker();
    redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&returned)
        .arg(&lagging)
        .arg("0")
        .query_async::<()>(&mut redis)
        .await
        .expect("XGROUP CREATE");
    let parking = source
        .parking()
        .poll_interval(Duration::from_millis(50))
        .build()
        .await
        .expect("parking");
    let parked = RedisParking::parked_stream(&stream, &group);
    for n in 0..5 {
        let _: String = redis
            .xadd(
                &parked,
                "*",
                &[
                    ("payload", format!("c{n}")),
                    (DUE, "0".to_owned()),
                    (ORIGIN, stream.clone()),
                ],
            )
            .await
            .expect("XADD");
    }
    let back = receive(&mut source, 5, 10, Duration::from_secs(10)).await;
    ack(&mut acker, &back).await;
    // A few rounds of the mover pass: the lagging group read nothing.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(xlen(&mut redis, &returned).await, 5);
    parking.shutdown().await;
}

/// `delete_acked` deletes an entry once this group acknowledged it; on a
/// stream that another group reads too, that would delete what the other
/// group has not read yet. Such a source is refused.
#[tokio::test]
async fn delete_acked_never_deletes_what_another_group_has_not_read() {
    let Some(mut redis) = redis_or_skip("delete_acked_never_deletes").await else {
        return;
    };
    let stream = unique("c12");
    let billing = unique("billing");
    let shipping = unique("shipping");
    produce(&mut redis, &stream, "m", 10).await;
    for group in [&billing, &shipping] {
        redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&stream)
            .arg(group)
            .arg("0")
            .query_async::<()>(&mut redis)
            .await
            .expect("XGROUP CREATE");
    }
    let built = group_builder(&stream, &billing, "c1")
        .delete_acked(true)
        .build()
        .await;
    match built {
        Err(Error::Config(error)) => {
            assert_eq!(error.setting, "delete_acked");
            assert!(error.problem.contains(&*shipping), "{error}");
        }
        Err(error) => panic!("refused for another reason: {error}"),
        Ok(mut source) => {
            let mut acker = source.acker();
            let read = receive(&mut source, 10, 10, Duration::from_secs(5)).await;
            ack(&mut acker, &read).await;
        }
    }
    // Shipping still reads every entry.
    let mut other = group_builder(&stream, &shipping, "c1")
        .build()
        .await
        .expect("connect");
    let read = receive(&mut other, 10, 10, Duration::from_secs(5)).await;
    assert_eq!(read.len(), 10, "shipping lost entries");
}

/// A group that starts reading the stream while a `delete_acked` source
/// runs stops the deleting: acknowledged entries stay, for the new group.
#[tokio::test]
async fn delete_acked_stops_deleting_once_another_group_reads_the_stream() {
    let Some(mut redis) = redis_or_skip("delete_acked_stops_deleting").await else {
        return;
    };
    let stream = unique("c12-later");
    let billing = unique("billing");
    let shipping = unique("shipping");
    produce(&mut redis, &stream, "m", 10).await;
    let mut source = group_builder(&stream, &billing, "c1")
        .delete_acked(true)
        .build()
        .await
        .expect("connect");
    let mut acker = source.acker();
    let read = receive(&mut source, 5, 5, Duration::from_secs(5)).await;
    ack(&mut acker, &read).await;
    assert_eq!(xlen(&mut redis, &stream).await, 5, "deleted with their ack");

    redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&stream)
        .arg(&shipping)
        .arg("0")
        .query_async::<()>(&mut redis)
        .await
        .expect("XGROUP CREATE");
    // Each deletion checks the stream's groups as it deletes.
    let read = receive(&mut source, 5, 5, Duration::from_secs(5)).await;
    ack(&mut acker, &read).await;
    assert_eq!(
        xlen(&mut redis, &stream).await,
        5,
        "acknowledged but kept for {shipping}"
    );
    let mut other = group_builder(&stream, &shipping, "c1")
        .build()
        .await
        .expect("connect");
    let read = receive(&mut other, 5, 10, Duration::from_secs(5)).await;
    assert_eq!(read.len(), 5);
}
