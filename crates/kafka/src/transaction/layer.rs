//! [`TransactionalLayer`]: keeps what a handler returns for the transaction
//! that commits its input.

use std::fmt;
use std::sync::Arc;

use tower::Layer;

use super::service::TransactionalService;
use super::store::OutputStore;

/// Wraps a handler whose response is
/// [`Outputs`](intake_core::publish::Outputs) into one the consumer
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
/// An output goes to the partition it
/// [names](intake_core::publish::Output::partition), else to its key's, as
/// [`KafkaPublisher`](crate::KafkaPublisher) puts it.
///
/// An output its destination would refuse (larger than the topic's
/// `max.message.bytes` or the producer's `message.max.bytes` as a batch of
/// its own, uncompressed; no key for a compacted topic; a partition the
/// topic does not have, counted again before refusing) fails its input
/// permanently with a
/// [`Rejected`](intake_core::publish::PublishErrorKind::Rejected)
/// [`PublishError`](intake_core::publish::PublishError), as
/// [`KafkaPublisher`](crate::KafkaPublisher) would, and keeps nothing of it:
/// a dead-letter layer outside this one takes the input, and the
/// transactions carry everything else. What each
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
        TransactionalService::new(inner, Arc::clone(&self.store))
    }
}
