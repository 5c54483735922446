//! NATS JetStream for intake, on [async-nats].
//!
//! - [`NatsSettings`] says how to connect (URL, credentials, [`Tls`], the
//!   connect timeout, the connection's name, the reconnect backoff), once:
//!   every builder takes it (or a URL alone), and so does [`NatsBroker`].
//! - [`NatsBroker`] holds the settings once, and derives every part from
//!   them ([`Broker`](intake_core::backend::Broker)): a route's source,
//!   acker, dead-letter sink and parking together, a publisher, a route's
//!   dead-letter store and lag probe. The explicit builders below stay for
//!   what it does not cover.
//! - [`NatsSource`] consumes a stream through a pull consumer: a durable
//!   consumer shared by a group's instances (each message goes to one), or
//!   in broadcast mode an ephemeral consumer per instance (each gets every
//!   new message). Its pull requests together never ask the server for
//!   more messages than the runtime has free slots (the next one overlaps
//!   the last, so the server is not left idle between them), so memory
//!   stays bounded whatever the backlog; the consumer's `max_ack_pending`
//!   is twice the budget, so that acks on their way do not hold the server
//!   back, plus room for parked messages (pending until due).
//! - [`NatsAcker`] acknowledges each finished message on its own (`+ACK`;
//!   JetStream has no watermark), and hands retries back with `-NAK` and
//!   the redelivery backoff's delay, so a failing message does not come
//!   back in a tight loop. The server confirms every batch of acks before
//!   the acker counts it done.
//! - Slow handlers: every delivery the consumer holds is reported in
//!   progress (`+WPI`) before half its `ack_wait` has passed, so it is not
//!   delivered again while it runs.
//! - [`NatsDeadLetterSink`] publishes a poison message to a dead-letter
//!   subject (default `<stream>.<consumer>.dlq`, on the stream
//!   `<stream>_dlq`) with the dead-letter envelope as headers, waits for
//!   JetStream's publish ack, then ends the original with `+TERM`.
//! - [`NatsDeadLetters`] reads a dead-letter stream back
//!   ([`NatsDeadLetterStore`]: count, list, read, replay to the original
//!   subject, purge), one message get per letter by stream sequence.
//! - [`NatsPublisher`] publishes handlers' outputs (`intake_core::publish`)
//!   to subjects, many in flight on one connection, at most
//!   `max_unconfirmed` awaiting their ack; each receipt resolves on the
//!   stream's publish ack (the key is the subject's last token, what the
//!   source reads back as the key).
//! - [`NatsControlChannel`] keeps a consumer group's control logs (pauses
//!   and resumes shared by its instances, their status) in the streams
//!   `INTAKE_CONTROL_{group}` and `INTAKE_STATUS_{group}`
//!   ([`NatsBroker::control_channel`]).
//! - A lost connection is made anew with a
//!   [`BackoffPolicy`](intake_core::BackoffPolicy); held deliveries stay
//!   valid across reconnects (JetStream acks go by subject, not by
//!   connection).
//!
//! # Mapping onto intake
//!
//! | intake | JetStream |
//! |---|---|
//! | source name | the stream |
//! | partition | 0, or the number in a subject token ([`NatsSourceBuilder::partition_token`]) |
//! | position | the stream sequence ([`Position::Offset`](intake_core::Position::Offset)) |
//! | key | the subject |
//! | attempt | the server's delivery count (`num_delivered`) |
//! | ack | `+ACK` per message, confirmed, in batches (the commit engine's ids mode) |
//! | retry | `-NAK` with the redelivery backoff's delay |
//! | park (retry after a delay) | [`NatsParking`]: held in the process until due (`+WPI` keeps it), then given back by the source; `-NAK` with the delay past the room |
//! | retry cap | `max_deliveries`: the source dead-letters a message delivered more often (parks held here are no deliveries) |
//! | dead letter | publish to a subject, confirmed, then `+TERM` |
//! | backpressure | pull requests sized from the free budget; `max_ack_pending` twice `max_in_flight` plus the room for parked messages |
//!
//! # Ordering
//!
//! Each stream is one partition unless a subject token numbers them, so
//! the runtime's default `DeliveryOrder::Partition` handles one message at a
//! time. `DeliveryOrder::Key` keeps the order per subject and runs subjects in
//! parallel; `DeliveryOrder::Unordered` runs everything in parallel. What
//! holds per subject (`tests/ordering.rs`, one test per clause):
//!
//! - one instance, steady state: stream order;
//! - a retryable failure that reaches the runtime goes back to the server
//!   (`-NAK` with the redelivery backoff) and comes back **after** the
//!   later messages of its subject (a `RetryLayer` retries in place and
//!   keeps the order);
//! - a park ([`NatsParking`]) keeps its place: the later messages of its
//!   subject that this process received wait behind it in the process;
//! - a crash: the crashed process's messages come back after `ack_wait`, in
//!   stream order among themselves, **after** later messages of their
//!   subject delivered meanwhile; so does a message whose progress reports
//!   were lost for longer than `ack_wait` (a connection cut that long);
//! - a graceful stop: what the process held goes back at once and comes
//!   first; a parked message goes back with what is left of its delay, and
//!   a later message of its subject runs before it;
//! - instances sharing a durable consumer split a subject's messages
//!   between them: no order across instances.
//!
//! Every part of a route, from one broker value (the stream `ORDERS` must
//! exist; the durable consumer `billing` and the dead-letter stream are
//! created when missing):
//!
//! ```no_run
//! use intake_core::backend::{Broker, RouteAddress, RouteOptions};
//! use intake_nats::NatsBroker;
//!
//! # async fn run() -> Result<(), intake_nats::Error> {
//! let broker = NatsBroker::from_url("nats://127.0.0.1:4222")?;
//! let address = RouteAddress::new("ORDERS", "billing");
//! let parts = broker.route(&address, &RouteOptions::new().parking()).await?;
//! // `parts.source` and `parts.acker` to the consumer runtime,
//! // `parts.dead_letter_sink` to the dead-letter layer, `parts.parking` to
//! // the parking layer: the parking is the source's own, so what it parks
//! // comes back through that source.
//! let publisher = broker.publisher().await?;
//! let probe = broker.lag_probe(&address).await?;
//! # drop((parts, publisher, probe));
//! broker.shutdown(std::time::Duration::from_secs(10)).await?;
//! # Ok(())
//! # }
//! ```
//!
//! The same with the explicit builders, each given the same settings:
//!
//! ```no_run
//! use intake_nats::{NatsSettings, NatsSource};
//!
//! # async fn run() -> Result<(), intake_nats::Error> {
//! let settings = NatsSettings::new("nats://127.0.0.1:4222").connection_name("billing");
//! let source = NatsSource::builder(&settings)
//!     .stream("ORDERS")
//!     .consumer("billing")
//!     .build()
//!     .await?;
//! let acker = source.acker();
//! let sink = source.dead_letter_sink().build().await?;
//! // Hand `source` and `acker` to the consumer runtime, `sink` to the
//! // dead-letter layer.
//! # drop((source, acker, sink));
//! # Ok(())
//! # }
//! ```
//!
//! # Content async-nats cannot read
//!
//! NATS headers are bytes on the wire; async-nats reads a header block
//! that is not UTF-8 (or a header name with a control character) as a
//! protocol error and drops the connection. Such a message is never seen
//! by the source: the client reconnects, the server delivers it again
//! after `ack_wait`, and so on (`tests/hostile_records.rs`). Move it out
//! of the stream (`nats stream rmm`), or give the producer valid headers.
#![warn(missing_docs)]

