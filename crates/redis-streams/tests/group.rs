//! Consumer-group behaviour against a real Redis, driving the source and
//! the acker by hand the way the runtime does.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use intake_core::dead_letter::envelope;
use intake_core::{
    ErrorClass,
    backend::{AckBatch, AckMode, Acker, PartitionAck, Source},
};
use redis::{AsyncCommands, Value};

use support::*;

#[tokio::test]
async fn entries_arrive_with_payload_key_headers_and_position() {
    let Some(mut redis) =
        redis_or_skip("entries_arrive_with_payload_key_headers_and_position").await
    else {
        return;
    };
    let stream = unique("fields");
    let id: String = redis
        .xadd(
            &stream,
            "*",
            &[("payload", "hello"), ("customer", "c-7"), ("trace", "t1")],
        )
        .await
        .expect("XADD");
    let mut source = group_builder(&stream, &unique("group"), "c1")
        .key_field("customer")
        .build()
        .await
        .expect("connect");
    let acker = source.acker();
    assert_eq!(acker.mode(), AckMode::Ids);
    assert!(acker.supports_requeue());

    let received = receive(&mut source, 1, 10, Duration::from_secs(5)).await;
    let message = &received[0];
    assert_eq!(message.payload(), &Bytes::from_static(b"hello"));
    assert_eq!(message.key(), Some(&Bytes::from_static(b"c-7")));
    assert_eq!(message.headers().get_str("trace"), Some("t1"));
    assert_eq!(message.headers().get_str("customer"), Some("c-7"));
    assert_eq!(message.metadata().position().to_string(), id);
    assert_eq!(&**message.metadata().source(), stream.as_str());
    assert_eq!(message.metadata().partition(), 0);
    assert_eq!(message.metadata().attempt(), 1);
}

#[tokio::test]
async fn acknowledged_entries_leave_the_pending_list_in_one_batch() {
    let Some(mut redis) = redis_or_skip("acknowledged_entries_leave_the_pending_list").await else {
        return;
    };
    let streams = [unique("ack-a"), unique("ack-b")];
    let group = unique("group");
    for stream in &streams {
        produce(&mut redis, stream, "m", 300).await;
    }
    let mut source = group_builder(&streams[0], &group, "c1")
        .stream(&streams[1])
        .build()
        .await
        .expect("connect");
    let mut acker = source.acker();
    let received = receive(&mut source, 600, 1000, Duration::from_secs(10)).await;
    assert_eq!(received.len(), 600);
    for stream in &streams {
        assert_eq!(
            unacknowledged(&mut redis, stream, &group).await.ok(),
            Some(300)
        );
    }
    ack(&mut acker, &received).await;
    for stream in &streams {
        assert_eq!(
            unacknowledged(&mut redis, stream, &group).await.ok(),
            Some(0)
        );
    }
}

#[tokio::test]
async fn reading_stops_at_the_number_the_runtime_asks_for() {
    let Some(mut redis) = redis_or_skip("reading_stops_at_the_number_the_runtime_asks_for").await
    else {
        return;
    };
    let stream = unique("budget");
    let group = unique("group");
    produce(&mut redis, &stream, "m", 50).await;
    let mut source = group_builder(&stream, &group, "c1")
        .build()
        .await
        .expect("connect");
    let mut buffer = Vec::new();
    source.next(&mut buffer, 7).await.expect("next");
    assert_eq!(buffer.len(), 7);
    // Only what was handed out was read: the rest is not even pending yet.
    let pending: redis::streams::StreamPendingReply =
        redis.xpending(&stream, &group).await.expect("XPENDING");
    assert_eq!(pending.count(), 7);
}

#[tokio::test]
async fn a_full_budget_reads_nothing_and_the_next_call_reads_on() {
    let Some(mut redis) = redis_or_skip("a_full_budget_reads_nothing").await else {
        return;
    };
    let stream = unique("full");
    let group = unique("group");
    produce(&mut redis, &stream, "m", 5).await;
    let mut source = group_builder(&stream, &group, "c1")
        .build()
        .await
        .expect("connect");
    let mut buffer = Vec::new();
    let waited =
        tokio::time::timeout(Duration::from_millis(300), source.next(&mut buffer, 0)).await;
    assert!(waited.is_err(), "with no budget, next waits");
    assert!(buffer.is_empty());
    let pending: redis::streams::StreamPendingReply =
        redis.xpending(&stream, &group).await.expect("XPENDING");
    assert_eq!(pending.count(), 0, "nothing was read");
    let received = receive(&mut source, 5, 10, Duration::from_secs(5)).await;
    assert_eq!(payloads(&received), vec!["m0", "m1", "m2", "m3", "m4"]);
}

