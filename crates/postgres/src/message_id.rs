//! [`MessageId`]: what identifies a message in the marker table.

use std::sync::Arc;

use intake_core::{Message, Position, SourceName};

use crate::error::Error;

/// Longest message id accepted from a header, in bytes. Longer ids would
/// bloat the marker index (and past about 2.7 kB PostgreSQL refuses them).
pub const MAX_MESSAGE_ID_LEN: usize = 512;

/// How a message is identified in the marker table: the same message
/// delivered again must get the same identity, and two messages must never
/// share one (the later would be skipped as a duplicate: acknowledged,
/// its effects never applied).
///
/// | mode | identity, within one consumer group | chosen by |
/// |---|---|---|
/// | [`Position`](Self::Position) (default) | first delivery's source, partition and broker position | the broker |
/// | [`Header`](Self::Header) | first delivery's source and the header's value | the producer |
///
/// Under both, a parked copy that came back through a
/// [`ParkingLayer`](intake_core::parking::ParkingLayer) outside the
/// exactly-once handler keeps the identity of its first delivery
/// ([`Metadata::parked_from`](intake_core::Metadata::parked_from)), not of
/// the return topic or stream it came back through: a message parked twice
/// (a crash between the park and the acknowledgement), or parked and then
/// delivered again from its source, has its effects applied once. The
/// parking layer believes the origin only on copies read from its own
/// return destinations, so whoever may write to those may claim any first
/// delivery: give them the source's write permissions, no wider.
///
/// Which to choose: [`Header`](Self::Header) where every producer of a
/// source sets a unique, unguessable id and all of them are trusted (it
/// also survives a source created again, and skips copies a producer sent
/// twice); [`Position`](Self::Position) where producers set no id, or are
/// not all trusted, and the source is never deleted and created again
/// under the same name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum MessageId {
    /// Source, partition and broker position: a Kafka or memory-broker
    /// offset, a NATS stream sequence, a Redis stream entry id. These are
    /// stable across redelivery. The default. A parked copy is identified
    /// by its first delivery (see [above](Self)).
    ///
    /// The broker assigns positions, so no producer can give its message
    /// the identity of another one within one life of the source (a Redis
    /// producer may choose its entry ids, but a stream refuses an id not
    /// above its last one).
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
    /// recreated, drop the group's markers of the old life
    /// (`DELETE FROM <marker table> WHERE consumer_group = $1 AND source =
    /// $2`) before the new one is consumed, or use
    /// [`Header`](Self::Header).
    #[default]
    Position,
    /// The value of this header, scoped to the consumer group and the
    /// first delivery's source (topic, stream or queue); the partition and
    /// the position are not part of the identity. The recommended identity
    /// wherever producers set a unique id and are trusted: it survives a
    /// source deleted and created again, and also skips copies a producer
    /// sent twice. Required for brokers whose positions change on
    /// redelivery (AMQP delivery tags: use `"amqp.message-id"`, the
    /// `message-id` property).
    ///
    /// The id is the producer's word, and nothing checks it. Any producer
    /// that can write to the source can give its message the id of another
    /// message: whichever is processed first runs, and the other is skipped
    /// as a duplicate, acknowledged, counted in
    /// [`duplicates`](crate::ExactlyOnceCounters::duplicates) and logged at
    /// `debug`, its effects never applied. So it can suppress a message
    /// whose id it can guess (a sequence number, an order number) or sees
    /// before it is processed (on another partition, which may be read
    /// ahead); reusing the id of a message processed earlier (within the
    /// markers' retention) only skips its own message. The scope bounds who
    /// can: a producer of another source, or the messages of another
    /// consumer group, are untouched. Keep it so:
    ///
    /// - let only producers of one trust domain write to a source (the
    ///   broker's ACLs; the parking's return destinations alike), and never
    ///   consume several producers' topics as one source name;
    /// - have producers set unguessable ids (random UUIDs, v4 or v7), not
    ///   sequence numbers;
    /// - watch the duplicates counter: duplicates without crashes,
    ///   rebalances or producer retries are worth a look.
    ///
    /// Where producers are not all trusted, use [`Position`](Self::Position)
    /// (the broker's identity) instead. Nothing compares the position of a
    /// skipped message with the first one's: the marker does not keep it.
    ///
    /// Refused, as a permanent error for the message: no header, a value
    /// that is not UTF-8, is empty, longer than [`MAX_MESSAGE_ID_LEN`], or
    /// holds a control character (NUL, which PostgreSQL text cannot hold,
    /// and the others, which would put forged lines or terminal escapes
    /// into the logs and errors that show the id).
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
                if id.chars().any(char::is_control) {
                    return Err(problem("contains a control character"));
                }
                // A parked copy is the message of its first delivery, also
                // when it came back through a return topic or stream.
                let source = match metadata.parked_from() {
                    Some(first) => first.source.clone(),
                    None => metadata.source().clone(),
                };
                Ok(MarkerKey {
                    source,
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
