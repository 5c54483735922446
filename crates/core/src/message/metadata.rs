//! Where a message came from: [`Metadata`] (source, partition, position,
//! timestamp, attempt, the first delivery of a parked copy), and the names
//! it is told by ([`SourceName`], [`Position`], [`PartitionKey`]).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The name of a topic, stream or queue. Cloning is a reference-count bump.
pub type SourceName = Arc<str>;

/// Where a delivery sits in its partition, in the broker's own terms.
///
/// Positions of one partition are strictly increasing in delivery order; they
/// may have gaps (Kafka transaction markers, compaction, deleted stream
/// entries), which the commit engine skips.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Position {
    /// A Kafka offset or a memory-broker offset.
    Offset(i64),
    /// A Redis stream entry id, `<ms>-<seq>`.
    StreamId {
        /// Milliseconds part of the id.
        ms: u64,
        /// Sequence part of the id.
        seq: u64,
    },
    /// An AMQP delivery tag (scoped to the channel it was delivered on).
    Tag(u64),
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Position::Offset(offset) => write!(f, "{offset}"),
            Position::StreamId { ms, seq } => write!(f, "{ms}-{seq}"),
            Position::Tag(tag) => write!(f, "{tag}"),
        }
    }
}

/// Identifies a partition: a source name and a partition number within it.
///
/// Kafka: topic and partition. Redis Streams: the stream key, partition 0.
/// AMQP: the queue and the epoch of the channel the deliveries arrived on (a
/// reopened channel is a new partition, so tags of the old one are fenced).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionKey {
    /// Topic, stream or queue.
    pub source: SourceName,
    /// Partition number within the source.
    pub partition: u32,
}

impl PartitionKey {
    /// A key for `partition` of `source`.
    pub fn new(source: impl Into<SourceName>, partition: u32) -> Self {
        Self {
            source: source.into(),
            partition,
        }
    }
}

impl fmt::Debug for PartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.source, self.partition)
    }
}

impl fmt::Display for PartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Where a message was first delivered: its source, partition and position
/// there. A parked copy that comes back is delivered elsewhere (a return
/// topic, a return stream, the tail of its queue) but is still that message:
/// see [`Metadata::parked_from`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FirstDelivery {
    /// Topic, stream or queue of the first delivery.
    pub source: SourceName,
    /// Partition within it.
    pub partition: u32,
    /// The broker's position of the first delivery.
    pub position: Position,
}

/// Where a message came from and how often it was delivered.
#[derive(Clone)]
pub struct Metadata {
    source: SourceName,
    partition: u32,
    position: Position,
    /// Nanoseconds since the Unix epoch, or [`NO_TIMESTAMP`], or
    /// [`RARE_TIMESTAMP`] for one past ±292 years of 1970. One word where
    /// `Option<SystemTime>` took two: with it the message's allocation is
    /// a 160-byte glibc chunk instead of 176.
    timestamp: i64,
    attempt: u32,
    /// Boxed: only parked copies that came back and timestamps past the
    /// range of `timestamp` have one, and every other message pays one
    /// word for it.
    rare: Option<Arc<RareMetadata>>,
}

/// The parts of [`Metadata`] that a message on the hot path does not have.
#[derive(Clone, Default)]
struct RareMetadata {
    parked_from: Option<FirstDelivery>,
    timestamp: Option<SystemTime>,
}

/// `Metadata::timestamp` for none.
const NO_TIMESTAMP: i64 = i64::MIN;
/// `Metadata::timestamp` for one kept in [`RareMetadata`].
const RARE_TIMESTAMP: i64 = i64::MIN + 1;

/// `time` as nanoseconds since the Unix epoch, if it is within ±292 years
/// of it (and not one of the two markers).
fn epoch_nanos(time: SystemTime) -> Option<i64> {
    let nanos = match time.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_nanos()).ok()?,
        Err(before) => i64::try_from(before.duration().as_nanos())
            .ok()?
            .checked_neg()?,
    };
    (nanos > RARE_TIMESTAMP).then_some(nanos)
}

impl fmt::Debug for Metadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metadata")
            .field("source", &self.source)
            .field("partition", &self.partition)
            .field("position", &self.position)
            .field("timestamp", &self.timestamp())
            .field("attempt", &self.attempt)
            .field("parked_from", &self.parked_from())
            .finish()
    }
}

impl Metadata {
    /// Whether the rarely set fields hold an allocation (the tests check it
    /// is freed once they are unset).
    #[cfg(test)]
    pub(super) fn has_rare(&self) -> bool {
        self.rare.is_some()
    }

    /// Metadata for a first delivery at `position` of `source`/`partition`.
    pub fn new(source: SourceName, partition: u32, position: Position) -> Self {
        Self {
            source,
            partition,
            position,
            timestamp: NO_TIMESTAMP,
            attempt: 1,
            rare: None,
        }
    }

    /// Topic, stream or queue the message was read from.
    pub fn source(&self) -> &SourceName {
        &self.source
    }

    /// Partition within the source.
    pub fn partition(&self) -> u32 {
        self.partition
    }