#[tokio::test]
async fn a_consumer_dropped_mid_batch_has_its_entries_claimed_by_another() {
    let Some(mut redis) =
        redis_or_skip("a_consumer_dropped_mid_batch_has_its_entries_claimed_by_another").await
    else {
        return;
    };
    let stream = unique("crash");
    let group = unique("group");
    produce(&mut redis, &stream, "m", 100).await;

    let mut doomed = group_builder(&stream, &group, "doomed")
        .build()
        .await
        .expect("connect");
    let mut doomed_acker = doomed.acker();
    let first = receive(&mut doomed, 60, 60, Duration::from_secs(5)).await;
    assert_eq!(first.len(), 60);
    // Half of the batch was handled and acknowledged, then the consumer died
    // without shutting down.
    ack(&mut doomed_acker, &first[..30]).await;
    drop((doomed, doomed_acker));

    let mut heir = group_builder(&stream, &group, "heir")
        .build()
        .await
        .expect("connect");
    let mut heir_acker = heir.acker();
    let rest = receive(&mut heir, 70, 100, Duration::from_secs(10)).await;
    ack(&mut heir_acker, &rest).await;

    let handled: BTreeSet<String> = payloads(&first[..30])
        .into_iter()
        .chain(payloads(&rest))
        .collect();
    let expected: BTreeSet<String> = (0..100).map(|n| format!("m{n}")).collect();
    assert_eq!(handled, expected, "every entry was handled");
    let claimed: Vec<_> = rest
        .iter()
        .filter(|message| message.metadata().attempt() == 2)
        .collect();
    assert_eq!(
        claimed.len(),
        30,
        "the 30 unfinished entries came back as second deliveries"
    );
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

#[tokio::test]
async fn a_restarted_consumer_takes_up_its_own_pending_entries_at_once() {
    let Some(mut redis) =
        redis_or_skip("a_restarted_consumer_takes_up_its_own_pending_entries_at_once").await
    else {
        return;
    };
    let stream = unique("restart");
    let group = unique("group");
    produce(&mut redis, &stream, "m", 10).await;
    // A claim would take 10 minutes: the entries can only come back as the
    // consumer's own.
    let config =
        || group_builder(&stream, &group, "stable-name").claim_min_idle(Duration::from_secs(600));
    let mut source = config().build().await.expect("connect");
    assert_eq!(
        receive(&mut source, 10, 10, Duration::from_secs(5))
            .await
            .len(),
        10
    );
    drop(source);

    let mut source = config().build().await.expect("connect");
    let mut acker = source.acker();
    let again = receive(&mut source, 10, 100, Duration::from_secs(5)).await;
    assert_eq!(
        payloads(&again),
        (0..10).map(|n| format!("m{n}")).collect::<Vec<_>>()
    );
    assert!(
        again
            .iter()
            .all(|message| message.metadata().attempt() == 2)
    );
    ack(&mut acker, &again).await;
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

#[tokio::test]
async fn retry_later_leaves_the_entry_pending_until_it_is_claimed_again() {
    let Some(mut redis) =
        redis_or_skip("retry_later_leaves_the_entry_pending_until_it_is_claimed_again").await
    else {
        return;
    };
    let stream = unique("retry");
    let group = unique("group");
    produce(&mut redis, &stream, "m", 1).await;
    let mut source = group_builder(&stream, &group, "c1")
        .build()
        .await
        .expect("connect");
    let mut acker = source.acker();
    let first = receive(&mut source, 1, 10, Duration::from_secs(5)).await;

    let mut batch = AckBatch::default();
    let mut partition = PartitionAck::new(partition(&stream));
    partition.requeue.push(first[0].metadata().position());
    partition.watermark = Some(first[0].metadata().position());
    batch.partitions.push(partition);
    acker.ack(&batch).await.expect("requeue");
    assert_eq!(
        unacknowledged(&mut redis, &stream, &group).await.ok(),
        Some(1)
    );

    let again = receive(&mut source, 1, 10, Duration::from_secs(5)).await;
    assert_eq!(
        again[0].metadata().position(),
        first[0].metadata().position()
    );
    assert_eq!(again[0].metadata().attempt(), 2);
}

#[tokio::test]
async fn a_poison_entry_past_max_deliveries_lands_in_the_dead_letter_stream_and_is_acknowledged() {
    let Some(mut redis) = redis_or_skip("a_poison_entry_past_max_deliveries").await else {
        return;
    };
    let stream = unique("poison");
    let group = unique("group");
    let id: String = redis
        .xadd(&stream, "*", &[("payload", "bad"), ("origin", "test")])
        .await
        .expect("XADD");
    let connect = || async {
        group_builder(&stream, &group, "c1")
            .max_deliveries(3)
            .build()
            .await
            .expect("connect")
    };

    // A crash loop: the handler never finishes, the process dies and its
    // successor (same name) takes the entry up again. It is delivered three
    // times, then the fourth delivery goes to the dead-letter stream
    // instead.
    let mut attempts = Vec::new();
    for _ in 0..3 {
        let mut source = connect().await;
        let delivered = receive(&mut source, 1, 10, Duration::from_secs(5)).await;
        attempts.extend(delivered.iter().map(|message| message.metadata().attempt()));
    }
    assert_eq!(attempts, vec![1, 2, 3]);
    let mut source = connect().await;
    let nothing = receive(&mut source, 1, 10, Duration::from_millis(1500)).await;
    assert!(
        nothing.is_empty(),
        "the entry was not dispatched a fourth time"
    );

    let dead = entries(&mut redis, &format!("{stream}:dlq")).await;
    assert_eq!(dead.len(), 1);
    let fields = &dead[0];
    assert_eq!(field(fields, "payload").as_deref(), Some("bad"));
    assert_eq!(field(fields, "origin").as_deref(), Some("test"));
    assert_eq!(
        field(fields, envelope::ORIGIN_SOURCE).as_deref(),
        Some(stream.as_str())
    );
    assert_eq!(field(fields, envelope::ORIGIN_POSITION), Some(id.clone()));
    let letter = dead_letter_of(fields).expect("a dead letter");
    assert_eq!(letter.message.metadata().position().to_string(), id);
    assert_eq!(letter.message.headers().get_str("origin"), Some("test"));
    let origin = letter.origin.as_ref().expect("origin");
    assert_eq!(origin.group.as_deref(), Some(group.as_str()));
    assert_eq!(origin.consumer.as_deref(), Some("c1"));
    assert_eq!(letter.attempts, 3);
    assert_eq!(
        letter.class,
        ErrorClass::Retryable,
        "its deliveries are used up"
    );
    assert!(letter.error.contains("max_deliveries"), "{}", letter.error);
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

#[tokio::test]
async fn an_entry_without_the_payload_field_is_dead_lettered_with_its_fields() {
    let Some(mut redis) = redis_or_skip("an_entry_without_the_payload_field").await else {
        return;
    };
    let stream = unique("nopayload");
    let group = unique("group");
    redis
        .xadd::<_, _, _, _, String>(&stream, "*", &[("body", "x")])
        .await
        .expect("XADD");
    produce(&mut redis, &stream, "ok", 1).await;
    let mut source = group_builder(&stream, &group, "c1")
        .build()
        .await
        .expect("connect");
    let received = receive(&mut source, 1, 10, Duration::from_secs(5)).await;
    assert_eq!(payloads(&received), vec!["ok0"]);
    let dead = entries(&mut redis, &format!("{stream}:dlq")).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(field(&dead[0], "body").as_deref(), Some("x"));
    assert_eq!(
        field(&dead[0], "payload"),
        None,
        "no payload field is invented"
    );
    let letter = dead_letter_of(&dead[0]).expect("a dead letter");
    assert!(letter.error.contains("payload_field"), "{}", letter.error);
    assert_eq!(letter.class, ErrorClass::Permanent);
    assert_eq!(letter.message.headers().get_str("body"), Some("x"));
}

#[tokio::test]
async fn the_dead_letter_sink_writes_the_origin_and_acknowledges_atomically() {
    let Some(mut redis) = redis_or_skip("the_dead_letter_sink_writes_the_origin").await else {
        return;
    };
    let stream = unique("sink");
    let group = unique("group");
    produce(&mut redis, &stream, "m", 1).await;
    let mut source = group_builder(&stream, &group, "c1")
        .build()
        .await
        .expect("connect");
    let received = receive(&mut source, 1, 10, Duration::from_secs(5)).await;
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let letter = intake_core::DeadLetter::new(received[0].clone(), "cannot parse", 4);
    intake_core::backend::DeadLetterSink::write(&sink, &letter)
        .await
        .expect("write");

    let dead = entries(&mut redis, &format!("{stream}:dlq")).await;
    assert_eq!(field(&dead[0], "payload").as_deref(), Some("m0"));
    let read = dead_letter_of(&dead[0]).expect("a dead letter");
    assert_eq!(read.error, "cannot parse");
    assert_eq!(read.attempts, 4);
    assert_eq!(
        read.message.metadata().position(),
        received[0].metadata().position()
    );
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

#[tokio::test]
async fn a_failed_dead_letter_write_leaves_the_original_pending() {
    let Some(mut redis) =
        redis_or_skip("a_failed_dead_letter_write_leaves_the_original_pending").await
    else {
        return;
    };
    let stream = unique("sinkfail");
    let group = unique("group");
    produce(&mut redis, &stream, "m", 1).await;
    // The dead-letter key holds a string: XADD fails with WRONGTYPE.
    redis
        .set::<_, _, ()>(format!("{stream}:dlq"), "occupied")
        .await
        .expect("SET");
    let mut source = group_builder(&stream, &group, "c1")
        .build()
        .await
        .expect("connect");
    let received = receive(&mut source, 1, 10, Duration::from_secs(5)).await;
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let letter = intake_core::DeadLetter::new(received[0].clone(), "bad", 1);
    let written = intake_core::backend::DeadLetterSink::write(&sink, &letter).await;
    assert!(written.is_err());
    assert_eq!(
        unacknowledged(&mut redis, &stream, &group).await.ok(),
        Some(1),
        "the original is not acknowledged without its copy"
    );
}

#[tokio::test]
async fn two_consumers_in_one_group_split_the_work() {
    let Some(mut redis) = redis_or_skip("two_consumers_in_one_group_split_the_work").await else {
        return;
    };
    let stream = unique("split");
    let group = unique("group");
    let consume = |name: &'static str| {
        let config = group_builder(&stream, &group, name);
        async move {
            let mut source = config.build().await.expect("connect");
            let mut acker = source.acker();
            let mut handled = Vec::new();
            let mut buffer = Vec::new();
            let mut idle = 0;
            while idle < 10 {
                buffer.clear();
                let _ =
                    tokio::time::timeout(Duration::from_millis(300), source.next(&mut buffer, 20))
                        .await;
                if buffer.is_empty() {
                    idle += 1;
                    continue;
                }
                idle = 0;
                ack(&mut acker, &buffer).await;
                handled.extend(payloads(&buffer));
                // Slow enough that the other consumer gets a share.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            handled
        }
    };
    let first = tokio::spawn(consume("one"));
    let second = tokio::spawn(consume("two"));
    for chunk in 0..10 {
        produce(&mut redis, &stream, &format!("c{chunk}-"), 50).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (first, second) = (first.await.expect("one"), second.await.expect("two"));
    assert!(
        !first.is_empty() && !second.is_empty(),
        "both consumers got work"
    );
    let all: BTreeSet<_> = first.iter().chain(second.iter()).cloned().collect();
    assert_eq!(all.len(), 500, "every entry was processed at least once");
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

#[tokio::test]
async fn connections_killed_from_outside_mid_run_lose_nothing() {
    let Some(mut redis) =
        redis_or_skip("connections_killed_from_outside_mid_run_lose_nothing").await
    else {
        return;
    };
    let stream = unique("kill");
    let group = unique("group");
    let consumer = unique("victim");
    // The consumer logs in as a user of its own, so that the kill below can
    // spare the connections of tests running alongside.
    let (user, _, url) = temporary_user(&mut redis).await;
    let mut source = intake_redis_streams::RedisStreamsSource::builder(url)
        .stream(&stream)
        .group(&group)
        .consumer(&consumer)
        .block(Duration::from_millis(100))
        .claim_min_idle(Duration::from_millis(500))
        .reconnect_backoff(intake_core::Constant::new(Duration::from_millis(50)).retry_forever())
        .build()
        .await
        .expect("connect");
    let mut acker = source.acker();
    let total = 2000;
    let producer = {
        let mut redis = redis.clone();
        let stream = stream.clone();
        let user = user.clone();
        tokio::spawn(async move {
            for chunk in 0..20 {
                produce(&mut redis, &stream, &format!("c{chunk}-"), total / 20).await;
                tokio::time::sleep(Duration::from_millis(15)).await;
                if chunk == 7 || chunk == 14 {
                    // Kills the consumer's normal clients: the source's
                    // reading connection and the acker's shared one.
                    let killed: i64 = redis::cmd("CLIENT")
                        .arg("KILL")
                        .arg("TYPE")
                        .arg("normal")
                        .arg("USER")
                        .arg(&user)
                        .query_async(&mut redis)
                        .await
                        .expect("CLIENT KILL");
                    assert!(killed >= 2, "the consumer's connections were killed");
                }
            }
        })
    };
    let mut handled = BTreeSet::new();
    let mut buffer = Vec::new();
    // Positions whose acknowledgement failed are sent again with the next
    // batch, as the runtime does.
    let mut unconfirmed = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while handled.len() < total && tokio::time::Instant::now() < deadline {
        buffer.clear();
        source
            .next(&mut buffer, 100)
            .await
            .expect("the source recovers by itself");
        let mut batch = AckBatch::default();
        let mut partition = PartitionAck::new(partition(&stream));
        partition.completed.append(&mut unconfirmed);
        partition
            .completed
            .extend(buffer.iter().map(|message| message.metadata().position()));
        batch.partitions.push(partition);
        if acker.ack(&batch).await.is_err() {
            unconfirmed = batch.partitions.remove(0).completed;
        }
        handled.extend(payloads(&buffer));
    }
    producer.await.expect("producer");
    assert_eq!(handled.len(), total, "every entry was handled");
    let mut batch = AckBatch::default();
    let mut last = PartitionAck::new(partition(&stream));
    last.completed = unconfirmed;
    batch.partitions.push(last);
    acker.ack(&batch).await.expect("final ack");
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

#[tokio::test]
async fn a_dropped_next_loses_no_entry() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("intake_redis_streams=debug")
        .try_init();
    let Some(redis) = redis_or_skip("a_dropped_next_loses_no_entry").await else {
        return;
    };
    let stream = unique("cancel");
    let group = unique("group");
    let mut source = group_builder(&stream, &group, "c1")
        .claim_min_idle(Duration::from_secs(600))
        .build()
        .await
        .expect("connect");
    let total: usize = 200;
    let mut dropped = 0;
    let mut producers = Vec::new();
    let mut handled = Vec::new();
    let mut buffer = Vec::new();
    for n in 0..total {
        let mut producer = redis.clone();
        let stream = stream.clone();
        // The entry lands while `next` is blocked, and `next` is dropped at a
        // moment that varies from round to round.
        producers.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_micros(200 * (n as u64 % 7))).await;
            producer
                .xadd::<_, _, _, _, String>(&stream, "*", &[("payload", format!("m{n}"))])
                .await
        }));
        buffer.clear();
        let call = tokio::time::timeout(
            Duration::from_micros(100 + 250 * (n as u64 % 9)),
            source.next(&mut buffer, 10),
        )
        .await;
        dropped += usize::from(call.is_err());
        handled.extend(payloads(&buffer));
    }
    for producer in producers {
        producer.await.expect("producer").expect("XADD");
    }
    handled.extend(payloads(
        &receive(
            &mut source,
            total - handled.len(),
            50,
            Duration::from_secs(10),
        )
        .await,
    ));
    assert!(dropped > 0, "calls were dropped midway");
    let distinct: BTreeSet<_> = handled.iter().cloned().collect();
    let missing: Vec<_> = (0..total)
        .map(|n| format!("m{n}"))
        .filter(|payload| !distinct.contains(payload))
        .collect();
    let mut inspect = redis.clone();
    let pending: redis::streams::StreamPendingReply =
        inspect.xpending(&stream, &group).await.expect("XPENDING");
    let mut seen = BTreeSet::new();
    let twice: Vec<_> = handled
        .iter()
        .filter(|payload| !seen.insert(payload.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "entries {missing:?} were lost ({} pending for the group; {} handled, {twice:?} twice)",
        pending.count(),
        handled.len(),
    );
    assert_eq!(distinct.len(), total, "no entry was lost");
    assert_eq!(handled.len(), total, "and none was delivered twice");
}

/// Polls `future` up to `polls` times, letting the runtime (and the
/// network) move between polls, and drops it if it is not done by then: a
/// cancellation at every await point in turn as `polls` grows, which a
/// timer (whose resolution is a millisecond) cannot aim at.
async fn poll_then_drop<F: std::future::Future>(future: F, polls: usize) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    for _ in 0..polls {
        let polled =
            std::future::poll_fn(|cx| std::task::Poll::Ready(future.as_mut().poll(cx))).await;
        if let std::task::Poll::Ready(output) = polled {
            return Some(output);
        }
        std::thread::sleep(Duration::from_micros(20));
        tokio::task::yield_now().await;
    }
    None
}

/// The delivery count of the group's first pending entry, 0 when nothing
/// is pending.
async fn first_pending_deliveries(
    redis: &mut redis::aio::MultiplexedConnection,
    stream: &str,
    group: &str,
) -> i64 {
    let rows: Value = redis::cmd("XPENDING")
        .arg(stream)
        .arg(group)
        .arg("-")
        .arg("+")
        .arg(10)
        .query_async(redis)
        .await
        .expect("XPENDING");
    match rows {
        Value::Array(rows) => match rows.first() {
            Some(Value::Array(row)) => match row.get(3) {
                Some(Value::Int(count)) => *count,
                other => panic!("no delivery count in {other:?}"),
            },
            _ => 0,
        },
        other => panic!("unexpected XPENDING reply {other:?}"),
    }
}

#[tokio::test]
async fn calls_dropped_while_re_reading_add_no_delivery() {
    let Some(mut redis) = redis_or_skip("calls_dropped_while_re_reading_add_no_delivery").await
    else {
        return;
    };
    let stream = unique("re-read");
    let group = unique("group");
    let mut source = group_builder(&stream, &group, "c1")
        .claim_min_idle(Duration::from_secs(600))
        .max_deliveries(2)
        .build()
        .await
        .expect("connect");
    let mut buffer = Vec::new();
    // A blocking read of new entries, dropped while it waits: the entry
    // added next is served to it, enters the pending list once and never
    // reaches the source.
    let waiting = tokio::time::timeout(Duration::from_millis(300), source.next(&mut buffer, 10));
    assert!(waiting.await.is_err(), "nothing to read yet");
    produce(&mut redis, &stream, "m", 1).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while first_pending_deliveries(&mut redis, &stream, &group).await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the waiting read took the entry"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        first_pending_deliveries(&mut redis, &stream, &group).await,
        1
    );
    // Later calls re-read it; each one dropped at a later await point than
    // the one before, until one completes.
    let mut dropped = 0;
    let received = loop {
        buffer.clear();
        match poll_then_drop(source.next(&mut buffer, 10), dropped + 1).await {
            Some(result) => {
                result.expect("next");
                break std::mem::take(&mut buffer);
            }
            None => dropped += 1,
        }
        assert!(
            tokio::time::Instant::now() < deadline + Duration::from_secs(10),
            "no call delivered the entry ({dropped} dropped)"
        );
    };
    assert!(dropped > 0, "calls were dropped before one completed");
    assert_eq!(payloads(&received), ["m0"]);
    assert_eq!(
        received[0].metadata().attempt(),
        1,
        "{dropped} dropped calls counted as deliveries of an entry the handler never saw"
    );
    assert_eq!(
        first_pending_deliveries(&mut redis, &stream, &group).await,
        1,
        "Redis counts one delivery"
    );
    assert_eq!(source.counters().dead_lettered(), 0);
}

#[tokio::test]
async fn a_poison_entry_is_dead_lettered_once_however_its_calls_are_dropped() {
    let Some(mut redis) =
        redis_or_skip("a_poison_entry_is_dead_lettered_once_however_its_calls_are_dropped").await
    else {
        return;
    };
    let stream = unique("poison-drop");
    let group = unique("group");
    redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&stream)
        .arg(&group)
        .arg("0")
        .arg("MKSTREAM")
        .query_async::<()>(&mut redis)
        .await
        .expect("XGROUP CREATE");
    produce(&mut redis, &stream, "m", 1).await;
    // An earlier process of consumer c1 took the entry and failed on it
    // five times: past max_deliveries, the restarted source dead-letters it.
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(&group)
        .arg("c1")
        .arg("STREAMS")
        .arg(&stream)
        .arg(">")
        .query_async(&mut redis)
        .await
        .expect("XREADGROUP");
    let id: Vec<(String, Vec<(String, String)>)> =
        redis.xrange(&stream, "-", "+").await.expect("XRANGE");
    let _: Value = redis::cmd("XCLAIM")
        .arg(&stream)
        .arg(&group)
        .arg("c1")
        .arg(0)
        .arg(&id[0].0)
        .arg("RETRYCOUNT")
        .arg(5)
        .arg("JUSTID")
        .query_async(&mut redis)
        .await
        .expect("XCLAIM");
    let mut source = group_builder(&stream, &group, "c1")
        .claim_min_idle(Duration::from_secs(600))
        .max_deliveries(2)
        .build()
        .await
        .expect("connect");
    // Every call is dropped, each at a later await point than the one
    // before: before, during and after the dead-letter write.
    let mut buffer = Vec::new();
    for polls in 1..=200 {
        buffer.clear();
        let finished = poll_then_drop(source.next(&mut buffer, 10), polls).await;
        assert!(finished.is_none(), "nothing is delivered to a handler");
    }
    let dead = entries(&mut redis, &format!("{stream}:dlq")).await;
    assert_eq!(dead.len(), 1, "dead-lettered exactly once");
    assert_eq!(
        first_pending_deliveries(&mut redis, &stream, &group).await,
        0,
        "and acknowledged"
    );
    // A write whose reply was lost with its call is not counted: the
    // source cannot tell it from one made by another consumer.
    assert!(source.counters().dead_lettered() <= 1);
}

