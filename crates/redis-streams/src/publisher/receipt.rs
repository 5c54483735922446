//! [`RedisStreamsReceipt`]: the answer to one output.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use intake_core::publish::{Confirmation, PublishError, PublishErrorKind};
use tokio::sync::oneshot;

/// What the writer answers for one output.
pub(super) type Answer = Result<Confirmation, PublishError>;

/// Resolves with the entry id Redis gave one output, or with why not; see
/// [`RedisStreamsPublisher`](crate::RedisStreamsPublisher).
///
/// The writer answers it at most
/// [`queue_timeout`](crate::RedisStreamsPublisherBuilder::queue_timeout) +
/// [`command_timeout`](crate::RedisSettings::command_timeout)
/// after the send, so it needs no timer of its own (a timer per output cost
/// more than the rest of the receipt). Dropping it does not take the
/// output back.
#[derive(Debug)]
#[must_use = "a receipt tells whether the output was stored only when awaited"]
pub struct RedisStreamsReceipt {
    answer: oneshot::Receiver<Answer>,
    destination: Arc<str>,
}

impl RedisStreamsReceipt {
    pub(super) fn new(answer: oneshot::Receiver<Answer>, destination: Arc<str>) -> Self {
        Self {
            answer,
            destination,
        }
    }
}

impl Future for RedisStreamsReceipt {
    type Output = Answer;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        Poll::Ready(match ready!(Pin::new(&mut self.answer).poll(cx)) {
            Ok(answer) => answer,
            // The writer answers every output it takes; only a runtime that
            // shuts down (and drops the writer task) leaves one unanswered.
            Err(_) => Err(PublishError::new(
                PublishErrorKind::Closed,
                &*self.destination,
                "the publisher's writer stopped before Redis answered (its runtime shut down); \
                 the entry may or may not have been added; make a new publisher",
            )),
        })
    }
}
