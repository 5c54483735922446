//! Kafka for intake, on rdkafka: a [`KafkaSource`], its [`KafkaAcker`], a
//! [`KafkaDeadLetterSink`] and a [`KafkaPublisher`] (outputs to topics from
//! an idempotent producer, each confirmed by its delivery report); [`Error`]
//! is everything that can go wrong building them.
//!
//! | shape | Kafka |
//! |---|---|
//! | broker value | [`KafkaBroker`]`::new(KafkaSettings)` or [`KafkaBroker::from_url`]: every part below derived from it ([`Broker`](intake_core::backend::Broker)) |
//! | entry point | [`KafkaSource::builder`]`(KafkaSettings)`, then `.build().await` |
//! | acker | [`KafkaSource::acker`] |
//! | dead-letter sink | [`KafkaSource::dead_letter_sink`], then `.build().await` |
//! | publisher | [`KafkaPublisher::builder`]`(KafkaSettings)`, then `.build()` |
//! | exactly once | [`KafkaTransactions`]: its layer keeps outputs, [`KafkaSourceBuilder::exactly_once`] commits them with the offsets in one transaction |
//! | reconnect | [`KafkaSourceBuilder::reconnect_backoff`] (librdkafka's `reconnect.backoff.*`) |
//! | budget | the consumer's `max_in_flight`, `max_in_flight_bytes`, `revoke_timeout` |
//!
//! | intake | Kafka |
//! |---|---|
//! | partition | topic-partition |
//! | position | offset ([`Position::Offset`](intake_core::Position::Offset)) |
//! | ack | commit the watermark + 1, one commit per batch, confirmed by the broker |
//! | retry | in process (Kafka cannot take one message back) |
//! | park (retry after a delay) | [`KafkaParking`]: a retry topic per delay tier, a mover that pauses each retry partition until its head is due and moves it to the group's return topic, which the source also reads ([`KafkaSourceBuilder::parking`], from its start); key order needs the `range` assignor; [`KafkaParking::backlog`] counts what is parked and not handled again |
//! | dead-letter store | [`KafkaDeadLetters`]: reads the dead-letter topic by partition and offset; removes by `DeleteRecords` of a prefix, or a mark in a compacted side topic |
//! | dead letter | produce to `<topic>.<group>.dlq` (created if missing) with origin headers |
//! | backpressure | pause the assigned partitions, keep polling |
//! | revoke | the rebalance callback waits for the runtime to drain and commit: the consumer's `revoke_timeout` + 5 s, ending 5 s before `max.poll.interval.ms` |
//! | broadcast | a group of its own per instance, from the end |
//! | group control | [`KafkaBroker::control_channel`]: topics `{group}.intake-control` (kept until deleted) and `{group}.intake-status` (an hour), one partition each, created on first use ([`KafkaControlChannel`]) |
//!
//! All librdkafka settings pass through [`KafkaSettings`], so TLS and SASL are
//! configured as usual; secrets never appear in logs or `Debug`.
//!
//! # Group protocol
//!
//! A consumer joins its group with the classic protocol unless its settings
//! choose KIP-848's ([`GroupProtocol::Consumer`], librdkafka's
//! `group.protocol=consumer`; Apache Kafka 4.0 or later):
//! [`KafkaSettings::group_protocol`], or `?group_protocol=consumer` in
//! [`KafkaBroker::from_url`]'s URL. Every part derived from the settings
//! follows it (the source, a parking's mover).
//!
//! | | classic (default) | consumer (KIP-848) |
//! |---|---|---|
//! | who assigns | the group's leader, with `partition.assignment.strategy` | the broker, with `group.remote.assignor` (`uniform` unless set, or `range`) |
//! | rebalance | eager (all partitions revoked) unless `cooperative-sticky` | incremental: only partitions that move are revoked, each drained and committed (`docs/CONTRACT.md` §3) |
//! | session, heartbeat | `session.timeout.ms`, `heartbeat.interval.ms` | the broker's `group.consumer.session.timeout.ms`, `group.consumer.heartbeat.interval.ms` (per group: `consumer.session.timeout.ms`, `consumer.heartbeat.interval.ms`) |
//! | refused settings | `group.remote.assignor` | `session.timeout.ms`, `heartbeat.interval.ms`, `partition.assignment.strategy`, `group.protocol.type` |
//! | a commit of an older epoch | `ILLEGAL_GENERATION`: librdkafka rejoins, the partitions are lost | `STALE_MEMBER_EPOCH`: sent again at once, up to three times in 600 ms, then refused to the runtime, which sends it again with its next batch |
//!
//! A refused setting fails the build with [`Error::GroupProtocolSetting`],
//! which names the setting and what replaces it. A parking keeps the order
//! per key under KIP-848 only with `group.remote.assignor=range` (see
//! [`parking`]).
//!
//! **Known defect (librdkafka 2.12, which rdkafka-sys 4.10 bundles).** A
//! member that goes longer than `max.poll.interval.ms` without polling
//! leaves its group and, under the classic protocol, joins again when it
//! polls. Under KIP-848's, librdkafka sends the leave at once; when its
//! answer is read before the member acts on its rejoin, the member is left
//! at epoch 0, its next heartbeat is refused (`INVALID_REQUEST`) and
//! librdkafka fails the consumer for good. The source reports that as a
//! fatal error ([`SourceError::Fatal`](intake_core::backend::SourceError::Fatal))
//! and the consumer stops; a new one joins again. librdkafka's issue
//! [#5541](https://github.com/confluentinc/librdkafka/issues/5541) (fix
//! [#5488](https://github.com/confluentinc/librdkafka/pull/5488), released
//! in librdkafka 2.15.0, which no rdkafka-sys bundles yet: a system
//! librdkafka of 2.15 or later, linked with rdkafka's `dynamic-linking`
//! feature, would carry the fix, untested with intake); reproduced on
//! Apache Kafka 4.1 by `tests/group_protocol.rs`. intake polls on a thread
//! of its own and keeps its own waits there inside the interval (a
//! revocation's, see `revoke` above), so a member passes it only when that
//! thread stalls: a log sink that blocks (librdkafka's log lines and the
//! source's are written from it), a revocation's final commit that
//! outlasts its 5 s margin, a process paused or starved of CPU. Keep
//! `max.poll.interval.ms` at its default (300 s: intake needs no shorter),
//! or stay on the classic protocol where a stall that long is possible.
//!
//! The shortest way in is the broker value: a route's source, acker,
//! dead-letter sink and parking derived together, so that the source reads
//! the parking's return topic, and the parkings' movers stopped with the
//! broker.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use intake_core::backend::{Broker, RouteAddress, RouteOptions};
//! use intake_core::dead_letter::DeadLetterLayer;
//! use intake_core::lag::LagProbe;
//! use intake_core::parking::ParkingLayer;
//! use intake_core::{Consumer, HandlerError, Message};
//! use intake_kafka::KafkaBroker;
//! use tokio_util::sync::CancellationToken;
//! use tower::{ServiceBuilder, service_fn};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = KafkaBroker::from_url("kafka://127.0.0.1:9092")?;
//! let address = RouteAddress::new("payments", "billing");
//! let parts = broker.route(&address, &RouteOptions::new().parking()).await?;
//! let parking = parts.parking.expect("the route parks");
//! let handler = ServiceBuilder::new()
//!     .layer(DeadLetterLayer::new(parts.dead_letter_sink))
//!     .layer(ParkingLayer::new(parking))
//!     .service(service_fn(|_: Message| async move {
//!         Err::<(), _>(HandlerError::retry_later("not yet", Duration::from_secs(10)))
//!     }));
//! Consumer::builder()
//!     .build(parts.source, parts.acker, handler)?
//!     .run(CancellationToken::new())
//!     .await?;
//! // What waits in the retry topics, which broker lag does not show.
//! let probe = broker.lag_probe(&address).await?;
//! println!("{:?} parked", probe.parked().await?);
//! broker.shutdown(Duration::from_secs(10)).await?;
//! # Ok(())
//! # }
//! ```
//!
//! The parts one by one, with the explicit builders:
//!
//! ```no_run
//! use intake_core::dead_letter::DeadLetterLayer;
//! use intake_core::{Consumer, DeliveryOrder, HandlerError, Json, Meta, handler_fn};
//! use intake_kafka::{KafkaSettings, KafkaSource};
//! use tokio_util::sync::CancellationToken;
//! use tower::Layer;
//!
//! #[derive(serde::Deserialize)]
//! struct Order {
//!     id: u64,
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // librdkafka's default assignment (`range`) gives partition p of every
//! // topic to one member: what parking's order per key needs (see
//! // `parking`); `cooperative-sticky` does not.
//! let settings = KafkaSettings::new("127.0.0.1:9092");
//! let source = KafkaSource::builder(settings)
//!     .group("billing")
//!     .topic("orders")
//!     .build()
//!     .await?;
//! let acker = source.acker();
//! // The source's brokers, settings, group and topics.
//! let dead_letters = source.dead_letter_sink().build().await?;
//!
//! let handler = handler_fn(|Meta(meta): Meta, Json(order): Json<Order>| async move {
//!     tracing::info!(offset = %meta.position(), order = order.id, "billed");
//!     Ok::<(), HandlerError>(())
//! });
//! // Undecodable orders go to `orders.billing.dlq`, then are committed.
//! let handler = DeadLetterLayer::new(dead_letters).layer(handler);
//!
//! let shutdown = CancellationToken::new();
//! let report = Consumer::builder()
//!     .ordering(DeliveryOrder::Key)
//!     .build(source, acker, handler)?
//!     .run(shutdown)
//!     .await?;
//! println!("{} orders billed", report.succeeded);
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

