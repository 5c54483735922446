//! Retry later without blocking: a message whose failure asks to be
//! [retried later](crate::HandlerError::retry_later) is **parked** through
//! the broker's own mechanism, and neither its partition nor the consumer
//! waits for it.
//!
//! A backend implements [`Parking`]: it either writes a copy of the message
//! somewhere that gives it back after the delay ([`Parked::Moved`]: Kafka
//! retry topics, RabbitMQ wait queues, a Redis due-time index, the memory
//! broker's timers), and the original is acknowledged only after the broker
//! confirmed that copy; or it lets the broker itself redeliver the original
//! later ([`Parked::HandedBack`]: NATS `nak` with a delay, sent by the
//! acker).
//!
//! [`ParkingLayer`] decides what to park:
//!
//! - a failure that asks for later (a handler's
//!   [`HandlerError::retry_later`](crate::HandlerError::retry_later), or the
//!   retry layer's after its attempts, with
//!   [`then_retry_later`](crate::RetryLayer::then_retry_later)) is parked
//!   for the delay it asks, and acknowledged;
//! - **order per key**: while a key has a parked message, the later messages
//!   of that key are parked behind it without running, and each comes back
//!   only after the ones before it are done. Every other key keeps flowing.
//!   A parked message that comes back while one before it is still parked
//!   is parked again, behind it;
//! - a message parked [`max_parks`](ParkingLayer::max_parks) times that
//!   asks for later once more becomes a
//!   [permanent](crate::ErrorClass::Permanent) failure, which a
//!   [`DeadLetterLayer`](crate::DeadLetterLayer) outside writes to the
//!   dead-letter destination;
//! - a copy that comes back before the due time it carries (a broker's
//!   expiry may run a few milliseconds early) is held until due, at most
//!   [`max_early_wait`](ParkingLayer::max_early_wait);
//! - a park the broker refuses leaves the failure as it was (retryable): the
//!   message is retried the ordinary way, never lost.
//!
//! A parked message is acknowledged at its origin, so it does not hold the
//! watermark, and it does not count toward the consumer-level backoff:
//! that stays for "everything is failing".
//!
//! What travels with a moved message, in its headers: how often it was
//! parked ([`PARKS`]), the attempts made ([`ATTEMPTS`]; the handler sees
//! them in [`Metadata::attempt`](crate::Metadata::attempt)), when it first
//! failed ([`FAILED_FIRST`]), when it is due ([`DUE`]), which park it
//! is ([`PARK_ID`]) and where it was first delivered ([`ORIGIN`],
//! [`ORIGIN_PARTITION`], [`ORIGIN_POSITION`]).
//!
//! **One message, one identity.** A copy that comes back is the message it
//! was parked from: the layers and handler inside the parking layer see
//! its first delivery in
//! [`Metadata::parked_from`](crate::Metadata::parked_from), so an
//! exactly-once marker keyed by position applies its effects once however
//! often the message was parked, and a dead letter names where the
//! message really was. A park may write a copy twice (a crash between the
//! park and the acknowledgement, a mover crash between its write and its
//! commit); both copies are the same message.
//!
//! **Only a copy's park headers are believed.** A backend tells the layer
//! whether a message is a copy it gave back
//! ([`Parking::is_returned_copy`]); on any other message the park headers
//! were written by a producer, and the layer drops them before anything
//! reads them: a producer cannot hold messages back with a due time, use up
//! their parks, or steer the order per key or the exactly-once identity.
//!
//! The order per key is kept by this process: it knows which keys have
//! messages parked (at most [`max_tracked`](ParkingLayer::max_tracked)).
//! After a restart, a deploy, or a rebalance that moves a key's partition
//! to another consumer, that knowledge is gone: **later messages of the key
//! that were never parked run as they come, before the parked ones come
//! back**, and a parked message that comes back is handled as it comes. A
//! key whose parked message never comes back here (purged by an operator,
//! taken by another consumer of the group) is released once it is overdue
//! by [`overdue_after`](ParkingLayer::overdue_after), or by its own delay
//! if that is longer; until then its followers wait behind it, each a
//! little longer than the one before. The order kept is the consumer's:
//! give the layer the consumer's [`key_with`](ParkingLayer::key_with) when
//! the consumer orders by something other than the broker's key.
//!
//! ```
//! use std::time::Duration;
//! use intake_core::memory::MemoryBroker;
//! use intake_core::parking::ParkingLayer;
//! use intake_core::{DeadLetterLayer, Exponential, HandlerError, Message, RetryLayer};
//! use tower::{ServiceBuilder, service_fn};
//!
//! let broker = MemoryBroker::new();
//! broker.create_topic("orders", 4)?;
//! let handler = ServiceBuilder::new()
//!     .layer(DeadLetterLayer::new(broker.dead_letter_sink("orders", "billing")?))
//!     .layer(ParkingLayer::new(broker.parking("orders", "billing")?).max_parks(5))
//!     // Three quick attempts, then come back in a minute.
//!     .layer(RetryLayer::new(Exponential::default().max_retries(2))
//!         .then_retry_later(Duration::from_secs(60)))
//!     .service(service_fn(|message: Message| async move {
//!         if message.payload().is_empty() {
//!             return Err(HandlerError::retry_later("the ledger is down", Duration::from_secs(30)));
//!         }
//!         Ok::<(), HandlerError>(())
//!     }));
//! # let _ = handler;
//! # Ok::<(), intake_core::memory::MemoryError>(())
//! ```

mod error;
mod future;
mod keys;
mod layer;
mod service;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use self::error::{ParkError, ParkedMessage};
pub use self::future::ResponseFuture;
pub use self::layer::ParkingLayer;
pub use self::service::ParkingService;
pub use crate::dead_letter::envelope::{ATTEMPTS, FAILED_FIRST};
use crate::message::{FirstDelivery, Message, Position, SourceName};

