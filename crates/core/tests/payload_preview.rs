//! Review M6: an undecodable payload is quoted in its error, and from there
//! in the runtime's log line, the message's span and the dead letter's
//! error text. Payloads can be personal data, so how they are shown is a
//! setting ([`PayloadPreview`]): escaped (the default), off, a hash, or a
//! function of the application's.
//!
//! The setting is process-wide, so this binary has one test, which sets
//! each in turn.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_core::consumer::Consumer;
use intake_core::dead_letter::DeadLetterLayer;
use intake_core::decode::{DecodeError, PayloadPreview};
use intake_core::memory::{MemoryBroker, Record};
use intake_core::trace::TraceLayer;
use intake_core::{DeadLetter, HandlerError, Json, handler_fn};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::FmtSpan;

/// The personal data in the payload: the field that fails to decode holds
/// it, so the codec's message quotes it too.
const SECRET: &str = "alice@example.com";
const PAYLOAD: &str = r#"{"id":"alice@example.com"}"#;

#[derive(Debug, Deserialize)]
struct Order {
    #[allow(dead_code)]
    id: u64,
}

/// Where the subscriber writes: everything logged, spans included.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        self.0
            .lock()
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut bytes) = self.0.lock() {
            bytes.extend_from_slice(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// What one undecodable message leaves behind.
struct Traces {
    /// The dead letter's error text (with a dead-letter layer).
    letter: Option<String>,
    /// Every log line and span, the message's span with its `error` field.
    logs: String,
}

/// Consumes one message of `PAYLOAD` through `TraceLayer`, a dead-letter
/// layer if `dead_letters`, and a `Json<Order>` handler.
fn consume_one(dead_letters: bool) -> Traces {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .with_span_events(FmtSpan::CLOSE)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    let letter = runtime.block_on(async {
        let broker = MemoryBroker::new();
        broker.create_topic("orders", 1).expect("topic");
        broker
            .send("orders", Record::new(PAYLOAD).with_key("k"))
            .expect("send");
        let (source, acker) = broker.consumer("orders", "g").expect("join");
        let handler = handler_fn(async |Json(_order): Json<Order>| Ok::<(), HandlerError>(()));
        let dlq = dead_letters
            .then(|| DeadLetterLayer::new(broker.dead_letter_sink("orders", "g").expect("sink")));
        let stack = ServiceBuilder::new()
            .option_layer(dlq)
            .layer(TraceLayer::new("orders"))
            .service(handler);
        let consumer = Consumer::builder()
            .commit_interval(Duration::from_millis(5))
            .build(source, acker, stack)
            .expect("valid settings");
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(consumer.run(shutdown.clone()));
        let committed = tokio::time::timeout(Duration::from_secs(10), async {
            while broker.lag("orders", "g").unwrap_or(1) > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(committed.is_ok(), "the message was not committed");
        shutdown.cancel();
        let _ = run.await;
        let letters: Vec<DeadLetter> = broker.dead_letters("orders", "g").unwrap_or_default();
        letters.first().map(|letter| letter.error.clone())
    });
    Traces {
        letter,
        logs: captured.text(),
    }
}

/// Checks that nothing of the payload shows, and returns the letter's
/// error text.
fn nothing_of_the_payload(mode: &str) -> String {
    let with = consume_one(true);
    let letter = with.letter.expect("a dead letter");
    let without = consume_one(false);
    for (place, text) in [
        ("the dead letter's error", &letter),
        ("the logs and spans (with a dead-letter layer)", &with.logs),
        ("the logs and spans (without)", &without.logs),
    ] {
        assert!(
            !text.contains(SECRET) && !text.contains("alice"),
            "{mode}: {place} shows the payload: {text}"
        );
    }
    assert!(
        without
            .logs
            .contains("permanent failure with no dead-letter layer"),
        "{mode}: the runtime logged the failure: {}",
        without.logs
    );
    assert!(
        with.logs.contains("error=") || with.logs.contains("error:"),
        "{mode}: the span recorded its error: {}",
        with.logs
    );
    letter
}

#[test]
fn payload_previews_are_escaped_by_default_and_can_be_hidden_hashed_or_redacted() {
    // The default: the start of the payload, escaped, and the codec's
    // message, which quotes the value it could not take.
    let traces = consume_one(true);
    let letter = traces.letter.expect("a dead letter");
    assert!(
        letter.contains(r#"payload (26 bytes): {\"id\":\"alice@example.com\"}"#),
        "{letter}"
    );
    assert!(
        letter.contains(r#"invalid type: string "alice@example.com", expected u64"#),
        "{letter}"
    );
    assert!(traces.logs.contains(SECRET), "{}", traces.logs);

    // Off: the length only; the codec's message is withheld too (it quotes
    // the payload), JSON's kind of error and its place are kept.
    PayloadPreview::off().set_global();
    let letter = nothing_of_the_payload("off");
    assert!(letter.contains("payload (26 bytes, not shown)"), "{letter}");
    assert!(
        letter.contains("invalid data at line 1 column 25"),
        "{letter}"
    );

    // A hash: equal payloads are told equal without showing either.
    PayloadPreview::hash().set_global();
    let letter = nothing_of_the_payload("hash");
    let fingerprint = PayloadPreview::fingerprint(PAYLOAD.as_bytes());
    assert!(fingerprint.starts_with("fnv1a64:"), "{fingerprint}");
    assert!(
        letter.contains(&format!("payload (26 bytes, {fingerprint})")),
        "{letter}"
    );

    // A function of the application's; its text is escaped and bounded
    // like a preview, and a panic in it does not take the message down.
    PayloadPreview::with(|payload: &[u8]| {
        format!("{} bytes of order JSON\nFORGED LOG LINE", payload.len())
    })
    .set_global();
    let letter = nothing_of_the_payload("function");
    assert!(
        letter.contains(r"payload (26 bytes): 26 bytes of order JSON\nFORGED LOG LINE"),
        "{letter}"
    );
    PayloadPreview::with(|_: &[u8]| -> String { panic!("a bug in the preview") }).set_global();
    let letter = nothing_of_the_payload("panicking function");
    assert!(
        letter.contains("payload (26 bytes, not shown: the preview function panicked)"),
        "{letter}"
    );

    // Errors a codec of the application's builds follow the setting too.
    PayloadPreview::off().set_global();
    let error = DecodeError::new::<u64>("decimal text", b"alice", "not a number: alice");
    let text = error.to_string();
    assert!(!text.contains("alice"), "{text}");
    assert_eq!(error.preview(), "");
    assert_eq!(error.payload_len(), 5);

    PayloadPreview::default().set_global();
    let error = DecodeError::new::<u64>("decimal text", b"bob", "not a number");
    assert!(
        error.to_string().ends_with("payload (3 bytes): bob"),
        "{error}"
    );
}