#[tokio::test]
async fn delete_acked_removes_entries_with_their_acknowledgement() {
    let Some(mut redis) = redis_or_skip("delete_acked_removes_entries").await else {
        return;
    };
    let stream = unique("xdel");
    let group = unique("group");
    produce(&mut redis, &stream, "m", 20).await;
    let mut source = group_builder(&stream, &group, "c1")
        .delete_acked(true)
        .build()
        .await
        .expect("connect");
    let mut acker = source.acker();
    let received = receive(&mut source, 20, 50, Duration::from_secs(5)).await;
    ack(&mut acker, &received).await;
    let length: u64 = redis.xlen(&stream).await.expect("XLEN");
    assert_eq!(length, 0);
}

#[tokio::test]
async fn closing_an_idle_consumer_removes_it_from_the_group() {
    let Some(mut redis) = redis_or_skip("closing_an_idle_consumer_removes_it_from_the_group").await
    else {
        return;
    };
    let stream = unique("close");
    let group = unique("group");
    produce(&mut redis, &stream, "m", 3).await;
    let mut source = group_builder(&stream, &group, "leaving")
        .build()
        .await
        .expect("connect");
    let mut acker = source.acker();
    let received = receive(&mut source, 3, 10, Duration::from_secs(5)).await;
    ack(&mut acker, &received[..2]).await;
    source.close().await.expect("close");
    let consumers: Vec<Value> = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(&stream)
        .arg(&group)
        .query_async(&mut redis)
        .await
        .expect("XINFO");
    assert_eq!(consumers.len(), 1, "a consumer with a pending entry stays");

    ack(&mut acker, &received[2..]).await;
    source.close().await.expect("close");
    let consumers: Vec<Value> = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(&stream)
        .arg(&group)
        .query_async(&mut redis)
        .await
        .expect("XINFO");
    assert!(consumers.is_empty(), "an idle consumer leaves the group");
}
