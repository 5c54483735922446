//! The dead-letter envelope, through its public API only (as a backend's
//! sink and the DLQ tooling use it): any letter written as the envelope and
//! read back with `DeadLetter::read` is the letter it was, with the error
//! capped; producer headers named like envelope fields change nothing of the
//! origin and come back under their own names; and no carrier content makes
//! the reader panic.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use intake_core::dead_letter::PayloadReference;
use intake_core::dead_letter::envelope::{self, Broker, Carrier, Envelope, Origin};
use intake_core::{DeadLetter, ErrorClass, Headers, Message, Metadata, Position};
use proptest::prelude::*;

/// What a carrier holds after a sink wrote `envelope`: the record's key
/// slot, the payload, and the pairs as headers (or stream fields).
fn carried(envelope: &Envelope<'_>) -> (Option<Bytes>, Bytes, Headers) {
    let headers = envelope
        .pairs()
        .map(|(name, value)| (name.into_owned(), Bytes::copy_from_slice(value)))
        .collect();
    (envelope.key().cloned(), envelope.payload().clone(), headers)
}

fn broker() -> impl Strategy<Value = Broker> {
    prop_oneof![
        Just(Broker::Kafka),
        Just(Broker::Redis),
        Just(Broker::Amqp),
        Just(Broker::Memory),
        Just(Broker::Nats),
    ]
}

fn position() -> impl Strategy<Value = Position> {
    prop_oneof![
        any::<i64>().prop_map(Position::Offset),
        (any::<u64>(), any::<u64>()).prop_map(|(ms, seq)| Position::StreamId { ms, seq }),
        any::<u64>().prop_map(Position::Tag),
    ]
}

/// Header names a producer may choose, envelope names and near misses
/// among them.
fn header_name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z-]{1,12}",
        1 => ".{0,16}",
        1 => Just(envelope::ORIGIN_SOURCE.to_owned()),
        1 => Just(envelope::ORIGIN_KEY.to_owned()),
        1 => Just(envelope::VERSION.to_owned()),
        1 => Just(envelope::ERROR_MESSAGE.to_owned()),
        1 => Just(envelope::FAILED_FIRST.to_owned()),
        1 => Just(envelope::REFERENCE_HEADERS.to_owned()),
        1 => Just(envelope::RESERVED_PREFIX.to_owned()),
        1 => Just(format!("{}x", envelope::PRODUCER_PREFIX)),
        1 => "intake\\.[a-z.]{0,12}",
    ]
}

fn headers() -> impl Strategy<Value = Headers> {
    proptest::collection::vec(
        (header_name(), proptest::collection::vec(any::<u8>(), 0..48)),
        0..8,
    )
    .prop_map(|headers| {
        headers
            .into_iter()
            .map(|(name, value)| (name, Bytes::from(value)))
            .collect()
    })
}

fn message() -> impl Strategy<Value = Message> {
    (
        proptest::collection::vec(any::<u8>(), 0..128),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..32)),
        headers(),
        ".{0,40}",
        any::<u32>(),
        position(),
        1..5_u32,
    )
        .prop_map(
            |(payload, key, headers, source, partition, position, attempt)| {
                let metadata = Metadata::new(source.as_str().into(), partition, position)
                    .with_attempt(attempt);
                let message = Message::new(payload, metadata).with_headers(headers);
                match key {
                    Some(key) => message.with_key(key),
                    None => message,
                }
            },
        )
}

fn class() -> impl Strategy<Value = ErrorClass> {
    prop_oneof![
        Just(ErrorClass::Permanent),
        Just(ErrorClass::Retryable),
        Just(ErrorClass::Ignore),
        Just(ErrorClass::Interrupted),
    ]
}

/// Milliseconds since the epoch up to the year 2100.
fn time() -> impl Strategy<Value = SystemTime> {
    (0..4_102_444_800_000_u64).prop_map(|millis| UNIX_EPOCH + Duration::from_millis(millis))
}

fn name() -> impl Strategy<Value = Option<Arc<str>>> {
    proptest::option::of(".{0,24}".prop_map(|name| Arc::from(name.as_str())))
}

fn origin() -> impl Strategy<Value = Option<Origin>> {
    proptest::option::of(
        (broker(), name(), name()).prop_map(|(broker, group, consumer)| {
            let mut origin = Origin::new(broker);
            origin.group = group;
            origin.consumer = consumer;
            origin
        }),
    )
}

fn reference() -> impl Strategy<Value = Option<PayloadReference>> {
    proptest::option::of(any::<(u32, u16, u8, u32)>().prop_map(
        |(payload_bytes, key_bytes, headers, header_bytes)| PayloadReference {
            payload_bytes: payload_bytes as usize,
            key_bytes: usize::from(key_bytes),
            headers: usize::from(headers),
            header_bytes: header_bytes as usize,
        },
    ))
}

