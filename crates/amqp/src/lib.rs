//! RabbitMQ (AMQP 0.9.1) for intake, on [lapin].
//!
//! [`AmqpSettings`] say how to reach the broker: its URL, TLS, connection
//! name and connect timeout, given once. Every builder takes them (or a
//! URL alone), and [`AmqpBroker`] holds them and derives every part of a route from them
//! ([`Broker`](intake_core::backend::Broker), the same shape on every
//! intake backend): the source, acker, dead-letter sink and parking of a
//! queue, consistent with each other (parked copies come back into the
//! queue the source reads), the publisher, the dead-letter store, a lag
//! probe that counts the parked backlog too, and a consumer group's control
//! logs ([`AmqpControlChannel`], stream queues).
//!
//! ```no_run
//! use std::time::Duration;
//! use intake_amqp::{AmqpBroker, AmqpSettings};
//! use intake_core::backend::{Broker, RouteAddress, RouteOptions};
//!
//! # async fn run() -> Result<(), intake_amqp::Error> {
//! let broker = AmqpBroker::new(
//!     AmqpSettings::new("amqp://guest:guest@127.0.0.1:5672/%2f").connection_name("billing"),
//! );
//! // The queue `payments` (which must exist), read as group `billing`.
//! let address = RouteAddress::new("payments", "billing");
//! let parts = broker.route(&address, &RouteOptions::new().parking()).await?;
//! // Hand `parts.source` and `parts.acker` to the consumer runtime,
//! // `parts.dead_letter_sink` to its dead-letter layer (dead letters go to
//! // `payments.dlq`) and `parts.parking` to its parking layer.
//! # drop(parts);
//! let publisher = broker.publisher().await?;
//! let probe = broker.lag_probe(&address).await?;
//! # drop((publisher, probe));
//! // Once every route has stopped: the parkings' relays, the publisher.
//! broker.shutdown(Duration::from_secs(10)).await?;
//! # Ok(())
//! # }
//! ```
//!
//! The explicit parts, for what the broker does not cover:
//!
//! - [`AmqpSource`] consumes a queue (or, in broadcast mode, every message of
//!   a fanout exchange) on one channel with manual acknowledgements. Its
//!   prefetch (`basic.qos`) comes from the consumer's budget
//!   ([`Source::set_limits`](intake_core::backend::Source::set_limits)):
//!   `max_in_flight` deliveries, so memory stays bounded however long the
//!   queue is. RabbitMQ bounds a prefetch by count only and sets it as a
//!   consumer starts, so the byte budget bounds it on reopened channels
//!   (no more than fit in half of `max_in_flight_bytes` at the recent
//!   average message size), not on the first.
//! - [`AmqpAcker`] turns the commit engine's watermark into one
//!   `basic.ack(multiple=true)` per batch, and retries into individual
//!   `basic.reject(requeue=true)` sent before it. Messages finished past one
//!   still running are acknowledged one by one, so a stuck message cannot
//!   fill the prefetch. On shutdown, whatever was delivered and not finished
//!   goes back with `basic.nack(requeue=true)`.
//! - The channel is the partition: `PartitionKey { source: queue, partition:
//!   channel epoch }`, the position is the delivery tag. A reopened channel
//!   is a new partition, so a tag of a lost channel is never acknowledged on
//!   its successor.
//! - A lost connection or channel is reopened with a
//!   [`BackoffPolicy`](intake_core::BackoffPolicy), the [`Topology`]
//!   re-declared and the queue consumed again; the broker redelivers what the
//!   old channel had not acknowledged. The new channel is opened only once
//!   the runtime has completed the old one's revocation (its handlers
//!   finished, or were cancelled at the runtime's `revoke_timeout`), so a
//!   redelivered message never runs beside its first copy in one consumer.
//! - Dead letters go to an exchange with publisher confirms
//!   ([`AmqpDeadLetterSink`]) or, by rejecting without requeue, to the
//!   queue's own dead-letter exchange ([`BrokerDeadLetterSink`]).
//! - [`AmqpParking`] parks a message that asks for later in a quorum wait
//!   queue per delay tier (`x-message-ttl`, at-least-once dead-lettering),
//!   which RabbitMQ dead-letters back into the queue once due: no tight
//!   requeue loop.
//! - [`AmqpPublisher`] publishes outputs on one channel in confirm mode,
//!   many in flight under a bound, each receipt resolved by the publisher
//!   confirm (unroutable, nacked or oversized outputs are rejected).
//! - [`Metadata::attempt`](intake_core::Metadata::attempt) is the quorum
//!   queue's `x-delivery-count` plus one, or 2 for a redelivery the queue
//!   does not count.
//!
//! ```no_run
//! use intake_amqp::{AmqpSource, Queue, Topology};
//!
//! # async fn run() -> Result<(), intake_amqp::Error> {
//! let source = AmqpSource::builder("amqp://guest:guest@127.0.0.1:5672/%2f")
//!     .queue("orders")
//!     .declare(Topology::new().queue(Queue::quorum("orders").delivery_limit(5)))
//!     .build()
//!     .await?;
//! let acker = source.acker();
//! let dead_letters = source
//!     .dead_letter_sink()
//!     .exchange("")
//!     .routing_key("orders.dlq")
//!     .build()
//!     .await?;
//! // Hand `source` and `acker` to the consumer runtime (its `max_in_flight`
//! // becomes the prefetch), and `dead_letters` to its dead-letter layer.
//! # drop((source, acker, dead_letters));
//! # Ok(())
//! # }
//! ```
//!
//! # Ordering
//!
//! A source consumes on one channel, which is one partition, so the
//! runtime's default `DeliveryOrder::Partition` handles one message at a time,
//! in queue order. For concurrency, use `DeliveryOrder::Unordered`, or
//! `DeliveryOrder::Key` to keep the order per routing key. A queue shared by
//! several consumers has no order across them anyway.
//!
//! # Dead letters
//!
//! Wrap the handler in the dead-letter layer with one of two sinks, both
//! made from the source: [`AmqpSource::dead_letter_sink`] builds an
//! [`AmqpDeadLetterSink`], which publishes a copy with its origin and error
//! to an exchange of your choice and waits for the publisher confirm, and
//! [`AmqpSource::broker_dead_letter_sink`] gives a [`BrokerDeadLetterSink`],
//! which rejects the message without requeue into the queue's own
//! `x-dead-letter-exchange` (no error text). Independently of both, a quorum queue with
//! [`Queue::delivery_limit`] dead-letters a message that keeps failing
//! through retries.
//!
//! # Delivery counts across RabbitMQ versions
//!
//! Quorum queues count returned deliveries in `x-delivery-count` and
//! dead-letter a message past `x-delivery-limit`. Up to RabbitMQ 4.2 every
//! return counts: a reject, a nack, a closed channel. From 4.3 only
//! `basic.reject` counts, so intake retries with reject (a message that
//! keeps failing reaches the limit) and hands back unfinished work at
//! shutdown with nack (which does not use up an attempt).
//!
//! # Content lapin cannot read
//!
//! AMQP short strings (header names, the message id, the routing key) are
//! bytes; lapin reads them as UTF-8 text and closes the connection on a
//! frame where they are not. The broker puts such a message back and
//! delivers it again on the next connection, so the source treats every
//! such loss as a failed attempt: reconnects back off further each time,
//! the log names the queue, channel and delivery tag, and
//! [`AmqpCounters::unparsable_deliveries`] counts it. The broker also
//! returns every delivery the lost channel held; so that those do not reach
//! a quorum queue's delivery limit along with it, the next channel takes
//! them one at a time before it returns to the full prefetch. Move the
//! message out of the queue, or give the queue a delivery limit and a
//! dead-letter exchange (up to RabbitMQ 4.2, a closed channel counts as a
//! delivery, so the broker dead-letters it once the limit is reached).
//!
//! lapin also parses nested header tables recursively on its I/O thread: a
//! header nested a few thousand levels deep (about 15 KB) overflows that
//! thread's stack and aborts the process (`hostile_content` tests). No
//! setting of intake prevents it; a larger default thread stack
//! (`RUST_MIN_STACK`) raises the depth it takes.
#![warn(missing_docs)]

