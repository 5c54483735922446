//! Parked copies that came back through a group's return stream, on a real
//! Redis: which entries the parking believes are its copies (their park
//! fields), and what the dead letter of such a copy names as its origin.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_core::backend::DeadLetterSink as _;
use intake_core::dead_letter::envelope;
use intake_core::parking::{
    DUE, ORIGIN, ORIGIN_PARTITION, ORIGIN_POSITION, PARKS, Parking as _, ParkingLayer, parks_header,
};
use intake_core::{Consumer, DeadLetter, DeliveryOrder, FirstDelivery, HandlerError, Message};
use intake_redis_streams::RedisParking;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio_util::sync::CancellationToken;

use support::*;

/// A consumer of `stream` in `group` that reads the group's return stream
/// of `stream` too, as a consumer that parks does.
fn parking_consumer(stream: &str, group: &str) -> intake_redis_streams::RedisStreamsSourceBuilder {
    group_builder(stream, group, "c1")
        .stream(RedisParking::return_stream(stream, group))
        .key_field("key")
}

async fn add(redis: &mut MultiplexedConnection, stream: &str, fields: &[(&str, &str)]) -> String {
    redis.xadd(stream, "*", fields).await.expect("XADD")
}

/// Waits until `stream` holds `length` entries, at most 20 s.
async fn wait_for_length(redis: &mut MultiplexedConnection, stream: &str, length: u64) {
    let started = tokio::time::Instant::now();
    while started.elapsed() < Duration::from_secs(20) {
        let now: u64 = redis.xlen(stream).await.expect("XLEN");
        if now >= length {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{stream} did not reach {length} entries within 20 s");
}

/// A parked copy that fails for good after it came back is a dead letter of
/// the entry it was first delivered as: the origin stream and that entry's
/// id (R4), not the origin with the id of the copy in the return stream,
/// which names another entry of the origin or none.
#[tokio::test]
async fn a_returned_copys_letter_names_the_origin_entry_it_was_first_delivered_as() {
    let Some(mut redis) = redis_or_skip("a_returned_copys_letter_names_the_origin_entry").await
    else {
        return;
    };
    let stream = unique("r4");
    let group = unique("group");
    let returned = RedisParking::return_stream(&stream, &group);
    add(&mut redis, &stream, &[("payload", "before"), ("key", "k0")]).await;
    let poison = add(&mut redis, &stream, &[("payload", "poison"), ("key", "k1")]).await;
    // Entries in the return stream ahead of the copy: its id there is no id
    // of the origin's.
    add(
        &mut redis,
        &returned,
        &[("payload", "unrelated"), ("key", "k2")],
    )
    .await;
    add(&mut redis, &stream, &[("payload", "after"), ("key", "k3")]).await;

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
            std::future::ready(match (message.payload().as_ref(), parks_header(&message)) {
                (b"poison", 0) => Err(HandlerError::retry_later(
                    "not yet",
                    Duration::from_millis(200),
                )),
                (b"poison", _) => Err(HandlerError::permanent("still wrong")),
                _ => Ok(()),
            })
        }));
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(
        Consumer::builder()
            .ordering(DeliveryOrder::Key)
            .build(source, acker, handler)
            .expect("consumer")
            .run(shutdown.clone()),
    );
    let dead_letters = sink.stream_for(&stream);
    wait_for_length(&mut redis, &dead_letters, 1).await;
    shutdown.cancel();
    let report = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("stopped within 10 s")
        .expect("joined")
        .expect("run");
    assert_eq!(report.parked, 1, "{report:?}");

    let letters = entries(&mut redis, &dead_letters).await;
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert_eq!(
        field(letter, envelope::ORIGIN_SOURCE).as_deref(),
        Some(stream.as_str())
    );
    assert_eq!(
        field(letter, envelope::ORIGIN_PARTITION).as_deref(),
        Some("0")
    );
    assert_eq!(
        field(letter, envelope::ORIGIN_POSITION).as_deref(),
        Some(poison.as_str()),
        "the poison entry's id in {stream}"
    );
    let read = dead_letter_of(letter).expect("a letter");
    assert_eq!(
        read.message.metadata().position().to_string(),
        poison,
        "read back, the letter's message is that entry"
    );
    assert_all_acknowledged(&mut redis, &stream, &group).await;
    assert_all_acknowledged(&mut redis, &returned, &group).await;
    parking.shutdown().await;
}

