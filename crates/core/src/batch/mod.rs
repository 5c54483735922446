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
mod settings;
mod state;
mod worker;

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};

use tokio::sync::mpsc;
use tower::Service;

pub use self::error::BatchError;
pub use self::future::ResponseFuture;
pub use self::layer::BatchLayer;
pub use self::settings::BatchSettings;
use self::state::{Join, OpenBatch};
use crate::error::{ConfigError, HandlerError};
use crate::message::Message;

/// A per-message handler over a batch handler `S`. See the
/// [module docs](self). Clones share the batches.
pub struct Batch<S> {
    shared: Arc<Shared<S>>,
}

struct Shared<S> {
    settings: BatchSettings,
    /// The batch new messages join.
    open: Mutex<Option<Arc<OpenBatch>>>,
    /// Tells the worker about each new batch. Set when the first message
    /// arrives (inside the runtime), which spawns the worker.
    worker: OnceLock<mpsc::UnboundedSender<Arc<OpenBatch>>>,
    /// The batch handler until the worker takes it.
    service: Mutex<Option<S>>,
}

impl<S> Batch<S> {
    /// Wraps the batch handler `inner`.
    ///
    /// # Errors
    ///
    /// Settings that [`BatchSettings::validate`] refuses.
    pub fn new(inner: S, settings: BatchSettings) -> Result<Self, ConfigError> {
        settings.validate()?;
        Ok(Self::from_valid(inner, settings))
    }

    fn from_valid(inner: S, settings: BatchSettings) -> Self {
        Self {
            shared: Arc::new(Shared {
                settings,
                open: Mutex::new(None),
                worker: OnceLock::new(),
                service: Mutex::new(Some(inner)),
            }),
        }
    }

    /// The settings.
    pub fn settings(&self) -> &BatchSettings {
        &self.shared.settings
    }
}

impl<S> Clone for Batch<S> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S> std::fmt::Debug for Batch<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("settings", &self.shared.settings)
            .finish_non_exhaustive()
    }
}

impl<S> Shared<S>
where
    S: Service<Vec<Message>, Response = Vec<Result<(), HandlerError>>> + Send + 'static,
    S::Error: Into<HandlerError>,
    S::Future: Send + 'static,
{
    fn worker(&self) -> Result<&mpsc::UnboundedSender<Arc<OpenBatch>>, BatchError> {
        if let Some(worker) = self.worker.get() {
            return Ok(worker);
        }
        let mut service = self.service.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(worker) = self.worker.get() {
            return Ok(worker);
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| BatchError::NoRuntime)?;
        let Some(service) = service.take() else {
            return Err(BatchError::WorkerStopped);
        };
        let (sender, receiver) = mpsc::unbounded_channel();
        runtime.spawn(worker::run(service, receiver, self.settings));
        Ok(self.worker.get_or_init(|| sender))
    }

    fn join(&self, message: Message) -> ResponseFuture {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let mut message = message;
        if let Some(batch) = open.as_ref() {
            match batch.join(message, self.settings.max_size) {
                Join::Joined { index, filled } => {
                    let batch = Arc::clone(batch);
                    if filled {
                        *open = None;
                        batch.full.notify_one();
                    }
                    return ResponseFuture::waiting(batch, index);
                }
                Join::Sealed(returned) => message = returned,
            }
        }
        let worker = match self.worker() {
            Ok(worker) => worker,
            Err(error) => return ResponseFuture::failed(HandlerError::retryable(error)),
        };
        let batch = Arc::new(OpenBatch::starting_with(message, self.settings.max_size));
        // Sent while `open` is locked, so the worker sees batches in the
        // order they opened.
        if worker.send(Arc::clone(&batch)).is_err() {
            return ResponseFuture::failed(HandlerError::retryable(BatchError::WorkerStopped));
        }
        if batch.is_sealed() {
            batch.full.notify_one();
        } else {
            *open = Some(Arc::clone(&batch));
        }
        ResponseFuture::waiting(batch, 0)
    }
}

impl<S> Service<Message> for Batch<S>
where
    S: Service<Vec<Message>, Response = Vec<Result<(), HandlerError>>> + Send + 'static,
    S::Error: Into<HandlerError>,
    S::Future: Send + 'static,
{
    type Response = ();
    type Error = HandlerError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Messages always join a batch; the runtime's in-flight budget
        // bounds how many wait, and the parallelism bounds the handler.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, message: Message) -> Self::Future {
        self.shared.join(message)
    }
}

#[cfg(test)]
mod tests;
