//! [`RedisStreamsReceipt`]: the answer to one output, bounded in time.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use intake_core::publish::{Confirmation, PublishError, PublishErrorKind};
use pin_project_lite::pin_project;
use tokio::sync::oneshot;
use tokio::time::Timeout;

/// What the writer answers for one output.
pub(super) type Answer = Result<Confirmation, PublishError>;

pin_project! {
    /// Resolves with the entry id Redis gave one output, or with why not;
    /// see [`RedisStreamsPublisher`](crate::RedisStreamsPublisher).
    ///
    /// It waits at most the publisher's
    /// [`confirm_timeout`](crate::RedisStreamsPublisherBuilder::confirm_timeout)
    /// from the send, then fails with
    /// [`Unavailable`](PublishErrorKind::Unavailable) (the entry may still
    /// be added: it was handed to the writer). Dropping it does not take the
    /// output back.
    #[derive(Debug)]
    #[must_use = "a receipt tells whether the output was stored only when awaited"]
    pub struct RedisStreamsReceipt {
        #[pin]
        answer: Timeout<oneshot::Receiver<Answer>>,
        destination: Arc<str>,
        timeout: Duration,
    }
}

impl RedisStreamsReceipt {
    pub(super) fn new(
        answer: oneshot::Receiver<Answer>,
        destination: Arc<str>,
        timeout: Duration,
    ) -> Self {
        Self {
            // The timer is registered only if the answer is not there at
            // the first poll.
            answer: tokio::time::timeout(timeout, answer),
            destination,
            timeout,
        }
    }
}

impl Future for RedisStreamsReceipt {
    type Output = Answer;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        let this = self.project();
        Poll::Ready(match ready!(this.answer.poll(cx)) {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(PublishError::new(
                PublishErrorKind::Closed,
                &**this.destination,
                "the publisher's writer stopped before Redis answered; the entry may or may \
                 not have been added; make a new publisher",
            )),
            Err(_) => Err(PublishError::new(
                PublishErrorKind::Unavailable,
                &**this.destination,
                format!(
                    "no reply from Redis within {:?}; the entry may or may not have been added; \
                     publish again",
                    this.timeout
                ),
            )),
        })
    }
}
