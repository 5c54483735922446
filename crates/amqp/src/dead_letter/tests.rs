use super::frame::{FRAME_OVERHEAD, Shape, content_header_len, properties};
use super::*;
use crate::headers;
use bytes::Bytes;
use intake_core::dead_letter::envelope;
use intake_core::dead_letter::envelope::Broker;
use intake_core::{Headers, Message, Metadata, Position};
use lapin::message::Delivery;
use lapin::types::AMQPValue;

#[tokio::test]
async fn a_sink_that_routes_into_the_consumed_queue_is_refused_before_connecting() {
    // Nothing listens on port 1: a refusal here is the build's.
    let url = "amqp://guest:guest@127.0.0.1:1/%2f";
    let refused = |builder: AmqpDeadLetterSinkBuilder| async move {
        match builder.consumed_queue("orders").build().await {
            Err(Error::Config(error)) => error,
            other => panic!("expected a config error, got {other:?}"),
        }
    };
    let through_default = refused(
        AmqpDeadLetterSink::builder(url)
            .exchange("")
            .routing_key("orders"),
    )
    .await;
    assert!(through_default.problem.contains("`orders`"));
    // A fanout bound to the queue, or a direct exchange bound with the
    // routing key the dead letters get (by default the queue's name).
    refused(
        AmqpDeadLetterSink::builder(url).exchange("dlx").declare(
            Topology::new()
                .exchange(crate::Exchange::fanout("dlx"))
                .bind("orders", "dlx", ""),
        ),
    )
    .await;
    refused(
        AmqpDeadLetterSink::builder(url).exchange("dlx").declare(
            Topology::new()
                .exchange(crate::Exchange::direct("dlx"))
                .bind("orders", "dlx", "orders"),
        ),
    )
    .await;
    let elsewhere = AmqpDeadLetterSink::builder(url)
        .exchange("dlx")
        .consumed_queue("orders")
        .declare(
            Topology::new()
                .exchange(crate::Exchange::direct("dlx"))
                .queue(crate::Queue::classic("orders.dlq"))
                .bind("orders.dlq", "dlx", "orders"),
        )
        .build()
        .await;
    assert!(
        matches!(elsewhere, Err(Error::Unreachable { .. })),
        "{elsewhere:?}"
    );
}

/// The longest letter id a sink writes.
const TOKEN: &str = "ffffffffffffffff-18446744073709551615";

fn carrier() -> Carrier {
    Carrier::keyless(Broker::Amqp)
}

fn table_of(properties: &BasicProperties) -> std::collections::BTreeMap<String, String> {
    properties
        .headers()
        .clone()
        .unwrap_or_default()
        .inner()
        .iter()
        .map(|(name, value)| {
            let text = match value {
                AMQPValue::LongString(text) => text.to_string(),
                other => panic!("{name}: {other:?} is not a long string"),
            };
            (name.to_string(), text)
        })
        .collect()
}

#[test]
fn a_producers_headers_never_pass_for_the_origin() {
    // The original has no routing key, so the envelope has none to set:
    // the producer's own `intake.origin.key` must not stand in.
    let headers: Headers = [
        (envelope::ORIGIN_KEY, Bytes::from_static(b"spoofed")),
        (envelope::ORIGIN_SOURCE, Bytes::from_static(b"spoofed")),
        (envelope::ERROR_MESSAGE, Bytes::from_static(b"spoofed")),
    ]
    .into_iter()
    .collect();
    let message = Message::new(
        Bytes::from_static(b"{}"),
        Metadata::new("orders".into(), 1, Position::Tag(5)),
    )
    .with_headers(headers);
    let properties = properties(
        &DeadLetter::new(message, "bad json", 1),
        &carrier(),
        Shape::Full,
        TOKEN,
    );
    let table = table_of(&properties);
    assert_eq!(table.get(envelope::ORIGIN_KEY), None);
    assert_eq!(table[envelope::ORIGIN_SOURCE], "orders");
    assert_eq!(table[envelope::ERROR_MESSAGE], "bad json");
    // Kept, under a name that cannot be taken for the origin.
    let kept = format!("{}{}", envelope::PRODUCER_PREFIX, envelope::ORIGIN_KEY);
    assert_eq!(table[&kept], "spoofed");
}

