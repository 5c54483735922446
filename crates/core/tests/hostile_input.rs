//! Bad input and hostile conditions: what a broker delivers is outside
//! input, and none of it may panic the consumer, stall it, or get a message
//! acknowledged unprocessed.
//!
//! - The parsers of outside input (the W3C `traceparent` header, the payload
//!   decoders, payload previews in errors) under arbitrary bytes
//!   (proptest): never a panic; a rejection is `None` or a typed error.
//! - Corrupt and oversized payloads through the runtime on the memory
//!   broker: the good ones are handled, the bad ones dead-lettered with the
//!   decoder's error, everything committed.
//! - A handler that never returns: a `tower::timeout` and the shutdown
//!   deadline still end the run, the message stays unacknowledged, and the
//!   broker delivers it again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use intake_core::consumer::{Consumer, DeliveryOrder, RunError, RunReport};
use intake_core::dead_letter::DeadLetterLayer;
use intake_core::decode::{DecodeError, PREVIEW_LIMIT};
use intake_core::memory::{MemoryBroker, Record};
use intake_core::message::payload_preview;
use intake_core::trace::{TRACEPARENT, TraceLayer, TraceParent};
use intake_core::{Constant, Decode, Decoded, HandlerError, Json, Message, handler_fn};
use proptest::prelude::*;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;
use tower::timeout::TimeoutLayer;

