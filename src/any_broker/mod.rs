//! [`AnyBroker`]: the backend chosen by the broker URL, at run time.
//!
//! Each backend crate has a broker value of its own (`KafkaBroker`,
//! `RedisBroker`, `AmqpBroker`, `NatsBroker`, and the
//! [`MemoryBroker`]), each a [`Broker`] with parts of its own types. A
//! service generic over `B: Broker` switches backend by changing one type;
//! one that takes `AnyBroker` switches by changing the URL only:
//! [`AnyBroker::from_url`] picks the backend by the URL's scheme, and every
//! part derived from it is an enum of the same backends ([`AnySource`],
//! [`AnyAcker`], [`AnyDeadLetterSink`], [`AnyParking`], [`AnyPublisher`],
//! [`AnyDeadLetterStore`], [`AnyLagProbe`], [`AnyBrokerError`]) that
//! forwards every call to the backend's own part, its own overrides of the
//! traits' default methods included.
//!
//! Only the backends compiled in (features `kafka`, `redis`, `amqp`,
//! `nats`) have a variant; the memory broker always has one. The enums are
//! `#[non_exhaustive]`: another crate of the build turning on a feature
//! adds a variant.
//!
//! # Cost
//!
//! A call goes through one `match`; the futures of the async methods are
//! the backend's own, held in the caller's future, with no allocation. Two
//! exceptions: the dead-letter sink, parking and dead-letter store traits
//! already return boxed futures (`async_trait`), which are passed on as
//! they are, not boxed again; and a publisher's receipt is boxed
//! ([`AnyReceipt`]): one allocation per output sent, beside the output's
//! own.

use std::time::Duration;

use intake_core::backend::{Broker, RouteAddress, RouteOptions, RouteParts};
use intake_core::group_control::ControlLog;
use intake_core::memory::MemoryBroker;

pub use self::error::AnyBrokerError;
pub use self::parts::{AnyAcker, AnyDeadLetterSink, AnyParking, AnySource};
pub use self::shared::{
    AnyControlChannel, AnyDeadLetterStore, AnyLagProbe, AnyPublisher, AnyReceipt,
};
pub use self::url::BrokerUrlError;

/// Matches `$value` (an enum of this module) with one arm per backend
/// compiled in, `$inner` bound to the variant's value in `$body`: each
/// method is forwarded once, for every backend.
macro_rules! dispatch {
    ($value:expr, $inner:ident => $body:expr) => {
        match $value {
            #[cfg(feature = "kafka")]
            Self::Kafka($inner) => $body,
            #[cfg(feature = "redis")]
            Self::Redis($inner) => $body,
            #[cfg(feature = "amqp")]
            Self::Amqp($inner) => $body,
            #[cfg(feature = "nats")]
            Self::Nats($inner) => $body,
            Self::Memory($inner) => $body,
        }
    };
}

/// Declares `$name`, the enum of each backend's associated type `$part`
/// (one variant per backend compiled in), with `kind`.
macro_rules! any_part {
    ($(#[$attr:meta])* $name:ident: $part:ident, $what:literal) => {
        $(#[$attr])*
        #[non_exhaustive]
        #[allow(
            clippy::large_enum_variant,
            reason = "one value per route or broker, made once and moved only while it is \
                      wired: boxing the largest backend's part would put an indirection in \
                      every call instead"
        )]
        pub enum $name {
            #[doc = concat!("Kafka's ", $what, " (feature `kafka`).")]
            #[cfg(feature = "kafka")]
            Kafka(<intake_kafka::KafkaBroker as intake_core::backend::Broker>::$part),
            #[doc = concat!("Redis Streams' ", $what, " (feature `redis`).")]
            #[cfg(feature = "redis")]
            Redis(<intake_redis_streams::RedisBroker as intake_core::backend::Broker>::$part),
            #[doc = concat!("RabbitMQ's ", $what, " (feature `amqp`).")]
            #[cfg(feature = "amqp")]
            Amqp(<intake_amqp::AmqpBroker as intake_core::backend::Broker>::$part),
            #[doc = concat!("NATS JetStream's ", $what, " (feature `nats`).")]
            #[cfg(feature = "nats")]
            Nats(<intake_nats::NatsBroker as intake_core::backend::Broker>::$part),
            #[doc = concat!("The memory broker's ", $what, ".")]
            Memory(<intake_core::memory::MemoryBroker as intake_core::backend::Broker>::$part),
        }

        impl $name {
            /// The backend it belongs to, as
            /// [`Broker::kind`](intake_core::backend::Broker::kind) names it:
            /// `kafka`, `redis`, `amqp`, `nats` or `memory`.
            pub fn kind(&self) -> &'static str {
                $crate::any_broker::kind_of!(self)
            }
        }
    };
}

