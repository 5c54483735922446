//! [`ParkingLayer`]: parks the failures of the handler it wraps that ask to
//! be retried later.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tower::Layer;

use super::keys::ParkedKeys;
use super::{Parking, ParkingService};
use crate::message::Message;

/// Parks messages whose failure asks to be
/// [retried later](crate::HandlerError::retry_later), keeping the order per
/// key. See the [module docs](super).
#[derive(Clone)]
pub struct ParkingLayer {
    shared: Arc<Shared>,
}

/// What every clone of the layer and its services shares: the parked keys
/// are one per consumer.
pub(super) struct Shared {
    pub(super) parking: Arc<dyn Parking>,
    pub(super) keys: ParkedKeys,
    pub(super) max_parks: u32,
    pub(super) keep_key_order: bool,
    pub(super) overdue_after: Duration,
    pub(super) max_early_wait: Duration,
    /// Where a message's key is; `None`: the broker's key.
    pub(super) key_with: Option<KeyFn>,
}

/// A function that finds a message's ordering key (see
/// [`ParkingLayer::key_with`]).
type KeyFn = Arc<dyn for<'a> Fn(&'a Message) -> Option<&'a [u8]> + Send + Sync>;

impl Shared {
    /// The key whose order `message` keeps, when the order per key is kept.
    pub(super) fn key_of(&self, message: &Message) -> Option<Bytes> {
        if !self.keep_key_order {
            return None;
        }
        match &self.key_with {
            Some(key_with) => key_with(message).map(Bytes::copy_from_slice),
            None => message.key().cloned(),
        }
    }
}

impl ParkingLayer {
    /// How often a message may be parked for its own failures before the
    /// next request for later makes it a permanent failure.
    pub const DEFAULT_MAX_PARKS: u32 = 10;

    /// How long past its due time a key waits for its parked message before
    /// it lets later messages run.
    pub const DEFAULT_OVERDUE_AFTER: Duration = Duration::from_secs(600);

    /// How long a copy that comes back before its due time is held until
    /// due.
    pub const DEFAULT_MAX_EARLY_WAIT: Duration = Duration::from_secs(1);

    /// How many parked messages the order per key keeps track of.
    pub const DEFAULT_MAX_TRACKED: usize = 100_000;

    /// Parks through `parking` (each backend has one), keeping the order per
    /// key, at most [`DEFAULT_MAX_PARKS`](Self::DEFAULT_MAX_PARKS) times per
    /// message.
    pub fn new(parking: impl Parking) -> Self {
        Self {
            shared: Arc::new(Shared {
                parking: Arc::new(parking),
                keys: ParkedKeys::with_capacity(Self::DEFAULT_MAX_TRACKED),
                max_parks: Self::DEFAULT_MAX_PARKS,
                keep_key_order: true,
                overdue_after: Self::DEFAULT_OVERDUE_AFTER,
                max_early_wait: Self::DEFAULT_MAX_EARLY_WAIT,
                key_with: None,
            }),
        }
    }

    fn shared_mut(&mut self) -> &mut Shared {
        // Settings are applied while the layer is built, before any clone;
        // a clone made earlier keeps the settings it was made with.
        if Arc::get_mut(&mut self.shared).is_none() {
            self.shared = Arc::new(Shared {
                parking: Arc::clone(&self.shared.parking),
                keys: ParkedKeys::with_capacity(self.shared.keys.capacity()),
                max_parks: self.shared.max_parks,
                keep_key_order: self.shared.keep_key_order,
                overdue_after: self.shared.overdue_after,
                max_early_wait: self.shared.max_early_wait,
                key_with: self.shared.key_with.clone(),
            });
        }
        Arc::get_mut(&mut self.shared).unwrap_or_else(|| unreachable!("made unique above"))
    }

    /// A message parked `max_parks` times that asks for later once more
    /// fails for good (a [`DeadLetterLayer`](crate::DeadLetterLayer) outside
    /// writes it to the dead-letter destination). Counted by the [`PARKS`]
    /// header; on a backend that hands the original back (NATS), where no
    /// header can change, by its deliveries.
    ///
    /// [`PARKS`]: super::PARKS
    pub fn max_parks(mut self, max_parks: u32) -> Self {
        self.shared_mut().max_parks = max_parks;
        self
    }

    /// Whether later messages of a key with a parked message are parked
    /// behind it (the default). Turn it off for a consumer whose
    /// [`DeliveryOrder`](crate::DeliveryOrder) is unordered: there a
    /// message does not wait for the one before it of its key, so keeping
    /// their order across a park promises what the consumer does not keep
    /// anyway.
    pub fn keep_key_order(mut self, keep: bool) -> Self {
        self.shared_mut().keep_key_order = keep;
        self
    }

    /// Where the key whose order is kept is found: the same function as
    /// the consumer's [`key_with`](crate::consumer::ConsumerBuilder::key_with),
    /// for a consumer that orders by a header or a part of the payload
    /// rather than the broker's key. Without it, the broker's key.
    pub fn key_with<F>(mut self, key_with: F) -> Self
    where
        F: for<'a> Fn(&'a Message) -> Option<&'a [u8]> + Send + Sync + 'static,
    {
        self.shared_mut().key_with = Some(Arc::new(key_with));
        self
    }

    /// How many parked messages the order per key tracks at most (default
    /// [`DEFAULT_MAX_TRACKED`](Self::DEFAULT_MAX_TRACKED), about 150 bytes
    /// each plus the key). Past it, a message parked for its own failure is
    /// still parked and comes back, but later messages of its key no longer
    /// wait for it (logged once while the bound holds): memory stays
    /// bounded through an outage that parks everything.
    pub fn max_tracked(mut self, max_tracked: usize) -> Self {
        self.shared_mut().keys = ParkedKeys::with_capacity(max_tracked);
        self
    }

    /// How long past its due time a key's parked message may stay away
    /// (purged by an operator, consumed by another instance after a
    /// rebalance) before the key's later messages stop waiting for it; a
    /// message parked for longer than this may stay away as long as it was
    /// parked for (a broker's delay tier may be longer than the delay).
    pub fn overdue_after(mut self, overdue_after: Duration) -> Self {
        self.shared_mut().overdue_after = overdue_after;
        self
    }

    /// How long a parked copy that comes back before the due time it
    /// carries ([`DUE`](super::DUE)) is held, unpolled, until it is due. A
    /// broker's expiry may run a little early (RabbitMQ's quorum queues do,
    /// by milliseconds); a copy due further ahead than this is no early
    /// expiry but clocks that disagree between the hosts that parked it and
    /// that consume it, and it runs as it comes (logged) rather than
    /// stalling its partition.
    pub fn max_early_wait(mut self, max_early_wait: Duration) -> Self {
        self.shared_mut().max_early_wait = max_early_wait;
        self
    }

    /// Messages parked by this layer's services that have not come back
    /// and finished yet, by key (keyed messages only, while the order per
    /// key is kept).
    pub fn parked(&self) -> usize {
        self.shared.keys.len()
    }
}

impl std::fmt::Debug for ParkingLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParkingLayer")
            .field("max_parks", &self.shared.max_parks)
            .field("keep_key_order", &self.shared.keep_key_order)
            .field("overdue_after", &self.shared.overdue_after)
            .field("max_early_wait", &self.shared.max_early_wait)
            .field("max_tracked", &self.shared.keys.capacity())
            .field("key_with", &self.shared.key_with.as_ref().map(|_| "fn"))
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for ParkingLayer {
    type Service = ParkingService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ParkingService::from_shared(inner, Arc::clone(&self.shared))
    }
}
