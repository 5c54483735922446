//! [`TransactionalService`]: the service of the
//! [`TransactionalLayer`](super::TransactionalLayer), which keeps a
//! handler's outputs for the transaction that commits its input, reading
//! first what a destination not known yet accepts.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use intake_core::publish::{Output, Outputs, PublishError, PublishErrorKind};
use intake_core::trace::TRACEPARENT;
use intake_core::{HandlerError, Message, PartitionKey, Position};
use tower::Service;

use super::limits::Described;
use super::store::{OutputStore, Put};

/// The service of [`TransactionalLayer`](super::TransactionalLayer).
#[derive(Clone)]
pub struct TransactionalService<S> {
    inner: S,
    store: Arc<OutputStore>,
}

impl<S> TransactionalService<S> {
    pub(super) fn new(inner: S, store: Arc<OutputStore>) -> Self {
        Self { inner, store }
    }
}

impl<S: fmt::Debug> fmt::Debug for TransactionalService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransactionalService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// The future of [`TransactionalService`]. Boxed, as
/// [`PublishFuture`](intake_core::publish::PublishFuture) is: keeping the
/// outputs allocates per input anyway.
pub type TransactionalFuture = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>;

impl<S> Service<Message> for TransactionalService<S>
where
    S: Service<Message, Response = Outputs>,
    S::Error: Into<HandlerError>,
    S::Future: Send + 'static,
{
    type Response = ();
    type Error = HandlerError;
    type Future = TransactionalFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), HandlerError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, message: Message) -> Self::Future {
        let partition = message.metadata().partition_key();
        let position = message.metadata().position();
        // Taken before the handler runs: a partition lost meanwhile moves
        // it on, and the outputs are not kept.
        let epoch = self.store.epoch(&partition);
        let trace = message.headers().get(TRACEPARENT).cloned();
        let handled = self.inner.call(message);
        let store = Arc::clone(&self.store);
        Box::pin(async move {
            let Position::Offset(offset) = position else {
                return Err(HandlerError::permanent(format!(
                    "{partition}: position {position} is not a Kafka offset; a transactional layer only runs on a Kafka source"
                )));
            };
            match handled.await.map_err(Into::into) {
                Ok(outputs) => {
                    let outputs = outputs
                        .into_iter()
                        .map(|output| match &trace {
                            Some(trace) if output.headers().get(TRACEPARENT).is_none() => {
                                output.with_header(TRACEPARENT, trace.clone())
                            }
                            _ => output,
                        })
                        .collect();
                    match store.put(&partition, epoch, offset, outputs) {
                        // Rare (a destination's first output, a partition
                        // past its count): boxed, so that every input's
                        // future does not carry the room of a read from
                        // the broker.
                        Put::Unread(topic, outputs) => {
                            Box::pin(keep_after_reading(
                                &store,
                                &partition,
                                epoch,
                                offset,
                                Read::First(topic),
                                outputs,
                            ))
                            .await
                        }
                        Put::Recount(topic, outputs) => {
                            Box::pin(keep_after_reading(
                                &store,
                                &partition,
                                epoch,
                                offset,
                                Read::Again(topic),
                                outputs,
                            ))
                            .await
                        }
                        put => settle(put, &store, &partition, offset),
                    }
                }
                Err(error) => {
                    store.remove(&partition, offset);
                    Err(error)
                }
            }
        })
    }
}

/// What an input comes to once [`OutputStore::put`] decided.
fn settle(
    put: Put,
    store: &OutputStore,
    partition: &PartitionKey,
    offset: i64,
) -> Result<(), HandlerError> {
    match put {
        Put::Kept => Ok(()),
        Put::Stale => {
            tracing::debug!(%partition, offset, "outputs of an input of a partition given up meanwhile dropped");
            Ok(())
        }
        Put::Refused {
            index,
            destination,
            reason,
        } => {
            store.remove(partition, offset);
            tracing::debug!(%partition, offset, index, %reason, "an output its destination would refuse fails its input");
            Err(HandlerError::from(PublishError::new(
                PublishErrorKind::Rejected,
                &*destination,
                reason,
            )))
        }
        Put::Unread(topic, _) | Put::Recount(topic, _) => Err(HandlerError::retryable(format!(
            "{partition}: what {topic} accepts is still not known"
        ))),
    }
}

/// Which destination [`keep_after_reading`] reads, and how.
enum Read {
    /// One not read yet.
    First(Arc<str>),
    /// One read before whose partition count an output is past: read fresh.
    Again(Arc<str>),
}

/// Reads what a destination accepts, then keeps `outputs` for the input at
/// `offset` of `partition` (reading every other destination not known
/// yet the same way), or fails the input if the broker would refuse one.
/// A destination's partition count is read again at most once per input.
async fn keep_after_reading(
    store: &OutputStore,
    partition: &PartitionKey,
    epoch: u64,
    offset: i64,
    mut read: Read,
    mut outputs: Vec<Output>,
) -> Result<(), HandlerError> {
    let mut recounted = false;
    loop {
        let (topic, fresh) = match read {
            Read::First(topic) => (topic, false),
            Read::Again(topic) => {
                recounted = true;
                (topic, true)
            }
        };
        let described = store.describer().describe(&topic, fresh).await;
        if let Described::Unknown(why) = &described {
            tracing::warn!(
                destination = %topic,
                why = %why,
                "what the destination accepts could not be read; its outputs are checked against the producer's message.max.bytes only, and one the broker refuses fails its transactions until it is read"
            );
        }
        store.learn(&topic, &described);
        // Each round learns one destination more, or reads one again once,
        // so this ends.
        let put = if recounted {
            store.put_recounted(partition, epoch, offset, outputs)
        } else {
            store.put(partition, epoch, offset, outputs)
        };
        match put {
            Put::Unread(next, given_back) => {
                read = Read::First(next);
                outputs = given_back;
            }
            Put::Recount(next, given_back) => {
                read = Read::Again(next);
                outputs = given_back;
            }
            put => return settle(put, store, partition, offset),
        }
    }
}
