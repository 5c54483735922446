//! [`AmqpReceipt`] and the task that collects the broker's confirms.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use intake_core::BoxError;
use intake_core::publish::{Confirmation, PublishError, PublishErrorKind};
use lapin::types::ShortString;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::error::{Operation, classify};

use super::{Pending, Publishing};

/// Resolves when the broker confirmed one output (see
/// [`AmqpPublisher`](super::AmqpPublisher)); bounded by the publisher's confirm timeout.
#[must_use = "a receipt tells whether the output was confirmed"]
pub struct AmqpReceipt {
    pub(super) receipt: oneshot::Receiver<Result<Confirmation, PublishError>>,
    pub(super) destination: Arc<str>,
}

impl fmt::Debug for AmqpReceipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpReceipt")
            .field("destination", &self.destination)
            .finish_non_exhaustive()
    }
}

impl Future for AmqpReceipt {
    type Output = Result<Confirmation, PublishError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.receipt).poll(cx).map(|answer| {
            answer.unwrap_or_else(|_dropped| {
                Err(PublishError::new(
                    PublishErrorKind::Closed,
                    &*self.destination,
                    "the publisher's runtime stopped before the output was confirmed; publish \
                     again with a new publisher",
                ))
            })
        })
    }
}

/// Awaits each output's publish and confirm, in order, answering its
/// receipt and giving its room back. Ends when the publisher is dropped.
pub(super) async fn collect_confirms(
    mut queue: mpsc::UnboundedReceiver<Pending>,
    endpoint: String,
    vhost: String,
) {
    while let Some(pending) = queue.recv().await {
        let answer = settle(
            pending.publishing,
            pending.deadline,
            &pending.destination,
            &pending.exchange,
            &pending.routing_key,
            &endpoint,
            &vhost,
        )
        .await;
        // A receipt dropped unawaited: nobody asks, the room comes back.
        let _ = pending.reply.send(answer);
    }
}

async fn settle(
    publishing: Publishing,
    deadline: Instant,
    destination: &str,
    exchange: &ShortString,
    routing_key: &ShortString,
    endpoint: &str,
    vhost: &str,
) -> Result<Confirmation, PublishError> {
    let unavailable = |what: &str, error: Option<lapin::Error>| {
        let publish_error = PublishError::new(PublishErrorKind::Unavailable, destination, what);
        match error {
            Some(error) => {
                publish_error.with_source(classify(error, endpoint, vhost, Operation::Other))
            }
            None => publish_error,
        }
    };
    let confirmed = tokio::time::timeout_at(deadline, async {
        let confirm = match publishing {
            Publishing::Written(result) => result,
            Publishing::Writing(future) => future.await,
        }
        .map_err(|error| {
            unavailable(
                "the channel failed before the output was sent; publish again",
                Some(error),
            )
        })?;
        confirm.await.map_err(|error| {
            unavailable(
                "the channel closed before the broker confirmed the output; publish again",
                Some(error),
            )
        })
    })
    .await
    .map_err(|_elapsed| unavailable("no publisher confirm in time; publish again", None))??;
    let refused = |what: String, source: BoxError| {
        tracing::debug!(destination, %what, "AMQP output refused");
        Err(PublishError::new(PublishErrorKind::Rejected, destination, what).with_source(source))
    };
    match confirmed {
        lapin::Confirmation::Ack(None) => Ok(Confirmation::default()),
        lapin::Confirmation::Ack(Some(returned)) | lapin::Confirmation::Nack(Some(returned)) => {
            refused(
                format!(
                    "no queue is bound to exchange `{exchange}` with routing key `{routing_key}`; \
                     declare and bind the queue"
                ),
                format!(
                    "basic.return {} {}",
                    returned.reply_code, returned.reply_text
                )
                .into(),
            )
        }
        lapin::Confirmation::Nack(None) => refused(
            format!("the broker refused it (basic.nack) on exchange `{exchange}`"),
            "basic.nack".into(),
        ),
        lapin::Confirmation::NotRequested => Err(unavailable(
            "the channel is not in confirm mode; publish again",
            None,
        )),
    }
}
