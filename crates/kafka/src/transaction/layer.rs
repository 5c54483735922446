//! [`TransactionalLayer`]: keeps what a handler returns for the transaction
//! that commits its input.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use intake_core::publish::{Output, Outputs, PublishError, PublishErrorKind};
use intake_core::trace::TRACEPARENT;
use intake_core::{HandlerError, Message, PartitionKey, Position};
use tower::{Layer, Service};

use super::limits::Described;
use super::store::{OutputStore, Put};

/// Wraps a handler whose response is [`Outputs`] into one the consumer
/// runs, for an [exactly-once pipeline](crate::KafkaTransactions): the
/// outputs are not published here but kept, by the input's partition and
/// offset, and the input completes at once. The source's acker produces
/// them in the transaction that commits the input's offset, so they count
/// exactly when the input does.
///
/// A failed handler leaves nothing kept for its input; an input handled
/// again (a retry) replaces what it kept. Each output without a
/// `traceparent` of its own carries its input's.
///
/// An output goes to the partition it [names](Output::partition), else to
/// its key's, as [`KafkaPublisher`](crate::KafkaPublisher) puts it.
///
/// An output its destination would refuse (larger than the topic's
/// `max.message.bytes` or the producer's `message.max.bytes` as a batch of
/// its own, uncompressed; no key for a compacted topic; a partition the
/// topic does not have, counted again before refusing) fails its input
/// permanently with a [`Rejected`](PublishErrorKind::Rejected)
/// [`PublishError`], as [`KafkaPublisher`](crate::KafkaPublisher) would,
/// and keeps nothing of it: a dead-letter layer outside this one takes the
/// input, and the transactions carry everything else. What each
/// destination accepts is read from the broker the first time an output
/// goes there (that input waits for the answer) and again every few
/// minutes.
///
/// Put it innermost, next to the handler, as
/// [`PublishLayer`](intake_core::publish::PublishLayer) would be. Made by
/// [`KafkaTransactions::layer`](crate::KafkaTransactions::layer).
#[derive(Clone)]
pub struct TransactionalLayer {
    store: Arc<OutputStore>,
}

impl TransactionalLayer {
    pub(crate) fn new(store: Arc<OutputStore>) -> Self {
        Self { store }
    }
}

impl fmt::Debug for TransactionalLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransactionalLayer")
            .field("outputs_held", &self.store.len())
            .finish()
    }
}

impl<S> Layer<S> for TransactionalLayer {
    type Service = TransactionalService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TransactionalService {
            inner,
            store: Arc::clone(&self.store),
        }
    }
}

/// The service of [`TransactionalLayer`].
#[derive(Clone)]
pub struct TransactionalService<S> {
    inner: S,
    store: Arc<OutputStore>,
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

/// Reads what `topics` accept again, in the background.
pub(crate) fn reread(store: &Arc<OutputStore>, topics: Vec<Arc<str>>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        // No runtime to read in: what was read stays until the next try.
        for topic in &topics {
            store.learn(topic, &Described::Unknown("no runtime to read in".into()));
        }
        return;
    };
    let store = Arc::clone(store);
    drop(runtime.spawn(async move {
        for topic in topics {
            let described = store.describer().describe(&topic, true).await;
            store.learn(&topic, &described);
        }
    }));
}
