//! [`AmqpPublisher`]: publishes [`Output`]s on one channel in confirm mode,
//! many in flight, each receipt resolved by the broker's publisher confirm.

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use intake_core::publish::{Confirmation, Output, PublishError, PublishErrorKind, Publisher};
use intake_core::{BackoffPolicy, BoxError, ConfigError, Exponential};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ExchangeKind, PublisherConfirm};
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use crate::connection::{DEFAULT_CONNECT_TIMEOUT, open_within};
use crate::error::{Error, Operation, classify};
use crate::headers;
use crate::tls::Tls;
use crate::topology::{MAX_NAME_BYTES, Topology, check_name};
use crate::url::AmqpUrl;

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

/// Builds an [`AmqpPublisher`]; see [`AmqpPublisher::builder`].
#[must_use = "a builder does nothing until `.build().await`"]
pub struct AmqpPublisherBuilder {
    /// Parsed when the builder is made; a bad URL is reported by `build`.
    url: Result<AmqpUrl, Error>,
    routing: Routing,
    topology: Topology,
    connection_name: Option<String>,
    tls: Tls,
    persistent: bool,
    send_timeout: Duration,
    confirm_timeout: Duration,
    max_payload_bytes: usize,
    max_unconfirmed: usize,
    reconnect: Arc<dyn BackoffPolicy>,
}

impl fmt::Debug for AmqpPublisherBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpPublisherBuilder")
            .field("endpoint", &self.url.as_ref().map(AmqpUrl::endpoint).ok())
            .field("routing", &self.routing)
            .field("max_unconfirmed", &self.max_unconfirmed)
            .finish_non_exhaustive()
    }
}

impl AmqpPublisherBuilder {
    /// The default bound on outputs awaiting their confirm.
    pub const DEFAULT_MAX_UNCONFIRMED: usize = 1_000;
    /// The default wait for room and a connection in a send, and for a
    /// confirm.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
    /// The default largest payload: RabbitMQ 4's `max_message_size`.
    pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 16 << 20;

    fn new(url: Result<AmqpUrl, Error>) -> Self {
        Self {
            url,
            routing: Routing::Exchange(String::new()),
            topology: Topology::new(),
            connection_name: None,
            tls: Tls::new(),
            persistent: true,
            send_timeout: Self::DEFAULT_TIMEOUT,
            confirm_timeout: Self::DEFAULT_TIMEOUT,
            max_payload_bytes: Self::DEFAULT_MAX_PAYLOAD_BYTES,
            max_unconfirmed: Self::DEFAULT_MAX_UNCONFIRMED,
            reconnect: Arc::new(
                Exponential::new(Duration::from_millis(100), Duration::from_secs(10))
                    .retry_forever(),
            ),
        }
    }

    /// Publishes every output to `exchange`, with its destination as the
    /// routing key. The default is `""`, the default exchange, which routes
    /// to the queue the routing key names.
    pub fn exchange(mut self, exchange: impl Into<String>) -> Self {
        self.routing = Routing::Exchange(exchange.into());
        self
    }

    /// Publishes each output to the exchange its destination names, with
    /// the output's key as the routing key (`""` without a key), so that an
    /// [`AmqpSource`](crate::AmqpSource) reads the key back as the
    /// message's key. The destination `""` is the default exchange, where
    /// the key names the queue.
    pub fn route_by_key(mut self) -> Self {
        self.routing = Routing::ByKey;
        self
    }

    /// Declares `topology` (exchanges, queues, bindings) whenever the
    /// publisher connects.
    pub fn declare(mut self, topology: Topology) -> Self {
        self.topology = topology;
        self
    }

