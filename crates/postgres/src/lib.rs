//! Exactly-once effects in PostgreSQL for intake consumers.
//!
//! Brokers deliver at least once: a consumer that crashes after it processed
//! a message, but before the broker learned so, receives the message again.
//! This crate makes the message's *effects* in PostgreSQL happen exactly
//! once. The handler runs in a transaction that first inserts a
//! processed-marker for the message, keyed by (consumer group, source,
//! partition, position) or by a message id from a header. The handler's
//! writes and the marker commit together, and the message is acknowledged
//! only after the commit. A redelivered message finds its marker: the
//! handler is skipped and the message is acknowledged as a duplicate.
//!
//! ```no_run
//! use intake_core::backend::{Acker, Source};
//! use intake_core::{Consumer, Json, Meta};
//! use intake_postgres::{exactly_once, MarkerTable, PoolConfig, PruneSettings, Pruner, Tx};
//! use serde::Deserialize;
//! use tokio_util::sync::CancellationToken;
//!
//! #[derive(Deserialize)]
//! struct Order {
//!     id: i64,
//!     cents: i64,
//! }
//!
//! # async fn run(source: impl Source, acker: impl Acker, shutdown: CancellationToken)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! // A bounded pool: each message in flight holds one connection.
//! let pool = PoolConfig::new("postgres://app:secret@127.0.0.1:5432/shop")?
//!     .max_connections(32)
//!     .connect()
//!     .await?;
//! // The marker table (idempotent), and pruning of markers older than 7 days.
//! MarkerTable::default().migrate(&pool).await?;
//! let pruner = Pruner::spawn(pool.clone(), MarkerTable::default(), PruneSettings::default())?;
//!
//! let handler = exactly_once(
//!     pool,
//!     "billing",
//!     async |mut tx: Tx, Meta(meta): Meta, Json(order): Json<Order>| -> Result<(), sqlx::Error> {
//!         sqlx::query("INSERT INTO invoices (order_id, cents) VALUES ($1, $2)")
//!             .bind(order.id)
//!             .bind(order.cents)
//!             .execute(&mut *tx)
//!             .await?;
//!         tracing::info!(order = order.id, position = %meta.position(), "invoiced");
//!         Ok(())
//!     },
//! )?;
//! let duplicates = handler.counters().clone();
//!
//! Consumer::builder()
//!     .max_in_flight(32)
//!     .build(source, acker, handler)?
//!     .run(shutdown)
//!     .await?;
//! tracing::info!(skipped = duplicates.duplicates(), "redeliveries skipped");
//! pruner.stop().await;
//! # Ok(())
//! # }
//! ```
//!
//! # The handler
//!
//! [`exactly_once`] (or [`ExactlyOnce::builder`] for the table, message
//! identity and isolation level) takes an async fn whose first argument is
//! the [`Tx`] and whose other arguments are intake's extractors (`Meta`,
//! `Key`, `Headers`, then one of `Json<T>`, `Payload`, `Message`), as
//! `handler_fn` does. It returns a `tower::Service<Message>`, so tower layers
//! (retry, timeout, dead letter, metrics) wrap it like any handler.
//!
//! [`Tx`] dereferences to a `sqlx::PgConnection` in the open transaction:
//! `query.execute(&mut *tx)`. Do not commit it, and do not keep it beyond the
//! handler: the framework commits when the handler returns `Ok` and rolls back
//! when it returns `Err`. An error is classified for the runtime
//! ([`IntoTxResult`]): a `HandlerError` keeps its class; a `sqlx::Error`
//! (returned as is, or as the source of your error) goes by its SQLSTATE.
//! Serialization failures and deadlocks are retryable. Constraint violations
//! and bad data are permanent, so they take the dead-letter path. Lost
//! connections and everything else are retryable ([`sqlstate_class`]).
//! To use `?` on both database errors and your own `HandlerError`s, return
//! `Result<(), BoxError>`; or map a `sqlx::Error` with [`handler_error`].
//!
//! Why the handler owns its `Tx` rather than borrowing `&mut Transaction`:
//! a closure cannot return a future that borrows its argument, so a
//! borrowed transaction would rule out closures (and `Send` futures from
//! async closures). The handler gives the `Tx` back by dropping it, which
//! every async fn does when it finishes.
//!
//! # Batches
//!
//! [`ExactlyOnceBuilder::batch_handler`] takes `async fn(Tx, Vec<T>)` and
//! writes a whole batch in one transaction. All the batch's markers go in
//! with one statement. Only new messages reach the fn, and each message
//! gets its own outcome. It is a `tower::Service<Vec<Message>>` that returns
//! one result per message, so it plugs into intake's batch layer, or you can
//! call it with batches you form.
//!
//! ```no_run
//! use std::time::Duration;
//! use intake_core::batch::{BatchLayer, BatchSettings};
//! use intake_core::Json;
//! use intake_postgres::{ExactlyOnce, Tx};
//! use tower::Layer;
//!
//! # fn build(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! let insert_all = ExactlyOnce::builder(pool, "billing").batch_handler(
//!     async |mut tx: Tx, amounts: Vec<Json<i64>>| -> Result<(), sqlx::Error> {
//!         let amounts: Vec<i64> = amounts.into_iter().map(|Json(cents)| cents).collect();
//!         sqlx::query("INSERT INTO payments (cents) SELECT * FROM UNNEST($1::int8[])")
//!             .bind(&amounts)
//!             .execute(&mut *tx)
//!             .await?;
//!         Ok(())
//!     },
//! )?;
//! // A per-message handler for the consumer: up to 100 messages a transaction.
//! let handler = BatchLayer::new(BatchSettings {
//!     max_size: 100,
//!     max_wait: Duration::from_millis(10),
//!     parallelism: 4,
//! })?
//! .layer(insert_all);
//! # drop(handler);
//! # Ok(())
//! # }
//! ```
//!
//! # Identity
//!
//! A message's marker key is its identity within the consumer group;
//! [`MessageId`] chooses it:
//!
//! - [`MessageId::Position`] (the default): the source, partition and
//!   broker position of its first delivery. Kafka offsets, NATS stream
//!   sequences, Redis stream entry ids and memory-broker offsets are stable
//!   across redelivery. AMQP delivery tags are not, so on RabbitMQ use a
//!   header. The broker assigns positions, so no producer can take another
//!   message's identity; but a position is unique only within one life of
//!   its source: after a Kafka topic or a Redis stream is deleted and
//!   created again, messages at positions seen before are skipped as
//!   duplicates ([`MessageId::Position`] says when, and what to do).
//! - [`MessageId::header`]`(name)`: the header's value, scoped to the
//!   first delivery's source (not its partition). It survives a source
//!   created again and also skips copies a producer sent twice; on
//!   RabbitMQ, `"amqp.message-id"` (the `message-id` property, which
//!   producers must set). The id is the producer's word: any producer that
//!   can write to the source can make another message be skipped as a
//!   duplicate by reusing its id. The per-source scope bounds who can;
//!   let only trusted producers write to a source and have them set
//!   unguessable ids ([`MessageId::Header`] says what a producer can do
//!   and how to keep it in bounds). Ids with control characters are
//!   refused.
//!
//! Under both, a parked copy that comes back through a
//! [`ParkingLayer`](intake_core::parking::ParkingLayer) outside the
//! exactly-once handler keeps its first delivery's identity, also when it
//! comes back through a return topic or stream, so parking and a crash
//! between a park and its acknowledgement apply effects once.
//!
//! # The marker table
//!
//! [`MarkerTable::migrate`] creates it. Its SQL is
//! [`MarkerTable::migration_sql`], documented on [`MarkerTable`]. [`Pruner`]
//! deletes markers older than the retention in the background. Keep markers
//! longer than any redelivery can take (see [`PruneSettings`]).
//!
//! # Publishing: the outbox
//!
//! A handler that also publishes writes its outputs into an
//! [`OutboxTable`] through its `Tx` ([`OutboxTable::write`]), so they
//! commit with its effects and its marker, or not at all. An
//! [`OutboxRelay`] publishes the committed rows with any intake
//! `Publisher`, in id order, and deletes them once the broker confirmed
//! them: exactly-once effects, at-least-once publishing, and every copy of
//! an output carries the same [`OUTBOX_ID_HEADER`] for downstream to drop
//! duplicates by. Rows of one destination and key reach the broker in id
//! order, also after a failed output ([`OutboxRelay`]'s order). A row the
//! broker refuses is moved to the outbox's failed table, logged at `error`
//! and counted, and the rest goes on; an operator re-queues it once its
//! cause is fixed ([`OutboxTable`]'s failed table). See the [`outbox`]
//! module for an example.
//!
//! # Cost
//!
//! A message costs a transaction: `BEGIN`, the marker `INSERT`, the
//! handler's statements, a check and `COMMIT`, on one pooled connection. The
//! check is one `SELECT` that makes sure the transaction is still the
//! marker's and has not failed. PostgreSQL turns a `COMMIT` in a failed
//! transaction into a silent rollback, so without the check a handler that
//! ignored a database error would get its message acknowledged with nothing
//! committed. A plain
//! handler's single auto-committed `INSERT` costs one round trip. Give the
//! pool as many connections as messages run at once. The batch form shares
//! one transaction and one marker statement among the whole batch.
//! BENCHMARKS.md has the measured ratios.
//!
//! # Driver
//!
//! Built on [sqlx](https://docs.rs/sqlx) (re-exported as [`sqlx`]). Most Rust
//! services that use PostgreSQL already use it, with `query!`, `FromRow` and
//! its migrations, so a handler's code is ordinary sqlx code. Its pool is
//! bounded and has acquire timeouts, and its database errors carry the
//! SQLSTATE that the error classes need. TLS is built in (rustls): the
//! URL's `sslmode` decides, `verify-full` included. A URL without one gets
//! `require` for a host that is not loopback, so a server (or anyone on
//! the way) that refuses TLS fails the connection rather than turning it
//! into clear text, and `prefer` for a loopback host or a Unix socket,
//! whose traffic stays on the machine ([`PoolConfig`]'s TLS).
#![warn(missing_docs)]

