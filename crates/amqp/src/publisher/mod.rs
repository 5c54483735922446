//! [`AmqpPublisher`]: publishes [`Output`]s on one channel in confirm mode,
//! many in flight, each receipt resolved by the broker's publisher confirm.

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use intake_core::BackoffPolicy;
use intake_core::publish::{Confirmation, Output, PublishError, PublishErrorKind, Publisher};
use lapin::options::BasicPublishOptions;
use lapin::types::ShortString;
use lapin::{Channel, Connection, PublisherConfirm};
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use crate::error::Error;
use crate::tls::Tls;
use crate::topology::Topology;
use crate::url::AmqpUrl;

mod builder;
mod link;
mod properties;
mod receipt;
#[cfg(test)]
mod tests;

pub use builder::AmqpPublisherBuilder;
pub use receipt::AmqpReceipt;
/// AMQP `delivery-mode` 2: the broker writes the message to disk.
const PERSISTENT: u8 = 2;

/// Frame type, channel, payload size and end marker.
const FRAME_OVERHEAD: usize = 8;

/// Publishes [`Output`]s to RabbitMQ with publisher confirms.
///
/// # Mapping
///
/// - **Destination**: by default the routing key on the publisher's
///   [exchange](AmqpPublisherBuilder::exchange), `""` (the default
///   exchange) unless set, so `Output::new("orders", ..)` lands in queue
///   `orders`. With [`route_by_key`](AmqpPublisherBuilder::route_by_key),
///   the destination names the exchange and the output's key is the routing
///   key instead.
/// - **Key**: an [`AmqpSource`](crate::AmqpSource) gives the delivery's
///   routing key as [`Message::key`](intake_core::Message::key). With
///   [`route_by_key`](AmqpPublisherBuilder::route_by_key) the key *is* the
///   routing key, so a consumer reads it back as the key; by default the
///   routing key is the destination and the key travels in the header
///   [`KEY_HEADER`](Self::KEY_HEADER) (a consumer reads the destination as
///   the key there).
/// - **Headers**: a header table of long strings; `amqp.message-id`,
///   `amqp.correlation-id` and `amqp.content-type` (as a source shows those
///   properties) become the properties again, and the input's
///   `x-delivery-count` is left out (it is the broker's count of the
///   input's deliveries, which a consumer of the output would take for its
///   own). A name that repeats keeps its last value.
/// - **Confirmation**: the publisher confirm; it names no position
///   ([`Confirmation::default`]).
/// - Persistent (`delivery-mode` 2) unless
///   [`transient`](AmqpPublisherBuilder::transient), and `mandatory`: an
///   output that no queue is bound to receive comes back (`basic.return`)
///   and is [rejected](PublishErrorKind::Rejected), not silently lost.
///
/// # Order, pipelining and backpressure
///
/// Every output goes out on one channel, in the order of the
/// [`send`](Publisher::send) calls (concurrent senders in the order they
/// took the channel), and one channel keeps its publishes in order on the
/// broker. A send hands the frames to lapin and returns; the broker's
/// confirms are collected in the background, so thousands can be in flight.
/// At most [`max_unconfirmed`](AmqpPublisherBuilder::max_unconfirmed)
/// outputs (default 1,000) await their confirm at once: a send beyond that
/// waits for room, at most [`send_timeout`](AmqpPublisherBuilder::send_timeout)
/// (default 30 s), then fails with [`PublishErrorKind::Unavailable`]. The
/// room comes back when the broker confirms, whether or not the receipt is
/// awaited.
///
/// # Failures
///
/// | what happened | kind |
/// |---|---|
/// | no room, or no connection, within the send timeout; no confirm within [`confirm_timeout`](AmqpPublisherBuilder::confirm_timeout); the channel closed before the confirm | [`Unavailable`](PublishErrorKind::Unavailable) |
/// | no queue bound for it (returned), a `basic.nack`, an exchange that does not exist, a payload above [`max_payload_bytes`](AmqpPublisherBuilder::max_payload_bytes), headers larger than a frame, a name longer than 255 bytes | [`Rejected`](PublishErrorKind::Rejected) |
/// | [`close`](Self::close)d, or the reconnect backoff gave up | [`Closed`](PublishErrorKind::Closed) |
///
/// A lost connection or channel is reopened by the next send, with the
/// [reconnect backoff](AmqpPublisherBuilder::reconnect_backoff) between
/// failed attempts; the outputs the lost channel had not confirmed fail as
/// unavailable (publish them again: a duplicate is possible). Errors name
/// the broker without its password.
///
/// The publisher has a connection of its own, as the
/// [`AmqpDeadLetterSink`](crate::AmqpDeadLetterSink) has: RabbitMQ blocks
/// publishing connections under memory pressure, and that must not stall
/// a consumer's acknowledgements. The sink publishes one dead letter at a
/// time and waits for its confirm; the publisher keeps many in flight.
/// Clones share the connection, the channel and the bound.
///
/// ```no_run
/// use intake_amqp::AmqpPublisher;
/// use intake_core::publish::{Output, Publisher};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let publisher = AmqpPublisher::builder("amqp://guest:guest@127.0.0.1:5672/%2f")
///     .max_unconfirmed(500)
///     .build()
///     .await?;
/// // To queue `receipts` through the default exchange.
/// let receipt = publisher
///     .send(Output::new("receipts", "paid").with_header("tenant", "acme"))
///     .await?;
/// receipt.await?; // the broker confirmed it
/// publisher.close().await;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct AmqpPublisher {
    shared: Arc<Shared>,
}

