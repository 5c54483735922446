//! [`ParkingLayer`]: parks the failures of the handler it wraps that ask to
//! be retried later.

use std::sync::Arc;
use std::time::Duration;

use tower::Layer;

use super::keys::ParkedKeys;
use super::{Parking, ParkingService};

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

    /// Parks through `parking` (each backend has one), keeping the order per
    /// key, at most [`DEFAULT_MAX_PARKS`](Self::DEFAULT_MAX_PARKS) times per
    /// message.
    pub fn new(parking: impl Parking) -> Self {
        Self {
            shared: Arc::new(Shared {
                parking: Arc::new(parking),
                keys: ParkedKeys::new(),
                max_parks: Self::DEFAULT_MAX_PARKS,
                keep_key_order: true,
                overdue_after: Self::DEFAULT_OVERDUE_AFTER,
                max_early_wait: Self::DEFAULT_MAX_EARLY_WAIT,
            }),
        }
    }

    fn shared_mut(&mut self) -> &mut Shared {
        // Settings are applied while the layer is built, before any clone;
        // a clone made earlier keeps the settings it was made with.
        if Arc::get_mut(&mut self.shared).is_none() {
            self.shared = Arc::new(Shared {
                parking: Arc::clone(&self.shared.parking),
                keys: ParkedKeys::new(),
                max_parks: self.shared.max_parks,
                keep_key_order: self.shared.keep_key_order,
                overdue_after: self.shared.overdue_after,
                max_early_wait: self.shared.max_early_wait,
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
    /// [`DeliveryOrder`](crate::DeliveryOrder) is unordered.
    pub fn keep_key_order(mut self, keep: bool) -> Self {
        self.shared_mut().keep_key_order = keep;
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
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for ParkingLayer {
    type Service = ParkingService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ParkingService::from_shared(inner, Arc::clone(&self.shared))
    }
}
