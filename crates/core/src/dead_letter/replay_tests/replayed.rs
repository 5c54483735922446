//! A dead letter replayed comes back as the original message.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tower::{Layer, ServiceBuilder, ServiceExt};

use super::support::*;
use crate::dead_letter::envelope::{Broker, Carrier, Envelope};
use crate::dead_letter::replay::ReplayCounts;
use crate::dead_letter::{DeadLetterLayer, ReplayLayer};
use crate::error::HandlerError;
use crate::memory::{MemoryBroker, Record};
use crate::message::{Headers, Message, Metadata, Position};

#[tokio::test]
async fn poison_messages_dead_lettered_by_a_run_are_replayed_once_each_as_the_original_message() {
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 1).expect("topic");
    for id in 0..6 {
        broker.send(TOPIC, original(id)).expect("produce");
    }
    let markers: Markers = Arc::default();

    // The first run bills 0, 2 and 5; 1, 3 and 4 fail for good. 4 fails
    // after its effect was applied (and its marker written): a replay must
    // not apply it twice.
    let broken = {
        let markers = markers.clone();
        tower::service_fn(move |message: Message| {
            let markers = markers.clone();
            async move {
                let id = offset(&message);
                if id != 1 && id != 3 {
                    *markers
                        .lock()
                        .expect("markers")
                        .entry(marker(&message))
                        .or_default() += 1;
                }
                match id {
                    1 | 3 | 4 => Err(HandlerError::permanent("no such customer")),
                    _ => Ok(()),
                }
            }
        })
    };
    let sink = broker.dead_letter_sink(TOPIC, GROUP).expect("sink");
    let first = run_until_drained(
        &broker,
        TOPIC,
        GROUP,
        DeadLetterLayer::new(sink.clone()).layer(broken),
    )
    .await;
    assert_eq!((first.succeeded, first.dead_lettered), (3, 3));
    // Something that is no dead letter lands in the destination too.
    broker
        .send(DEAD_LETTERS, Record::new("not a letter").with_key("x"))
        .expect("produce");

    // The fixed handler, under the same stack, on the dead-letter topic.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let fixed = {
        let (markers, seen) = (markers.clone(), seen.clone());
        tower::service_fn(move |message: Message| {
            let (markers, seen) = (markers.clone(), seen.clone());
            async move {
                seen.lock().expect("seen").push(Seen::of(&message));
                let mut markers = markers.lock().expect("markers");
                let applied = markers.entry(marker(&message)).or_default();
                if *applied == 0 {
                    *applied += 1;
                }
                Ok::<(), HandlerError>(())
            }
        })
    };
    let replay = ReplayLayer::keyed();
    let report = replay.counters();
    let run = run_until_drained(
        &broker,
        DEAD_LETTERS,
        "billing.replay",
        ServiceBuilder::new()
            .layer(replay)
            .layer(DeadLetterLayer::new(sink))
            .service(fixed),
    )
    .await;

    let mut seen = seen.lock().expect("seen").clone();
    seen.sort_by_key(|seen| seen.position);
    let expected: Vec<Seen> = [1, 3, 4]
        .into_iter()
        .map(|id| Seen {
            payload: format!("order-{id}"),
            key: Some(format!("customer-{id}")),
            tenant: Some("acme".to_owned()),
            source: TOPIC.to_owned(),
            partition: 0,
            position: Position::Offset(id),
            attempt: 1,
            replays: Some("1".to_owned()),
        })
        .collect();
    assert_eq!(seen, expected, "each original once, as it was consumed");
    let markers = markers.lock().expect("markers").clone();
    assert_eq!(markers.len(), 6, "{markers:?}");
    assert!(
        markers.values().all(|&applied| applied == 1),
        "a marker keyed by origin applies each message once: {markers:?}"
    );
    assert_eq!((run.succeeded, run.discarded), (3, 1), "{run:?}");
    let mut expected_counts = ReplayCounts {
        records: 4,
        replayed: 3,
        succeeded: 3,
        unreadable: 1,
        ..ReplayCounts::default()
    };
    expected_counts.by_class.insert("permanent", 3);
    assert_eq!(report.snapshot(), expected_counts);
}

#[tokio::test]
async fn a_keyless_replay_takes_the_key_from_the_envelope_never_from_the_record() {
    let letter = letter(7, 0);
    let envelope = Envelope::new(&letter, &Carrier::keyless(Broker::Redis));
    let headers: Headers = envelope
        .pairs()
        .map(|(name, value)| (name.into_owned(), Bytes::copy_from_slice(value)))
        .collect();
    // An AMQP source gives the routing key as the record's key.
    let record = Message::new(
        envelope.payload().clone(),
        Metadata::new("orders:dlq".into(), 0, Position::StreamId { ms: 1, seq: 0 }),
    )
    .with_key("orders.dlq")
    .with_headers(headers);
    let handler = Recorder::default();
    ReplayLayer::keyless()
        .layer(handler.clone())
        .oneshot(record.clone())
        .await
        .expect("replayed");
    let seen = handler.seen();
    assert_eq!(seen[0].key().map(|key| &key[..]), Some(&b"customer-7"[..]));
    assert_eq!(seen[0].metadata().position(), Position::Offset(7));

    // Without the envelope's key, a keyless replay gives none.
    let mut no_key = letter.clone();
    no_key.message = Message::new("order-7", no_key.message.metadata().clone());
    let envelope = Envelope::new(&no_key, &Carrier::keyless(Broker::Redis));
    let headers: Headers = envelope
        .pairs()
        .map(|(name, value)| (name.into_owned(), Bytes::copy_from_slice(value)))
        .collect();
    ReplayLayer::keyless()
        .layer(handler.clone())
        .oneshot(record.with_headers(headers))
        .await
        .expect("replayed");
    assert_eq!(handler.seen()[1].key(), None);
}