struct Shared {
    url: AmqpUrl,
    tls: Tls,
    connection_name: Option<String>,
    connect_timeout: Duration,
    topology: Topology,
    routing: Routing,
    persistent: bool,
    send_timeout: Duration,
    confirm_timeout: Duration,
    max_payload_bytes: usize,
    max_unconfirmed: usize,
    reconnect: Arc<dyn BackoffPolicy>,
    room: Arc<Semaphore>,
    link: Mutex<LinkState>,
    pending: mpsc::UnboundedSender<Pending>,
    closed: AtomicBool,
}

/// Where an output goes.
#[derive(Clone, Debug)]
enum Routing {
    /// To this exchange, with the destination as the routing key.
    Exchange(String),
    /// To the exchange the destination names, with the key as routing key.
    ByKey,
}

/// The connection as the senders share it.
#[derive(Default)]
struct LinkState {
    live: Option<Link>,
    /// Failed connection attempts in a row.
    failures: u32,
    /// No attempt before this, after a failure.
    retry_at: Option<Instant>,
    /// Why the last attempt failed.
    last_error: Option<Arc<Error>>,
}

struct Link {
    connection: Connection,
    channel: Channel,
    /// The largest frame the connection may send, 0 for no limit.
    frame_max: u32,
    /// Exchanges known to exist on this connection.
    exchanges: HashSet<String>,
}

/// One output on its way: its publish (the frames are queued already),
/// then its confirm.
struct Pending {
    publishing: Publishing,
    deadline: Instant,
    destination: Arc<str>,
    exchange: ShortString,
    routing_key: ShortString,
    reply: oneshot::Sender<Result<Confirmation, PublishError>>,
    /// Room in the bound, given back once the confirm (or failure) is in.
    _permit: OwnedSemaphorePermit,
}

type PublishFuture = Pin<Box<dyn Future<Output = lapin::Result<PublisherConfirm>> + Send>>;

enum Publishing {
    /// Frames queued; lapin has not written them yet.
    Writing(PublishFuture),
    /// `basic_publish` finished when first polled.
    Written(lapin::Result<PublisherConfirm>),
}

impl fmt::Debug for AmqpPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpPublisher")
            .field("endpoint", &self.shared.url.endpoint())
            .field("routing", &self.shared.routing)
            .field("unconfirmed", &self.unconfirmed())
            .field("max_unconfirmed", &self.shared.max_unconfirmed)
            .finish_non_exhaustive()
    }
}

impl AmqpPublisher {
    /// The header that carries an output's key when the routing key is its
    /// destination (not with
    /// [`route_by_key`](AmqpPublisherBuilder::route_by_key)).
    pub const KEY_HEADER: &'static str = "intake.key";

    /// Starts building a publisher for the broker `settings` describe (a
    /// URL alone converts into [`AmqpSettings`](crate::AmqpSettings)).
    pub fn builder(settings: impl Into<crate::AmqpSettings>) -> AmqpPublisherBuilder {
        AmqpPublisherBuilder::new(settings.into())
    }

