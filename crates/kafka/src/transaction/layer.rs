//! [`TransactionalLayer`]: keeps what a handler returns for the transaction
//! that commits its input.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use intake_core::publish::Outputs;
use intake_core::trace::TRACEPARENT;
use intake_core::{HandlerError, Message, Position};
use tower::{Layer, Service};

use super::store::OutputStore;

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
                    if !store.put(partition.clone(), epoch, offset, outputs) {
                        tracing::debug!(%partition, offset, "outputs of an input of a partition given up meanwhile dropped");
                    }
                    Ok(())
                }
                Err(error) => {
                    store.remove(&partition, offset);
                    Err(error)
                }
            }
        })
    }
}