/// The backend of an enum of this module, as [`Broker::kind`] names it.
macro_rules! kind_of {
    ($value:expr) => {
        match $value {
            #[cfg(feature = "kafka")]
            Self::Kafka(_) => "kafka",
            #[cfg(feature = "redis")]
            Self::Redis(_) => "redis",
            #[cfg(feature = "amqp")]
            Self::Amqp(_) => "amqp",
            #[cfg(feature = "nats")]
            Self::Nats(_) => "nats",
            Self::Memory(_) => "memory",
        }
    };
}
use kind_of;

/// `Debug` for a part, naming its type and backend only: the parts' own
/// types need not implement `Debug`.
macro_rules! kind_debug {
    ($name:ident) => {
        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_tuple(stringify!($name))
                    .field(&format_args!("{}", self.kind()))
                    .finish()
            }
        }
    };
}

mod error;
mod parts;
mod shared;
mod url;

/// A broker of any backend compiled in, picked at run time, most often by
/// its URL ([`from_url`](Self::from_url)): a [`Service`](crate::service::Service)
/// on it switches backend by changing the URL only.
///
/// It is a [`Broker`] whose parts are enums of the same backends (see the
/// [module docs](self)); each call is forwarded to the backend's own
/// broker or part. Build a backend's broker with its own builder for what
/// a URL does not carry (a TLS certificate, a consumer name) and convert
/// it with `From`; the [`MemoryBroker`] comes the same way, for tests.
///
/// ```no_run
/// use intake::AnyBroker;
/// use intake::service::Service;
/// use intake::{HandlerError, Json, Key};
///
/// #[derive(serde::Deserialize)]
/// struct Payment {
///     cents: u64,
/// }
///
/// async fn bill(Key(account): Key, Json(payment): Json<Payment>) -> Result<(), HandlerError> {
///     if payment.cents == 0 {
///         return Err(HandlerError::permanent("a payment of nothing")); // dead-lettered
///     }
///     tracing::info!(?account, cents = payment.cents, "billed");
///     Ok(())
/// }
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// // kafka://127.0.0.1:9092, redis://127.0.0.1:6379, amqp://…, nats://…:
/// // the same service on each, with that backend's feature enabled.
/// let url = std::env::var("BROKER_URL")?;
/// let broker = AnyBroker::from_url(&url)?;
/// Service::new("billing", broker).route("payments", bill).run().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum AnyBroker {
    /// Apache Kafka (feature `kafka`).
    #[cfg(feature = "kafka")]
    Kafka(intake_kafka::KafkaBroker),
    /// Redis Streams (feature `redis`).
    #[cfg(feature = "redis")]
    Redis(intake_redis_streams::RedisBroker),
    /// RabbitMQ (feature `amqp`).
    #[cfg(feature = "amqp")]
    Amqp(intake_amqp::AmqpBroker),
    /// NATS JetStream (feature `nats`).
    #[cfg(feature = "nats")]
    Nats(intake_nats::NatsBroker),
    /// The in-process broker, for tests and examples.
    Memory(MemoryBroker),
}

#[cfg(feature = "kafka")]
impl From<intake_kafka::KafkaBroker> for AnyBroker {
    fn from(broker: intake_kafka::KafkaBroker) -> Self {
        Self::Kafka(broker)
    }
}

#[cfg(feature = "redis")]
impl From<intake_redis_streams::RedisBroker> for AnyBroker {
    fn from(broker: intake_redis_streams::RedisBroker) -> Self {
        Self::Redis(broker)
    }
}

#[cfg(feature = "amqp")]
impl From<intake_amqp::AmqpBroker> for AnyBroker {
    fn from(broker: intake_amqp::AmqpBroker) -> Self {
        Self::Amqp(broker)
    }
}

#[cfg(feature = "nats")]
impl From<intake_nats::NatsBroker> for AnyBroker {
    fn from(broker: intake_nats::NatsBroker) -> Self {
        Self::Nats(broker)
    }
}

impl From<MemoryBroker> for AnyBroker {
    fn from(broker: MemoryBroker) -> Self {
        Self::Memory(broker)
    }
}

