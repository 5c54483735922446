//! Redis Streams for intake: consume a stream as a member of a consumer
//! group (or as a broadcast reader), with acknowledgements batched into one
//! round trip, the work of dead consumers claimed, and poison entries moved
//! to a dead-letter stream.
//!
//! | intake | Redis Streams |
//! |---|---|
//! | partition | the stream key (partition 0) |
//! | position | the entry id, [`Position::StreamId`](intake_core::Position::StreamId) |
//! | payload | one field, `payload` by default |
//! | headers | every other field |
//! | key | a configured field, if any |
//! | attempt | the delivery count Redis keeps for the entry |
//! | ack | `XACK` of many ids, every stream in one pipelined round trip |
//! | retry | the entry stays pending and is claimed again after `claim_min_idle` |
//! | park (retry after a delay) | [`RedisParking`]: `XADD` to a parking stream, a mover that moves due entries to the group's return stream in one Lua script per round; the source also reads that stream |
//! | dead letter | `XADD <stream>:dlq` and `XACK`, atomically |
//! | crashed peers | their pending entries are claimed once idle longer than `claim_min_idle` (a live consumer keeps the entries it holds from going idle) |
//! | order per key | with a key field, an entry waits while an older entry of its key is pending with another consumer or given back for a retry ([`keep_key_order`](RedisStreamsSourceBuilder::keep_key_order)): stream order per key across the group, crashes and restarts |
//! | broadcast | `XREAD` without a group |
//! | publish | [`RedisStreamsPublisher`]: `XADD` of the payload, key and header fields the source reads, pipelined, each confirmed by its entry id |
//! | read size | `COUNT` up to what the runtime allows, and at most what fits in an eighth of the byte budget at the average entry size |
//! | lag | [`RedisLagProbe`]: `XINFO GROUPS` per stream, and the parked backlog (`XLEN` of the group's parking streams) |
//! | group control | [`RedisControlChannel`]: streams `{group}:intake-control` (never trimmed) and `{group}:intake-status` (`MAXLEN ~ 10000`), `XADD` to append, `XREAD … BLOCK` from `0-0` to follow |
//!
//! # From one broker value
//!
//! A [`RedisBroker`] holds the connection, a [`RedisSettings`] (URL, TLS
//! root certificate, timeouts), once, and derives every part of a route
//! from it, the same way
//! as on every other backend ([`Broker`](intake_core::backend::Broker)):
//! the source, acker, dead-letter sink and parking of a stream and group
//! together, so that the source reads the stream the parking returns to;
//! the publisher, the group's dead-letter store and its lag probe.
//!
//! ```no_run
//! use std::time::Duration;
//! use intake_core::backend::{Broker, RouteAddress, RouteOptions};
//! use intake_core::lag::LagProbe;
//! use intake_core::parking::ParkingLayer;
//! use intake_core::{Consumer, DeadLetterLayer, HandlerError, Message};
//! use intake_redis_streams::RedisBroker;
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = RedisBroker::from_url("redis://127.0.0.1:6379")?;
//! let address = RouteAddress::new("orders", "billing");
//! let parts = broker.route(&address, &RouteOptions::new().parking()).await?;
//! let parking = parts.parking.expect("asked for parking");
//! let handler = tower::ServiceBuilder::new()
//!     .layer(DeadLetterLayer::new(parts.dead_letter_sink))
//!     .layer(ParkingLayer::new(parking))
//!     .service(tower::service_fn(|message: Message| async move {
//!         if message.payload().is_empty() {
//!             return Err(HandlerError::retry_later("not yet", Duration::from_secs(30)));
//!         }
//!         Ok::<(), HandlerError>(())
//!     }));
//! let report = Consumer::builder()
//!     .build(parts.source, parts.acker, handler)?
//!     .run(CancellationToken::new())
//!     .await?;
//! println!("{} parked", report.parked);
//! let probe = broker.lag_probe(&address).await?;
//! println!("{:?} still parked", probe.parked().await?);
//! broker.shutdown(Duration::from_secs(5)).await?;
//! # Ok(())
//! # }
//! ```
//!
//! The explicit builders ([`RedisStreamsSource::builder`] and the others)
//! remain for what the broker does not cover. Each takes the same
//! [`RedisSettings`], or just a URL (which converts into settings with the
//! default timeouts):
//!
//! ```no_run
//! use std::time::Duration;
//! use intake_core::backend::Source;
//! use intake_redis_streams::{RedisSettings, RedisStreamsSource};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let settings = RedisSettings::new("redis://127.0.0.1:6379")
//!     .connect_timeout(Duration::from_secs(2));
//! let mut source = RedisStreamsSource::builder(settings)
//!     .stream("orders")
//!     .group("billing")
//!     .consumer("billing-1")
//!     .key_field("customer")
//!     .claim_min_idle(Duration::from_secs(60))
//!     .build()
//!     .await?;
//! // The runtime drives the source and the acker; by hand it looks like this:
//! let mut deliveries = Vec::new();
//! source.next(&mut deliveries, 100).await?;
//! for message in &deliveries {
//!     println!("{} {:?}", message.metadata().position(), message.payload());
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Errors are typed ([`Error`]): a bad URL, an unreachable
//! server, refused credentials and a key that is not a stream each say what
//! to fix, and none of them shows a password.
#![warn(missing_docs)]

mod acker;
mod broker;
mod connection;
mod control_channel;
mod counters;
mod dead_letter;
mod dead_letter_store;
mod endpoint;
mod error;
mod held;
mod lag;
mod parking;
mod publisher;
mod settings;
mod source;
mod stream_id;

pub use acker::RedisStreamsAcker;
pub use broker::RedisBroker;
pub use control_channel::RedisControlChannel;
pub use counters::RedisCounters;
pub use dead_letter::{MAX_DEAD_LETTER_VALUES, RedisDeadLetterSink, RedisDeadLetterSinkBuilder};
pub use dead_letter_store::{RedisDeadLetterStore, RedisDeadLetters, RedisDeadLettersBuilder};
pub use endpoint::Endpoint;
pub use error::{Error, TRANSIENT_CODES};
pub use lag::RedisLagProbe;
pub use parking::{RedisParking, RedisParkingBuilder};
pub use publisher::{RedisStreamsPublisher, RedisStreamsPublisherBuilder, RedisStreamsReceipt};
pub use settings::RedisSettings;
pub use source::RedisStreamsSource;
pub use source::builder::RedisStreamsSourceBuilder;
pub use source::settings::{DeadLetterStream, StartFrom};

/// The Redis client this crate is built on, so that applications use the
/// same version for their own commands.
pub use redis;