#[test]
fn a_dead_letter_carries_its_origin_and_restores_properties() {
    let headers: Headers = [
        (headers::MESSAGE_ID, Bytes::from_static(b"m-7")),
        ("tenant", Bytes::from_static(b"acme")),
    ]
    .into_iter()
    .collect();
    let message = Message::new(
        Bytes::from_static(b"{}"),
        Metadata::new("orders".into(), 3, Position::Tag(42)),
    )
    .with_key(Bytes::from_static(b"orders.eu"))
    .with_headers(headers);
    let letter = DeadLetter::new(message, "bad json", 4);
    let properties = properties(&letter, &carrier(), Shape::Full, TOKEN);
    assert_eq!(
        properties.message_id().as_ref().map(ShortString::as_str),
        Some("m-7")
    );
    assert_eq!(*properties.delivery_mode(), Some(PERSISTENT));
    let table = table_of(&properties);
    assert_eq!(table[envelope::ORIGIN_BROKER], "amqp");
    assert_eq!(table[envelope::ORIGIN_SOURCE], "orders");
    assert_eq!(table[envelope::ORIGIN_PARTITION], "3");
    assert_eq!(table[envelope::ORIGIN_POSITION], "42");
    assert_eq!(table[envelope::ORIGIN_KEY], "orders.eu");
    assert_eq!(table[envelope::ERROR_MESSAGE], "bad json");
    assert_eq!(table[envelope::ATTEMPTS], "4");
    assert_eq!(table["tenant"], "acme");
    assert!(!table.contains_key(headers::MESSAGE_ID));
}

#[test]
fn a_header_name_too_long_for_amqp_is_left_out_and_counted_even_when_multibyte() {
    // 300 bytes of 3-byte characters: byte 64 is inside a character.
    let name = "€".repeat(100);
    let headers: Headers = [
        (name.as_str(), Bytes::from_static(b"v")),
        ("tenant", Bytes::from_static(b"acme")),
    ]
    .into_iter()
    .collect();
    let message = Message::new(
        Bytes::from_static(b"{}"),
        Metadata::new("orders".into(), 1, Position::Tag(1)),
    )
    .with_headers(headers);
    let letter = DeadLetter::new(message, "bad", 1);
    // With a subscriber, so that the warning's fields are evaluated.
    let subscriber = tracing_subscriber::fmt().with_test_writer().finish();
    let properties = tracing::subscriber::with_default(subscriber, || {
        properties(&letter, &carrier(), Shape::Full, TOKEN)
    });
    let table = table_of(&properties);
    assert!(!table.keys().any(|key| key.starts_with('€')));
    assert_eq!(table["tenant"], "acme");
    assert_eq!(table[envelope::HEADERS_OMITTED], "1");
}

#[test]
fn a_property_that_cannot_be_one_stays_a_header_instead_of_being_dropped() {
    // From another broker: a message id longer than an AMQP short
    // string (it was dropped), a correlation id that is not UTF-8 (it
    // was replaced by a lossy copy).
    let long_id = Bytes::from("m".repeat(300));
    let binary = Bytes::from_static(&[0xff, 0xfe]);
    let headers: Headers = [
        (headers::MESSAGE_ID, long_id.clone()),
        (headers::CORRELATION_ID, binary.clone()),
    ]
    .into_iter()
    .collect();
    let message = Message::new(
        Bytes::from_static(b"{}"),
        Metadata::new("orders".into(), 0, Position::Offset(3)),
    )
    .with_headers(headers);
    let letter = DeadLetter::new(message, "bad", 1);
    let properties = properties(&letter, &carrier(), Shape::Full, TOKEN);
    assert_eq!(properties.message_id(), &None);
    assert_eq!(properties.correlation_id(), &None);
    let mut delivery = Delivery::mock(
        1,
        ShortString::from("dlx"),
        ShortString::from("orders.dlq"),
        false,
        b"{}".to_vec(),
    );
    delivery.properties = properties;
    let read = read_dead_letter(delivery).expect("a dead letter");
    assert_eq!(
        read.message.headers().get(headers::MESSAGE_ID),
        Some(&long_id)
    );
    assert_eq!(
        read.message.headers().get(headers::CORRELATION_ID),
        Some(&binary)
    );
}

