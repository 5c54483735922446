//! Batch handlers: handle messages in batches, complete each on its own
//! outcome.
//!
//! A batch handler is a `Service<Vec<Message>>` that returns one
//! `Result<(), HandlerError>` per message, in the batch's order (for
//! example one database round trip for many inserts, reporting the rows
//! that failed). [`BatchLayer`] turns it into an ordinary per-message
//! handler: a message joins the open batch and its future resolves with
//! that message's own outcome, so commits, retries, dead-lettering and
//! metrics work per message exactly as for any handler. Layers above the
//! batch layer see single messages.
//!
//! A batch is handed over when it holds [`max_size`](BatchSettings::max_size)
//! messages or its first message has waited
//! [`max_wait`](BatchSettings::max_wait); at most
//! [`parallelism`](BatchSettings::parallelism) batches run at once. If the
//! handler fails as a whole, every message gets its error (same class); if
//! it panics, every message gets a retryable error carrying the panic; if
//! it returns too few outcomes, the messages without one are retried.
//!
//! Batches only fill when the runtime runs several messages at once: with
//! one message in flight per partition, a batch holds at most one message
//! of each partition.
//!
//! Allocation is per batch (the batch and its task), not per message.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use intake_core::batch::{BatchLayer, BatchSettings};
//! use intake_core::dead_letter::{DeadLetterLayer, FailurePolicy};
//! use intake_core::{HandlerError, Message};
//! use tower::{ServiceBuilder, service_fn};
//!
//! # fn main() -> Result<(), intake_core::ConfigError> {
//! let insert_rows = service_fn(|batch: Vec<Message>| async move {
//!     // One outcome per message, in order.
//!     let outcomes = batch
//!         .iter()
//!         .map(|message| match message.payload().is_empty() {
//!             true => Err(HandlerError::permanent("empty row")),
//!             false => Ok(()),
//!         })
//!         .collect::<Vec<_>>();
//!     Ok::<_, HandlerError>(outcomes)
//! });
//! let handler = ServiceBuilder::new()
//!     .layer(DeadLetterLayer::with_policy(FailurePolicy::discard()))
//!     .layer(BatchLayer::new(BatchSettings {
//!         max_size: 500,
//!         max_wait: Duration::from_millis(20),
//!         parallelism: 2,
//!     })?)
//!     .service(insert_rows);
//! # let _ = handler;
//! # Ok(())
//! # }
//! ```

mod error;
mod future;
mod layer;
mod service;
mod settings;
mod state;
mod worker;

pub use self::error::BatchError;
pub use self::future::ResponseFuture;
pub use self::layer::BatchLayer;
pub use self::service::Batch;
pub use self::settings::BatchSettings;

#[cfg(test)]
mod tests;