mod acker;
mod broker;
mod connection;
mod control_channel;
mod counters;
mod dead_letter;
mod dead_letter_store;
mod error;
pub mod headers;
mod lag;
mod live_channel;
mod parking;
mod prefetch;
mod publisher;
mod settings;
mod source;
mod tag_ledger;
mod tls;
mod topology;
mod url;

pub use acker::AmqpAcker;
pub use broker::AmqpBroker;
pub use control_channel::AmqpControlChannel;
pub use counters::AmqpCounters;
pub use dead_letter::{
    AmqpDeadLetterSink, AmqpDeadLetterSinkBuilder, BrokerDeadLetterSink, read_dead_letter,
};
pub use dead_letter_store::{AmqpDeadLetterStore, AmqpDeadLetterStoreBuilder};
pub use error::Error;
pub use lag::AmqpLagProbe;
pub use parking::{AmqpParking, AmqpParkingBuilder};
pub use publisher::{AmqpPublisher, AmqpPublisherBuilder, AmqpReceipt};
pub use settings::AmqpSettings;
pub use source::{AmqpSource, AmqpSourceBuilder};
pub use tls::Tls;
pub use topology::{Binding, Exchange, Queue, QueueKind, Topology};
pub use url::AmqpUrl;

/// The lapin version this crate is built on, for [`Queue::argument`] values
/// and direct use alongside intake.
pub use lapin;
