//! One value per broker, from which every part of a route is derived.
//!
//! A [`Broker`] holds a connection's settings (address, TLS, credentials,
//! client settings), given once. Every part a service needs comes from it
//! with the same name and the same shape on every backend:
//!
//! | part | method |
//! |---|---|
//! | source, acker, dead-letter sink, parking | [`route`](Broker::route) |
//! | publisher | [`publisher`](Broker::publisher) |
//! | dead-letter store | [`dead_letter_store`](Broker::dead_letter_store) |
//! | lag probe (broker lag and parked backlog) | [`lag_probe`](Broker::lag_probe) |
//! | a group's control channel (pauses across instances, their status) | [`control_channel`](Broker::control_channel) |
//!
//! The parts of one route are derived together so that they agree by
//! construction: a route with parking gets a source that reads the
//! parking's return path (Kafka's return topic, Redis's return stream), so
//! a parked message cannot be stranded by a step left out. Each backend's
//! explicit builders stay available for what this shape does not cover.
//!
//! ```
//! use intake_core::backend::{Broker, RouteAddress, RouteOptions};
//! use intake_core::memory::MemoryBroker;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = MemoryBroker::new();
//! broker.create_topic("payments", 2)?;
//! let address = RouteAddress::new("payments", "billing");
//! let parts = Broker::route(&broker, &address, &RouteOptions::new().parking()).await?;
//! assert!(parts.parking.is_some());
//! let _probe = broker.lag_probe(&address).await?;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::acker::Acker;
use crate::dead_letter::DeadLetterSink;
use crate::dead_letter::store::DeadLetterStore;
use crate::group_control::{ControlChannel, ControlLog};
use crate::lag::LagProbe;
use crate::parking::Parking;
use crate::publish::Publisher;
use crate::source::Source;

/// What a route reads, and as which group: the broker's own names.
///
/// | backend | `source` | `group` |
/// |---|---|---|
/// | Kafka | topic | consumer group |
/// | Redis Streams | stream | consumer group |
/// | RabbitMQ | queue | names the connection and the group's own return path (the queue is the group) |
/// | NATS JetStream | stream | durable consumer |
/// | memory | topic | consumer group |
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RouteAddress {
    source: String,
    group: String,
}

impl RouteAddress {
    /// `group` reading `source`.
    pub fn new(source: impl Into<String>, group: impl Into<String>) -> Self {
        Self {
            source: source.into(),
            group: group.into(),
        }
    }

    /// The topic, stream or queue the route reads.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The consumer group (durable consumer on NATS) the route reads as.
    pub fn group(&self) -> &str {
        &self.group
    }
}

impl fmt::Display for RouteAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} as {}", self.source, self.group)
    }
}

/// What a route's parts are derived with, beyond its address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RouteOptions {
    /// Whether the route can park messages (a handler's "retry later"), and
    /// with which delays; `None`: no parking.
    pub parking: Option<ParkingOptions>,
}

impl RouteOptions {
    /// No parking.
    pub fn new() -> Self {
        Self::default()
    }

    /// With parking at the backend's default delays.
    pub fn parking(mut self) -> Self {
        self.parking = Some(ParkingOptions::default());
        self
    }

    /// With parking at these delays (tiers: Kafka retry topics, RabbitMQ
    /// wait queues; a backend with exact delays ignores them).
    pub fn parking_tiers(mut self, tiers: impl IntoIterator<Item = Duration>) -> Self {
        self.parking = Some(ParkingOptions {
            tiers: Some(tiers.into_iter().collect()),
        });
        self
    }
}

/// How a route parks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParkingOptions {
    /// The delays a backend with fixed tiers parks for; `None`: its
    /// defaults.
    pub tiers: Option<Vec<Duration>>,
}

