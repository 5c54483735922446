//! Entry ids whose milliseconds no clock reads (review L10): Redis takes
//! any explicit id up to `18446744073709551615-18446744073709551615`, and
//! the source makes an entry's timestamp from its id's milliseconds. An
//! entry with an id near `u64::MAX` arrives with the instant its id names
//! when the platform's clock type holds it, none otherwise, and never
//! panics the source. Against Redis on 127.0.0.1:6379 (skipped with a
//! printed reason when absent, unless `INTAKE_REQUIRE_BROKERS=1`).

mod support;

use std::time::{Duration, UNIX_EPOCH};

use intake_core::Position;
use intake_core::backend::Source;
use support::{group_builder, receive, redis_or_skip, unique};

#[tokio::test]
async fn entries_with_ids_near_the_largest_arrive_with_their_instant_or_none() {
    let test = "entries_with_ids_near_the_largest_arrive_with_their_instant_or_none";
    let Some(mut redis) = redis_or_skip(test).await else {
        return;
    };
    let stream = unique("far-ids");
    let ids = [
        (1_700_000_000_000_u64, 0_u64),
        (u64::MAX - 1, 7),
        (u64::MAX, 0),
        (u64::MAX, u64::MAX),
    ];
    for (ms, seq) in ids {
        redis::cmd("XADD")
            .arg(&stream)
            .arg(format!("{ms}-{seq}"))
            .arg("payload")
            .arg(format!("{ms}-{seq}"))
            .query_async::<String>(&mut redis)
            .await
            .expect("Redis takes any increasing explicit id");
    }
    let mut source = group_builder(&stream, &unique("group"), "c1")
        .build()
        .await
        .expect("connect");
    let received = receive(&mut source, ids.len(), 16, Duration::from_secs(10)).await;
    assert_eq!(received.len(), ids.len(), "every entry arrives");
    for (message, (ms, seq)) in received.iter().zip(ids) {
        assert_eq!(
            message.metadata().position(),
            Position::StreamId { ms, seq }
        );
        assert_eq!(
            message.metadata().timestamp(),
            UNIX_EPOCH.checked_add(Duration::from_millis(ms)),
            "entry {ms}-{seq}"
        );
    }
    source.close().await.expect("close");
}