#[derive(Debug, Deserialize)]
#[allow(dead_code)] // read only through `Debug`: decoding is what is tested
struct Order {
    id: u64,
    customer: String,
    lines: Vec<Line>,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct Line {
    sku: String,
    quantity: u32,
}

/// A valid traceparent, then any of its bytes replaced: most mutants are a
/// near miss of the grammar, where a parser is most likely to slip.
fn near_traceparent() -> impl Strategy<Value = Vec<u8>> {
    let valid = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_vec();
    prop::collection::vec((0..valid.len(), any::<u8>()), 0..4).prop_map(move |edits| {
        let mut value = valid.clone();
        for (at, byte) in edits {
            value[at] = byte;
        }
        value
    })
}

/// JSON-ish bytes: fragments of valid documents glued in any order, so the
/// decoder sees truncations, unbalanced brackets and wrong types more often
/// than random bytes would produce them.
fn jsonish() -> impl Strategy<Value = Vec<u8>> {
    let fragments = prop::sample::select(vec![
        "{",
        "}",
        "[",
        "]",
        "\"id\"",
        ":",
        ",",
        "7",
        "-1",
        "1e400",
        "18446744073709551616",
        "\"customer\"",
        "\"lines\"",
        "\"sku\"",
        "\"quantity\"",
        "null",
        "true",
        "\"\\u00\"",
        "\"\\ud800\"",
        " ",
        "\u{0}",
        "é",
        "\"",
    ]);
    prop::collection::vec(fragments, 0..40).prop_map(|parts| parts.concat().into_bytes())
}

fn is_lower_hex(text: &str) -> bool {
    text.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn a_traceparent_parse_never_panics_and_accepts_only_the_grammar(
        value in prop_oneof![prop::collection::vec(any::<u8>(), 0..80), near_traceparent()]
    ) {
        if let Some(parsed) = TraceParent::parse(&value) {
            prop_assert_eq!(parsed.trace_id.len(), 32);
            prop_assert!(is_lower_hex(parsed.trace_id));
            prop_assert!(parsed.trace_id.bytes().any(|b| b != b'0'));
            prop_assert_eq!(parsed.parent_id.len(), 16);
            prop_assert!(is_lower_hex(parsed.parent_id));
            prop_assert!(parsed.parent_id.bytes().any(|b| b != b'0'));
            // What was accepted prints back to a header that parses the same.
            let again = format!("00-{}-{}-{:02x}", parsed.trace_id, parsed.parent_id, parsed.flags);
            prop_assert_eq!(TraceParent::parse(again.as_bytes()), Some(parsed));
        }
    }

    #[test]
    fn decoders_never_panic_and_fail_with_a_bounded_typed_error(
        payload in prop_oneof![prop::collection::vec(any::<u8>(), 0..600), jsonish()]
    ) {
        let payload = Bytes::from(payload);
        let failures: Vec<DecodeError> = [
            Json::<Order>::decode(&payload).err(),
            Json::<serde_json::Value>::decode(&payload).err(),
            String::decode(&payload).err(),
        ]
        .into_iter()
        .flatten()
        .collect();
        for failure in failures {
            prop_assert_eq!(failure.payload_len(), payload.len());
            // Escaping shows a byte as at most 4 characters, plus the tail.
            prop_assert!(failure.preview().len() <= PREVIEW_LIMIT * 4 + 32);
            let error: HandlerError = failure.into();
            prop_assert!(error.is_permanent());
        }
    }

    #[test]
    fn a_payload_preview_is_bounded_whatever_the_bytes(
        payload in prop::collection::vec(any::<u8>(), 0..2_000),
        limit in 0usize..600,
    ) {
        let preview = payload_preview(&payload, limit);
        prop_assert!(preview.len() <= limit * 4 + 32);
        prop_assert!(preview.is_ascii() || payload.len() > limit);
    }
}

#[test]
fn deeply_nested_json_fails_with_a_typed_error_not_a_stack_overflow() {
    let depth = 1_000_000;
    let mut payload = "[".repeat(depth);
    payload.push_str(&"]".repeat(depth));
    let error = Json::<serde_json::Value>::decode(&Bytes::from(payload))
        .expect_err("serde_json's recursion limit rejects it");
    assert!(error.to_string().contains("recursion limit"), "{error}");
}

#[test]
fn a_decode_error_quoting_a_huge_value_stays_bounded() {
    // serde quotes a value of the wrong type whole: a 1 MiB string where a
    // number belongs made an error (and a log line, and a dead letter) of
    // more than 1 MiB.
    let payload = format!(
        r#"{{"id":"{}","customer":"c","lines":[]}}"#,
        "9".repeat(1 << 20)
    );
    let error = Json::<Order>::decode(&Bytes::from(payload)).expect_err("a string is not a u64");
    let text = error.to_string();
    assert!(
        text.len() <= DecodeError::CAUSE_LIMIT + PREVIEW_LIMIT * 4 + 256,
        "{} bytes",
        text.len()
    );
    assert!(text.contains("invalid type"), "{text}");
    assert!(
        error.cause().to_string().len() > 1 << 20,
        "the codec's whole error stays available as the cause"
    );
}

/// Payloads a broker may deliver to a JSON handler, with whether each is a
/// valid order.
fn hostile_payloads() -> Vec<(Bytes, bool)> {
    let valid = |id: u64| {
        Bytes::from(format!(
            r#"{{"id":{id},"customer":"c-{id}","lines":[{{"sku":"s","quantity":1}}]}}"#
        ))
    };
    let huge_line = r#"{"sku":"sku-with-a-long-name","quantity":3}"#;
    let mut oversized = String::from(r#"{"id":9,"customer":"big","lines":["#);
    // About 16 MiB: far above any broker's default message size.
    let lines = 16 * 1024 * 1024 / huge_line.len();
    for line in 0..lines {
        if line > 0 {
            oversized.push(',');
        }
        oversized.push_str(huge_line);
    }
    oversized.push_str("]}");
    let mut binary = vec![0u8; 4096];
    for (index, byte) in binary.iter_mut().enumerate() {
        *byte = (index * 131 % 251) as u8;
    }
    vec![
        (valid(1), true),
        (Bytes::new(), false),
        (Bytes::from_static(b"{"), false),
        (
            Bytes::from_static(br#"{"id":2,"customer":"c","lines":[{"sku":"s","quantity":-1}]}"#),
            false,
        ),
        (
            Bytes::from_static(br#"{"id":18446744073709551616,"customer":"c","lines":[]}"#),
            false,
        ),
        (Bytes::from_static(b"\xff\xfe\xfd"), false),
        (
            Bytes::from_static(br#"{"id":3,"customer":"\ud800","lines":[]}"#),
            false,
        ),
        (Bytes::from("[".repeat(100_000)), false),
        (Bytes::from(binary), false),
        (valid(4), true),
        (Bytes::from(oversized), true),
        (
            Bytes::from(format!(
                r#"{{"id":5,"customer":"{}","lines":[]}}"#,
                "x".repeat(1 << 20)
            )),
            true,
        ),
        (valid(6), true),
    ]
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn corrupt_and_oversized_payloads_are_dead_lettered_or_handled_never_lost() {
    // Spans on, so the trace layer parses every (hostile) traceparent.
    let _logs = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(std::io::sink)
            .with_max_level(tracing::Level::INFO)
            .finish(),
    );
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 1).expect("topic");
    let payloads = hostile_payloads();
    let headers = [
        &b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"[..],
        b"\xff\xff\xff",
        b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-\x00",
        b"",
    ];
    for (index, (payload, _)) in payloads.iter().enumerate() {
        broker
            .send(
                "orders",
                Record::new(payload.clone())
                    .with_key(vec![0xff, index as u8])
                    .with_header(TRACEPARENT, headers[index % headers.len()]),
            )
            .expect("send");
    }
    let handled = Arc::new(Mutex::new(Vec::new()));
    let handler = {
        let handled = handled.clone();
        handler_fn(move |Json(order): Json<Order>| {
            let handled = handled.clone();
            async move {
                handled.lock().expect("handled").push(order.id);
            }
        })
    };
    let sink = broker.dead_letter_sink("orders", "billing").expect("sink");
    let handler = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(sink))
        .layer(TraceLayer::new("orders"))
        .service(handler);
    let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Consumer::builder()
            .ordering(DeliveryOrder::Unordered)
            .commit_interval(Duration::from_millis(5))
            .build(source, acker, handler)
            .expect("valid settings")
            .run(shutdown.clone()),
    );
    let end = payloads.len() as u64;
    until_committed(&broker, "orders", "billing").await;
    let report = stop_after(Duration::ZERO, shutdown, run).await;
    assert_eq!(
        broker.lag("orders", "billing").expect("group"),
        0,
        "all committed"
    );

    let mut handled = handled.lock().expect("handled").clone();
    handled.sort_unstable();
    assert_eq!(
        handled,
        vec![1, 4, 5, 6, 9],
        "every valid order was handled"
    );
    let dead_letters = broker
        .dead_letters("orders", "billing")
        .expect("dead letters");
    let expected_bad = payloads.iter().filter(|(_, valid)| !valid).count();
    assert_eq!(
        dead_letters.len(),
        expected_bad,
        "every bad payload was dead-lettered"
    );
    for letter in &dead_letters {
        assert!(
            letter.error.contains("cannot decode the payload as JSON"),
            "{}",
            letter.error
        );
        assert!(
            letter.error.len() < 4 * PREVIEW_LIMIT + 512,
            "the error stays small"
        );
    }
    assert_eq!(report.dead_lettered, dead_letters.len() as u64);
    assert_eq!(report.ignored, 0, "dead letters are not counted as ignored");
    assert_eq!(report.succeeded + report.dead_lettered, end);
}

/// Waits (on the paused clock) until `group` committed everything of
/// `topic`, for at most five virtual seconds.
async fn until_committed(broker: &MemoryBroker, topic: &str, group: &str) {
    for _ in 0..1_000 {
        if broker.lag(topic, group).expect("group") == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Stops a running consumer after `after` and returns its report; a run
/// that does not end within a minute (virtual) hangs.
async fn stop_after(
    after: Duration,
    shutdown: CancellationToken,
    run: tokio::task::JoinHandle<Result<RunReport, RunError>>,
) -> RunReport {
    tokio::time::sleep(after).await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the run ends after the stop")
        .expect("no panic")
        .expect("clean run")
}

/// A handler that never answers for offset 0 on its first delivery; later
/// deliveries (and other offsets) succeed. Counts calls per attempt.
fn stuck_on_first_delivery(
    calls: Arc<AtomicUsize>,
    redelivered: Arc<Mutex<Vec<u32>>>,
) -> impl tower::Service<Message, Response = (), Error = HandlerError, Future: Send> + Clone + Send
{
    handler_fn(move |message: Message| {
        let (calls, redelivered) = (calls.clone(), redelivered.clone());
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            let attempt = message.metadata().attempt();
            if message.metadata().position() == intake_core::Position::Offset(0) {
                if attempt == 1 {
                    std::future::pending::<()>().await;
                }
                redelivered.lock().expect("redelivered").push(attempt);
            }
            Ok::<(), HandlerError>(())
        }
    })
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_handler_that_never_returns_is_cut_off_left_unacked_and_delivered_again() {
    let broker = MemoryBroker::new();
    broker.create_topic("payments", 1).expect("topic");
    for payment in ["p0", "p1", "p2"] {
        broker.send("payments", Record::new(payment)).expect("send");
    }
    let calls = Arc::new(AtomicUsize::new(0));
    let redelivered = Arc::new(Mutex::new(Vec::new()));

    // First consumer: no timeout layer. Only the shutdown deadline ends the
    // stuck handler.
    let (source, acker) = broker.consumer("payments", "ledger").expect("consumer");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Consumer::builder()
            .ordering(DeliveryOrder::Unordered)
            .shutdown_deadline(Duration::from_secs(2))
            .build(
                source,
                acker,
                stuck_on_first_delivery(calls.clone(), redelivered.clone()),
            )
            .expect("valid settings")
            .run(shutdown.clone()),
    );
    let report = stop_after(Duration::from_secs(1), shutdown, run).await;
    assert_eq!(report.succeeded, 2);
    assert_eq!(
        report.unfinished.len(),
        1,
        "offset 0 was cut off: {report:?}"
    );
    assert!(report.unfinished[0].started);
    assert_eq!(
        broker.committed("payments", "ledger").expect("group"),
        vec![None],
        "nothing past the stuck offset 0 is committed"
    );

    // Second consumer: the broker delivers offset 0 again, and it succeeds.
    let (source, acker) = broker.consumer("payments", "ledger").expect("consumer");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Consumer::builder()
            .commit_interval(Duration::from_millis(5))
            .build(
                source,
                acker,
                stuck_on_first_delivery(calls.clone(), redelivered.clone()),
            )
            .expect("valid settings")
            .run(shutdown.clone()),
    );
    until_committed(&broker, "payments", "ledger").await;
    stop_after(Duration::ZERO, shutdown, run).await;
    assert_eq!(*redelivered.lock().expect("redelivered"), vec![2]);
    assert_eq!(broker.lag("payments", "ledger").expect("group"), 0);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_timeout_layer_ends_a_handler_that_never_returns_and_it_is_retried_not_acked() {
    let broker = MemoryBroker::new();
    broker.create_topic("payments", 1).expect("topic");
    broker.send("payments", Record::new("p0")).expect("send");
    let calls = Arc::new(AtomicUsize::new(0));
    let handler = {
        let calls = calls.clone();
        handler_fn(move |_: Message| {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>().await;
                Ok::<(), HandlerError>(())
            }
        })
    };
    let handler = ServiceBuilder::new()
        .layer(TimeoutLayer::new(Duration::from_millis(100)))
        .service(handler);
    let (source, acker) = broker.consumer("payments", "ledger").expect("consumer");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Consumer::builder()
            .backoff(Constant::new(Duration::from_millis(50)).retry_forever())
            .shutdown_deadline(Duration::from_secs(30))
            .build(source, acker, handler)
            .expect("valid settings")
            .run(shutdown.clone()),
    );
    let report = stop_after(Duration::from_secs(2), shutdown, run).await;
    let calls = calls.load(Ordering::SeqCst);
    assert!(
        calls >= 3,
        "each timeout let the message be tried again: {calls}"
    );
    assert_eq!(report.succeeded, 0);
    assert!(report.redispatched >= 2, "{report:?}");
    // On the paused clock: the stop came at 2 s, and the timeout ended the
    // last attempt soon after, long before the 30 s shutdown deadline.
    assert!(report.elapsed < Duration::from_secs(30), "{report:?}");
    assert_eq!(
        broker.committed("payments", "ledger").expect("group"),
        vec![None],
        "a timed-out message is never acknowledged"
    );
    let (mut source, _acker) = broker.consumer("payments", "ledger").expect("consumer");
    let mut deliveries = Vec::new();
    let _assigned = intake_core::backend::Source::next(&mut source, &mut deliveries, 10)
        .await
        .expect("assigned");
    intake_core::backend::Source::next(&mut source, &mut deliveries, 10)
        .await
        .expect("delivered");
    assert_eq!(deliveries.len(), 1, "the broker delivers it again");
    assert!(deliveries[0].metadata().attempt() > 1);
}

#[test]
fn decoded_text_rejects_invalid_utf8_with_a_preview() {
    let payload = Bytes::from_static(b"ok\xc3\x28tail");
    let Err(error) = String::decode(&payload) else {
        panic!("invalid UTF-8 is rejected");
    };
    assert!(
        error.preview().starts_with(r"ok\xc3("),
        "{}",
        error.preview()
    );
    let Err(error) = <Decoded<String> as intake_core::FromMessage>::from_message(Message::new(
        payload,
        intake_core::Metadata::new("t".into(), 0, intake_core::Position::Offset(0)),
    )) else {
        panic!("the extractor fails too");
    };
    assert!(error.is_permanent());
}