/// Header: how often the message was parked for its own failures.
pub const PARKS: &str = "intake.parks";
/// Header: when the parked message is due, in milliseconds since the Unix
/// epoch.
pub const DUE: &str = "intake.park.due";
/// Header: which park this is; the parking layer recognises a message that
/// comes back by it.
pub const PARK_ID: &str = "intake.park.id";
/// Header: the source the message was parked from. A copy may come back
/// through a destination of its own (a return topic that only its consumer
/// group reads); its key's order is still that of its origin.
pub const ORIGIN: &str = "intake.park.origin";
/// Header: the partition the message was first delivered from, before its
/// first park (kept by every later park).
pub const ORIGIN_PARTITION: &str = "intake.park.origin.partition";
/// Header: the broker's position of the message's first delivery, before
/// its first park (kept by every later park), as the position's text
/// (`42` for an offset, `1700000000000-0` for a stream entry id).
pub const ORIGIN_POSITION: &str = "intake.park.origin.position";

/// Whether header `name` belongs to the park: what the parking layer writes
/// on a copy and reads back when the copy returns. On a message that is not
/// a copy its parking gave back, such headers come from a producer and are
/// dropped before anything reads them.
pub fn is_park_header(name: &str) -> bool {
    name == PARKS
        || name == ATTEMPTS
        || name == FAILED_FIRST
        || name
            .strip_prefix("intake.park")
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// Where `message`, a parked copy, was first delivered, as its park headers
/// ([`ORIGIN`], [`ORIGIN_PARTITION`], [`ORIGIN_POSITION`]) say: `None`
/// when it carries none of them or they do not parse. The position is read
/// as a position of the kind this delivery has (a copy comes back on the
/// backend it was parked on).
///
/// Headers are what a producer can write too: trust the answer only for a
/// copy a parking gave back ([`Parking::is_returned_copy`]), as the
/// [`ParkingLayer`] does before it sets
/// [`Metadata::parked_from`](crate::Metadata::parked_from).
pub fn first_delivery_of(message: &Message) -> Option<FirstDelivery> {
    let headers = message.headers();
    let source = headers
        .get_str(ORIGIN)
        .filter(|origin| !origin.is_empty())?;
    let partition = headers.get_str(ORIGIN_PARTITION)?.parse().ok()?;
    let position = parse_position(
        headers.get_str(ORIGIN_POSITION)?,
        message.metadata().position(),
    )?;
    Some(FirstDelivery {
        source: SourceName::from(source),
        partition,
        position,
    })
}

/// `text` as a position of the same kind as `like`.
fn parse_position(text: &str, like: Position) -> Option<Position> {
    match like {
        Position::Offset(_) => text.parse().ok().map(Position::Offset),
        Position::Tag(_) => text.parse().ok().map(Position::Tag),
        Position::StreamId { .. } => {
            let (ms, seq) = text.split_once('-')?;
            Some(Position::StreamId {
                ms: ms.parse().ok()?,
                seq: seq.parse().ok()?,
            })
        }
    }
}

/// How a backend parked a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Parked {
    /// A copy is durably parked and comes back by itself once due; the
    /// original is acknowledged.
    Moved,
    /// The broker redelivers the original no sooner than the delay: the
    /// runtime hands it back through the acker
    /// ([`PartitionAck::requeue_after`](crate::acker::PartitionAck::requeue_after)),
    /// which needs an acker that
    /// [supports it](crate::acker::Acker::supports_delayed_requeue).
    HandedBack,
}

/// A broker's way to give a message back later.
#[async_trait::async_trait]
pub trait Parking: Send + Sync + 'static {
    /// Parks `message` (its headers already carry the park headers of this
    /// module) for `delay`. Resolves once the broker confirmed the park; a
    /// [`Parked::Moved`] message comes back, with the same key, payload and
    /// headers, to a source the same consumer reads: the one it was
    /// consumed from, or a return destination of its consumer group's own,
    /// so that other groups of the origin never see the copy.
    async fn park(&self, message: &Message, delay: Duration) -> Result<Parked, ParkError>;

    /// Whether `message` is a copy this parking gave back: read from its
    /// return destination (Kafka's return topic, Redis's return stream), or
    /// recognised by the broker's own record of the park (RabbitMQ's
    /// `x-death`). Only such a message's park headers are believed; on
    /// every other message they were written by a producer, and the
    /// parking layer drops them before anything reads them (they would
    /// otherwise hold messages back, skip parks, or steer the order per key
    /// and the exactly-once identity). A backend that hands originals back
    /// (NATS) writes no headers and answers `false`.
    fn is_returned_copy(&self, message: &Message) -> bool;

    /// How often `message` was parked for its own failures: the [`PARKS`]
    /// header it carries. A backend that hands originals back, whose
    /// headers never change, counts redeliveries instead.
    fn parks(&self, message: &Message) -> u32 {
        parks_header(message)
    }
}

/// The [`PARKS`] header of `message`, 0 when it has none.
pub fn parks_header(message: &Message) -> u32 {
    message
        .headers()
        .get_str(PARKS)
        .and_then(|parks| parks.parse().ok())
        .unwrap_or(0)
}

#[async_trait::async_trait]
impl<P: Parking + ?Sized> Parking for std::sync::Arc<P> {
    async fn park(&self, message: &Message, delay: Duration) -> Result<Parked, ParkError> {
        (**self).park(message, delay).await
    }

    fn is_returned_copy(&self, message: &Message) -> bool {
        (**self).is_returned_copy(message)
    }

    fn parks(&self, message: &Message) -> u32 {
        (**self).parks(message)
    }
}