mod batch;
mod builder;
mod classify;
mod context;
mod counters;
mod error;
mod exactly_once;
mod handler;
mod isolation;
mod marker_table;
mod message_id;
pub mod outbox;
mod pool;
mod prune;
mod tls;
mod tx;
mod url;

pub use batch::{BatchResponseFuture, ExactlyOnceBatch, TxBatchHandler};
pub use builder::ExactlyOnceBuilder;
pub use classify::{error_class, handler_error, sqlstate_class};
pub use counters::ExactlyOnceCounters;
pub use error::Error;
pub use exactly_once::{ExactlyOnce, ResponseFuture, exactly_once};
pub use handler::{IntoTxResult, TxHandler};
pub use isolation::IsolationLevel;
pub use marker_table::MarkerTable;
pub use message_id::{HEADER_ID_PARTITION, MAX_MESSAGE_ID_LEN, MessageId};
pub use outbox::{
    OUTBOX_ID_HEADER, OutboxError, OutboxRelay, OutboxRelayHandle, OutboxTable, RelaySettings,
    RelayedBatch,
};
pub use pool::PoolConfig;
pub use prune::{PruneSettings, Pruner, PrunerHandle};
pub use tls::SslMode;
pub use tx::Tx;
pub use url::DatabaseUrl;

/// The sqlx version this crate is built on, for handlers' queries.
pub use sqlx;