    /// Names the publisher's connection (shown by `rabbitmqctl
    /// list_connections client_properties` and the management UI).
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = Some(name.into());
        self
    }

    /// TLS beyond the defaults for an `amqps://` URL (see [`Tls`]).
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = tls;
        self
    }

    /// Publishes with `delivery-mode` 1: the broker may keep the outputs in
    /// memory only (faster, lost with the broker). Persistent by default.
    pub fn transient(mut self) -> Self {
        self.persistent = false;
        self
    }

    /// How many outputs may await the broker's confirm at once (default
    /// 1,000): the publisher's buffer, and so its backpressure.
    pub fn max_unconfirmed(mut self, max: usize) -> Self {
        self.max_unconfirmed = max;
        self
    }

    /// How long a send waits for room and for a connection (default 30 s).
    pub fn send_timeout(mut self, timeout: Duration) -> Self {
        self.send_timeout = timeout;
        self
    }

    /// How long a sent output waits for the broker's confirm (default
    /// 30 s).
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// The largest payload sent (default 16 MiB, RabbitMQ 4's
    /// `max_message_size`; RabbitMQ 3 allows 128 MiB). A larger one is
    /// rejected before it is sent: the broker would close the channel on
    /// it, failing every other output in flight.
    pub fn max_payload_bytes(mut self, max: usize) -> Self {
        self.max_payload_bytes = max;
        self
    }

    /// How long to wait between failed attempts to reconnect (default:
    /// from 100 ms doubling to 10 s, never giving up). A policy that gives
    /// up closes the publisher.
    pub fn reconnect_backoff(mut self, policy: impl BackoffPolicy) -> Self {
        self.reconnect = Arc::new(policy);
        self
    }

    /// Checks the settings and connects once, so that a wrong password or a
    /// refused declaration shows here. A broker that cannot be reached now
    /// is not an error: the first send connects (and fails as unavailable
    /// while it cannot).
    ///
    /// # Errors
    ///
    /// [`Error`] for a bad URL or setting, or a connection the broker
    /// refuses for a reason retrying does not fix.
    pub async fn build(self) -> Result<AmqpPublisher, Error> {
        let url = self.url?;
        if let Routing::Exchange(exchange) = &self.routing {
            check_name("exchange", exchange)?;
        }
        self.topology.validate()?;
        self.tls.check_for(&url)?;
        self.reconnect.validate().map_err(|error| {
            ConfigError::new("reconnect_backoff", format!("is invalid: {error}"))
        })?;
        for (setting, timeout) in [
            ("send_timeout", self.send_timeout),
            ("confirm_timeout", self.confirm_timeout),
        ] {
            if timeout.is_zero() {
                return Err(ConfigError::new(setting, "is zero; give the broker time").into());
            }
        }
        if self.max_unconfirmed == 0 || self.max_unconfirmed > Semaphore::MAX_PERMITS {
            return Err(ConfigError::new(
                "max_unconfirmed",
                "must be at least 1 (the outputs in flight at once)",
            )
            .into());
        }
        let (pending, queue) = mpsc::unbounded_channel();
        tokio::spawn(collect_confirms(
            queue,
            url.endpoint().to_owned(),
            url.vhost().to_owned(),
        ));
        let publisher = AmqpPublisher {
            shared: Arc::new(Shared {
                url,
                tls: self.tls,
                connection_name: self.connection_name,
                topology: self.topology,
                routing: self.routing,
                persistent: self.persistent,
                send_timeout: self.send_timeout,
                confirm_timeout: self.confirm_timeout,
                max_payload_bytes: self.max_payload_bytes,
                max_unconfirmed: self.max_unconfirmed,
                reconnect: self.reconnect,
                room: Arc::new(Semaphore::new(self.max_unconfirmed)),
                link: Mutex::new(LinkState::default()),
                pending,
                closed: AtomicBool::new(false),
            }),
        };
        let shared = &publisher.shared;
        match shared.connect(None).await {
            Ok(link) => shared.link.lock().await.live = Some(link),
            Err(error) if error.is_transient() => {
                tracing::warn!(
                    endpoint = shared.url.endpoint(),
                    %error,
                    "AMQP publisher cannot connect yet; the first send tries again"
                );
                let mut link = shared.link.lock().await;
                link.failures = 1;
                link.last_error = Some(Arc::new(error));
            }
            Err(error) => return Err(error),
        }
        Ok(publisher)
    }
}

impl AmqpPublisher {
    /// The header that carries an output's key when the routing key is its
    /// destination (not with
    /// [`route_by_key`](AmqpPublisherBuilder::route_by_key)).
    pub const KEY_HEADER: &'static str = "intake.key";