#[test]
fn a_letter_that_fits_no_frame_even_reduced_is_rejected() {
    // A key from another broker, longer than any AMQP routing key.
    let message = Message::new(
        Bytes::from_static(b"{}"),
        Metadata::new("orders".into(), 0, Position::Offset(9)),
    )
    .with_key(vec![b'k'; 5_000]);
    let letter = DeadLetter::new(message, "bad", 1);
    assert!(matches!(
        fitting(&letter, &carrier(), 4096, TOKEN),
        Fit::Rejected { .. }
    ));
    // Its reference has no key, and fits.
    assert!(matches!(
        fitting(&letter.to_reference(), &carrier(), 4096, TOKEN),
        Fit::Full(_)
    ));
}

fn letter_with(
    headers: Vec<(String, Vec<u8>)>,
    key: Option<Vec<u8>>,
    source: String,
    error: String,
) -> DeadLetter {
    let headers: Headers = headers.into_iter().collect();
    let mut message = Message::new(
        Bytes::from_static(b"{}"),
        Metadata::new(source.as_str().into(), 7, Position::Tag(u64::MAX)),
    )
    .with_headers(headers);
    if let Some(key) = key {
        message = message.with_key(Bytes::from(key));
    }
    DeadLetter::new(message, error, u32::MAX)
}

fn header_name() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    prop_oneof![
        ".{0,40}",
        Just(headers::MESSAGE_ID.to_owned()),
        Just(headers::CONTENT_TYPE.to_owned()),
        Just(envelope::ORIGIN_SOURCE.to_owned()),
        "[a-z]{300}",
    ]
}

/// Any letter: names, keys and sources of any length.
fn any_letter() -> impl proptest::strategy::Strategy<Value = DeadLetter> {
    use proptest::prelude::*;
    (
        proptest::collection::vec(
            (
                header_name(),
                proptest::collection::vec(any::<u8>(), 0..3_000),
            ),
            0..8,
        ),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..2_000)),
        ".{0,400}",
        ".{0,5000}",
    )
        .prop_map(|(headers, key, source, error)| letter_with(headers, key, source, error))
}

/// A letter of a message from an AMQP queue: a queue name and a routing
/// key of at most 255 bytes, headers as a delivery's (distinct names
/// AMQP can carry, long-string values).
fn amqp_letter() -> impl proptest::strategy::Strategy<Value = DeadLetter> {
    use proptest::prelude::*;
    (
        proptest::collection::btree_map(
            prop_oneof![
                "[a-z.-]{1,40}",
                Just(headers::MESSAGE_ID.to_owned()),
                Just(headers::CORRELATION_ID.to_owned()),
                Just(envelope::ORIGIN_SOURCE.to_owned()),
                Just(envelope::VERSION.to_owned()),
            ],
            proptest::collection::vec(any::<u8>(), 0..3_000),
            0..8,
        ),
        proptest::option::of("[a-z.]{1,255}"),
        "[a-z.]{1,255}",
        ".{0,5000}",
    )
        .prop_map(|(headers, key, source, error)| {
            // A property comes as text of at most 255 bytes.
            let headers = headers
                .into_iter()
                .map(|(name, value)| match name.starts_with("amqp.") {
                    true => (name, value.escape_ascii().take(255).collect()),
                    false => (name, value),
                })
                .collect();
            letter_with(headers, key.map(String::into_bytes), source, error)
        })
}

