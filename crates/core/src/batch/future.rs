//! [`ResponseFuture`]: one message waiting for its batch's outcome.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::state::OpenBatch;
use crate::error::HandlerError;

/// The future of [`Batch`](super::Batch): resolves with this message's own
/// outcome once its batch has run.
pub struct ResponseFuture {
    kind: Kind,
}

enum Kind {
    Waiting { batch: Arc<OpenBatch>, index: usize },
    Failed(Option<HandlerError>),
}

impl ResponseFuture {
    pub(super) fn waiting(batch: Arc<OpenBatch>, index: usize) -> Self {
        Self {
            kind: Kind::Waiting { batch, index },
        }
    }

    pub(super) fn failed(error: HandlerError) -> Self {
        Self {
            kind: Kind::Failed(Some(error)),
        }
    }
}

impl Future for ResponseFuture {
    type Output = Result<(), HandlerError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.kind {
            Kind::Waiting { batch, index } => match batch.poll_outcome(*index, cx.waker()) {
                Some(outcome) => Poll::Ready(outcome),
                None => Poll::Pending,
            },
            Kind::Failed(error) => Poll::Ready(Err(error.take().unwrap_or_else(|| {
                HandlerError::retryable("a batched message's future was polled after it completed")
            }))),
        }
    }
}

impl std::fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
