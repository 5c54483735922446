//! The dead-letter sink: where letters go, what they carry on NATS, and the
//! destinations it refuses.

mod support;

use std::time::Duration;

use bytes::Bytes;
use intake_core::dead_letter::envelope::{self, Broker};
use intake_core::{DeadLetter, Headers, Message, Metadata, Position, backend::DeadLetterSink};
use intake_nats::async_nats::jetstream;
use intake_nats::{Error, NatsSource};
use support::NatsBackend;

#[tokio::test]
async fn the_default_subject_inside_the_consumed_stream_is_refused() {
    let Some(backend) = NatsBackend::new("dead-letter loop").await else {
        return;
    };
    // The common naming: stream ORDERS storing ORDERS.>, which also
    // matches the default dead-letter subject ORDERS.<consumer>.dlq.
    let stream = support::unique("LOOP");
    jetstream::new(backend.client().clone())
        .create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{stream}.>")],
            ..Default::default()
        })
        .await
        .expect("stream");
    let source = NatsSource::builder(support::nats_url())
        .stream(&stream)
        .consumer("billing")
        .build()
        .await
        .expect("source");
    let refused = source.dead_letter_sink().build().await.expect_err("a loop");
    assert!(
        matches!(&refused, Error::DeadLetterLoop { subject, .. } if *subject == format!("{stream}.billing.dlq")),
        "{refused:?}"
    );
    assert!(!refused.is_transient());
    // Another subject, stored elsewhere, is accepted.
    let sink = source
        .dead_letter_sink()
        .subject(format!("dlq.{stream}.billing"))
        .build()
        .await
        .expect("another subject");
    assert_eq!(
        sink.stream(),
        intake_nats::default_dead_letter_stream(&stream)
    );
}

#[tokio::test]
async fn a_letter_says_nats_on_the_wire_and_keeps_nats_headers_and_line_breaks_readable() {
    let Some(backend) = NatsBackend::new("dead-letter carrier").await else {
        return;
    };
    let stream = support::unique("carrier");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    let source = backend.source(&stream, "g").build().await.expect("source");
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let headers: Headers = [
        ("Nats-Msg-Id", "order-7"),
        ("Nats-Expected-Stream", "elsewhere"),
        ("tenant", "acme"),
    ]
    .into_iter()
    .map(|(name, value)| (name, Bytes::from_static(value.as_bytes())))
    .collect();
    let message = Message::new(
        "payload",
        Metadata::new(stream.as_str().into(), 0, Position::Offset(41)),
    )
    .with_key(format!("in.{stream}.k"))
    .with_headers(headers.clone());
    let letter = DeadLetter::new(message, "line one\nline two\r\n", 2);
    // Twice: JetStream would deduplicate the second by `Nats-Msg-Id`, and
    // `Nats-Expected-Stream` would refuse both, if they were carried as is.
    sink.write(&letter).await.expect("first letter");
    sink.write(&letter).await.expect("second letter");
    let stored = support::stored(
        backend.client(),
        sink.stream(),
        &intake_nats::default_dead_letter_subject(&stream, "g"),
    )
    .await
    .expect("stored letters");
    assert_eq!(stored.len(), 2, "neither deduplicated nor refused");
    assert_eq!(
        stored[0].headers().get_str(envelope::ORIGIN_BROKER),
        Some(intake_nats::BROKER_NAME)
    );
    assert_eq!(
        stored[0].headers().get_str("intake.nats.Nats-Msg-Id"),
        Some("order-7")
    );
    let read = intake_nats::read_dead_letter(&stored[0]).expect("read back");
    assert_eq!(
        read.origin.as_ref().map(|origin| origin.broker),
        Some(Broker::Nats),
        "a NATS letter names NATS as its origin's broker"
    );
    let mut original: Vec<_> = headers
        .iter()
        .map(|h| (h.name.clone(), h.value.clone()))
        .collect();
    let mut restored: Vec<_> = read
        .message
        .headers()
        .iter()
        .map(|h| (h.name.clone(), h.value.clone()))
        .collect();
    original.sort();
    restored.sort();
    assert_eq!(
        restored, original,
        "producer headers come back under their names"
    );
    assert_eq!(
        read.error, "line one\\nline two\\r\\n",
        "line breaks written as text"
    );
    assert_eq!(read.message.metadata().position(), Position::Offset(41));
    assert_eq!(
        read.message.key().map(|key| &key[..]),
        Some(format!("in.{stream}.k").as_bytes())
    );
    // Core reads the letter too (the DLQ tooling's path): origin NATS,
    // the `Nats-…` headers still under their carried names.
    let by_core = DeadLetter::read(None, stored[0].payload().clone(), stored[0].headers())
        .expect("core reads a NATS letter");
    assert_eq!(
        by_core.origin.map(|origin| origin.broker),
        Some(Broker::Nats)
    );
    assert_eq!(
        by_core.message.headers().get_str("intake.nats.Nats-Msg-Id"),
        Some("order-7")
    );
    drop(source);
}