    /// Starts building a publisher for the broker at `url`.
    pub fn builder(url: impl Into<String>) -> AmqpPublisherBuilder {
        AmqpPublisherBuilder::new(AmqpUrl::parse(&url.into()))
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

impl Shared {
    fn error(&self, kind: PublishErrorKind, destination: &str, what: String) -> PublishError {
        PublishError::new(kind, destination, what)
    }

    /// Where `output` goes: exchange and routing key.
    fn route(&self, output: &Output) -> Result<(ShortString, ShortString), PublishError> {
        let destination = output.destination();
        let (exchange, routing_key) = match &self.routing {
            Routing::Exchange(exchange) => (exchange.as_str(), destination.as_bytes()),
            Routing::ByKey => (destination, output.key().map_or(&[][..], Bytes::as_ref)),
        };
        let short = |what: &str, name: &[u8]| {
            std::str::from_utf8(name)
                .ok()
                .and_then(|name| ShortString::try_new(name).ok())
                .ok_or_else(|| {
                    self.error(
                        PublishErrorKind::Rejected,
                        destination,
                        format!(
                            "its {what} is not UTF-8 text of at most {MAX_NAME_BYTES} bytes, which \
                             AMQP (and lapin) require"
                        ),
                    )
                })
        };
        Ok((
            short("exchange", exchange.as_bytes())?,
            short("routing key", routing_key)?,
        ))
    }

    /// The output's properties (see [`properties`]).
    fn properties(&self, output: &Output) -> Result<BasicProperties, PublishError> {
        properties(output, &self.routing, self.persistent)
    }

    /// Rejects what the broker would refuse by closing the channel (or the
    /// connection), which would fail every other output in flight.
    fn check_size(
        &self,
        output: &Output,
        properties: &BasicProperties,
        frame_max: u32,
    ) -> Result<(), PublishError> {
        let payload = output.payload().len();
        if payload > self.max_payload_bytes {
            return Err(self.error(
                PublishErrorKind::Rejected,
                output.destination(),
                format!(
                    "its payload of {payload} bytes is larger than max_payload_bytes ({}); the \
                     broker refuses messages above its max_message_size",
                    self.max_payload_bytes
                ),
            ));
        }
        let room = usize::try_from(frame_max)
            .unwrap_or(usize::MAX)
            .saturating_sub(FRAME_OVERHEAD);
        let header = content_header_len(properties);
        if frame_max != 0 && header > room {
            return Err(self.error(
                PublishErrorKind::Rejected,
                output.destination(),
                format!(
                    "its headers take {header} bytes, more than one frame of {frame_max} bytes \
                     holds (the broker would close the connection)"
                ),
            ));
        }
        Ok(())
    }

    /// Opens a connection (or, on `reuse`'s live connection, a channel) in
    /// confirm mode and declares the topology.
    async fn connect(&self, reuse: Option<Connection>) -> Result<Link, Error> {
        let url = &self.url;
        let fail = |error| classify(error, url.endpoint(), url.vhost(), Operation::Other);
        let connection = match reuse.filter(|connection| connection.status().connected()) {
            Some(connection) => connection,
            None => {
                open_within(
                    url,
                    self.connection_name.as_deref(),
                    &self.tls,
                    DEFAULT_CONNECT_TIMEOUT,
                )
                .await?
            }
        };
        let channel = connection.create_channel().await.map_err(fail)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(fail)?;
        self.topology.declare_on(&channel, url).await?;
        let frame_max = connection.configuration().frame_max();
        tracing::debug!(
            endpoint = url.endpoint(),
            channel = channel.id(),
            "AMQP publisher connected"
        );
        Ok(Link {
            connection,
            channel,
            frame_max,
            exchanges: HashSet::new(),
        })
    }

    /// The live link, reconnecting (with the backoff between attempts)
    /// until `deadline`.
    async fn live<'a>(
        &self,
        state: &'a mut LinkState,
        deadline: Instant,
        destination: &str,
    ) -> Result<&'a mut Link, PublishError> {
        loop {
            let reuse = match state.live.take() {
                Some(link) if link.channel.status().connected() => {
                    return Ok(state.live.insert(link));
                }
                Some(link) => {
                    tracing::warn!(
                        endpoint = self.url.endpoint(),
                        channel = link.channel.id(),
                        "AMQP publisher's channel is gone; its unconfirmed outputs fail as \
                         unavailable; reopening"
                    );
                    Some(link.connection)
                }
                None => None,
            };
            if let Some(at) = state.retry_at {
                if at > deadline {
                    let error = self.error(
                        PublishErrorKind::Unavailable,
                        destination,
                        format!(
                            "no connection to the broker at {} within the send timeout ({:?}); \
                             publish again",
                            self.url.endpoint(),
                            self.send_timeout
                        ),
                    );
                    return Err(match &state.last_error {
                        Some(cause) => error.with_source(Arc::clone(cause)),
                        None => error,
                    });
                }
                tokio::time::sleep_until(at).await;
            }
            let attempt = tokio::time::timeout_at(deadline, self.connect(reuse)).await;
            match attempt {
                Ok(Ok(link)) => {
                    if state.failures > 0 {
                        tracing::info!(
                            endpoint = self.url.endpoint(),
                            failures = state.failures,
                            "AMQP publisher reconnected"
                        );
                    }
                    state.failures = 0;
                    state.retry_at = None;
                    state.last_error = None;
                    return Ok(state.live.insert(link));
                }
                Ok(Err(error)) => {
                    state.failures = state.failures.saturating_add(1);
                    tracing::warn!(
                        endpoint = self.url.endpoint(),
                        failures = state.failures,
                        %error,
                        "AMQP publisher cannot connect"
                    );
                    let error = Arc::new(error);
                    state.last_error = Some(Arc::clone(&error));
                    let Some(delay) = self.reconnect.delay(state.failures) else {
                        self.closed.store(true, Ordering::Release);
                        return Err(self
                            .error(
                                PublishErrorKind::Closed,
                                destination,
                                format!(
                                    "the reconnect backoff gave up after {} failed attempts; \
                                     make a new publisher",
                                    state.failures
                                ),
                            )
                            .with_source(error));
                    };
                    state.retry_at = Some(Instant::now() + delay);
                }
                Err(_elapsed) => {
                    return Err(self.error(
                        PublishErrorKind::Unavailable,
                        destination,
                        format!(
                            "no connection to the broker at {} within the send timeout ({:?}); \
                             publish again",
                            self.url.endpoint(),
                            self.send_timeout
                        ),
                    ));
                }
            }
        }
    }