mod acker;
mod broker;
mod control_channel;
pub mod dead_letter;
mod dead_letter_store;
mod error;
mod lag;
mod ownership;
pub mod parking;
mod publisher;
mod record_headers;
mod settings;
mod source;
mod topic_admin;
mod transaction;

pub use acker::KafkaAcker;
pub use broker::{KafkaBroker, KafkaBrokerError};
pub use control_channel::{ControlTopicError, KafkaControlChannel};
pub use dead_letter::{KafkaDeadLetterSink, KafkaDeadLetterSinkBuilder};
pub use dead_letter_store::{
    DeadLetterLogError, KafkaDeadLetterStore, KafkaDeadLetters, KafkaDeadLettersBuilder,
    REMOVED_SUFFIX,
};
pub use error::Error;
pub use lag::KafkaLagProbe;
pub use parking::{KafkaParking, KafkaParkingBuilder, ParkedBacklog};
pub use publisher::{KafkaPublisher, KafkaPublisherBuilder, KafkaReceipt};
pub use settings::{GroupProtocol, KafkaSettings, LIBRDKAFKA_SECRETS, is_secret};
pub use source::{KafkaSource, KafkaSourceBuilder};
pub use transaction::{
    KafkaTransactions, TransactionError, TransactionalFuture, TransactionalLayer,
    TransactionalService,
};

/// The rdkafka version this crate builds on, for settings and types that
/// pass through.
pub use rdkafka;
