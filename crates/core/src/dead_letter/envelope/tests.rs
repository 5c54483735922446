use std::borrow::Cow;

use super::fields::FIELDS;
use super::*;
use crate::dead_letter::DeadLetter;
use crate::message::Position;

#[test]
fn an_error_capped_once_is_not_cut_again() {
    let long = "é".repeat(5_000);
    let capped = capped_error(&long, DeadLetter::ERROR_LIMIT).into_owned();
    assert!(capped.len() <= DeadLetter::ERROR_LIMIT, "{}", capped.len());
    assert!(capped.ends_with(" bytes cut)"), "{capped}");
    assert!(matches!(
        capped_error(&capped, DeadLetter::ERROR_LIMIT),
        Cow::Borrowed(_)
    ));
}

#[test]
fn every_field_name_is_in_the_reserved_namespace_and_none_is_a_producer_name() {
    for field in FIELDS {
        assert!(field.starts_with(RESERVED_PREFIX), "{field}");
        assert!(!field.starts_with(PRODUCER_PREFIX), "{field}");
    }
}

#[test]
fn a_position_is_read_as_its_broker_prints_it() {
    let cases = [
        (Broker::Kafka, Position::Offset(41)),
        (Broker::Memory, Position::Offset(0)),
        (Broker::Nats, Position::Offset(1)),
        (
            Broker::Redis,
            Position::StreamId {
                ms: 1_700_000_000_000,
                seq: 3,
            },
        ),
        (Broker::Amqp, Position::Tag(u64::MAX)),
    ];
    for (broker, position) in cases {
        assert_eq!(broker.position(&position.to_string()), Some(position));
        assert_eq!(Broker::of(position, broker), broker);
    }
    assert_eq!(
        Broker::of(Position::Offset(1), Broker::Redis),
        Broker::Kafka
    );
    assert_eq!(Broker::Redis.position("17"), None);
}