prop_compose! {
    /// A letter with every field chosen, its error not yet capped.
    fn letter()(
        message in message(),
        error in prop_oneof![3 => ".{0,64}", 1 => ".{4000,4200}", 1 => "é{2000,2100}"],
        class in class(),
        attempts in any::<u32>(),
        first in time(),
        last in time(),
        replays in any::<u32>(),
        reference in reference(),
        origin in origin(),
        headers_omitted in prop_oneof![Just(0_u32), Just(u32::MAX - 2), any::<u32>()],
    ) -> DeadLetter {
        let mut letter = DeadLetter::new(message, "", attempts).with_class(class);
        letter.error = error;
        letter.first_failed_at = first;
        letter.failed_at = last;
        letter.replays = replays;
        letter.reference = reference;
        letter.origin = origin;
        letter.headers_omitted = headers_omitted;
        letter
    }
}

fn carrier() -> impl Strategy<Value = Carrier> {
    (broker(), any::<bool>(), name(), name()).prop_map(|(broker, keyed, group, consumer)| {
        let carrier = match keyed {
            true => Carrier::keyed(broker),
            false => Carrier::keyless(broker),
        };
        let carrier = match group {
            Some(group) => carrier.with_group(group),
            None => carrier,
        };
        match consumer {
            Some(consumer) => carrier.with_consumer(consumer),
            None => carrier,
        }
    })
}

fn millis(time: SystemTime) -> u128 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis())
}

/// The error a letter carries for `error`: the same cap `DeadLetter::new`
/// applies.
fn capped(error: &str) -> String {
    DeadLetter::new(
        Message::new("", Metadata::new("s".into(), 0, Position::Offset(0))),
        error,
        1,
    )
    .error
}

/// Asserts everything of `read` but the headers, the omitted count and the
/// error equals `written`, as written by a sink of `carrier`.
fn assert_same_letter(
    read: &DeadLetter,
    written: &DeadLetter,
    carrier: &Carrier,
) -> Result<(), TestCaseError> {
    let (message, original) = (&read.message, &written.message);
    prop_assert_eq!(message.payload(), original.payload());
    prop_assert_eq!(message.key(), original.key());
    let (metadata, origin) = (message.metadata(), original.metadata());
    prop_assert_eq!(metadata.source(), origin.source());
    prop_assert_eq!(metadata.partition(), origin.partition());
    prop_assert_eq!(metadata.position(), origin.position());
    prop_assert_eq!(metadata.attempt(), written.attempts.max(1));
    prop_assert_eq!(read.class, written.class);
    prop_assert_eq!(read.attempts, written.attempts);
    prop_assert_eq!(
        millis(read.first_failed_at),
        millis(written.first_failed_at)
    );
    prop_assert_eq!(millis(read.failed_at), millis(written.failed_at));
    prop_assert_eq!(read.replays, written.replays);
    prop_assert_eq!(read.reference, written.reference);
    let expected = match &written.origin {
        Some(origin) => origin.clone(),
        None => {
            let mut origin = Origin::new(carrier.broker());
            origin.group = carrier.group().cloned();
            origin.consumer = carrier.consumer().cloned();
            origin
        }
    };
    let read_origin = read
        .origin
        .as_ref()
        .expect("a letter read back has an origin");
    prop_assert_eq!(
        read_origin.broker,
        Broker::of(origin.position(), expected.broker)
    );
    prop_assert_eq!(&read_origin.group, &expected.group);
    prop_assert_eq!(&read_origin.consumer, &expected.consumer);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any message, error, origin and headers (producer headers named
    /// `intake.…` among them) written as the envelope and read back is the
    /// letter that was written, its error capped.
    #[test]
    fn a_letter_written_as_the_envelope_reads_back_as_itself(
        letter in letter(),
        carrier in carrier(),
    ) {
        let envelope = Envelope::new(&letter, &carrier);
        let (key_slot, payload, headers) = carried(&envelope);
        let read = DeadLetter::read(key_slot, payload, &headers)
            .map_err(|error| TestCaseError::fail(format!("{error}: {headers:?}")))?;
        assert_same_letter(&read, &letter, &carrier)?;
        prop_assert_eq!(read.message.headers(), letter.message.headers());
        prop_assert_eq!(read.headers_omitted, letter.headers_omitted);
        prop_assert_eq!(&read.error, &capped(&letter.error));
        prop_assert!(read.error.len() <= DeadLetter::ERROR_LIMIT);
        // Every name the carrier holds is the envelope's or the producer's
        // under its own name outside the namespace: none passes for a field.
        for header in &headers {
            let name = &*header.name;
            prop_assert!(
                !name.starts_with(envelope::RESERVED_PREFIX)
                    || name.starts_with(envelope::PRODUCER_PREFIX)
                    || envelope.fields().any(|(field, _)| field == name),
                "{} is carried as is", name
            );
        }
    }

    /// A reduced letter keeps everything but the producer's headers, which
    /// it counts, and cuts the error to the reduced limit.
    #[test]
    fn a_reduced_letter_reads_back_without_its_headers_counting_them(
        letter in letter(),
        carrier in carrier(),
        limit in 64..2048_usize,
    ) {
        let envelope = Envelope::new(&letter, &carrier).reduced(limit);
        prop_assert!(envelope.is_reduced());
        let (key_slot, payload, headers) = carried(&envelope);
        let read = DeadLetter::read(key_slot, payload, &headers)
            .map_err(|error| TestCaseError::fail(format!("{error}: {headers:?}")))?;
        assert_same_letter(&read, &letter, &carrier)?;
        prop_assert!(read.message.headers().is_empty());
        let headers = u32::try_from(letter.message.headers().len()).unwrap_or(u32::MAX);
        prop_assert_eq!(
            read.headers_omitted,
            letter.headers_omitted.saturating_add(headers),
        );
        prop_assert!(read.error.len() <= limit, "{} bytes", read.error.len());
    }

    /// Whatever a carrier holds (a letter changed by hand, another
    /// producer's record), reading it is a letter or a typed error, never a
    /// panic.
    #[test]
    fn reading_any_carrier_content_is_a_letter_or_a_typed_error(
        key in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..16)),
        headers in proptest::collection::vec(
            (
                prop_oneof![
                    Just(envelope::VERSION.to_owned()),
                    Just(envelope::ORIGIN_BROKER.to_owned()),
                    Just(envelope::ORIGIN_POSITION.to_owned()),
                    Just(envelope::FAILED_LAST.to_owned()),
                    Just(envelope::REFERENCE_KEY_BYTES.to_owned()),
                    header_name(),
                ],
                prop_oneof![
                    Just(b"1".to_vec()),
                    Just(b"redis".to_vec()),
                    Just(b"18446744073709551615".to_vec()),
                    proptest::collection::vec(any::<u8>(), 0..24),
                ],
            ),
            0..24,
        ),
    ) {
        let headers: Headers = headers
            .into_iter()
            .map(|(name, value)| (name, Bytes::from(value)))
            .collect();
        let _ = DeadLetter::read(key.map(Bytes::from), Bytes::new(), &headers);
    }
}