/// Park fields that a producer wrote on an entry of a stream the consumer
/// reads, which is no return stream, are not followed by the sink: the
/// letter is the entry's own, in its own stream's dead-letter stream, even
/// when the fields name another consumed stream and an entry there. A copy
/// in the return stream that names its origin but not where it was first
/// delivered (parked by hand, or by an older intake) names where it is.
#[tokio::test]
async fn park_fields_lead_a_letter_elsewhere_only_from_the_return_stream_of_their_origin() {
    let Some(mut redis) = redis_or_skip("park_fields_lead_a_letter_elsewhere_only").await else {
        return;
    };
    let orders = unique("r4-orders");
    let payments = unique("r4-payments");
    let group = unique("group");
    let returned = RedisParking::return_stream(&orders, &group);
    let real = add(&mut redis, &payments, &[("payload", "real"), ("key", "p")]).await;
    let forged = add(
        &mut redis,
        &orders,
        &[
            ("payload", "forged"),
            ("key", "o"),
            (ORIGIN, &payments),
            (ORIGIN_PARTITION, "0"),
            (ORIGIN_POSITION, &real),
        ],
    )
    .await;
    let copy = add(
        &mut redis,
        &returned,
        &[("payload", "copy"), ("key", "o"), (ORIGIN, &orders)],
    )
    .await;
    let mut source = group_builder(&orders, &group, "c1")
        .stream(&payments)
        .stream(&returned)
        .key_field("key")
        .build()
        .await
        .expect("connect");
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let received = receive(&mut source, 3, 10, Duration::from_secs(5)).await;
    assert_eq!(received.len(), 3);
    for message in received {
        if message.payload().as_ref() == b"real" {
            continue;
        }
        sink.write(&DeadLetter::new(message, "bad", 1))
            .await
            .expect("written");
    }
    let letters = entries(&mut redis, &sink.stream_for(&orders)).await;
    assert_eq!(letters.len(), 2, "both are letters of {orders}");
    let positions: Vec<(Option<String>, Option<String>)> = letters
        .iter()
        .map(|letter| {
            (
                field(letter, envelope::ORIGIN_SOURCE),
                field(letter, envelope::ORIGIN_POSITION),
            )
        })
        .collect();
    assert_eq!(
        positions,
        vec![
            (Some(orders.clone()), Some(forged)),
            (Some(returned.clone()), Some(copy)),
        ]
    );
    assert_eq!(
        entries(&mut redis, &sink.stream_for(&payments)).await.len(),
        0,
        "nothing in {payments}'s dead letters"
    );
}

/// The parking believes the park fields of the entries of its return
/// streams only: on an entry of the origin a producer wrote them, and the
/// parking layer drops them before the handler (no hold for `DUE`, no parks
/// counted from `intake.parks`, no origin); the copy it parks comes back
/// through the return stream with the layer's own fields, believed, and
/// the first delivery they name.
#[tokio::test]
async fn park_fields_are_believed_on_return_stream_copies_only() {
    let Some(mut redis) = redis_or_skip("park_fields_are_believed_on_return_stream_copies").await
    else {
        return;
    };
    let stream = unique("r25");
    let group = unique("group");
    let other_group = unique("other");
    let returned = RedisParking::return_stream(&stream, &group);
    let due = (std::time::SystemTime::now() + Duration::from_secs(3600))
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis()
        .to_string();
    let original = add(
        &mut redis,
        &stream,
        &[
            ("payload", "m"),
            ("key", "k"),
            (DUE, &due),
            (PARKS, "10"),
            (ORIGIN, "elsewhere"),
        ],
    )
    .await;
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

    // By the stream a message was read from.
    let at = |source: &str| {
        Message::new(
            "m",
            intake_core::Metadata::new(source.into(), 0, intake_core::Position::Offset(0)),
        )
    };
    assert!(parking.is_returned_copy(&at(&returned)));
    assert!(!parking.is_returned_copy(&at(&stream)));
    assert!(!parking.is_returned_copy(&at(&RedisParking::return_stream(&stream, &other_group))));
    assert!(!parking.is_returned_copy(&at(&RedisParking::parked_stream(&stream, &group))));

    // Each run: (read from, DUE, parks, parked_from).
    type Run = (String, Option<String>, u32, Option<FirstDelivery>);
    let runs: Arc<Mutex<Vec<Run>>> = Arc::default();
    let shutdown = CancellationToken::new();
    let handler = tower::ServiceBuilder::new()
        .layer(ParkingLayer::new(parking.clone()))
        .service(tower::service_fn({
            let runs = Arc::clone(&runs);
            let shutdown = shutdown.clone();
            move |message: Message| {
                let parks = parks_header(&message);
                runs.lock().expect("not poisoned").push((
                    message.metadata().source().to_string(),
                    message.headers().get_str(DUE).map(str::to_owned),
                    parks,
                    message.metadata().parked_from().cloned(),
                ));
                std::future::ready(if parks == 0 {
                    Err(HandlerError::retry_later(
                        "later",
                        Duration::from_millis(200),
                    ))
                } else {
                    shutdown.cancel();
                    Ok(())
                })
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
    .expect("handled within 20 s")
    .expect("run");
    assert_eq!(report.parked, 1, "{report:?}");
    assert_eq!(report.dead_lettered, 0, "{report:?}");
    let runs = runs.lock().expect("not poisoned").clone();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(
        runs[0],
        (stream.clone(), None, 0, None),
        "the producer's park fields were dropped"
    );
    let (read_from, copy_due, parks, parked_from) = &runs[1];
    assert_eq!(read_from, &returned);
    assert!(copy_due.is_some(), "the layer's own due time is believed");
    assert_eq!(*parks, 1);
    assert_eq!(
        parked_from.as_ref().map(|first| (
            first.source.to_string(),
            first.partition,
            first.position.to_string()
        )),
        Some((stream.clone(), 0, original)),
        "first delivered as the original entry"
    );
    assert_all_acknowledged(&mut redis, &stream, &group).await;
    assert_all_acknowledged(&mut redis, &returned, &group).await;
    parking.shutdown().await;
}
