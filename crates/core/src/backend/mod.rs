//! For backend authors: what a broker adapter implements, what the runtime
//! hands it, and the suite that accepts it.
//!
//! A handler author never needs this module: the crate root holds what
//! they use (the consumer, `handler_fn` and the extractors, the layers, the
//! errors, the memory broker). A backend crate (`intake-kafka`,
//! `intake-redis-streams`, `intake-amqp`, `intake-nats`, or one of your
//! own) implements the traits below, every one of them in this module, and
//! one [`Broker`] value from which a service derives them all.
//!
//! The consuming side:
//!
//! - [`Source`]: fetches deliveries into the runtime's buffer, no more than
//!   the runtime asks for ([`Source::next`]'s `max` is the room in its
//!   budget: that is the backpressure), reports partitions
//!   [assigned](SourceEvent::Assigned) and [revoked](SourceEvent::Revoked),
//!   and sizes its own buffers and the broker's prefetch from the
//!   [`Limits`] it is told once. A revocation carries a [`Revocation`]: the
//!   runtime completes it once it has drained and committed the partitions,
//!   and the source waits on its [`RevocationHandle`] (from a rebalance
//!   callback on a client library's thread, with
//!   [`wait_blocking`](RevocationHandle::wait_blocking), always bounded).
//!   Failures are [`SourceError`]s: the runtime retries the
//!   [transient](SourceError::is_transient) ones with its reconnect backoff
//!   and stops on the others.
//! - [`Acker`]: receives [`AckBatch`]es from the commit engine, one batch at a
//!   time. Its [`AckMode`] says what the engine collects per partition
//!   ([`PartitionAck`]): only the contiguous watermark (Kafka offsets, AMQP
//!   `ack multiple`) or also each completed id (Redis `XACK`). A failed
//!   batch is an [`AckError`]; the runtime counts it and goes on, since a
//!   later watermark supersedes it and an unacknowledged message is
//!   delivered again.
//! - [`DeadLetterSink`] (optional): writes a [`DeadLetter`] durably, as the
//!   [`envelope`] lays it out on the broker's carrier (headers, stream
//!   fields, properties), and says with [`DeadLetterError::rejected`] when a
//!   letter can never fit the destination.
//!
//! The other parts, each optional on its own, all derived from the
//! [`Broker`] (see [`broker`]):
//!
//! - [`Parking`]: gives a message back later (a retry topic, a wait queue,
//!   a delayed redelivery), for the [`ParkingLayer`](crate::ParkingLayer).
//! - [`Publisher`]: sends outputs with the broker's confirmation, for the
//!   [`PublishLayer`](crate::publish::PublishLayer).
//! - [`DeadLetterStore`]: lists, replays and purges what the sink wrote.
//! - [`LagProbe`]: asks the broker how far a group is behind, and how much
//!   it parked.
//!
//! Endpoints and settings in errors, logs and `Debug` go through
//! [`redact`](crate::redact), so no password reaches them.
//!
//! # The contract
//!
//! `docs/CONTRACT.md` in the repository states what every backend must keep,
//! clause by clause: nothing acknowledged before it is finished, a watermark
//! never past a message in flight, a revoked partition drained and committed
//! before it is released, a crash delivering again, memory bounded, poison
//! messages dead-lettered with their origin, outages waited out, bad input
//! a typed error and never a panic. Each clause names the tests that check
//! it.
//!
//! # The conformance suite
//!
//! A backend is accepted when it passes the shared scenarios unchanged. With
//! the `testkit` feature, [`testkit`] holds them: implement
//! [`testkit::Backend`] (a fixture that creates sources, produces, connects
//! consumers and reads dead letters back) and let
//! [`conformance_suite!`](crate::conformance_suite) write one test per
//! scenario:
//!
//! ```ignore
//! // tests/conformance.rs of a backend crate, with
//! // intake-core = { features = ["testkit"] } among its dev-dependencies.
//! async fn backend() -> Option<MyBackend> {
//!     MyBackend::connect().await // None: the broker is absent, the tests skip
//! }
//! intake_core::conformance_suite!(backend());
//! ```
//!
//! # Example
//!
//! A source of a fixed list of messages on one partition, and an acker that
//! records the watermarks, run by the consumer:
//!
//! ```
//! use std::collections::VecDeque;
//! use std::sync::{Arc, Mutex};
//!
//! use intake_core::backend::{
//!     AckBatch, AckError, Acker, Source, SourceError, SourceEvent,
//! };
//! use intake_core::{Consumer, Message, Metadata, Payload, Position, handler_fn};
//! use intake_core::consumer::Shutdown;
//!
//! struct ListSource {
//!     left: VecDeque<Message>,
//! }
//!
//! impl Source for ListSource {
//!     async fn next(
//!         &mut self,
//!         deliveries: &mut Vec<Message>,
//!         max: usize,
//!     ) -> Result<SourceEvent, SourceError> {
//!         if self.left.is_empty() {
//!             return Ok(SourceEvent::Exhausted);
//!         }
//!         if max == 0 {
//!             // The budget is full: deliver nothing, wait for room.
//!             std::future::pending::<()>().await;
//!         }
//!         let taken = max.min(self.left.len());
//!         deliveries.extend(self.left.drain(..taken));
//!         Ok(SourceEvent::Delivered)
//!     }
//! }
//!
//! #[derive(Clone, Default)]
//! struct RecordingAcker {
//!     watermarks: Arc<Mutex<Vec<Position>>>,
//! }
//!
//! impl Acker for RecordingAcker {
//!     async fn ack(&mut self, batch: &AckBatch) -> Result<(), AckError> {
//!         let mut watermarks = self.watermarks.lock().unwrap_or_else(|e| e.into_inner());
//!         watermarks.extend(batch.partitions.iter().filter_map(|ack| ack.watermark));
//!         Ok(())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let messages = (0..3)
//!     .map(|offset| Message::new("hello", Metadata::new("greetings".into(), 0, Position::Offset(offset))))
//!     .collect();
//! let acker = RecordingAcker::default();
//! let handler = handler_fn(|Payload(_payload): Payload| async {});
//! let report = Consumer::builder()
//!     .build(ListSource { left: messages }, acker.clone(), handler)?
//!     .run(Shutdown::never())
//!     .await?;
//! assert_eq!(report.succeeded, 3);
//! assert_eq!(acker.watermarks.lock().unwrap().last(), Some(&Position::Offset(2)));
//! # Ok(())
//! # }
//! ```

pub mod broker;

pub use crate::acker::{AckBatch, AckError, AckMode, Acker, PartitionAck};
pub use crate::dead_letter::store::{DeadLetterLog, DeadLetterStore};
pub use crate::dead_letter::{DeadLetter, DeadLetterError, DeadLetterSink, envelope};
pub use crate::lag::LagProbe;
pub use crate::message::{Header, Headers, Message, Metadata, PartitionKey, Position, SourceName};
pub use crate::parking::Parking;
pub use crate::publish::Publisher;
pub use crate::reachability::Reachability;
pub use crate::source::{
    Limits, Revocation, RevocationError, RevocationHandle, RevocationOutcome, RevokedPartition,
    Source, SourceError, SourceEvent,
};
pub use broker::{Broker, ParkingOptions, RouteAddress, RouteOptions, RouteParts};

#[cfg(feature = "testkit")]
pub mod testkit;
