//! [`MessageId`]: what identifies a message in the marker table.

use std::sync::Arc;

use intake_core::{Message, Position, SourceName};

use crate::error::Error;

/// Longest message id accepted from a header, in bytes. Longer ids would
/// bloat the marker index (and past about 2.7 kB PostgreSQL refuses them).
pub const MAX_MESSAGE_ID_LEN: usize = 512;

/// How a message is identified in the marker table: the same message
/// delivered again must get the same identity.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum MessageId {
    /// Source, partition and broker position: a Kafka or memory-broker
    /// offset, a Redis stream entry id. These are stable across redelivery.
    /// The default. A parked copy that came back through a
    /// [`ParkingLayer`](intake_core::parking::ParkingLayer) outside the
    /// exactly-once handler is identified by its first delivery
    /// ([`Metadata::parked_from`](intake_core::Metadata::parked_from)), so
    /// a message parked twice (a crash between the park and the
    /// acknowledgement) still has its effects applied once.
    ///
    /// A position identifies a message only within one life of its source.
    /// A Kafka topic that is deleted and created again starts its offsets
    /// at 0, and a Redis stream created again takes the ids its producers
    /// give (Redis's own `*` ids come from its clock and do not repeat, but
    /// explicit ids, or a failover to a server whose clock is behind, do):
    /// messages at positions seen before are then skipped as duplicates and
    /// their effects lost, until the markers are pruned. (Kafka names each
    /// life of a topic with a topic id, but rdkafka does not hand it to
    /// consumers, so the position cannot include it.) Where sources may be
    /// recreated, or producers can set an id, prefer
    /// [`Header`](Self::Header).
    #[default]
    Position,
    /// The value of this header, per source (the partition is not part of
    /// the identity). The recommended identity wherever producers can set a
    /// unique id: it survives a source deleted and created again, and also
    /// skips copies a producer sent twice. Required for brokers whose
    /// positions change on redelivery (AMQP delivery tags: use
    /// `"amqp.message-id"`, the `message-id` property). A message without
    /// the header fails permanently.
    Header(Arc<str>),
}

impl MessageId {
    /// Identify messages by the value of header `name`.
    pub fn header(name: impl Into<Arc<str>>) -> Self {
        MessageId::Header(name.into())
    }

    /// The marker key of `message`.
    pub(crate) fn key_of(&self, message: &Message) -> Result<MarkerKey, Error> {
        let metadata = message.metadata();
        match self {
            MessageId::Position => {
                // A parked copy that came back is the message of its first
                // delivery: its own position is new with every park.
                let first = metadata.first_delivery();
                let id = match first.position {
                    Position::Offset(offset) => offset.to_string(),
                    Position::StreamId { ms, seq } => format!("{ms}-{seq}"),
                    Position::Tag(_) => {
                        return Err(Error::UnstablePosition {
                            source_name: metadata.source().to_string(),
                        });
                    }
                };
                Ok(MarkerKey {
                    source: first.source,
                    partition: i64::from(first.partition),
                    id,
                })
            }
            MessageId::Header(name) => {
                let problem = |problem| Error::MessageId {
                    header: name.to_string(),
                    problem,
                };
                let value = message
                    .headers()
                    .get(name)
                    .ok_or_else(|| problem("missing"))?;
                let id = std::str::from_utf8(value).map_err(|_| problem("not UTF-8"))?;
                if id.is_empty() {
                    return Err(problem("empty"));
                }
                if id.len() > MAX_MESSAGE_ID_LEN {
                    return Err(problem("longer than 512 bytes"));
                }
                if id.contains('\0') {
                    return Err(problem("contains a NUL byte"));
                }
                Ok(MarkerKey {
                    source: metadata.source().clone(),
                    partition: HEADER_ID_PARTITION,
                    id: id.to_owned(),
                })
            }
        }
    }
}

/// The `partition` stored for ids taken from a header: the id identifies the
/// message across partitions (and AMQP channels, which are partitions).
pub const HEADER_ID_PARTITION: i64 = -1;

