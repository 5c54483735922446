//! Dead letters against Redis's limits and against producers' fields: an
//! entry with more fields than one script call can pass is still
//! dead-lettered (without them, counted), the error text is capped, and the
//! origin fields (`dlq.*`) cannot be spoofed by the producer.

mod support;

use std::time::Duration;

use intake_core::{DeadLetter, DeadLetterSink};
use intake_redis_streams::{RedisStreamsConfig, dead_letter_fields};
use redis::aio::MultiplexedConnection;

use support::*;

/// Receives the single entry of `stream` and hands it to the consumer's own
/// dead-letter sink with `error`.
async fn dead_letter_the_entry(
    stream: &str,
    group: &str,
    error: &str,
) -> (
    Result<(), intake_core::DeadLetterError>,
    intake_redis_streams::RedisStreamsSource,
) {
    let (mut source, _acker) = group_config(stream, group, "c1")
        .connect()
        .await
        .expect("connect");
    let received = receive(&mut source, 1, 10, Duration::from_secs(5)).await;
    assert_eq!(received.len(), 1, "the entry was delivered");
    let sink = source.dead_letter_sink();
    let written = sink
        .write(&DeadLetter::new(received[0].clone(), error, 3))
        .await;
    (written, source)
}

async fn add(redis: &mut MultiplexedConnection, stream: &str, fields: &[(String, String)]) {
    let mut command = redis::cmd("XADD");
    command.arg(stream).arg("*");
    for (name, value) in fields {
        command.arg(name).arg(value);
    }
    command.query_async::<String>(redis).await.expect("XADD");
}

#[tokio::test]
async fn an_entry_with_more_fields_than_a_script_can_pass_is_dead_lettered_without_them() {
    let Some(mut redis) = redis_or_skip("an_entry_with_more_fields_than_a_script").await else {
        return;
    };
    let stream = unique("wide");
    let group = unique("group");
    // Lua's unpack (and any call from a script) stops near 8,000 values.
    let mut fields = vec![("payload".to_owned(), "body".to_owned())];
    fields.extend((0..5_000).map(|n| (format!("h{n}"), format!("v{n}"))));
    add(&mut redis, &stream, &fields).await;

    let (written, source) = dead_letter_the_entry(&stream, &group, "cannot parse").await;
    assert!(
        written.is_ok(),
        "the dead letter could not be written: {written:?}"
    );
    let dead = entries(&mut redis, &format!("{stream}:dlq")).await;
    assert_eq!(dead.len(), 1);
    let letter = &dead[0];
    assert_eq!(field(letter, "payload").as_deref(), Some("body"));
    assert_eq!(field(letter, "h0"), None, "the headers were left out");
    assert_eq!(
        field(letter, dead_letter_fields::FIELDS_OMITTED).as_deref(),
        Some("5000")
    );
    assert_eq!(
        field(letter, dead_letter_fields::STREAM),
        Some(stream.clone())
    );
    assert!(field(letter, dead_letter_fields::ID).is_some());
    assert_eq!(source.stats().dead_letters_reduced(), 1);
    assert_all_acknowledged(&mut redis, &stream, &group).await;
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
    let (written, _source) = dead_letter_the_entry(&stream, &group, &error).await;
    assert!(written.is_ok(), "{written:?}");
    let dead = entries(&mut redis, &format!("{stream}:dlq")).await;
    let text = field(&dead[0], dead_letter_fields::ERROR).expect("the error");
    assert!(
        text.len() <= intake_redis_streams::MAX_DEAD_LETTER_ERROR_LEN + 64,
        "{} bytes",
        text.len()
    );
    assert!(text.starts_with("éé"), "cut at a character boundary");
    assert!(
        text.ends_with("(truncated)"),
        "{}",
        &text[text.len() - 20..]
    );
}

#[tokio::test]
async fn origin_fields_win_over_producer_fields_of_the_same_name() {
    let Some(mut redis) = redis_or_skip("origin_fields_win_over_producer_fields").await else {
        return;
    };
    let stream = unique("spoof");
    let group = unique("group");
    let spoofed = [
        dead_letter_fields::STREAM,
        dead_letter_fields::ID,
        dead_letter_fields::GROUP,
        dead_letter_fields::CONSUMER,
        dead_letter_fields::ERROR,
        dead_letter_fields::ATTEMPTS,
        dead_letter_fields::FAILED_AT,
        dead_letter_fields::FIELDS_OMITTED,
    ];
    let mut fields = vec![("payload".to_owned(), "body".to_owned())];
    fields.extend(
        spoofed
            .iter()
            .map(|name| (name.to_string(), "spoofed".to_owned())),
    );
    fields.push(("dlq.custom".to_owned(), "kept".to_owned()));
    add(&mut redis, &stream, &fields).await;

    let (written, _source) = dead_letter_the_entry(&stream, &group, "rejected").await;
    assert!(written.is_ok(), "{written:?}");
    let dead = entries(&mut redis, &format!("{stream}:dlq")).await;
    let letter = &dead[0];
    for name in spoofed {
        let values: Vec<_> = letter
            .iter()
            .filter(|(field, _)| field == name)
            .map(|(_, value)| String::from_utf8_lossy(value).into_owned())
            .collect();
        assert!(
            values.iter().all(|value| value != "spoofed"),
            "{name} can be spoofed: {values:?}"
        );
        let original = format!("{}{name}", dead_letter_fields::PRODUCER_PREFIX);
        assert_eq!(
            field(letter, &original).as_deref(),
            Some("spoofed"),
            "the producer's {name} is kept as {original}"
        );
    }
    assert_eq!(
        field(letter, dead_letter_fields::STREAM),
        Some(stream.clone())
    );
    assert_eq!(
        field(letter, dead_letter_fields::ERROR).as_deref(),
        Some("rejected")
    );
    assert_eq!(field(letter, "dlq.custom").as_deref(), Some("kept"));
}

#[test]
fn a_dead_letter_stream_that_is_also_consumed_is_refused_when_built() {
    let error = RedisStreamsConfig::new("redis://127.0.0.1")
        .streams(["orders", "orders:dlq"])
        .group("g")
        .validate()
        .expect_err("dead letters would be consumed again");
    assert_eq!(error.setting, "dead_letter_stream");
}

#[tokio::test]
async fn an_entry_just_under_the_field_limit_is_dead_lettered_with_every_field() {
    let Some(mut redis) = redis_or_skip("an_entry_just_under_the_field_limit").await else {
        return;
    };
    let stream = unique("wide-enough");
    let group = unique("group");
    // Payload, headers and the eight origin fields, two values each.
    let headers = intake_redis_streams::MAX_DEAD_LETTER_VALUES / 2 - 1 - 8;
    let mut fields = vec![("payload".to_owned(), "body".to_owned())];
    fields.extend((0..headers).map(|n| (format!("h{n}"), format!("v{n}"))));
    add(&mut redis, &stream, &fields).await;

    let (written, source) = dead_letter_the_entry(&stream, &group, "cannot parse").await;
    assert!(written.is_ok(), "{written:?}");
    let dead = entries(&mut redis, &format!("{stream}:dlq")).await;
    let letter = &dead[0];
    assert_eq!(
        field(letter, &format!("h{}", headers - 1)),
        Some(format!("v{}", headers - 1))
    );
    assert_eq!(field(letter, dead_letter_fields::FIELDS_OMITTED), None);
    assert_eq!(source.stats().dead_letters_reduced(), 0);
}
