//! [`Broker`]: the broker a dead-lettered message was consumed from, and
//! how it prints positions.

use std::fmt;

use crate::message::Position;

/// The broker a dead-lettered message was consumed from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Broker {
    /// Apache Kafka: positions are offsets.
    Kafka,
    /// Redis Streams: positions are entry ids.
    Redis,
    /// AMQP 0-9-1 (RabbitMQ): positions are delivery tags.
    Amqp,
    /// intake's in-process broker: positions are offsets.
    Memory,
    /// NATS JetStream: positions are stream sequences, carried as offsets.
    Nats,
}

impl Broker {
    /// The name the envelope carries: `kafka`, `redis`, `amqp`, `memory`,
    /// `nats`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Broker::Kafka => "kafka",
            Broker::Redis => "redis",
            Broker::Amqp => "amqp",
            Broker::Memory => "memory",
            Broker::Nats => "nats",
        }
    }

    /// The broker of that name, if intake knows it.
    pub fn from_name(name: &str) -> Option<Self> {
        [
            Broker::Kafka,
            Broker::Redis,
            Broker::Amqp,
            Broker::Memory,
            Broker::Nats,
        ]
        .into_iter()
        .find(|broker| broker.as_str() == name)
    }

    /// The broker a message at `position` came from: `preferred` when its
    /// positions have that form, otherwise the broker whose do (an offset
    /// is Kafka's).
    pub fn of(position: Position, preferred: Broker) -> Self {
        match position {
            _ if preferred.has_positions_like(position) => preferred,
            Position::Offset(_) => Broker::Kafka,
            Position::StreamId { .. } => Broker::Redis,
            Position::Tag(_) => Broker::Amqp,
        }
    }

    fn has_positions_like(self, position: Position) -> bool {
        matches!(
            (self, position),
            (
                Broker::Kafka | Broker::Memory | Broker::Nats,
                Position::Offset(_)
            ) | (Broker::Redis, Position::StreamId { .. })
                | (Broker::Amqp, Position::Tag(_))
        )
    }

    /// `text` as a position of this broker.
    pub(super) fn position(self, text: &str) -> Option<Position> {
        match self {
            Broker::Kafka | Broker::Memory | Broker::Nats => {
                text.parse().ok().map(Position::Offset)
            }
            Broker::Redis => {
                let (ms, seq) = text.split_once('-')?;
                Some(Position::StreamId {
                    ms: ms.parse().ok()?,
                    seq: seq.parse().ok()?,
                })
            }
            Broker::Amqp => text.parse().ok().map(Position::Tag),
        }
    }
}

impl fmt::Display for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