/// Creates stream `name` storing `in.<name>.>` with `retention`.
async fn create_stream_with(
    client: &intake_nats::async_nats::Client,
    name: &str,
    retention: jetstream::stream::RetentionPolicy,
) {
    jetstream::new(client.clone())
        .create_stream(jetstream::stream::Config {
            name: name.to_owned(),
            subjects: vec![format!("in.{name}.>")],
            retention,
            ..Default::default()
        })
        .await
        .expect("stream");
}

/// Whether stream sequence `sequence` is still stored in `stream`.
async fn stored_at(client: &intake_nats::async_nats::Client, stream: &str, sequence: u64) -> bool {
    jetstream::new(client.clone())
        .get_stream(stream)
        .await
        .expect("stream")
        .get_raw_message(sequence)
        .await
        .is_ok()
}

/// A handler that fails every payload not starting with `ok` for good,
/// counting the calls of the others.
fn fails_all_but_ok(
    calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> impl tower::Service<
    Message,
    Response = (),
    Error = intake_core::HandlerError,
    Future = impl Future<Output = Result<(), intake_core::HandlerError>> + Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |message: Message| {
        let calls = calls.clone();
        async move {
            if message.payload().starts_with(b"ok") {
                return Ok(());
            }
            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Err(intake_core::HandlerError::permanent("malformed"))
        }
    })
}

/// Runs a consumer with a dead-letter layer over stream `stream` (created
/// with `retention`) holding one message just under the server's
/// `max_payload` (its letter, with the envelope, is over it) and one `ok`;
/// stops once the large one was handled `calls` times. Returns the letters
/// and whether the large one (sequence 1) is still stored.
async fn too_large_for_a_letter(
    backend: &NatsBackend,
    stream: &str,
    retention: jetstream::stream::RetentionPolicy,
    calls: usize,
) -> (Vec<DeadLetter>, bool) {
    create_stream_with(backend.client(), stream, retention).await;
    let max_payload = backend.client().server_info().max_payload;
    let payload = "p".repeat(max_payload - 300);
    support::produce(
        backend.client(),
        stream,
        vec![
            intake_core::backend::testkit::TestMessage::new("k", payload),
            intake_core::backend::testkit::TestMessage::new("k", "ok1"),
        ],
    )
    .await
    .expect("produce");
    let source = backend.source(stream, "g").build().await.expect("source");
    let acker = source.acker();
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let handled = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handler = tower::ServiceBuilder::new()
        .layer(intake_core::DeadLetterLayer::new(sink))
        .service(fails_all_but_ok(handled.clone()));
    let running = support::Running::start(
        intake_core::Consumer::builder().ordering(intake_core::DeliveryOrder::Unordered),
        source,
        acker,
        handler,
    );
    support::wait_until("the large message handled", Duration::from_secs(30), || {
        handled.load(std::sync::atomic::Ordering::Relaxed) >= 1
    })
    .await;
    // Then it is dead-lettered (everything settles) or kept and handled
    // again.
    support::wait_until(
        "the large message settled or handled again",
        Duration::from_secs(30),
        || {
            handled.load(std::sync::atomic::Ordering::Relaxed) >= calls
                || support::block_on_unacknowledged(backend.client(), stream, "g") == 0
        },
    )
    .await;
    // A letter written, or not: the outcome of the last call settles (and
    // the next delivery, past `max_deliveries`, is the source's to write).
    tokio::time::sleep(Duration::from_secs(1)).await;
    running.stop().await;
    let letters = intake_core::backend::testkit::Backend::dead_letters(backend, stream, "g")
        .await
        .expect("read back");
    (letters, stored_at(backend.client(), stream, 1).await)
}

/// Review R11: on a work-queue stream the server deletes a message once
/// it is acknowledged or terminated. A letter too large for the server
/// became a reference letter (no payload: "the original is at its
/// origin") and the original was terminated and acknowledged, so the
/// payload was gone from everywhere. The sink must not let that happen:
/// the message stays in the stream, unacknowledged, and no reference
/// claims it is at its origin when it is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_letter_too_large_on_a_work_queue_stream_never_leaves_only_a_reference() {
    let Some(backend) = NatsBackend::new("reference on a work queue").await else {
        return;
    };
    let stream = support::unique("workq");
    // Five calls: the source's `max_deliveries` (5) is used up, and the
    // source's own dead letter (delivery 6) meets the same refusal.
    let (letters, stored) = too_large_for_a_letter(
        &backend,
        &stream,
        jetstream::stream::RetentionPolicy::WorkQueue,
        5,
    )
    .await;
    let references: Vec<&DeadLetter> = letters
        .iter()
        .filter(|letter| letter.reference.is_some())
        .collect();
    assert!(
        stored && references.is_empty(),
        "the original is {} the work-queue stream, and {} reference letter(s) say it is at its \
         origin: {references:?}",
        if stored { "still in" } else { "gone from" },
        references.len()
    );
}