    /// The partition this message belongs to, as a key.
    pub fn partition_key(&self) -> PartitionKey {
        PartitionKey {
            source: self.source.clone(),
            partition: self.partition,
        }
    }

    /// The broker's position of the message within its partition.
    pub fn position(&self) -> Position {
        self.position
    }

    /// When the broker (or producer) stamped the message, if it did.
    pub fn timestamp(&self) -> Option<SystemTime> {
        match self.timestamp {
            NO_TIMESTAMP => None,
            RARE_TIMESTAMP => self.rare.as_ref().and_then(|rare| rare.timestamp),
            nanos => match u64::try_from(nanos) {
                Ok(after) => SystemTime::UNIX_EPOCH.checked_add(Duration::from_nanos(after)),
                Err(_) => {
                    SystemTime::UNIX_EPOCH.checked_sub(Duration::from_nanos(nanos.unsigned_abs()))
                }
            },
        }
    }

    /// Delivery attempt, starting at 1. Counts broker redeliveries where the
    /// broker keeps a count (Redis, AMQP quorum queues) and in-process retries.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Where this message was first delivered, when this delivery came
    /// back from a park (a parked copy, or on NATS the original handed back
    /// after its delay, whose first delivery is its own position); `None`
    /// for a message delivered first-hand. A handler tells a second chance
    /// by it (`meta.parked_from().is_some()`).
    ///
    /// The [`ParkingLayer`](crate::parking::ParkingLayer) sets it, for the
    /// layers and handler inside it, from the park headers of a copy its
    /// parking gave back (never from headers a producer wrote on an
    /// ordinary message). What identifies a message across redeliveries
    /// (an exactly-once marker, a dead letter's origin) is this first
    /// delivery, not the copy's own position, which is new each time the
    /// message is parked.
    pub fn parked_from(&self) -> Option<&FirstDelivery> {
        self.rare
            .as_ref()
            .and_then(|rare| rare.parked_from.as_ref())
    }

    /// The first delivery of this message: [`parked_from`](Self::parked_from)
    /// for a parked copy that came back, this delivery otherwise.
    pub fn first_delivery(&self) -> FirstDelivery {
        match self.parked_from() {
            Some(first) => first.clone(),
            None => FirstDelivery {
                source: self.source.clone(),
                partition: self.partition,
                position: self.position,
            },
        }
    }

    /// Sets where this message was first delivered (see
    /// [`parked_from`](Self::parked_from)).
    pub fn set_parked_from(&mut self, first: Option<FirstDelivery>) {
        self.set_rare(|rare| rare.parked_from = first);
    }

    /// Changes the rare parts, allocating them only when they are not all
    /// `None` afterwards.
    fn set_rare(&mut self, change: impl FnOnce(&mut RareMetadata)) {
        let mut rare = self
            .rare
            .take()
            .map(Arc::unwrap_or_clone)
            .unwrap_or_default();
        change(&mut rare);
        if rare.parked_from.is_some() || rare.timestamp.is_some() {
            self.rare = Some(Arc::new(rare));
        }
    }

    /// Sets the timestamp.
    pub fn set_timestamp(&mut self, timestamp: Option<SystemTime>) {
        let nanos = match timestamp {
            None => Some(NO_TIMESTAMP),
            Some(time) => epoch_nanos(time),
        };
        if self.timestamp == RARE_TIMESTAMP {
            self.set_rare(|rare| rare.timestamp = None);
        }
        match nanos {
            Some(nanos) => self.timestamp = nanos,
            None => {
                self.timestamp = RARE_TIMESTAMP;
                self.set_rare(|rare| rare.timestamp = timestamp);
            }
        }
    }

    /// Sets the timestamp from milliseconds since the Unix epoch (negative:
    /// before it), the unit Kafka records and Redis stream ids carry.
    /// The same as [`set_timestamp`](Self::set_timestamp) with that instant,
    /// without making a `SystemTime` only to take it apart again (a few
    /// percent of a Kafka source's polling thread).
    pub fn set_timestamp_unix_millis(&mut self, millis: i64) {
        match millis
            .checked_mul(1_000_000)
            .filter(|nanos| *nanos > RARE_TIMESTAMP)
        {
            Some(nanos) if self.timestamp != RARE_TIMESTAMP => self.timestamp = nanos,
            _ => {
                let after = Duration::from_millis(millis.unsigned_abs());
                let time = if millis >= 0 {
                    SystemTime::UNIX_EPOCH.checked_add(after)
                } else {
                    SystemTime::UNIX_EPOCH.checked_sub(after)
                };
                self.set_timestamp(time);
            }
        }
    }

    /// Sets the delivery attempt (1 = first delivery).
    pub fn set_attempt(&mut self, attempt: u32) {
        self.attempt = attempt.max(1);
    }

    /// Builder form of [`Metadata::set_timestamp`].
    pub fn with_timestamp(mut self, timestamp: SystemTime) -> Self {
        self.set_timestamp(Some(timestamp));
        self
    }

    /// Builder form of [`Metadata::set_attempt`].
    pub fn with_attempt(mut self, attempt: u32) -> Self {
        self.set_attempt(attempt);
        self
    }
}