#[test]
fn a_letter_without_the_version_is_not_a_dead_letter() {
    let headers: Headers = [(envelope::ORIGIN_SOURCE, Bytes::from_static(b"orders"))]
        .into_iter()
        .collect();
    let error = DeadLetter::read(None, Bytes::new(), &headers).expect_err("no version");
    assert!(matches!(
        error,
        envelope::EnvelopeError::Missing { field } if field == envelope::VERSION
    ));
}

#[test]
fn a_field_written_twice_is_refused_rather_than_guessed() {
    let letter = DeadLetter::new(
        Message::new("x", Metadata::new("orders".into(), 0, Position::Offset(4))),
        "bad",
        1,
    );
    let carrier = Carrier::keyed(Broker::Kafka);
    let (key, payload, mut headers) = carried(&Envelope::new(&letter, &carrier));
    headers.insert(envelope::ORIGIN_SOURCE, Bytes::from_static(b"elsewhere"));
    let error = DeadLetter::read(key, payload, &headers).expect_err("ambiguous origin");
    assert!(matches!(
        error,
        envelope::EnvelopeError::Duplicate { field } if field == envelope::ORIGIN_SOURCE
    ));
}

#[test]
fn a_newer_envelope_is_refused_with_its_version() {
    let letter = DeadLetter::new(
        Message::new("x", Metadata::new("orders".into(), 0, Position::Offset(4))),
        "bad",
        1,
    );
    let carrier = Carrier::keyed(Broker::Kafka);
    let (key, payload, headers) = carried(&Envelope::new(&letter, &carrier));
    let headers: Headers = headers
        .iter()
        .map(|header| match &*header.name {
            envelope::VERSION => (header.name.clone(), Bytes::from_static(b"2")),
            _ => (header.name.clone(), header.value.clone()),
        })
        .collect();
    let error = DeadLetter::read(key, payload, &headers).expect_err("version 2");
    assert_eq!(
        error.to_string(),
        "the dead letter's envelope is version 2; this intake reads version 1"
    );
}

#[test]
fn a_replayed_message_keeps_its_first_failure_and_replay_count() {
    let message = Message::new("x", Metadata::new("orders".into(), 0, Position::Offset(4)))
        .with_headers(
            [
                (envelope::FAILED_FIRST, Bytes::from_static(b"1700000000000")),
                (envelope::REPLAYS, Bytes::from_static(b"2")),
            ]
            .into_iter()
            .collect(),
        );
    let letter = DeadLetter::new(message, "bad again", 1);
    assert_eq!(
        letter.first_failed_at,
        UNIX_EPOCH + Duration::from_millis(1_700_000_000_000)
    );
    assert_eq!(letter.replays, 2);
    assert!(letter.failed_at > letter.first_failed_at);
}