fn sorted(headers: &Headers) -> Vec<(String, Bytes)> {
    let mut headers: Vec<_> = headers
        .iter()
        .map(|header| (header.name.to_string(), header.value.clone()))
        .collect();
    headers.sort();
    headers
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

    /// The size the sink compares with `frame_max` is the size lapin
    /// writes on the wire.
    #[test]
    fn the_computed_header_size_is_what_lapin_encodes(letter in any_letter()) {
        for shape in [Shape::Full, Shape::Reduced] {
            let properties = properties(&letter, &carrier(), shape, TOKEN);
            let (encoded, _) = cookie_factory::r#gen(
                lapin::protocol::basic::gen_properties(&properties),
                Vec::new(),
            )
            .expect("the properties encode");
            // Class, weight and body size precede the properties.
            proptest::prop_assert_eq!(content_header_len(&properties), 12 + encoded.len());
        }
    }

    /// Whatever the letter, what the sink publishes fits the frame, and
    /// it is rejected only when even the reduced letter does not.
    #[test]
    fn what_the_sink_publishes_fits_the_frame(letter in any_letter()) {
        let room = 4096 - FRAME_OVERHEAD;
        match fitting(&letter, &carrier(), 4096, TOKEN) {
            Fit::Full(properties) => {
                proptest::prop_assert!(content_header_len(&properties) <= room);
            }
            Fit::Reduced { properties, full } => {
                proptest::prop_assert!(full > room);
                proptest::prop_assert!(content_header_len(&properties) <= room);
            }
            Fit::Rejected { reduced } => proptest::prop_assert!(reduced > room),
        }
    }

    /// A letter from an AMQP queue is never rejected: even reduced, it
    /// fits the smallest frame a broker may negotiate (4096 bytes).
    #[test]
    fn a_letter_from_an_amqp_queue_fits_the_smallest_frame(letter in amqp_letter()) {
        let rejected = matches!(fitting(&letter, &carrier(), 4096, TOKEN), Fit::Rejected { .. });
        proptest::prop_assert!(!rejected, "rejected: {:?}", letter);
    }

    /// A letter published whole and delivered from the dead-letter
    /// queue reads back as the letter: origin, key, headers (properties
    /// among them), error, attempts, times.
    #[test]
    fn a_delivered_dead_letter_reads_back_as_the_letter(letter in amqp_letter()) {
        let Fit::Full(properties) = fitting(&letter, &carrier(), 0, TOKEN) else {
            return Err(proptest::test_runner::TestCaseError::fail("no frame limit"));
        };
        let mut delivery = Delivery::mock(
            1,
            ShortString::from("dlx"),
            ShortString::from("orders.dlq"),
            false,
            letter.message.payload().to_vec(),
        );
        delivery.properties = properties;
        let read = read_dead_letter(delivery)
            .map_err(|error| proptest::test_runner::TestCaseError::fail(error.to_string()))?;
        let (written, read_message) = (&letter.message, &read.message);
        proptest::prop_assert_eq!(read_message.payload(), written.payload());
        proptest::prop_assert_eq!(read_message.key(), written.key());
        proptest::prop_assert_eq!(sorted(read_message.headers()), sorted(written.headers()));
        proptest::prop_assert_eq!(read_message.metadata().source(), written.metadata().source());
        proptest::prop_assert_eq!(read_message.metadata().partition(), 7);
        proptest::prop_assert_eq!(read_message.metadata().position(), Position::Tag(u64::MAX));
        proptest::prop_assert_eq!(&read.error, &letter.error);
        proptest::prop_assert_eq!(read.attempts, u32::MAX);
        proptest::prop_assert_eq!(read.headers_omitted, 0);
        let origin = read.origin.expect("origin");
        proptest::prop_assert_eq!(origin.broker, Broker::Amqp);
    }
}