/// On a limits stream (the default) the original stays stored after its
/// term: the reference letter is written, and says where the payload is
/// and for how long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_letter_on_a_limits_stream_says_the_original_stays_while_the_stream_keeps_it() {
    let Some(backend) = NatsBackend::new("reference on a limits stream").await else {
        return;
    };
    let stream = support::unique("limits");
    let (letters, stored) = too_large_for_a_letter(
        &backend,
        &stream,
        jetstream::stream::RetentionPolicy::Limits,
        1,
    )
    .await;
    assert!(stored, "a limits stream keeps a terminated message");
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert!(letter.reference.is_some(), "{letter:?}");
    assert!(
        letter
            .error
            .contains(&format!("stays in stream `{stream}` at sequence 1")),
        "{}",
        letter.error
    );
}

/// The source's own dead letter (past `max_deliveries`, without a
/// dead-letter layer) of a message whose letter does not fit becomes a
/// reference too, as under the layer, on a stream that keeps the original.
/// Before, the source gave the delivery back after `ack_wait` and tried
/// the same letter again, forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sources_own_letter_too_large_becomes_a_reference() {
    let Some(backend) = NatsBackend::new("the source's reference").await else {
        return;
    };
    let stream = support::unique("srcref");
    create_stream_with(
        backend.client(),
        &stream,
        jetstream::stream::RetentionPolicy::Limits,
    )
    .await;
    let max_payload = backend.client().server_info().max_payload;
    support::produce(
        backend.client(),
        &stream,
        vec![intake_core::backend::testkit::TestMessage::new(
            "k",
            "p".repeat(max_payload - 300),
        )],
    )
    .await
    .expect("produce");
    let source = backend
        .source(&stream, "g")
        .max_deliveries(2)
        .build()
        .await
        .expect("source");
    let counters = source.counters();
    let acker = source.acker();
    let handler = tower::service_fn(|_: Message| async {
        Err::<(), _>(intake_core::HandlerError::retryable("not yet"))
    });
    let running = support::Running::start(
        intake_core::Consumer::builder()
            .ordering(intake_core::DeliveryOrder::Unordered)
            .backoff(intake_core::Disabled),
        source,
        acker,
        handler,
    );
    support::wait_until("the source's letter", Duration::from_secs(30), || {
        counters.source_dead_letters() >= 1
    })
    .await;
    running.stop().await;
    let letters = intake_core::backend::testkit::Backend::dead_letters(&backend, &stream, "g")
        .await
        .expect("read back");
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert!(letters[0].reference.is_some(), "{:?}", letters[0]);
    assert!(
        letters[0].error.contains("max_deliveries = 2")
            && letters[0].error.contains("stays in stream"),
        "{}",
        letters[0].error
    );
    assert_eq!(counters.terms(), 1);
}

/// A letter whose headers do not fit JetStream's 64 KiB is written without
/// the original headers; on a work-queue stream the original goes once
/// terminated, and the letter says those headers are not kept anywhere
/// (on a limits stream it says they stay with the original:
/// `tests/hostile_records.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reduced_letter_on_a_work_queue_stream_says_the_left_out_headers_are_not_kept() {
    let Some(backend) = NatsBackend::new("reduced on a work queue").await else {
        return;
    };
    let stream = support::unique("workqh");
    create_stream_with(
        backend.client(),
        &stream,
        jetstream::stream::RetentionPolicy::WorkQueue,
    )
    .await;
    let mut poison = intake_core::backend::testkit::TestMessage::new("k", "poison");
    poison.headers = [(
        "X-Huge",
        "h".repeat(intake_nats::MAX_DEAD_LETTER_HEADER_BYTES - 200),
    )]
    .into_iter()
    .collect::<Headers>();
    support::produce(backend.client(), &stream, vec![poison])
        .await
        .expect("produce");
    let source = backend.source(&stream, "g").build().await.expect("source");
    let acker = source.acker();
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let handled = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handler = tower::ServiceBuilder::new()
        .layer(intake_core::DeadLetterLayer::new(sink))
        .service(fails_all_but_ok(handled.clone()));
    let running = support::Running::start(intake_core::Consumer::builder(), source, acker, handler);
    support::wait_until("settled", Duration::from_secs(30), || {
        handled.load(std::sync::atomic::Ordering::Relaxed) >= 1
            && support::block_on_unacknowledged(backend.client(), &stream, "g") == 0
    })
    .await;
    running.stop().await;
    let letters = intake_core::backend::testkit::Backend::dead_letters(&backend, &stream, "g")
        .await
        .expect("read back");
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(&letters[0].message.payload()[..], b"poison");
    assert_eq!(letters[0].headers_omitted, 1);
    assert!(
        letters[0].error.contains("not kept anywhere") && letters[0].error.contains("work-queue"),
        "{}",
        letters[0].error
    );
}