    /// Outputs sent and not yet confirmed (or failed): never more than
    /// [`max_unconfirmed`](Self::max_unconfirmed).
    pub fn unconfirmed(&self) -> usize {
        self.shared.max_unconfirmed - self.shared.room.available_permits()
    }

    /// The bound on outputs awaiting their confirm.
    pub fn max_unconfirmed(&self) -> usize {
        self.shared.max_unconfirmed
    }

    /// Stops taking outputs (a send fails as
    /// [closed](PublishErrorKind::Closed) from now on), waits up to the
    /// confirm timeout for the outputs in flight, and closes the
    /// connection.
    pub async fn close(&self) {
        let shared = &self.shared;
        shared.closed.store(true, Ordering::Release);
        let all = u32::try_from(shared.max_unconfirmed).unwrap_or(u32::MAX);
        let drained = tokio::time::timeout(shared.confirm_timeout, shared.room.acquire_many(all))
            .await
            .ok()
            .and_then(Result::ok);
        if drained.is_none() {
            tracing::warn!(
                endpoint = shared.url.endpoint(),
                unconfirmed = self.unconfirmed(),
                "AMQP publisher closed with outputs still unconfirmed"
            );
        }
        shared.room.close();
        if let Some(link) = shared.link.lock().await.live.take() {
            let _ = tokio::time::timeout(
                Duration::from_secs(5),
                link.connection.close(200, "publisher closed".into()),
            )
            .await;
        }
    }
}

impl Publisher for AmqpPublisher {
    type Receipt = AmqpReceipt;

    async fn send(&self, output: Output) -> Result<AmqpReceipt, PublishError> {
        let shared = &*self.shared;
        let deadline = Instant::now() + shared.send_timeout;
        let destination = Arc::clone(output.destination_shared());
        let closed = || {
            shared.error(
                PublishErrorKind::Closed,
                &destination,
                "the publisher is closed; make a new one".to_owned(),
            )
        };
        if shared.closed.load(Ordering::Acquire) {
            return Err(closed());
        }
        let (exchange, routing_key) = shared.route(&output)?;
        let properties = shared.properties(&output)?;
        let permit =
            match tokio::time::timeout_at(deadline, Arc::clone(&shared.room).acquire_owned()).await
            {
                Ok(Ok(permit)) => permit,
                Ok(Err(_closed)) => return Err(closed()),
                Err(_elapsed) => {
                    return Err(shared.error(
                        PublishErrorKind::Unavailable,
                        &destination,
                        format!(
                            "{} outputs still await the broker's confirm after the send \
                             timeout ({:?}); publish again",
                            shared.max_unconfirmed, shared.send_timeout
                        ),
                    ));
                }
            };
        let Ok(mut state) = tokio::time::timeout_at(deadline, shared.link.lock()).await else {
            return Err(shared.error(
                PublishErrorKind::Unavailable,
                &destination,
                format!(
                    "the channel stayed busy for the send timeout ({:?}); publish again",
                    shared.send_timeout
                ),
            ));
        };
        let link = shared.live(&mut state, deadline, &destination).await?;
        shared.check_size(&output, &properties, link.frame_max)?;
        shared.check_exchange(link, &exchange, &destination).await?;
        let channel = link.channel.clone();
        let payload = output.payload().clone();
        let (publish_exchange, publish_key) = (exchange.clone(), routing_key.clone());
        let mut publishing: PublishFuture = Box::pin(async move {
            channel
                .basic_publish(
                    publish_exchange,
                    publish_key,
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &payload,
                    properties,
                )
                .await
        });
        // The first poll queues the frames on the channel (lapin writes them
        // later): done under the lock, it fixes the order of outputs on the
        // wire without holding the lock through the write.
        let first = std::future::poll_fn(|cx| Poll::Ready(publishing.as_mut().poll(cx))).await;
        let publishing = match first {
            Poll::Ready(result) => Publishing::Written(result),
            Poll::Pending => Publishing::Writing(publishing),
        };
        let (reply, receipt) = oneshot::channel();
        let queued = shared.pending.send(Pending {
            publishing,
            deadline: Instant::now() + shared.confirm_timeout,
            destination: Arc::clone(&destination),
            exchange,
            routing_key,
            reply,
            _permit: permit,
        });
        drop(state);
        if queued.is_err() {
            return Err(closed());
        }
        Ok(AmqpReceipt {
            receipt,
            destination,
        })
    }
}
