//! [`PublishLayer`]: publishes what a handler returns, and completes the
//! input only once every output is confirmed.

use std::fmt;
use std::sync::Arc;

use tower::Layer;

use super::PublishService;

/// Wraps a handler whose response is [`Outputs`] (a handler fn returning
/// `Outputs` or `Result<Outputs, E>`) into one the consumer runs: it calls
/// the handler, sends its outputs in order through the [`Publisher`], and
/// answers only once the broker confirmed every one of them. The input is
/// therefore committed after its outputs are durable, never before.
///
/// - A failed or unconfirmed output fails the input with the
///   [`PublishError`]'s class: retryable for an unavailable broker, permanent
///   for an output the broker rejects. A retried input runs its handler
///   again and publishes all of its outputs again, so an output confirmed
///   before another failed is published twice: downstream sees at least
///   once (deduplicate by a key or id of your own, or use a backend's
///   exactly-once pipeline).
/// - Outputs of one input are sent in the order returned. In
///   [`Key`](crate::DeliveryOrder::Key) or
///   [`Partition`](crate::DeliveryOrder::Partition) order an input's
///   outputs are sent once every earlier input of its key has sent its own,
///   the next input of the key runs once they are sent (not confirmed), and
///   the input answers once its outputs and every earlier output of its key
///   are confirmed. An output that fails after a later one of its key was
///   sent fails that later input too
///   ([`KeyOrderError::EarlierOutputFailed`]), which sends again after it:
///   the last copy of each key's outputs is in input order (`docs/PUBLISHING.md`
///   has the whole rule).
/// - Each output without a `traceparent` of its own carries its input's.
///
/// Put it innermost (next to the handler), inside the retry and
/// dead-letter layers, so a failed publish is retried and dead-lettered as
/// the handler's failure.
///
/// ```
/// use intake_core::backend::Broker;
/// use intake_core::memory::{MemoryBroker, Record};
/// use intake_core::publish::{Output, PublishLayer};
/// use intake_core::{Consumer, Payload, handler_fn};
/// use tokio_util::sync::CancellationToken;
/// use tower::ServiceBuilder;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let broker = MemoryBroker::new();
/// broker.create_topic("orders", 1)?;
/// broker.create_topic("receipts", 1)?;
/// broker.send("orders", Record::new("order 1"))?;
///
/// let handler = ServiceBuilder::new()
///     .layer(PublishLayer::new(broker.publisher().await?))
///     .service(handler_fn(|Payload(order): Payload| async move {
///         Output::new("receipts", order).with_key("customer-7")
///     }));
/// let (source, acker) = broker.consumer("orders", "billing")?;
/// let consumer = Consumer::builder().build(source, acker, handler)?;
/// let shutdown = CancellationToken::new();
/// let run = tokio::spawn(consumer.run(shutdown.clone()));
/// while broker.lag("orders", "billing")? > 0 {
///     tokio::time::sleep(std::time::Duration::from_millis(5)).await;
/// }
/// shutdown.cancel();
/// run.await??;
/// assert_eq!(broker.messages("receipts", 0, 0)?[0].payload().as_ref(), b"order 1");
/// # Ok(())
/// # }
/// ```
///
/// A handler that returns outputs is not run without this layer: nothing
/// would publish them, so the consumer does not accept it.
///
/// ```compile_fail
/// use intake_core::memory::MemoryBroker;
/// use intake_core::publish::Output;
/// use intake_core::{Consumer, Payload, handler_fn};
///
/// let broker = MemoryBroker::new();
/// broker.create_topic("orders", 1).unwrap();
/// let (source, acker) = broker.consumer("orders", "billing").unwrap();
/// let handler = handler_fn(|Payload(order): Payload| async move { Output::new("receipts", order) });
/// let consumer = Consumer::builder().build(source, acker, handler);
/// ```
///
/// [`Outputs`]: super::Outputs
/// [`KeyOrderError::EarlierOutputFailed`]: super::KeyOrderError::EarlierOutputFailed
/// [`PublishError`]: super::PublishError
/// [`Publisher`]: super::Publisher
pub struct PublishLayer<P> {
    publisher: Arc<P>,
}

impl<P> PublishLayer<P> {
    /// Publishes through `publisher`.
    pub fn new(publisher: P) -> Self {
        Self {
            publisher: Arc::new(publisher),
        }
    }

    /// Publishes through a publisher shared with others (the app's state,
    /// another route).
    pub fn shared(publisher: Arc<P>) -> Self {
        Self { publisher }
    }
}

impl<P> Clone for PublishLayer<P> {
    fn clone(&self) -> Self {
        Self {
            publisher: Arc::clone(&self.publisher),
        }
    }
}

impl<P> fmt::Debug for PublishLayer<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublishLayer")
            .field("publisher", &std::any::type_name::<P>())
            .finish()
    }
}

impl<S, P> Layer<S> for PublishLayer<P> {
    type Service = PublishService<S, P>;

    fn layer(&self, inner: S) -> Self::Service {
        PublishService::new(inner, Arc::clone(&self.publisher))
    }
}
