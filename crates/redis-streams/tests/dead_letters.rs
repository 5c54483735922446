//! Dead letters against Redis's limits and against producers' fields: an
//! entry with more fields than one script call can pass is still
//! dead-lettered (without them, counted), the error text is capped, and the
//! envelope's fields (`intake.*`) cannot be spoofed by the producer.

mod support;

use std::time::Duration;

use intake_core::dead_letter::envelope;
use intake_core::{DeadLetter, backend::DeadLetterSink};
use intake_redis_streams::{DeadLetterStream, Error, RedisDeadLetterSink, RedisStreamsSource};
use redis::aio::MultiplexedConnection;

use support::*;

/// Receives the single entry of `stream` and hands it to the consumer's own
/// dead-letter sink with `error`.
async fn dead_letter_the_entry(
    stream: &str,
    group: &str,
    error: &str,
) -> (
    Result<(), intake_core::backend::DeadLetterError>,
    intake_redis_streams::RedisStreamsSource,
    intake_core::Message,
) {
    let mut source = group_builder(stream, group, "c1")
        .build()
        .await
        .expect("connect");
    let received = receive(&mut source, 1, 10, Duration::from_secs(5)).await;
    assert_eq!(received.len(), 1, "the entry was delivered");
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let written = sink
        .write(&DeadLetter::new(received[0].clone(), error, 3))
        .await;
    (written, source, received[0].clone())
}

async fn add(redis: &mut MultiplexedConnection, stream: &str, fields: &[(String, String)]) {
    let mut command = redis::cmd("XADD");
    command.arg(stream).arg("*");
    for (name, value) in fields {
        command.arg(name).arg(value);
    }
    command.query_async::<String>(redis).await.expect("XADD");
}

/// An entry of a payload and `headers` fields `h0`, `h1`, ….
fn wide_entry(headers: usize) -> Vec<(String, String)> {
    let mut fields = vec![("payload".to_owned(), "body".to_owned())];
    fields.extend((0..headers).map(|n| (format!("h{n}"), format!("v{n}"))));
    fields
}