mod acker;
mod broker;
mod confirm;
mod connection;
mod control_channel;
mod counters;
mod dead_letter;
mod dead_letter_store;
mod deliveries;
mod error;
mod lag;
mod parking;
mod publisher;
mod settings;
mod source;
mod url;

pub use acker::NatsAcker;
pub use broker::NatsBroker;
pub use control_channel::NatsControlChannel;
pub use counters::NatsCounters;
pub use dead_letter::{
    BROKER_NAME, MAX_HEADER_BYTES as MAX_DEAD_LETTER_HEADER_BYTES, NATS_HEADER_PREFIX,
    NatsDeadLetterSink, NatsDeadLetterSinkBuilder, default_stream as default_dead_letter_stream,
    default_subject as default_dead_letter_subject, read_dead_letter,
};
pub use dead_letter_store::{
    NatsDeadLetterStore, NatsDeadLetters, NatsDeadLettersBuilder, NatsReplayPublisher,
};
pub use error::Error;
pub use lag::NatsLagProbe;
pub use parking::NatsParking;
pub use publisher::{NatsPublisher, NatsPublisherBuilder, NatsReceipt};
pub use settings::{NatsSettings, Tls};
pub use source::{NatsSource, NatsSourceBuilder};

/// The async-nats version this crate is built on, for producing alongside
/// intake.
pub use async_nats;