/// The parts of one route, derived together by [`Broker::route`] so that
/// they agree: the source reads whatever the parking gives back.
#[non_exhaustive]
pub struct RouteParts<B: Broker> {
    /// Where the route's messages come from.
    pub source: B::Source,
    /// What acknowledges them.
    pub acker: B::Acker,
    /// Where what fails for good is written.
    pub dead_letter_sink: B::DeadLetterSink,
    /// How the route parks, when its options asked for parking.
    pub parking: Option<B::Parking>,
}

impl<B: Broker> RouteParts<B> {
    /// The parts, as a backend assembles them.
    pub fn new(
        source: B::Source,
        acker: B::Acker,
        dead_letter_sink: B::DeadLetterSink,
        parking: Option<B::Parking>,
    ) -> Self {
        Self {
            source,
            acker,
            dead_letter_sink,
            parking,
        }
    }
}

impl<B: Broker> fmt::Debug for RouteParts<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteParts")
            .field("parking", &self.parking.is_some())
            .finish_non_exhaustive()
    }
}

/// A broker's connection, given once, and every part derived from it (see
/// the [module docs](self)). Every backend crate has one (`KafkaBroker`,
/// `RedisBroker`, `AmqpBroker`, `NatsBroker`), and so does the
/// [`MemoryBroker`](crate::memory::MemoryBroker).
///
/// Every method is async and bounded by the backend's connect timeout, and
/// every part is shut down the same way: [`Broker::shutdown`] stops what
/// the broker's parts run in the background (parking movers, publishers'
/// pending sends), within its timeout.
pub trait Broker: Clone + Send + Sync + 'static {
    /// The route's source.
    type Source: Source;
    /// The route's acker.
    type Acker: Acker;
    /// The route's dead-letter sink.
    type DeadLetterSink: DeadLetterSink;
    /// The route's parking.
    type Parking: Parking + Clone;
    /// The broker's publisher, shared by every route that publishes.
    type Publisher: Publisher;
    /// A route's dead letters, to list, replay and purge.
    type DeadLetterStore: DeadLetterStore;
    /// A route's lag, broker lag and parked backlog.
    type LagProbe: LagProbe;
    /// One of a consumer group's control logs.
    type ControlChannel: ControlChannel;
    /// What went wrong deriving a part.
    type Error: std::error::Error + Send + Sync + 'static;

    /// A short name for logs and metrics: `kafka`, `redis`, `amqp`, `nats`
    /// or `memory`.
    fn kind(&self) -> &'static str;

    /// The source, acker, dead-letter sink and (when `options` ask for it)
    /// parking of the route at `address`, consistent with each other.
    fn route(
        &self,
        address: &RouteAddress,
        options: &RouteOptions,
    ) -> impl Future<Output = Result<RouteParts<Self>, Self::Error>> + Send;

    /// A publisher on this broker.
    fn publisher(&self) -> impl Future<Output = Result<Self::Publisher, Self::Error>> + Send;

    /// The dead letters the route at `address` wrote.
    fn dead_letter_store(
        &self,
        address: &RouteAddress,
    ) -> impl Future<Output = Result<Self::DeadLetterStore, Self::Error>> + Send;

    /// How far the route at `address` is behind: broker lag per partition
    /// and its parked backlog ([`LagProbe::parked`]).
    fn lag_probe(
        &self,
        address: &RouteAddress,
    ) -> impl Future<Output = Result<Self::LagProbe, Self::Error>> + Send;

    /// Group `group`'s control log `log` (see
    /// [`group_control`](crate::group_control)): where its instances send
    /// pauses and resumes to each other, and what each runs. Created on
    /// the broker when first used.
    fn control_channel(
        &self,
        group: &str,
        log: ControlLog,
    ) -> impl Future<Output = Result<Self::ControlChannel, Self::Error>> + Send;

    /// Stops what this broker's parts run in the background (parking
    /// movers, a publisher's pending sends), waiting at most `timeout`.
    /// Call it once every route has stopped. The default has nothing to
    /// stop.
    fn shutdown(&self, timeout: Duration) -> impl Future<Output = Result<(), Self::Error>> + Send {
        let _ = timeout;
        async { Ok(()) }
    }
}