#[tokio::test]
async fn an_entry_with_more_fields_than_a_script_can_pass_is_dead_lettered_without_them() {
    let Some(mut redis) = redis_or_skip("an_entry_with_more_fields_than_a_script").await else {
        return;
    };
    let stream = unique("wide");
    let group = unique("group");
    // Lua's unpack (and any call from a script) stops near 8,000 values.
    add(&mut redis, &stream, &wide_entry(5_000)).await;

    let (written, source, original) = dead_letter_the_entry(&stream, &group, "cannot parse").await;
    assert!(
        written.is_ok(),
        "the dead letter could not be written: {written:?}"
    );
    let dead = entries(&mut redis, &format!("{stream}:dlq")).await;
    assert_eq!(dead.len(), 1);
    let fields = &dead[0];
    assert_eq!(field(fields, "payload").as_deref(), Some("body"));
    assert_eq!(field(fields, "h0"), None, "the headers were left out");
    assert_eq!(
        field(fields, envelope::HEADERS_OMITTED).as_deref(),
        Some("5000")
    );
    let letter = dead_letter_of(fields).expect("a dead letter");
    assert_eq!(letter.headers_omitted, 5_000);
    assert!(letter.message.headers().is_empty());
    assert_eq!(&**letter.message.metadata().source(), stream);
    assert_eq!(
        letter.message.metadata().position(),
        original.metadata().position(),
        "the origin, to find the entry with its fields in the source"
    );
    assert_eq!(letter.error, "cannot parse");
    assert_eq!(source.counters().dead_letters_reduced(), 1);
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

#[tokio::test]
async fn an_entry_just_under_the_field_limit_is_dead_lettered_with_every_field() {
    let Some(mut redis) = redis_or_skip("an_entry_just_under_the_field_limit").await else {
        return;
    };
    // Payload, headers and the 13 fields of this letter's envelope (version,
    // broker, source, partition, position, group, consumer, class, message,
    // attempts, first, last, replays), two values each: exactly the limit,
    // and one header more is over it.
    let headers = intake_redis_streams::MAX_DEAD_LETTER_VALUES / 2 - 1 - 13;
    for (headers, reduced) in [(headers, false), (headers + 1, true)] {
        let stream = unique("wide-enough");
        let group = unique("group");
        add(&mut redis, &stream, &wide_entry(headers)).await;
        let (written, source, _) = dead_letter_the_entry(&stream, &group, "cannot parse").await;
        assert!(written.is_ok(), "{written:?}");
        let dead = entries(&mut redis, &format!("{stream}:dlq")).await;
        let letter = dead_letter_of(&dead[0]).expect("a dead letter");
        let last = format!("h{}", headers - 1);
        match reduced {
            false => {
                assert_eq!(letter.message.headers().len(), headers);
                assert_eq!(letter.headers_omitted, 0);
                assert_eq!(
                    letter.message.headers().get_str(&last),
                    Some(format!("v{}", headers - 1).as_str())
                );
            }
            true => {
                assert!(letter.message.headers().is_empty());
                assert_eq!(letter.headers_omitted as usize, headers);
            }
        }
        assert_eq!(source.counters().dead_letters_reduced(), u64::from(reduced));
    }
}

#[tokio::test]
async fn the_error_text_of_a_dead_letter_is_capped() {
    let Some(mut redis) = redis_or_skip("the_error_text_of_a_dead_letter_is_capped").await else {
        return;
    };
    let stream = unique("long-error");
    let group = unique("group");
    produce(&mut redis, &stream, "m", 1).await;
    let error = "é".repeat(1 << 20);
    let (written, _source, _) = dead_letter_the_entry(&stream, &group, &error).await;
    assert!(written.is_ok(), "{written:?}");
    let dead = entries(&mut redis, &format!("{stream}:dlq")).await;
    let text = field(&dead[0], envelope::ERROR_MESSAGE).expect("the error");
    assert!(
        text.len() <= DeadLetter::ERROR_LIMIT,
        "{} bytes",
        text.len()
    );
    assert!(text.starts_with("éé"), "cut at a character boundary");
    assert!(
        text.ends_with(" bytes cut)"),
        "{}",
        &text[text.len() - 20..]
    );
}

#[tokio::test]
async fn a_write_retried_after_its_reply_was_lost_writes_one_letter() {
    let Some(mut redis) = redis_or_skip("a_write_retried_after_its_reply_was_lost").await else {
        return;
    };
    let stream = unique("retried-letter");
    let group = unique("group");
    produce(&mut redis, &stream, "m", 1).await;
    let (written, source, message) = dead_letter_the_entry(&stream, &group, "poison").await;
    assert!(written.is_ok(), "{written:?}");
    // The caller saw a timeout and tries again: the first write went
    // through, so the second must not add a copy.
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let again = sink.write(&DeadLetter::new(message, "poison", 3)).await;
    assert!(again.is_ok(), "{again:?}");
    let dead = entries(&mut redis, &format!("{stream}:dlq")).await;
    assert_eq!(dead.len(), 1, "one dead letter");
    let pending: redis::streams::StreamPendingReply =
        redis::AsyncCommands::xpending(&mut redis, &stream, &group)
            .await
            .expect("XPENDING");
    assert_eq!(pending.count(), 0, "the original is acknowledged");
}

#[tokio::test]
async fn a_producer_field_named_like_an_envelope_field_does_not_change_the_letter() {
    let Some(mut redis) = redis_or_skip("a_producer_field_named_like_an_envelope_field").await
    else {
        return;
    };
    let stream = unique("spoof");
    let group = unique("group");
    let spoofed = [
        envelope::VERSION,
        envelope::ORIGIN_BROKER,
        envelope::ORIGIN_SOURCE,
        envelope::ORIGIN_PARTITION,
        envelope::ORIGIN_POSITION,
        envelope::ORIGIN_GROUP,
        envelope::ORIGIN_CONSUMER,
        envelope::ORIGIN_KEY,
        envelope::ERROR_CLASS,
        envelope::ERROR_MESSAGE,
        envelope::ATTEMPTS,
        envelope::FAILED_LAST,
        envelope::HEADERS_OMITTED,
        envelope::REFERENCE_PAYLOAD_BYTES,
    ];
    let mut fields = vec![("payload".to_owned(), "body".to_owned())];
    fields.extend(
        spoofed
            .iter()
            .map(|name| (name.to_string(), "spoofed".to_owned())),
    );
    fields.push(("dlq.custom".to_owned(), "kept".to_owned()));
    add(&mut redis, &stream, &fields).await;

    let (written, _source, original) = dead_letter_the_entry(&stream, &group, "rejected").await;
    assert!(written.is_ok(), "{written:?}");
    let dead = entries(&mut redis, &format!("{stream}:dlq")).await;
    let carried = &dead[0];
    for name in spoofed {
        assert!(
            carried
                .iter()
                .filter(|(field, _)| field == name)
                .all(|(_, value)| value.as_ref() != b"spoofed"),
            "{name} can be spoofed: {carried:?}"
        );
        let kept = format!("{}{name}", envelope::PRODUCER_PREFIX);
        assert_eq!(
            field(carried, &kept).as_deref(),
            Some("spoofed"),
            "the producer's {name} is kept as {kept}"
        );
    }
    let letter = dead_letter_of(carried).expect("a dead letter");
    assert_eq!(&**letter.message.metadata().source(), stream);
    assert_eq!(
        letter.message.metadata().position(),
        original.metadata().position()
    );
    assert_eq!(letter.message.key(), None, "the entry had no key");
    assert_eq!(letter.error, "rejected");
    assert_eq!(letter.reference, None);
    assert_eq!(letter.headers_omitted, 0);
    assert_eq!(
        letter.message.headers(),
        original.headers(),
        "the producer's fields come back under their own names"
    );
}

#[test]
fn a_dead_letter_stream_that_is_also_consumed_is_refused_when_built() {
    let error = RedisStreamsSource::builder("redis://127.0.0.1")
        .streams(["orders", "orders:dlq"])
        .group("g")
        .validate()
        .expect_err("dead letters would be consumed again");
    assert_eq!(error.setting, "dead_letter_stream");
}

#[tokio::test]
async fn a_letter_its_sink_would_write_back_into_its_own_stream_is_refused() {
    let Some(mut redis) = redis_or_skip("a_letter_its_sink_would_write_back").await else {
        return;
    };
    let stream = unique("loop");
    let group = unique("group");
    add(&mut redis, &stream, &wide_entry(0)).await;
    let mut source = group_builder(&stream, &group, "c1")
        .build()
        .await
        .expect("connect");
    let received = receive(&mut source, 1, 10, Duration::from_secs(5)).await;
    assert_eq!(received.len(), 1, "the entry was delivered");
    // A sink for other streams whose one destination is this stream: it
    // does not know this stream is consumed.
    let sink = RedisDeadLetterSink::builder(redis_url())
        .consumed_stream(unique("other"))
        .group(&group)
        .dead_letter_stream(DeadLetterStream::Fixed(stream.clone()))
        .build()
        .await
        .expect("sink");
    let written = sink
        .write(&DeadLetter::new(received[0].clone(), "rejected", 1))
        .await;
    assert!(written.is_err(), "the letter would be consumed again");
    assert_eq!(
        entries(&mut redis, &stream).await.len(),
        1,
        "nothing was written into the consumed stream"
    );
    assert_eq!(
        unacknowledged(&mut redis, &stream, &group).await.ok(),
        Some(1),
        "the original stays pending"
    );
}

#[tokio::test]
async fn a_sink_of_the_source_refuses_a_dead_letter_stream_the_source_reads() {
    if redis_or_skip("a_sink_of_the_source_refuses")
        .await
        .is_none()
    {
        return;
    }
    let stream = unique("consumed");
    let source = group_builder(&stream, &unique("group"), "c1")
        .build()
        .await
        .expect("connect");
    let built = source
        .dead_letter_sink()
        .dead_letter_stream(DeadLetterStream::Fixed(stream))
        .build()
        .await;
    match built {
        Err(Error::Config(error)) => assert_eq!(error.setting, "dead_letter_stream"),
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_sink_refuses_a_consumed_dead_letter_stream_before_connecting() {
    // Nothing listens on port 1: an attempt to connect would fail otherwise.
    let built = RedisDeadLetterSink::builder("redis://127.0.0.1:1")
        .consumed_stream("orders")
        .consumed_stream("payments")
        .dead_letter_stream(DeadLetterStream::Fixed("payments".into()))
        .build()
        .await;
    match built {
        Err(Error::Config(error)) => assert_eq!(error.setting, "dead_letter_stream"),
        other => panic!("expected a configuration error, got {other:?}"),
    }
}
