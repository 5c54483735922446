//! Publishing: handlers that produce, with every input acknowledged only
//! after its outputs are confirmed.
//!
//! A [`Publisher`] sends an [`Output`] to the broker and hands back a
//! receipt that resolves when the broker confirmed it (a Kafka delivery
//! report from an idempotent producer, an AMQP publisher confirm, the reply
//! to a Redis `XADD`, a JetStream publish ack, or at once on the memory
//! broker). Each backend crate has one; [`MemoryPublisher`] is the memory
//! broker's, whose topics record what was published for a test to read.
//!
//! A handler publishes in one of two ways, and either way its input is
//! completed in the commit engine only once every output is confirmed:
//!
//! - it **returns** its outputs ([`Output`], [`Outputs`], `Option<Output>`
//!   or a `Result` of them), and a [`PublishLayer`] publishes them;
//! - it **publishes** as it goes, through the [`Publish<P>`] extractor (a
//!   publisher from the handler's state, within the input's scope), and
//!   awaits each confirmation before it returns.
//!
//! A failed output makes the input retryable (or permanent, if the broker
//! rejects the output itself). In [`Key`](crate::DeliveryOrder::Key) and
//! [`Partition`](crate::DeliveryOrder::Partition) order the order of
//! delivery carries over to the outputs: under [`PublishLayer`] the next
//! input of a key runs once the outputs of the one before are sent, and an
//! input is acknowledged only once its outputs and every earlier output of
//! its key are confirmed (an earlier failure sends the later outputs again
//! after it: [`KeyOrderError`]); through [`Publish<P>`] the handler awaits
//! each confirmation, and the key's next input waits for the handler.
//! Outputs carry their input's W3C `traceparent`.
//!
//! ```
//! use intake_core::backend::Broker;
//! use intake_core::memory::{MemoryBroker, MemoryPublisher, Record};
//! use intake_core::publish::{Output, Publish};
//! use intake_core::{HandlerError, Key, Payload, handler_fn_with_state};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = MemoryBroker::new();
//! broker.create_topic("audit", 1)?;
//! let handler = handler_fn_with_state(
//!     broker.publisher().await?,
//!     |Key(key): Key, publish: Publish<MemoryPublisher>, Payload(body): Payload| async move {
//!         let output = Output::new("audit", body).with_key(key.unwrap_or_default());
//!         publish.publish(output).await?; // confirmed when this returns
//!         Ok::<(), HandlerError>(())
//!     },
//! );
//! # drop(handler);
//! # Ok(())
//! # }
//! ```

mod error;
mod extract;
mod future;
mod layer;
mod output;
mod service;
mod turn;

use std::future::Future;
use std::sync::Arc;

pub use self::error::{KeyOrderError, PublishError, PublishErrorKind};
pub use self::extract::Publish;
pub use self::future::PublishFuture;
pub use self::layer::PublishLayer;
pub use self::output::{Output, Outputs};
pub use self::service::PublishService;
pub use crate::memory::MemoryPublisher;
use crate::message::Position;

/// The broker's word that an output is stored: where, when it says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Confirmation {
    /// The partition it was stored in, on a broker with partitions.
    pub partition: Option<u32>,
    /// Its position there (a Kafka offset, a Redis stream id, a JetStream
    /// stream sequence as an offset); `None` where the broker's
    /// confirmation names none (an AMQP publisher confirm).
    pub position: Option<Position>,
}

impl Confirmation {
    /// A confirmation at `position` of `partition`.
    pub fn at(partition: Option<u32>, position: Option<Position>) -> Self {
        Self {
            partition,
            position,
        }
    }
}

/// Publishes [`Output`]s with confirmation: what each backend implements.
///
/// Publishing is two steps so that a caller can have many outputs on the
/// wire at once and still keep their order: [`send`](Self::send) hands one
/// output to the client, in call order, waiting only for room in the
/// publisher's bounded buffer (the backpressure); the receipt it returns
/// resolves once the broker confirmed that output. [`publish`](Self::publish)
/// does both.
///
/// Every wait is bounded: a send that finds no room, or a confirmation
/// that does not come, ends with [`PublishErrorKind::Unavailable`] after
/// the publisher's own timeout.
///
/// A place in the buffer is freed when the broker's confirmation arrives,
/// whether or not its receipt is being awaited: callers send several
/// outputs before they await any receipt ([`PublishLayer`] sends all of an
/// input's outputs first), and a publisher that freed places only as
/// receipts are polled would keep such a caller waiting for room until its
/// timeout.
pub trait Publisher: Send + Sync + 'static {
    /// Resolves when the broker confirmed one output, or with why not.
    type Receipt: Future<Output = Result<Confirmation, PublishError>> + Send + 'static;

    /// Hands `output` to the broker client; outputs sent one after another
    /// reach a destination (and a key's partition) in that order.
    fn send(
        &self,
        output: Output,
    ) -> impl Future<Output = Result<Self::Receipt, PublishError>> + Send;

    /// Sends `output` and waits for its confirmation.
    fn publish(
        &self,
        output: Output,
    ) -> impl Future<Output = Result<Confirmation, PublishError>> + Send {
        async move { self.send(output).await?.await }
    }
}

impl<P: Publisher> Publisher for Arc<P> {
    type Receipt = P::Receipt;

    fn send(
        &self,
        output: Output,
    ) -> impl Future<Output = Result<Self::Receipt, PublishError>> + Send {
        P::send(self, output)
    }

    // A backend's own `publish` (one round trip where its client has one)
    // stays in force behind an `Arc`.
    fn publish(
        &self,
        output: Output,
    ) -> impl Future<Output = Result<Confirmation, PublishError>> + Send {
        P::publish(self, output)
    }
}
