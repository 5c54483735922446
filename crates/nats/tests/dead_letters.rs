//! The dead-letter sink: where letters go, what they carry on NATS, and the
//! destinations it refuses.

mod support;

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