/// How a backend's parts become the variants of this module's enums: the
/// one place that names each backend's variant, besides the enums.
trait Variant: Broker {
    fn any_parts(&self, parts: RouteParts<Self>) -> RouteParts<AnyBroker>;
    fn any_publisher(&self, publisher: Self::Publisher) -> AnyPublisher;
    fn any_store(&self, store: Self::DeadLetterStore) -> AnyDeadLetterStore;
    fn any_probe(&self, probe: Self::LagProbe) -> AnyLagProbe;
    fn any_channel(&self, channel: Self::ControlChannel) -> AnyControlChannel;
    fn any_error(&self, error: Self::Error) -> AnyBrokerError;
}

macro_rules! variant {
    ($variant:ident: $broker:ty) => {
        impl Variant for $broker {
            fn any_parts(&self, parts: RouteParts<Self>) -> RouteParts<AnyBroker> {
                RouteParts::new(
                    AnySource::$variant(parts.source),
                    AnyAcker::$variant(parts.acker),
                    AnyDeadLetterSink::$variant(parts.dead_letter_sink),
                    parts.parking.map(AnyParking::$variant),
                )
            }

            fn any_publisher(&self, publisher: Self::Publisher) -> AnyPublisher {
                AnyPublisher::$variant(publisher)
            }

            fn any_store(&self, store: Self::DeadLetterStore) -> AnyDeadLetterStore {
                AnyDeadLetterStore::$variant(store)
            }

            fn any_probe(&self, probe: Self::LagProbe) -> AnyLagProbe {
                AnyLagProbe::$variant(probe)
            }

            fn any_channel(&self, channel: Self::ControlChannel) -> AnyControlChannel {
                AnyControlChannel::$variant(channel)
            }

            fn any_error(&self, error: Self::Error) -> AnyBrokerError {
                AnyBrokerError::$variant(error)
            }
        }
    };
}

#[cfg(feature = "kafka")]
variant!(Kafka: intake_kafka::KafkaBroker);
#[cfg(feature = "redis")]
variant!(Redis: intake_redis_streams::RedisBroker);
#[cfg(feature = "amqp")]
variant!(Amqp: intake_amqp::AmqpBroker);
#[cfg(feature = "nats")]
variant!(Nats: intake_nats::NatsBroker);
variant!(Memory: MemoryBroker);

impl Broker for AnyBroker {
    type Source = AnySource;
    type Acker = AnyAcker;
    type DeadLetterSink = AnyDeadLetterSink;
    type Parking = AnyParking;
    type Publisher = AnyPublisher;
    type DeadLetterStore = AnyDeadLetterStore;
    type LagProbe = AnyLagProbe;
    type ControlChannel = AnyControlChannel;
    type Error = AnyBrokerError;

    fn kind(&self) -> &'static str {
        dispatch!(self, broker => Broker::kind(broker))
    }

    async fn route(
        &self,
        address: &RouteAddress,
        options: &RouteOptions,
    ) -> Result<RouteParts<Self>, AnyBrokerError> {
        dispatch!(self, broker => Broker::route(broker, address, options).await
            .map(|parts| broker.any_parts(parts))
            .map_err(|error| broker.any_error(error)))
    }

    async fn publisher(&self) -> Result<AnyPublisher, AnyBrokerError> {
        dispatch!(self, broker => Broker::publisher(broker).await
            .map(|part| broker.any_publisher(part))
            .map_err(|error| broker.any_error(error)))
    }

    async fn dead_letter_store(
        &self,
        address: &RouteAddress,
    ) -> Result<AnyDeadLetterStore, AnyBrokerError> {
        dispatch!(self, broker => Broker::dead_letter_store(broker, address).await
            .map(|part| broker.any_store(part))
            .map_err(|error| broker.any_error(error)))
    }

    async fn lag_probe(&self, address: &RouteAddress) -> Result<AnyLagProbe, AnyBrokerError> {
        dispatch!(self, broker => Broker::lag_probe(broker, address).await
            .map(|part| broker.any_probe(part))
            .map_err(|error| broker.any_error(error)))
    }

    async fn control_channel(
        &self,
        group: &str,
        log: ControlLog,
    ) -> Result<AnyControlChannel, AnyBrokerError> {
        dispatch!(self, broker => Broker::control_channel(broker, group, log).await
            .map(|part| broker.any_channel(part))
            .map_err(|error| broker.any_error(error)))
    }

    async fn shutdown(&self, timeout: Duration) -> Result<(), AnyBrokerError> {
        dispatch!(self, broker => Broker::shutdown(broker, timeout)
            .await
            .map_err(|error| broker.any_error(error)))
    }
}
