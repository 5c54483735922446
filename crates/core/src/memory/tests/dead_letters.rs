//! Dead letters: origin, error and attempts kept; what is no letter is a
//! typed error; a failed write stores nothing.

use super::support::*;
use crate::dead_letter::DeadLetterSink;
use crate::dead_letter::{DeadLetter, envelope};
use crate::memory::*;
use crate::message::{Message, Position};
use bytes::Bytes;

#[tokio::test]
async fn a_dead_letter_keeps_its_origin_error_and_attempts() {
    let broker = broker_with_topic(2);
    broker
        .send(TOPIC, Record::new("poison").with_key("k").to_partition(1))
        .expect("send");
    let (mut source, _acker) = joined(&broker).await;
    let mut buf = Vec::new();
    delivered(&mut source, &mut buf, 10).await;
    let sink = broker.dead_letter_sink(TOPIC, GROUP).expect("sink");
    assert_eq!(sink.topic(), "orders.billing.dlq");
    sink.write(&DeadLetter::new(buf[0].clone(), "bad json", 3))
        .await
        .expect("write");

    let letters = broker.dead_letters(TOPIC, GROUP).expect("dead letters");
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].message.payload(), "poison");
    assert_eq!(letters[0].message.metadata().partition(), 1);
    assert_eq!(letters[0].error, "bad json");
    assert_eq!(letters[0].attempts, 3);

    // The dead-letter topic is an ordinary topic a consumer can read: the
    // record key is the original key, the envelope's fields are headers.
    let stored = broker
        .messages("orders.billing.dlq", 0, 0)
        .expect("dlq topic");
    let headers = stored[0].headers();
    assert_eq!(stored[0].payload(), "poison");
    assert_eq!(stored[0].key().map(Bytes::as_ref), Some(&b"k"[..]));
    assert_eq!(headers.get_str(envelope::ORIGIN_BROKER), Some("memory"));
    assert_eq!(headers.get_str(envelope::ORIGIN_SOURCE), Some(TOPIC));
    assert_eq!(headers.get_str(envelope::ORIGIN_PARTITION), Some("1"));
    assert_eq!(headers.get_str(envelope::ORIGIN_POSITION), Some("0"));
    assert_eq!(headers.get_str(envelope::ORIGIN_GROUP), Some(GROUP));
    assert_eq!(
        headers.get_str(envelope::ORIGIN_KEY),
        None,
        "the key is the record key"
    );
    assert_eq!(headers.get_str(envelope::ERROR_MESSAGE), Some("bad json"));
    assert_eq!(headers.get_str(envelope::ERROR_CLASS), Some("permanent"));
    assert_eq!(headers.get_str(envelope::ATTEMPTS), Some("3"));
    assert!(headers.get_str(envelope::FAILED_LAST).is_some());
    assert!(
        broker
            .dead_letters(TOPIC, "other")
            .expect("none")
            .is_empty()
    );
}

#[tokio::test]
async fn a_producer_header_named_like_an_origin_field_does_not_change_the_origin() {
    let broker = broker_with_topic(1);
    broker
        .send(
            TOPIC,
            Record::new("poison")
                .with_header(envelope::ORIGIN_SOURCE, "spoofed")
                .with_header(envelope::ERROR_MESSAGE, "spoofed"),
        )
        .expect("send");
    let (mut source, _acker) = joined(&broker).await;
    let mut buf = Vec::new();
    delivered(&mut source, &mut buf, 10).await;
    let sink = broker.dead_letter_sink(TOPIC, GROUP).expect("sink");
    sink.write(&DeadLetter::new(buf[0].clone(), "bad json", 1))
        .await
        .expect("write");

    let stored = broker
        .messages("orders.billing.dlq", 0, 0)
        .expect("dlq topic");
    let headers = stored[0].headers();
    assert_eq!(headers.get_str(envelope::ORIGIN_SOURCE), Some(TOPIC));
    let kept = format!("{}{}", envelope::PRODUCER_PREFIX, envelope::ORIGIN_SOURCE);
    assert_eq!(headers.get_str(&kept), Some("spoofed"));
    let letters = broker.dead_letters(TOPIC, GROUP).expect("dead letters");
    assert_eq!(&**letters[0].message.metadata().source(), TOPIC);
    assert_eq!(letters[0].error, "bad json");
    assert_eq!(
        letters[0].message.headers(),
        buf[0].headers(),
        "the producer's headers come back under their own names"
    );
}

#[tokio::test]
async fn a_record_in_the_dead_letter_topic_that_is_not_a_letter_is_a_typed_error() {
    let broker = broker_with_topic(1);
    broker.dead_letter_sink(TOPIC, GROUP).expect("sink");
    broker
        .send("orders.billing.dlq", Record::new("written by hand"))
        .expect("send");
    assert_eq!(
        broker
            .dead_letters(TOPIC, GROUP)
            .map(|letters| letters.len()),
        Err(MemoryError::MalformedDeadLetter {
            topic: "orders.billing.dlq".into(),
            offset: 0,
            source: envelope::EnvelopeError::Missing {
                field: envelope::VERSION
            },
        })
    );
}

#[tokio::test]
async fn a_failed_dead_letter_write_stores_nothing() {
    let broker = broker_with_topic(1);
    let sink = broker.dead_letter_sink(TOPIC, GROUP).expect("sink");
    broker
        .faults(TOPIC, GROUP)
        .expect("faults")
        .fail_next_dead_letter_writes(1);
    let message = Message::new(
        "poison",
        crate::Metadata::new(TOPIC.into(), 0, Position::Offset(0)),
    );
    let letter = DeadLetter::new(message, "boom", 1);
    assert!(sink.write(&letter).await.is_err());
    assert!(
        broker
            .dead_letters(TOPIC, GROUP)
            .expect("dead letters")
            .is_empty()
    );
    sink.write(&letter).await.expect("second write");
    assert_eq!(
        broker
            .dead_letters(TOPIC, GROUP)
            .expect("dead letters")
            .len(),
        1
    );
}