/// One row of the marker table, without the group.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct MarkerKey {
    pub(crate) source: SourceName,
    pub(crate) partition: i64,
    pub(crate) id: String,
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use intake_core::{Headers, Metadata};

    use super::*;

    fn at(position: Position) -> Message {
        Message::new(Bytes::new(), Metadata::new("orders".into(), 3, position))
    }

    #[test]
    fn offsets_and_stream_ids_identify_a_message_with_its_partition() {
        let key = MessageId::Position
            .key_of(&at(Position::Offset(42)))
            .unwrap();
        assert_eq!((&*key.source, key.partition, &*key.id), ("orders", 3, "42"));
        let key = MessageId::Position
            .key_of(&at(Position::StreamId { ms: 17, seq: 2 }))
            .unwrap();
        assert_eq!(key.id, "17-2");
    }

    #[test]
    fn a_parked_copy_is_identified_by_its_first_delivery_not_its_own_position() {
        // The copy came back through the group's return topic at offset 7;
        // it is the message first delivered at orders/3 @ 42, whose marker
        // a second copy of it (a crash between the park and the
        // acknowledgement) must find.
        let mut copy = Message::new(
            Bytes::new(),
            Metadata::new("orders.billing.returned".into(), 3, Position::Offset(7)),
        );
        copy.metadata_mut()
            .set_parked_from(Some(intake_core::FirstDelivery {
                source: "orders".into(),
                partition: 3,
                position: Position::Offset(42),
            }));
        let key = MessageId::Position.key_of(&copy).unwrap();
        let original = MessageId::Position
            .key_of(&at(Position::Offset(42)))
            .unwrap();
        assert_eq!(key, original);
    }

    #[test]
    fn a_parked_copy_with_a_header_id_is_scoped_to_its_first_deliverys_source() {
        // Back through the return topic, the copy of a message first
        // delivered on `orders` carries its id header: it is that message,
        // whose original a crash may deliver again on `orders`.
        let headers: Headers = [("message-id", "order-9")].into_iter().collect();
        let original = at(Position::Offset(42)).with_headers(headers.clone());
        let mut copy = Message::new(
            Bytes::new(),
            Metadata::new("orders.billing.returned".into(), 3, Position::Offset(7)),
        )
        .with_headers(headers);
        copy.metadata_mut()
            .set_parked_from(Some(intake_core::FirstDelivery {
                source: "orders".into(),
                partition: 3,
                position: Position::Offset(42),
            }));
        let id = MessageId::header("message-id");
        assert_eq!(id.key_of(&copy).unwrap(), id.key_of(&original).unwrap());
    }

    #[test]
    fn a_header_id_with_a_control_character_is_refused() {
        let id = MessageId::header("message-id");
        for value in [
            "a\nb",
            "a\rb",
            "a\tb",
            "\u{1b}[31m",
            "a\u{7f}",
            "a\u{85}b",
            "a\u{9b}",
        ] {
            let headers: Headers = [("message-id", value)].into_iter().collect();
            let error = id
                .key_of(&at(Position::Offset(1)).with_headers(headers))
                .unwrap_err();
            assert!(
                error.to_string().contains("control character"),
                "{value:?}: {error}"
            );
            assert_eq!(error.class(), intake_core::ErrorClass::Permanent);
        }
        let headers: Headers = [("message-id", "Bestellung ä-9 ✓")].into_iter().collect();
        assert!(
            id.key_of(&at(Position::Offset(1)).with_headers(headers))
                .is_ok()
        );
    }

    #[test]
    fn delivery_tags_are_refused_because_they_change_on_redelivery() {
        let error = MessageId::Position
            .key_of(&at(Position::Tag(7)))
            .unwrap_err();
        assert!(error.to_string().contains("amqp.message-id"), "{error}");
    }

    #[test]
    fn a_header_id_ignores_the_partition() {
        let headers: Headers = [("message-id", "order-9")].into_iter().collect();
        let message = at(Position::Tag(7)).with_headers(headers);
        let key = MessageId::header("message-id").key_of(&message).unwrap();
        assert_eq!((key.partition, &*key.id), (HEADER_ID_PARTITION, "order-9"));
    }

    #[test]
    fn a_missing_or_unusable_header_id_is_a_permanent_error() {
        let id = MessageId::header("message-id");
        let missing = id.key_of(&at(Position::Offset(1))).unwrap_err();
        assert_eq!(missing.class(), intake_core::ErrorClass::Permanent);
        let headers: Headers = [("message-id", Bytes::from_static(b"\xff"))]
            .into_iter()
            .collect();
        let invalid = id
            .key_of(&at(Position::Offset(1)).with_headers(headers))
            .unwrap_err();
        assert!(invalid.to_string().contains("not UTF-8"), "{invalid}");
    }
}
