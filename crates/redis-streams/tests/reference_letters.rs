//! Reference letters (R11, Redis part): when a letter cannot be written,
//! the dead-letter layer writes a reference instead (origin and sizes, no
//! payload), which says the original is still at its origin. On Redis that
//! holds only while the entry outlives its acknowledgement: not under
//! `delete_acked`, and not for a copy in a return stream, which the parking's
//! mover trims once acknowledged.

mod support;

use std::sync::Arc;
use std::time::Duration;

use intake_core::backend::{DeadLetterError, DeadLetterSink};
use intake_core::parking::ORIGIN;
use intake_core::{Consumer, DeadLetter, DeadLetterLayer, HandlerError, Message};
use intake_redis_streams::{RedisDeadLetterSink, RedisParking};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio_util::sync::CancellationToken;

use support::*;

/// A destination that refuses every whole letter (as one over a size limit
/// would) and takes references through the Redis sink.
#[derive(Clone)]
struct RefusesWholeLetters(Arc<RedisDeadLetterSink>);

#[async_trait::async_trait]
impl DeadLetterSink for RefusesWholeLetters {
    async fn write(&self, letter: &DeadLetter) -> Result<(), DeadLetterError> {
        if letter.reference.is_none() {
            return Err(DeadLetterError::rejected("too large for the destination"));
        }
        self.0.write(letter).await
    }
}

async fn xlen(redis: &mut MultiplexedConnection, key: &str) -> u64 {
    redis.xlen(key).await.expect("XLEN")
}

/// Runs one poison entry of `stream` through the dead-letter layer over a
/// destination that refuses whole letters; the run's report.
async fn run_poison(stream: &str, group: &str, delete_acked: bool) -> intake_core::RunReport {
    let source = group_builder(stream, group, "c1")
        .delete_acked(delete_acked)
        .build()
        .await
        .expect("connect");
    let acker = source.acker();
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let shutdown = CancellationToken::new();
    let handler = tower::ServiceBuilder::new()
        .layer(DeadLetterLayer::new(RefusesWholeLetters(Arc::new(sink))))
        .service(tower::service_fn({
            let shutdown = shutdown.clone();
            move |_message: Message| {
                shutdown.cancel();
                std::future::ready(Err::<(), _>(HandlerError::permanent("bad")))
            }
        }));
    tokio::time::timeout(
        Duration::from_secs(20),
        Consumer::builder()
            .shutdown_deadline(Duration::from_secs(2))
            .build(source, acker, handler)
            .expect("consumer")
            .run(shutdown),
    )
    .await
    .expect("stopped within 20 s")
    .expect("run")
}

/// Under `delete_acked` the acknowledgement deletes the entry: its
/// reference letter would point at nothing. The sink refuses it, and the
/// entry stays, pending, for a later attempt.
#[tokio::test]
async fn no_reference_letter_of_an_entry_its_acknowledgement_deletes() {
    let Some(mut redis) = redis_or_skip("no_reference_letter_of_an_entry").await else {
        return;
    };
    let stream = unique("r11");
    let group = unique("group");
    produce(&mut redis, &stream, "poison", 1).await;
    let report = run_poison(&stream, &group, true).await;
    assert_eq!(
        xlen(&mut redis, &format!("{stream}:dlq")).await,
        0,
        "no reference letter"
    );
    assert_eq!(report.dead_lettered, 0, "{report:?}");
    assert_eq!(
        xlen(&mut redis, &stream).await,
        1,
        "the entry is still there"
    );
    assert_eq!(
        unacknowledged(&mut redis, &stream, &group).await.ok(),
        Some(1),
        "and pending, for a later attempt"
    );
}

/// Without `delete_acked` the entry outlives its acknowledgement: the
/// reference letter is written and points at it.
#[tokio::test]
async fn a_reference_letter_points_at_an_entry_that_stays() {
    let Some(mut redis) = redis_or_skip("a_reference_letter_points_at_an_entry").await else {
        return;
    };
    let stream = unique("r11-kept");
    let group = unique("group");
    produce(&mut redis, &stream, "poison", 1).await;
    let report = run_poison(&stream, &group, false).await;
    assert_eq!(report.dead_lettered, 1, "{report:?}");
    let letters = entries(&mut redis, &format!("{stream}:dlq")).await;
    assert_eq!(letters.len(), 1);
    assert!(field(&letters[0], "intake.reference.payload_bytes").is_some());
    assert_eq!(xlen(&mut redis, &stream).await, 1, "the original is there");
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

/// A copy in a return stream would have a reference to itself, which the
/// mover trims once acknowledged: refused. One whose park fields name its
/// first delivery (the reference keeps them), or that the parking layer
/// marked with it (a dead-letter layer inside it), gets a reference to
/// that entry of the origin, which stays.
#[tokio::test]
async fn a_returned_copy_gets_a_reference_only_to_its_first_delivery() {
    let Some(mut redis) = redis_or_skip("a_returned_copy_gets_a_reference").await else {
        return;
    };
    let stream = unique("r11-copy");
    let group = unique("group");
    let returned = RedisParking::return_stream(&stream, &group);
    let original: String = redis
        .xadd(&stream, "*", &[("payload", "first")])
        .await
        .expect("XADD");
    let mut source = group_builder(&stream, &group, "c1")
        .stream(&returned)
        .build()
        .await
        .expect("connect");
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let first = receive(&mut source, 1, 10, Duration::from_secs(5)).await;
    assert_eq!(first.len(), 1);
    let _: String = redis
        .xadd(&returned, "*", &[("payload", "bare"), (ORIGIN, &stream)])
        .await
        .expect("XADD");
    let _: String = redis
        .xadd(
            &returned,
            "*",
            &[
                ("payload", "named"),
                (ORIGIN, &stream),
                ("intake.park.origin.partition", "0"),
                ("intake.park.origin.position", &original),
            ],
        )
        .await
        .expect("XADD");
    let copies = receive(&mut source, 2, 10, Duration::from_secs(5)).await;
    assert_eq!(payloads(&copies), vec!["bare", "named"]);
    let refused = sink
        .write(&DeadLetter::new(copies[0].clone(), "bad", 1).to_reference())
        .await;
    assert!(refused.is_err(), "a reference to a copy the mover trims");
    sink.write(&DeadLetter::new(copies[1].clone(), "bad", 1).to_reference())
        .await
        .expect("a reference to the first delivery its fields name");
    let mut marked = copies[1].clone();
    marked
        .metadata_mut()
        .set_parked_from(Some(first[0].metadata().first_delivery()));
    sink.write(&DeadLetter::new(marked, "bad", 1).to_reference())
        .await
        .expect("a reference to the first delivery");
    // Both letters are of one origin entry: the sink writes it once.
    let letters = entries(&mut redis, &sink.stream_for(&stream)).await;
    assert_eq!(letters.len(), 1);
    for letter in &letters {
        assert_eq!(
            field(letter, "intake.origin.position").as_deref(),
            Some(original.as_str())
        );
    }
}
