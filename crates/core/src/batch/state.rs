//! [`OpenBatch`]: one batch, from its first message to every message's
//! outcome.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::BatchError;
use crate::catch_panic::Panicked;
use crate::error::HandlerError;
use crate::message::Message;

/// A batch shared by its messages' futures, the worker and the task that
/// runs it. One allocation per batch; a message adds an entry to two
/// vectors that were sized for the batch.
pub(super) struct OpenBatch {
    pub(super) opened_at: Instant,
    /// Told when the batch is full, so the worker hands it over at once.
    pub(super) full: Notify,
    inner: Mutex<Inner>,
}

struct Inner {
    messages: Vec<Message>,
    slots: Vec<Slot>,
    /// No more messages join once the batch is full or handed over.
    sealed: bool,
}

enum Slot {
    Waiting(Option<Waker>),
    Done(Result<(), HandlerError>),
    Taken,
}

/// What became of a message offered to a batch.
pub(super) enum Join {
    /// It is message `index` of the batch; `filled`: it was the last one
    /// the batch had room for.
    Joined { index: usize, filled: bool },
    /// The batch is sealed; here is the message back.
    Sealed(Message),
}

impl OpenBatch {
    /// A batch opened by `first`, with room for `max_size` messages
    /// (reserved up to a bound, so a huge `max_size` costs nothing at low
    /// traffic).
    pub(super) fn starting_with(first: Message, max_size: usize) -> Self {
        let capacity = max_size.min(256);
        let mut messages = Vec::with_capacity(capacity);
        let mut slots = Vec::with_capacity(capacity);
        messages.push(first);
        slots.push(Slot::Waiting(None));
        Self {
            opened_at: Instant::now(),
            full: Notify::new(),
            inner: Mutex::new(Inner {
                messages,
                slots,
                sealed: max_size <= 1,
            }),
        }
    }

    /// Whether no more messages may join.
    pub(super) fn is_sealed(&self) -> bool {
        self.lock().sealed
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds `message` unless the batch is sealed (then hands it back).
    pub(super) fn join(&self, message: Message, max_size: usize) -> Join {
        let mut inner = self.lock();
        if inner.sealed {
            return Join::Sealed(message);
        }
        inner.messages.push(message);
        inner.slots.push(Slot::Waiting(None));
        let index = inner.messages.len() - 1;
        let filled = inner.messages.len() >= max_size;
        if filled {
            inner.sealed = true;
        }
        Join::Joined { index, filled }
    }

    /// Closes the batch and takes its messages for the handler.
    pub(super) fn seal(&self) -> Vec<Message> {
        let mut inner = self.lock();
        inner.sealed = true;
        std::mem::take(&mut inner.messages)
    }

    /// The outcome of message `index`, or registers `waker` for it.
    pub(super) fn poll_outcome(
        &self,
        index: usize,
        waker: &Waker,
    ) -> Option<Result<(), HandlerError>> {
        let mut inner = self.lock();
        let Some(slot) = inner.slots.get_mut(index) else {
            return Some(Err(HandlerError::retryable(
                "a batched message's slot is missing from its batch",
            )));
        };
        match std::mem::replace(slot, Slot::Taken) {
            Slot::Done(outcome) => Some(outcome),
            Slot::Waiting(registered) => {
                let waker = match registered {
                    Some(registered) if registered.will_wake(waker) => registered,
                    _ => waker.clone(),
                };
                *slot = Slot::Waiting(Some(waker));
                None
            }
            Slot::Taken => Some(Err(HandlerError::retryable(
                "a batched message's future was polled after it completed",
            ))),
        }
    }

    /// Gives each message its outcome, `outcome(index)`, and wakes them.
    fn complete(&self, mut outcome: impl FnMut(usize) -> Result<(), HandlerError>) {
        let mut wakers = Vec::new();
        {
            let mut inner = self.lock();
            for (index, slot) in inner.slots.iter_mut().enumerate() {
                if let Slot::Waiting(waker) = slot {
                    wakers.extend(waker.take());
                    *slot = Slot::Done(outcome(index));
                }
            }
        }
        for waker in wakers {
            waker.wake();
        }
    }

    fn len(&self) -> usize {
        self.lock().slots.len()
    }
}

/// Delivers a batch's outcomes; if it is dropped first (the handler
/// panicked or was cancelled), every message fails retryably instead of
/// waiting forever.
pub(super) struct Completion {
    batch: Option<Arc<OpenBatch>>,
}

impl Completion {
    pub(super) fn new(batch: Arc<OpenBatch>) -> Self {
        Self { batch: Some(batch) }
    }

    /// The handler's answer: one outcome per message, or one error for all.
    pub(super) fn outcomes(mut self, answer: Result<Vec<Result<(), HandlerError>>, HandlerError>) {
        let Some(batch) = self.batch.take() else {
            return;
        };
        let size = batch.len();
        match answer {
            Ok(outcomes) => {
                let returned = outcomes.len();
                if returned != size {
                    tracing::error!(
                        size,
                        returned,
                        "the batch handler returned a wrong number of outcomes"
                    );
                }
                let mut outcomes = outcomes.into_iter();
                batch.complete(|index| {
                    outcomes.next().unwrap_or_else(|| {
                        Err(HandlerError::retryable(BatchError::MissingOutcome {
                            size,
                            returned,
                            index,
                        }))
                    })
                });
            }
            Err(error) => {
                let class = error.class();
                let attempts = error.attempts();
                let error = Arc::new(error);
                batch.complete(|_| {
                    Err(HandlerError::retryable(BatchError::Failed {
                        size,
                        error: Arc::clone(&error),
                    })
                    .reclassify(class)
                    .with_attempts(attempts))
                });
            }
        }
    }

    /// The handler panicked: every message fails with the panic, retryably.
    pub(super) fn panicked(mut self, panic: &Panicked) {
        if let Some(batch) = self.batch.take() {
            tracing::error!(panic = %panic.message(), "batch handler panicked");
            batch.complete(|_| Err(HandlerError::panicked(panic.clone())));
        }
    }

    /// The batch could not be handed to the handler.
    pub(super) fn failed(mut self, error: HandlerError) {
        if let Some(batch) = self.batch.take() {
            let size = batch.len();
            let class = error.class();
            let error = Arc::new(error);
            batch.complete(|_| {
                Err(HandlerError::retryable(BatchError::Failed {
                    size,
                    error: Arc::clone(&error),
                })
                .reclassify(class))
            });
        }
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if let Some(batch) = self.batch.take() {
            batch.complete(|_| Err(HandlerError::retryable(BatchError::Abandoned)));
        }
    }
}