    /// Checks once per connection that `exchange` exists, on a channel of
    /// its own: publishing to a missing exchange closes the channel, and
    /// every output in flight on it would fail along.
    async fn check_exchange(
        &self,
        link: &mut Link,
        exchange: &ShortString,
        destination: &str,
    ) -> Result<(), PublishError> {
        let name = exchange.as_str();
        if name.is_empty() || name.starts_with("amq.") || link.exchanges.contains(name) {
            return Ok(());
        }
        let url = &self.url;
        let unavailable = |error: lapin::Error| {
            self.error(
                PublishErrorKind::Unavailable,
                destination,
                format!("could not check that exchange `{name}` exists; publish again"),
            )
            .with_source(classify(
                error,
                url.endpoint(),
                url.vhost(),
                Operation::Other,
            ))
        };
        let probe = link
            .connection
            .create_channel()
            .await
            .map_err(unavailable)?;
        let declared = probe
            .exchange_declare(
                exchange.clone(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    passive: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await;
        match declared {
            Ok(()) => {
                let _ = probe.close(200, "checked".into()).await;
                link.exchanges.insert(name.to_owned());
                Ok(())
            }
            Err(error) if is_not_found(&error) => Err(self
                .error(
                    PublishErrorKind::Rejected,
                    destination,
                    format!("exchange `{name}` does not exist; declare it before publishing to it"),
                )
                .with_source(classify(
                    error,
                    url.endpoint(),
                    url.vhost(),
                    Operation::Other,
                ))),
            Err(error) => Err(unavailable(error)),
        }
    }
}

/// The output's properties: persistent, the `amqp.` headers as
/// properties again, the others as a table of long strings.
fn properties(
    output: &Output,
    routing: &Routing,
    persistent: bool,
) -> Result<BasicProperties, PublishError> {
    let mut properties = BasicProperties::default();
    if persistent {
        properties = properties.with_delivery_mode(PERSISTENT);
    }
    let mut table = FieldTable::default();
    for header in output.headers() {
        let (name, value) = (&*header.name, &header.value);
        let property = || {
            std::str::from_utf8(value)
                .ok()
                .and_then(|text| ShortString::try_new(text).ok())
        };
        match (name, property()) {
            (headers::MESSAGE_ID, Some(value)) => {
                properties = properties.with_message_id(value);
                continue;
            }
            (headers::CORRELATION_ID, Some(value)) => {
                properties = properties.with_correlation_id(value);
                continue;
            }
            (headers::CONTENT_TYPE, Some(value)) => {
                properties = properties.with_content_type(value);
                continue;
            }
            (headers::DELIVERY_COUNT, _) => continue,
            _ => {}
        }
        let Ok(name) = ShortString::try_new(name) else {
            return Err(PublishError::new(
                PublishErrorKind::Rejected,
                output.destination(),
                format!(
                    "header `{}…` has a name longer than the {MAX_NAME_BYTES} bytes AMQP \
                     allows",
                    &name[..name.floor_char_boundary(32)]
                ),
            ));
        };
        table.insert(
            name,
            AMQPValue::LongString(LongString::from(value.to_vec())),
        );
    }
    // After the headers: a forwarded message's own key header must not
    // stand in for this output's key.
    if let (Routing::Exchange(_), Some(key)) = (routing, output.key()) {
        table.insert(
            ShortString::from(AmqpPublisher::KEY_HEADER),
            AMQPValue::LongString(LongString::from(key.to_vec())),
        );
    }
    Ok(properties.with_headers(table))
}

fn is_not_found(error: &lapin::Error) -> bool {
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    matches!(
        error.kind(),
        lapin::ErrorKind::ProtocolError(amqp)
            if matches!(amqp.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
    )
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

/// Resolves when the broker confirmed one output (see
/// [`AmqpPublisher`]); bounded by the publisher's confirm timeout.
#[must_use = "a receipt tells whether the output was confirmed"]
pub struct AmqpReceipt {
    receipt: oneshot::Receiver<Result<Confirmation, PublishError>>,
    destination: Arc<str>,
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
async fn collect_confirms(
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

/// The size of the content header frame's payload for `properties` as this
/// publisher sets them: class, weight, body size, flags, then the
/// properties it uses.
fn content_header_len(properties: &BasicProperties) -> usize {
    let short =
        |text: &Option<ShortString>| text.as_ref().map_or(0, |text| 1 + text.as_str().len());
    let table = properties.headers().as_ref().map_or(0, |table| {
        4 + table
            .inner()
            .iter()
            .map(|(name, value)| {
                1 + name.as_str().len()
                    + match value {
                        AMQPValue::LongString(text) => 1 + 4 + text.as_bytes().len(),
                        // Only long strings are written; anything else is
                        // counted generously.
                        _ => 1 + 8,
                    }
            })
            .sum::<usize>()
    });
    2 + 2
        + 8
        + 2
        + short(properties.content_type())
        + short(properties.message_id())
        + short(properties.correlation_id())
        + usize::from(properties.delivery_mode().is_some())
        + table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(properties: &BasicProperties) -> FieldTable {
        properties.headers().clone().unwrap_or_default()
    }

    fn text(table: &FieldTable, name: &str) -> Option<Vec<u8>> {
        match table.inner().get(name) {
            Some(AMQPValue::LongString(text)) => Some(text.as_bytes().to_vec()),
            _ => None,
        }
    }

    #[test]
    fn a_forwarded_key_header_never_replaces_the_outputs_own_key() {
        let output = Output::new("orders.out", "x")
            .with_header(AmqpPublisher::KEY_HEADER, "stale")
            .with_key("fresh");
        let routing = Routing::Exchange(String::new());
        let properties = properties(&output, &routing, true).expect("properties");
        assert_eq!(
            text(&table(&properties), AmqpPublisher::KEY_HEADER),
            Some(b"fresh".to_vec())
        );
    }

    #[test]
    fn properties_come_back_and_the_inputs_delivery_count_is_left_out() {
        let output = Output::new("orders.out", "x")
            .with_header(headers::MESSAGE_ID, "m-1")
            .with_header(headers::DELIVERY_COUNT, "3")
            .with_header("tenant", "acme")
            .with_key("k");
        let properties = properties(&output, &Routing::ByKey, false).expect("properties");
        let table = table(&properties);
        assert_eq!(
            properties.message_id().as_ref().map(ShortString::as_str),
            Some("m-1")
        );
        assert_eq!(*properties.delivery_mode(), None);
        assert_eq!(text(&table, "tenant"), Some(b"acme".to_vec()));
        assert!(!table.inner().contains_key(headers::DELIVERY_COUNT));
        assert!(!table.inner().contains_key(headers::MESSAGE_ID));
        // The routing key carries it.
        assert!(!table.inner().contains_key(AmqpPublisher::KEY_HEADER));
    }
}
