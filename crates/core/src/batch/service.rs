//! [`Batch`]: the per-message service that gathers messages into batches
//! for a batch handler.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};

use tokio::sync::mpsc;
use tower::Service;

use super::state::{Join, OpenBatch};
use super::{BatchError, BatchSettings, ResponseFuture, worker};
use crate::error::{ConfigError, HandlerError};
use crate::message::Message;

/// A per-message handler over a batch handler `S`. See the
/// [module docs](super). Clones share the batches.
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

    pub(super) fn from_valid(inner: S, settings: BatchSettings) -> Self {
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
