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
//! is ([`PARK_ID`]) and where it was parked from ([`ORIGIN`]).
//!
//! The order per key is kept by this process: it knows which keys have
//! messages parked. After a restart (or when a key's partition moves to
//! another consumer) a parked message that comes back is handled as it
//! comes; and a key whose parked message never comes back (purged by an
//! operator, say) is released once it is overdue by
//! [`overdue_after`](ParkingLayer::overdue_after), or by its own delay if
//! that is longer.
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
//!     .layer(ParkingLayer::new(broker.parking("orders")?).max_parks(5))
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
use crate::message::Message;

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

    fn parks(&self, message: &Message) -> u32 {
        (**self).parks(message)
    }
}
