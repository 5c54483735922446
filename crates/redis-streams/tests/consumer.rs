//! The Redis Streams source and acker under the consumer runtime, and
//! parking (retry later without blocking): a parked message comes back to
//! its group's return stream once due (never to the origin, which other
//! groups read), outlives the parking that parked it, and runs through the
//! runtime's parking layer.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use intake_core::parking::{DUE, ORIGIN, PARK_ID, Parked, Parking, ParkingLayer, parks_header};
use intake_core::{Consumer, DeliveryOrder, HandlerError, Message};
use intake_redis_streams::{Error, RedisParking, RedisParkingBuilder, RedisSettings};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio_util::sync::CancellationToken;

use support::*;

/// Cancels `shutdown` once `count` calls of the returned closure were made.
fn stop_after(count: usize, shutdown: &CancellationToken) -> impl Fn() + Clone + use<> {
    let seen = Arc::new(AtomicUsize::new(0));
    let shutdown = shutdown.clone();
    move || {
        if seen.fetch_add(1, AtomicOrdering::SeqCst) + 1 == count {
            shutdown.cancel();
        }
    }
}

#[tokio::test]
async fn the_runtime_handles_and_acknowledges_every_entry() {
    let Some(mut redis) = redis_or_skip("the_runtime_handles_and_acknowledges_every_entry").await
    else {
        return;
    };
    let stream = unique("runtime");
    let group = unique("group");
    produce(&mut redis, &stream, "m", 1000).await;
    let source = group_builder(&stream, &group, "c1")
        .build()
        .await
        .expect("connect");
    let acker = source.acker();
    let shutdown = CancellationToken::new();
    let done = stop_after(1000, &shutdown);
    let handler = tower::service_fn(move |_message: Message| {
        done();
        std::future::ready(Ok::<_, HandlerError>(()))
    });
    let report = Consumer::builder()
        .max_in_flight(100)
        .ordering(DeliveryOrder::Unordered)
        .build(source, acker, handler)
        .expect("consumer")
        .run(shutdown)
        .await
        .expect("run");
    assert_eq!(report.succeeded, 1000);
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

#[tokio::test]
async fn a_retryable_failure_is_left_pending_and_comes_back_with_the_next_attempt() {
    let Some(mut redis) = redis_or_skip("a_retryable_failure_is_left_pending").await else {
        return;
    };
    let stream = unique("runtime-retry");
    let group = unique("group");
    produce(&mut redis, &stream, "m", 20).await;
    let source = group_builder(&stream, &group, "c1")
        .build()
        .await
        .expect("connect");
    let acker = source.acker();
    let shutdown = CancellationToken::new();
    let done = stop_after(20, &shutdown);
    let handler = tower::service_fn(move |message: Message| {
        let outcome = if message.metadata().attempt() == 1 {
            Err(HandlerError::retryable("downstream busy").without_backoff())
        } else {
            done();
            Ok(())
        };
        std::future::ready(outcome)
    });
    let report = tokio::time::timeout(
        Duration::from_secs(20),
        Consumer::builder()
            .max_in_flight(50)
            .ordering(DeliveryOrder::Key)
            .build(source, acker, handler)
            .expect("consumer")
            .run(shutdown),
    )
    .await
    .expect("every entry came back within the claim time")
    .expect("run");
    assert_eq!(report.requeued, 20, "each first attempt was left pending");
    assert_eq!(
        report.succeeded, 20,
        "and succeeded when it was claimed again"
    );
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

#[tokio::test]
async fn shutdown_leaves_unfinished_entries_pending_for_the_next_run() {
    let Some(mut redis) =
        redis_or_skip("shutdown_leaves_unfinished_entries_pending_for_the_next_run").await
    else {
        return;
    };
    let stream = unique("runtime-stop");
    let group = unique("group");
    produce(&mut redis, &stream, "m", 10).await;
    let config =
        || group_builder(&stream, &group, "stable").claim_min_idle(Duration::from_secs(600));
    let source = config().build().await.expect("connect");
    let acker = source.acker();
    let shutdown = CancellationToken::new();
    let stop = stop_after(5, &shutdown);
    // Handles five, then stops while the other five wait behind a handler
    // that never finishes in time.
    let handler = tower::service_fn(move |message: Message| {
        let stop = stop.clone();
        async move {
            let n: usize = String::from_utf8_lossy(message.payload())
                .trim_start_matches('m')
                .parse()
                .unwrap_or(0);
            if n >= 5 {
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            stop();
            Ok::<_, HandlerError>(())
        }
    });
    let report = Consumer::builder()
        .max_in_flight(10)
        .ordering(DeliveryOrder::Unordered)
        .shutdown_deadline(Duration::from_millis(200))
        .build(source, acker, handler)
        .expect("consumer")
        .run(shutdown)
        .await
        .expect("run");
    assert_eq!(report.succeeded, 5);
    assert_eq!(
        unacknowledged(&mut redis, &stream, &group).await.ok(),
        Some(5)
    );

    // The next run of the same consumer takes them up at once.
    let mut source = config().build().await.expect("connect");
    let mut acker = source.acker();
    let again = receive(&mut source, 5, 10, Duration::from_secs(5)).await;
    let mut names = payloads(&again);
    names.sort();
    assert_eq!(names, vec!["m5", "m6", "m7", "m8", "m9"]);
    ack(&mut acker, &again).await;
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

/// A parking of `stream` for `group` for tests: a short poll interval, so
/// that a park of another instance is seen soon.
fn parking_of(stream: &str, group: &str) -> RedisParkingBuilder {
    RedisParking::builder(redis_url())
        .group(group)
        .consumed_stream(stream)
        .poll_interval(Duration::from_millis(200))
}

/// A consumer of `stream` in `group` that reads the group's return stream
/// of `stream` too, as a consumer that parks does.
fn parking_consumer(stream: &str, group: &str) -> intake_redis_streams::RedisStreamsSourceBuilder {
    group_builder(stream, group, "c1").stream(RedisParking::return_stream(stream, group))
}

/// `message` with the headers the parking layer gives a copy it parks for
/// `delay`; returns it with its due time.
fn parked_copy(message: &Message, delay: Duration, park_id: u64) -> (Message, u64) {
    let due = now_millis() + delay.as_millis() as u64;
    let mut copy = message.clone();
    copy.headers_mut().set(DUE, due.to_string());
    copy.headers_mut().set(PARK_ID, park_id.to_string());
    if copy.headers().get(ORIGIN).is_none() {
        let origin = message.metadata().source().to_string();
        copy.headers_mut().set(ORIGIN, origin);
    }
    (copy, due)
}

async fn xlen(redis: &mut MultiplexedConnection, key: &str) -> u64 {
    redis.xlen(key).await.expect("XLEN")
}

/// Waits until `stream` holds `length` entries, at most `deadline`.
async fn wait_for_length(
    redis: &mut MultiplexedConnection,
    stream: &str,
    length: u64,
    deadline: Duration,
) -> u64 {
    let started = tokio::time::Instant::now();
    loop {
        let now = xlen(redis, stream).await;
        if now >= length || started.elapsed() > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_parked_message_comes_back_to_its_return_stream_after_its_due_time_with_its_fields() {
    let Some(mut redis) = redis_or_skip("a_parked_message_comes_back").await else {
        return;
    };
    let stream = unique("park");
    let group = unique("group");
    let returned = RedisParking::return_stream(&stream, &group);
    redis::cmd("XADD")
        .arg(&stream)
        .arg("*")
        .arg("payload")
        .arg("body")
        .arg("key")
        .arg("k1")
        .arg("trace")
        .arg("t-1")
        .query_async::<String>(&mut redis)
        .await
        .expect("XADD");
    let mut source = parking_consumer(&stream, &group)
        .key_field("key")
        .build()
        .await
        .expect("connect");
    let mut acker = source.acker();
    let original = receive(&mut source, 1, 10, Duration::from_secs(5)).await;
    assert_eq!(original.len(), 1);
    let parking = source
        .parking()
        .poll_interval(Duration::from_millis(200))
        .build()
        .await
        .expect("parking");
    assert_eq!(parking.return_stream_of(&stream), Some(returned.as_str()));

    let (copy, due) = parked_copy(&original[0], Duration::from_secs(1), 7);
    let parked = parking.park(&copy, Duration::from_secs(1)).await;
    assert!(matches!(parked, Ok(Parked::Moved)), "{parked:?}");
    ack(&mut acker, &original).await;

    let back = receive(&mut source, 1, 10, Duration::from_secs(20)).await;
    let arrived = now_millis();
    assert_eq!(back.len(), 1, "the parked copy came back within 20 s");
    assert!(
        arrived >= due,
        "back at {arrived}, before its due time {due}"
    );
    let back = &back[0];
    assert_eq!(
        &**back.metadata().source(),
        returned,
        "through the return stream"
    );
    assert_eq!(back.payload(), copy.payload());
    assert_eq!(back.key(), copy.key());
    assert_eq!(back.headers(), copy.headers(), "the same fields, in order");
    assert_eq!(
        xlen(&mut redis, &stream).await,
        1,
        "nothing added to the origin"
    );
    ack(&mut acker, std::slice::from_ref(back)).await;

    // Parked again from the return stream by a caller without the layer
    // (no origin or due header): it waits with the messages of its origin
    // for the delay asked, and comes back to the same return stream, naming
    // its origin.
    let mut again = back.clone();
    *again.headers_mut() = intake_core::Headers::default();
    for header in back.headers() {
        if &*header.name != ORIGIN && &*header.name != DUE {
            again
                .headers_mut()
                .insert(header.name.clone(), header.value.clone());
        }
    }
    let not_before = now_millis() + 500;
    let parked = parking.park(&again, Duration::from_millis(500)).await;
    assert!(matches!(parked, Ok(Parked::Moved)), "{parked:?}");
    assert_eq!(parking.waiting(&stream).await.ok(), Some(1));
    let back_again = receive(&mut source, 1, 10, Duration::from_secs(20)).await;
    let arrived = now_millis();
    assert_eq!(back_again.len(), 1, "back again within 20 s");
    assert!(arrived >= not_before, "back at {arrived}, due {not_before}");
    assert_eq!(&**back_again[0].metadata().source(), returned);
    assert_eq!(
        back_again[0].headers().get_str(ORIGIN),
        Some(stream.as_str())
    );
    ack(&mut acker, &back_again).await;

    assert_all_acknowledged(&mut redis, &stream, &group).await;
    assert_all_acknowledged(&mut redis, &returned, &group).await;
    assert_eq!(parking.waiting(&stream).await.ok(), Some(0));
    let indexed: u64 = redis
        .zcard(RedisParking::due_index(&stream, &group))
        .await
        .expect("ZCARD");
    assert_eq!(indexed, 0, "the due index is empty again");

    // A message of a stream the parking was not built for would never
    // come back: refused, so that the layer retries it the ordinary way.
    let other = Message::new(
        "body",
        intake_core::Metadata::new("another-stream".into(), 0, back.metadata().position()),
    );
    assert!(parking.park(&other, Duration::from_secs(1)).await.is_err());
    parking.shutdown().await;
    assert!(
        parking.park(&copy, Duration::from_secs(1)).await.is_err(),
        "a parking that was shut down refuses parks"
    );
}

#[tokio::test]
async fn a_parking_built_from_a_source_that_does_not_read_the_return_stream_is_refused() {
    let Some(_redis) = redis_or_skip("a_parking_built_from_a_source_that_does_not_read").await
    else {
        return;
    };
    let stream = unique("park-forgotten");
    let group = unique("group");
    let source = group_builder(&stream, &group, "c1")
        .build()
        .await
        .expect("connect");
    match source.parking().build().await {
        Err(Error::Config(error)) => {
            let expected = RedisParking::return_stream(&stream, &group);
            assert!(error.to_string().contains(&expected), "{error}");
        }
        other => panic!("expected a config error, got {other:?}"),
    }
}

#[tokio::test]
async fn another_group_of_the_origin_never_sees_a_parked_copy() {
    let Some(mut redis) = redis_or_skip("another_group_of_the_origin").await else {
        return;
    };
    let stream = unique("park-groups");
    let (billing, audit) = (unique("billing"), unique("audit"));
    let count = 5;
    produce(&mut redis, &stream, "m", count).await;
    let mut source = parking_consumer(&stream, &billing)
        .build()
        .await
        .expect("connect");
    // A group that exists before the park, and one made after the copies
    // are back.
    let mut before = group_builder(&stream, &audit, "c1")
        .build()
        .await
        .expect("connect");
    let mut acker = source.acker();
    let originals = receive(&mut source, count, count, Duration::from_secs(5)).await;
    assert_eq!(originals.len(), count);
    let parking = source
        .parking()
        .poll_interval(Duration::from_millis(200))
        .build()
        .await
        .expect("parking");
    let delay = Duration::from_millis(300);
    for (n, message) in originals.iter().take(3).enumerate() {
        let (copy, _) = parked_copy(message, delay, n as u64);
        let parked = parking.park(&copy, delay).await;
        assert!(matches!(parked, Ok(Parked::Moved)), "{parked:?}");
    }
    ack(&mut acker, &originals).await;
    let back = receive(&mut source, 3, 10, Duration::from_secs(20)).await;
    assert_eq!(payloads(&back), ["m0", "m1", "m2"], "the copies came back");
    ack(&mut acker, &back).await;

    let mut after = group_builder(&stream, &unique("late"), "c1")
        .build()
        .await
        .expect("connect");
    for other in [&mut before, &mut after] {
        let seen = receive(other, count + 3, count + 3, Duration::from_millis(500)).await;
        assert_eq!(
            payloads(&seen),
            ["m0", "m1", "m2", "m3", "m4"],
            "exactly the originals"
        );
        assert!(
            seen.iter()
                .all(|message| message.headers().get(PARK_ID).is_none())
        );
    }
    assert_all_acknowledged(&mut redis, &stream, &billing).await;
    parking.shutdown().await;
}

#[tokio::test]
async fn parked_messages_outlive_their_parking_and_two_movers_move_each_once() {
    let Some(mut redis) = redis_or_skip("parked_messages_outlive_their_parking").await else {
        return;
    };
    let stream = unique("park-outlive");
    let group = unique("group");
    let returned = RedisParking::return_stream(&stream, &group);
    let count = 20;
    produce(&mut redis, &stream, "m", count).await;
    let mut source = parking_consumer(&stream, &group)
        .build()
        .await
        .expect("connect");
    let mut acker = source.acker();
    let originals = receive(&mut source, count, count, Duration::from_secs(5)).await;
    assert_eq!(originals.len(), count);

    let parking = parking_of(&stream, &group).build().await.expect("parking");
    let delay = Duration::from_millis(800);
    let mut latest_due = 0;
    for (n, message) in originals.iter().enumerate() {
        let (copy, due) = parked_copy(message, delay, n as u64);
        latest_due = latest_due.max(due);
        let parked = parking.park(&copy, delay).await;
        assert!(matches!(parked, Ok(Parked::Moved)), "{parked:?}");
    }
    ack(&mut acker, &originals).await;
    // The process goes away before anything is due: its mover stops.
    drop(parking);
    tokio::time::sleep(delay + Duration::from_millis(500)).await;
    assert_eq!(xlen(&mut redis, &returned).await, 0, "no mover ran");
    let parked_stream = RedisParking::parked_stream(&stream, &group);
    assert_eq!(xlen(&mut redis, &parked_stream).await, count as u64);

    // Two instances start; between them each parked message moves once.
    let (first, second) = tokio::join!(
        parking_of(&stream, &group).batch(3).build(),
        parking_of(&stream, &group).batch(3).build()
    );
    let (first, second) = (first.expect("parking"), second.expect("parking"));
    let length =
        wait_for_length(&mut redis, &returned, count as u64, Duration::from_secs(20)).await;
    assert_eq!(length, count as u64, "every parked message came back");
    assert!(now_millis() >= latest_due);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        xlen(&mut redis, &returned).await,
        count as u64,
        "and none twice"
    );
    assert_eq!(xlen(&mut redis, &stream).await, count as u64);
    assert_eq!(xlen(&mut redis, &parked_stream).await, 0);
    let back = receive(&mut source, count, count, Duration::from_secs(5)).await;
    let mut names = payloads(&back);
    names.sort();
    let mut expected = payloads(&originals);
    expected.sort();
    assert_eq!(names, expected);
    ack(&mut acker, &back).await;
    assert_all_acknowledged(&mut redis, &stream, &group).await;
    assert_all_acknowledged(&mut redis, &returned, &group).await;
    first.shutdown().await;
    second.shutdown().await;
}

#[tokio::test]
async fn the_mover_moves_an_undated_entry_at_once_keeps_a_later_one_and_drops_a_vanished_one() {
    let Some(mut redis) = redis_or_skip("the_mover_moves_an_undated_entry_at_once").await else {
        return;
    };
    let stream = unique("park-malformed");
    let group = unique("group");
    let parked_stream = RedisParking::parked_stream(&stream, &group);
    let due_index = RedisParking::due_index(&stream, &group);
    let returned = RedisParking::return_stream(&stream, &group);
    // Written by hand: an entry without a due time, one due in an hour,
    // and index members that name no entry (one not even an id).
    redis::cmd("XADD")
        .arg(&parked_stream)
        .arg("*")
        .arg("payload")
        .arg("undated")
        .query_async::<String>(&mut redis)
        .await
        .expect("XADD");
    redis::cmd("XADD")
        .arg(&parked_stream)
        .arg("*")
        .arg("payload")
        .arg("later")
        .arg(DUE)
        .arg(now_millis() + 3_600_000)
        .query_async::<String>(&mut redis)
        .await
        .expect("XADD");
    let _: () = redis
        .zadd_multiple(&due_index, &[(0, "1-1"), (0, "not-an-id")])
        .await
        .expect("ZADD");

    // The first round runs in `build`.
    let parking = parking_of(&stream, &group).build().await.expect("parking");
    let moved = entries(&mut redis, &returned).await;
    assert_eq!(moved.len(), 1);
    assert_eq!(field(&moved[0], "payload").as_deref(), Some("undated"));
    assert_eq!(
        parking.waiting(&stream).await.ok(),
        Some(1),
        "the later one waits"
    );
    let indexed: Vec<String> = redis.zrange(&due_index, 0, -1).await.expect("ZRANGE");
    assert_eq!(indexed.len(), 1, "{indexed:?}");
    let later = entries(&mut redis, &parked_stream).await;
    assert_eq!(field(&later[0], "payload").as_deref(), Some("later"));
    parking.shutdown().await;

    // The mover made the group on the return stream, from its start, so
    // a source of the group made later (even one that starts at new
    // entries) reads the copy.
    let mut source = parking_consumer(&stream, &group)
        .start_from(intake_redis_streams::StartFrom::NewEntries)
        .build()
        .await
        .expect("connect");
    let back = receive(&mut source, 1, 10, Duration::from_secs(5)).await;
    assert_eq!(payloads(&back), ["undated"]);

    // A due index of another type fails the build, naming the key.
    let wrong = unique("park-wrong");
    let _: () = redis
        .set(RedisParking::due_index(&wrong, &group), "a string")
        .await
        .expect("SET");
    match parking_of(&wrong, &group).build().await {
        Err(error @ Error::WrongType { .. }) => {
            let chain = format!("{error} {:?}", std::error::Error::source(&error));
            assert!(
                chain.contains(&RedisParking::due_index(&wrong, &group)),
                "{chain}"
            );
        }
        other => panic!("expected WrongType, got {other:?}"),
    }
}

#[tokio::test]
async fn an_entry_a_failed_round_read_but_did_not_index_is_moved_by_the_next() {
    let Some(mut redis) = redis_or_skip("an_entry_a_failed_round_read").await else {
        return;
    };
    let stream = unique("park-interrupted");
    let group = unique("group");
    let parked_stream = RedisParking::parked_stream(&stream, &group);
    redis::cmd("XADD")
        .arg(&parked_stream)
        .arg("*")
        .arg("payload")
        .arg("interrupted")
        .arg(DUE)
        .arg(now_millis())
        .query_async::<String>(&mut redis)
        .await
        .expect("XADD");
    // What a round that stopped after its read (`OOM` on the `ZADD`)
    // leaves: the group's cursor past the entry, the entry pending.
    redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&parked_stream)
        .arg(RedisParking::MOVER_GROUP)
        .arg("0")
        .query_async::<()>(&mut redis)
        .await
        .expect("XGROUP CREATE");
    redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(RedisParking::MOVER_GROUP)
        .arg("mover")
        .arg("STREAMS")
        .arg(&parked_stream)
        .arg(">")
        .query_async::<redis::Value>(&mut redis)
        .await
        .expect("XREADGROUP");

    let parking = parking_of(&stream, &group).build().await.expect("parking");
    let moved = entries(&mut redis, &RedisParking::return_stream(&stream, &group)).await;
    assert_eq!(moved.len(), 1, "moved by the first round, in build");
    assert_eq!(field(&moved[0], "payload").as_deref(), Some("interrupted"));
    assert_eq!(parking.waiting(&stream).await.ok(), Some(0));
    parking.shutdown().await;
}

#[tokio::test]
async fn the_runtime_parks_retry_later_failures_and_handles_them_after_their_delay() {
    let Some(mut redis) = redis_or_skip("the_runtime_parks_retry_later_failures").await else {
        return;
    };
    let stream = unique("park-runtime");
    let group = unique("group");
    let count = 30;
    produce(&mut redis, &stream, "m", count).await;
    let source = parking_consumer(&stream, &group)
        .build()
        .await
        .expect("connect");
    let acker = source.acker();
    let parking = source
        .parking()
        .poll_interval(Duration::from_millis(200))
        .build()
        .await
        .expect("parking");
    let shutdown = CancellationToken::new();
    let done = stop_after(count, &shutdown);
    // Every third id asks for later on its first attempt; for each, when it
    // was handled again and the due time its copy carried.
    let late: Arc<Mutex<HashMap<String, (u64, u64)>>> = Arc::default();
    let handler = tower::ServiceBuilder::new()
        .layer(ParkingLayer::new(parking.clone()))
        .service(tower::service_fn({
            let late = Arc::clone(&late);
            move |message: Message| {
                let name = String::from_utf8_lossy(message.payload()).into_owned();
                let n: usize = name.trim_start_matches('m').parse().unwrap_or(0);
                let outcome = if n.is_multiple_of(3) && parks_header(&message) == 0 {
                    Err(HandlerError::retry_later(
                        "the ledger is down",
                        Duration::from_secs(1),
                    ))
                } else {
                    if parks_header(&message) > 0 {
                        let due = message
                            .headers()
                            .get_str(DUE)
                            .and_then(|due| due.parse().ok())
                            .unwrap_or(u64::MAX);
                        late.lock()
                            .expect("not poisoned")
                            .insert(name, (now_millis(), due));
                    }
                    done();
                    Ok(())
                };
                std::future::ready(outcome)
            }
        }));
    let report = tokio::time::timeout(
        Duration::from_secs(20),
        Consumer::builder()
            .max_in_flight(50)
            .build(source, acker, handler)
            .expect("consumer")
            .run(shutdown),
    )
    .await
    .expect("every id was handled within 20 s")
    .expect("run");
    assert_eq!(report.parked, 10, "{report:?}");
    assert_eq!(report.succeeded, count as u64, "{report:?}");
    let late = late.lock().expect("not poisoned").clone();
    let mut parked: Vec<_> = late.keys().cloned().collect();
    parked.sort();
    let mut expected: Vec<_> = (0..count)
        .filter(|n| n % 3 == 0)
        .map(|n| format!("m{n}"))
        .collect();
    expected.sort();
    assert_eq!(parked, expected, "the parked ids came back once each");
    for (name, (handled, due)) in &late {
        assert!(handled >= due, "{name} handled at {handled}, due {due}");
    }
    let returned = RedisParking::return_stream(&stream, &group);
    // The mover trims the copies the group acknowledged from the return
    // stream (tests/bounded_streams.rs), so at most the 10 are left.
    assert!(xlen(&mut redis, &returned).await <= 10);
    assert_eq!(xlen(&mut redis, &stream).await, count as u64);
    assert_all_acknowledged(&mut redis, &stream, &group).await;
    assert_all_acknowledged(&mut redis, &returned, &group).await;
    assert_eq!(parking.waiting(&stream).await.ok(), Some(0));
    parking.shutdown().await;
}

#[tokio::test]
async fn what_is_parked_when_redis_goes_away_moves_back_once_it_returns() {
    let Some(mut redis) = redis_or_skip("what_is_parked_when_redis_goes_away").await else {
        return;
    };
    let mut proxy = Proxy::start().await;
    let stream = unique("park-outage");
    let group = unique("group");
    let returned = RedisParking::return_stream(&stream, &group);
    let count = 5;
    produce(&mut redis, &stream, "m", count).await;
    let mut source = parking_consumer(&stream, &group)
        .build()
        .await
        .expect("connect");
    let originals = receive(&mut source, count, count, Duration::from_secs(5)).await;
    assert_eq!(originals.len(), count);
    let parking = RedisParking::builder(
        RedisSettings::new(format!("redis://{}", proxy.address()))
            .connect_timeout(Duration::from_millis(500))
            .command_timeout(Duration::from_millis(500)),
    )
    .group(&group)
    .consumed_stream(&stream)
    .poll_interval(Duration::from_millis(200))
    .build()
    .await
    .expect("parking");
    let delay = Duration::from_millis(700);
    let mut latest_due = 0;
    for (n, message) in originals.iter().enumerate() {
        let (copy, due) = parked_copy(message, delay, n as u64);
        latest_due = latest_due.max(due);
        let parked = parking.park(&copy, delay).await;
        assert!(matches!(parked, Ok(Parked::Moved)), "{parked:?}");
    }

    proxy.stop();
    // A park while Redis is away fails within its bound, and the parking
    // layer would retry that message the ordinary way.
    let (late, _) = parked_copy(&originals[0], delay, 99);
    let refused = tokio::time::timeout(Duration::from_secs(5), parking.park(&late, delay)).await;
    assert!(matches!(refused, Ok(Err(_))), "{refused:?}");
    tokio::time::sleep(delay).await;
    assert_eq!(
        xlen(&mut redis, &returned).await,
        0,
        "nothing moved while the mover could not reach Redis"
    );

    let _proxy = proxy.restart().await;
    let length =
        wait_for_length(&mut redis, &returned, count as u64, Duration::from_secs(20)).await;
    assert_eq!(length, count as u64, "every parked message came back");
    assert!(now_millis() >= latest_due);
    assert_eq!(parking.waiting(&stream).await.ok(), Some(0));
    parking.shutdown().await;
}

/// A returned copy that fails for good is a dead letter of its origin: it
/// goes to `{stream}:dlq`, where operators and `intake dlq --source STREAM`
/// look, and names the origin as its source, not the return stream it was
/// consumed from; the copy is acknowledged in the return stream.
#[tokio::test]
async fn a_returned_copy_that_fails_for_good_is_a_dead_letter_of_its_origin() {
    use intake_core::dead_letter::store::{DeadLetterStore as _, Filter};

    let Some(mut redis) = redis_or_skip("a_returned_copy_that_fails_for_good").await else {
        return;
    };
    let stream = unique("park-dlq");
    let group = unique("group");
    let returned = RedisParking::return_stream(&stream, &group);
    produce(&mut redis, &stream, "m", 1).await;
    let source = parking_consumer(&stream, &group)
        .build()
        .await
        .expect("connect");
    let acker = source.acker();
    let parking = source
        .parking()
        .poll_interval(Duration::from_millis(100))
        .build()
        .await
        .expect("parking");
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let handler = tower::ServiceBuilder::new()
        .layer(intake_core::DeadLetterLayer::new(sink.clone()))
        .layer(ParkingLayer::new(parking.clone()))
        .service(tower::service_fn(|message: Message| {
            std::future::ready(match parks_header(&message) {
                0 => Err(HandlerError::retry_later(
                    "not yet",
                    Duration::from_millis(300),
                )),
                _ => Err(HandlerError::permanent("still wrong")),
            })
        }));
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(
        Consumer::builder()
            .build(source, acker, handler)
            .expect("consumer")
            .run(shutdown.clone()),
    );
    let store = intake_redis_streams::RedisDeadLetters::builder(redis_url())
        .dead_letters_of(&stream)
        .build()
        .await
        .expect("the origin's dead letters")
        .store(
            intake_redis_streams::RedisStreamsPublisher::builder(redis_url())
                .build()
                .await
                .expect("publisher"),
        );
    let filter = Filter::all();
    let started = tokio::time::Instant::now();
    while store.count(&filter).await.unwrap_or(0) == 0
        && started.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    let report = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("stopped within 10 s")
        .expect("joined")
        .expect("run");
    assert_eq!(report.parked, 1, "{report:?}");
    assert_eq!(store.count(&filter).await.expect("count"), 1);
    let page = store.list(&filter, 10, None).await.expect("list");
    let letter = page.letters[0].letter.as_ref().expect("a letter");
    let metadata = letter.message.metadata();
    assert_eq!(&**metadata.source(), stream, "the origin, not {returned}");
    assert_eq!(
        letter
            .origin
            .as_ref()
            .and_then(|origin| origin.group.as_deref()),
        Some(group.as_str())
    );
    assert_eq!(sink.stream_for(&stream), format!("{stream}:dlq"));
    assert_eq!(xlen(&mut redis, &sink.stream_for(&returned)).await, 0);
    assert_all_acknowledged(&mut redis, &stream, &group).await;
    assert_all_acknowledged(&mut redis, &returned, &group).await;
    parking.shutdown().await;
}

/// An entry's `intake.park.origin` field is followed only to another
/// stream the consumer reads: one naming any other stream, its own, an
/// absurdly long name or bytes that are no text is dead-lettered as an
/// entry of the stream it was consumed from, so a producer cannot direct
/// letters to a stream of its choosing.
#[tokio::test]
async fn a_park_origin_naming_no_other_consumed_stream_is_not_followed() {
    use intake_core::DeadLetter;
    use intake_core::backend::DeadLetterSink as _;

    let Some(mut redis) = redis_or_skip("a_park_origin_naming_no_other_consumed_stream").await
    else {
        return;
    };
    let stream = unique("park-hostile");
    let group = unique("group");
    let returned = RedisParking::return_stream(&stream, &group);
    let elsewhere = unique("elsewhere");
    let mut source = parking_consumer(&stream, &group)
        .build()
        .await
        .expect("connect");
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let long = "o".repeat(100_000);
    let hostile: [&[u8]; 5] = [
        elsewhere.as_bytes(),
        returned.as_bytes(),
        long.as_bytes(),
        b"",
        b"\xff\xfe",
    ];
    for origin in hostile {
        let _: String = redis
            .xadd(&returned, "*", &[("payload", &b"x"[..]), (ORIGIN, origin)])
            .await
            .expect("XADD");
    }
    let received = receive(
        &mut source,
        hostile.len(),
        hostile.len(),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(received.len(), hostile.len());
    for message in received {
        sink.write(&DeadLetter::new(message, "bad", 1))
            .await
            .expect("written");
    }
    let letters = entries(&mut redis, &sink.stream_for(&returned)).await;
    assert_eq!(letters.len(), hostile.len());
    for letter in &letters {
        assert_eq!(
            field(letter, "intake.origin.source").as_deref(),
            Some(returned.as_str())
        );
    }
    assert_eq!(xlen(&mut redis, &sink.stream_for(&stream)).await, 0);
    assert_eq!(xlen(&mut redis, &sink.stream_for(&elsewhere)).await, 0);
    assert_all_acknowledged(&mut redis, &returned, &group).await;
}

/// In key order, while a key's message is parked its later messages wait
/// behind it, parked too, and come back after it through the return
/// stream; other keys flow meanwhile. The order per key holds although the
/// copies come back through another stream than their originals.
#[tokio::test]
async fn a_parked_key_keeps_its_order_through_the_return_stream_and_other_keys_flow() {
    let Some(mut redis) = redis_or_skip("a_parked_key_keeps_its_order").await else {
        return;
    };
    let stream = unique("park-order");
    let group = unique("group");
    // k1-0 k2-0 k3-0 k1-1 … k3-3, the key in the field `key`.
    let mut pipe = redis::pipe();
    for n in 0..4 {
        for key in ["k1", "k2", "k3"] {
            pipe.cmd("XADD")
                .arg(&stream)
                .arg("*")
                .arg("payload")
                .arg(format!("{key}-{n}"))
                .arg("key")
                .arg(key)
                .ignore();
        }
    }
    pipe.query_async::<()>(&mut redis).await.expect("XADD");
    let source = parking_consumer(&stream, &group)
        .key_field("key")
        .build()
        .await
        .expect("connect");
    let acker = source.acker();
    let parking = source
        .parking()
        .poll_interval(Duration::from_millis(100))
        .build()
        .await
        .expect("parking");
    let shutdown = CancellationToken::new();
    let done = stop_after(12, &shutdown);
    // Every run, in order: (payload, whether it succeeded).
    let runs: Arc<Mutex<Vec<(String, bool)>>> = Arc::default();
    let layer = ParkingLayer::new(parking.clone());
    let handler = tower::ServiceBuilder::new()
        .layer(layer.clone())
        .service(tower::service_fn({
            let runs = Arc::clone(&runs);
            move |message: Message| {
                let payload = String::from_utf8_lossy(message.payload()).into_owned();
                // k1-0 asks for later on its first two runs.
                let later = payload == "k1-0" && parks_header(&message) < 2;
                runs.lock().expect("not poisoned").push((payload, !later));
                let outcome = if later {
                    Err(HandlerError::retry_later(
                        "the ledger is down",
                        Duration::from_millis(300),
                    ))
                } else {
                    done();
                    Ok(())
                };
                std::future::ready(outcome)
            }
        }));
    let report = tokio::time::timeout(
        Duration::from_secs(20),
        Consumer::builder()
            .ordering(DeliveryOrder::Key)
            .build(source, acker, handler)
            .expect("consumer")
            .run(shutdown),
    )
    .await
    .expect("every message handled within 20 s")
    .expect("run");
    let runs = runs.lock().expect("not poisoned").clone();
    let succeeded = |key: &str| -> Vec<String> {
        runs.iter()
            .filter(|(payload, ok)| *ok && payload.starts_with(key))
            .map(|(payload, _)| payload.clone())
            .collect()
    };
    for key in ["k1", "k2", "k3"] {
        let expected: Vec<String> = (0..4).map(|n| format!("{key}-{n}")).collect();
        assert_eq!(succeeded(key), expected, "order of {key}: {runs:?}");
    }
    // k1's later messages never ran while k1-0 was parked.
    for n in 1..4 {
        let payload = format!("k1-{n}");
        let count = runs.iter().filter(|(p, _)| *p == payload).count();
        assert_eq!(count, 1, "{payload} ran {count} times: {runs:?}");
    }
    // The other keys did not wait for k1.
    let k1_done = runs
        .iter()
        .position(|(payload, ok)| payload == "k1-0" && *ok)
        .expect("k1-0 succeeded");
    for key in ["k2", "k3"] {
        let last = runs
            .iter()
            .position(|(payload, _)| *payload == format!("{key}-3"))
            .expect("last of the key");
        assert!(last < k1_done, "{key} waited for k1: {runs:?}");
    }
    assert!(report.parked >= 2 + 3, "{report:?}");
    // Every copy came back through the return stream and was known as
    // its origin's: the layer holds no key as parked any more.
    assert_eq!(layer.parked(), 0, "{runs:?}");
    let returned = RedisParking::return_stream(&stream, &group);
    assert_all_acknowledged(&mut redis, &stream, &group).await;
    assert_all_acknowledged(&mut redis, &returned, &group).await;
    parking.shutdown().await;
}
