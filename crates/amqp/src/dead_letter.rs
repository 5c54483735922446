//! [`AmqpDeadLetterSink`]: publish a copy of the poison message, with its
//! origin, to a dead-letter exchange, and resolve only on the broker's
//! publisher confirm.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use intake_core::dead_letter::EnvelopeError;
use intake_core::dead_letter::envelope::{Broker, Carrier, Envelope};
use intake_core::{
    ConfigError, DeadLetter, Position, SourceName,
    backend::{DeadLetterError, DeadLetterSink},
};
use lapin::message::Delivery;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use tokio::sync::Mutex;

use crate::connection::open_within;
use crate::error::{Error, Operation, classify};
use crate::headers;
use crate::source::convert::DeliveryReader;
use crate::tls::Tls;
use crate::topology::{MAX_NAME_BYTES, Topology, check_name, short};
use crate::url::AmqpUrl;

/// AMQP `delivery-mode` 2: the broker writes the message to disk.
const PERSISTENT: u8 = 2;

/// Publishes dead letters to an exchange with publisher confirms.
///
/// Each dead letter is a copy of the original payload and properties
/// (`message-id`, `correlation-id`, `content-type`) with the dead-letter
/// [envelope](intake_core::dead_letter::envelope) as headers: the original
/// headers (a name in the `intake.` namespace as `intake.producer.<name>`,
/// so nothing a producer wrote can pass for the origin), then the origin
/// (queue, channel epoch, delivery tag, and the routing key in
/// `intake.origin.key`: the letter's own routing key routes it), error
/// class and text, attempts and times. `docs/DEAD-LETTERS.md` has the
/// table; [`read_dead_letter`] reads a delivery of the dead-letter queue
/// back. It is published persistent and `mandatory`, and [`write`]
/// resolves only when the broker confirmed it; a message that no queue is
/// bound to receive is an error, not a silent loss. The runtime
/// acknowledges the original only after that, so a failed write leaves it
/// in its queue.
///
/// The headers of one message travel in one frame, so they must fit the
/// connection's `frame_max` (128 KiB on RabbitMQ by default; a broker
/// refuses a larger frame and closes the connection, so such a dead letter
/// could never be written). A dead letter whose headers would not fit is
/// written reduced: without the original headers (their number in
/// `intake.headers.omitted`) and with the error cut to
/// [`DEAD_LETTER_ERROR_REDUCED_BYTES`](crate::headers::DEAD_LETTER_ERROR_REDUCED_BYTES);
/// one from an AMQP queue always fits the smallest frame AMQP allows. It is
/// logged and counted
/// ([`reduced_dead_letters`](AmqpDeadLetterSink::reduced_dead_letters)). A
/// letter that does not fit even reduced (a key or source longer than AMQP
/// names, from another broker) is [rejected](DeadLetterError::rejected),
/// and the dead-letter layer writes its reference instead.
///
/// # No reference letters of AMQP messages
///
/// When a letter cannot be written (the destination refuses it: a queue at
/// its `x-max-length-bytes` with `reject-publish`, no queue bound; or it
/// stays unconfirmed through the policy's write retries), the dead-letter
/// layer asks for a **reference letter** instead: origin and sizes, no
/// payload, "the original is at its origin". For a message of an AMQP queue
/// that is not so: the acknowledgement that follows a written letter
/// deletes the message, and the payload would be lost although counted as
/// dead-lettered. So the sink refuses to write the reference of a message
/// delivered by an AMQP queue ([`Error::ReferenceNotWritten`], logged at
/// error level): the policy's [fallback](intake_core::FailurePolicy::or_else)
/// decides, and without one the message is left unacknowledged, delivered
/// again (under the consumer's backoff) and dead-lettered whole once the
/// destination takes it. A quorum queue with a
/// [delivery limit](crate::Queue::delivery_limit) and a dead-letter exchange
/// then moves the whole message there after so many deliveries; without a
/// dead-letter exchange RabbitMQ drops it at the limit. A message from
/// another broker (its position is an offset or an entry id, which outlive
/// the acknowledgement) still gets its reference.
///
/// The sink has a connection of its own: RabbitMQ throttles publishing
/// connections under memory pressure, and that must not stall the consumer's
/// acknowledgements. It reconnects on the next write after a failure.
///
/// For the alternative that lets the broker dead-letter
/// (`basic.reject(requeue=false)` into the queue's dead-letter exchange), see
/// [`BrokerDeadLetterSink`](crate::BrokerDeadLetterSink).
///
/// [`write`]: DeadLetterSink::write
pub struct AmqpDeadLetterSink {
    url: AmqpUrl,
    exchange: String,
    routing_key: Option<String>,
    topology: Topology,
    /// The sink's topology and the source's: where a dead letter must not
    /// be routed back into the queue it came from.
    routes: Topology,
    connection_name: Option<String>,
    confirm_timeout: Duration,
    tls: Tls,
    carrier: Carrier,
    link: Mutex<Option<Link>>,
    reduced: AtomicU64,
    /// This sink's part of every letter id: random, so that the letters of
    /// two processes (whose channel epochs and delivery tags repeat) never
    /// share an id.
    instance: u64,
    /// Letters this sink has tried to write: the other part of the id.
    written: AtomicU64,
}

struct Link {
    /// Kept so the connection lives as long as the channel is used.
    _connection: Connection,
    channel: Channel,
    /// The largest frame the connection may send, 0 for no limit.
    frame_max: u32,
}

impl fmt::Debug for AmqpDeadLetterSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpDeadLetterSink")
            .field("endpoint", &self.url.endpoint())
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .finish_non_exhaustive()
    }
}

/// Builds an [`AmqpDeadLetterSink`]: from the source whose messages it
/// dead-letters ([`AmqpSource::dead_letter_sink`](crate::AmqpSource::dead_letter_sink),
/// which fills in the broker, TLS and what the source consumes), or from a
/// URL ([`AmqpDeadLetterSink::builder`]).
#[must_use = "a builder does nothing until `.build().await`"]
pub struct AmqpDeadLetterSinkBuilder {
    /// Parsed when the builder is made; a bad URL is reported by `build`.
    url: Result<AmqpUrl, Error>,
    exchange: Option<String>,
    routing_key: Option<String>,
    consumed_queues: Vec<String>,
    /// The fanout exchange a broadcast source receives from.
    consumed_exchange: Option<String>,
    topology: Topology,
    /// What the source declares: routes the sink does not declare but must
    /// not publish into.
    source_topology: Topology,
    connection_name: Option<String>,
    confirm_timeout: Duration,
    tls: Tls,
}

impl fmt::Debug for AmqpDeadLetterSinkBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpDeadLetterSinkBuilder")
            .field("endpoint", &self.url.as_ref().map(AmqpUrl::endpoint).ok())
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .finish_non_exhaustive()
    }
}

impl AmqpDeadLetterSinkBuilder {
    fn new(url: Result<AmqpUrl, Error>) -> Self {
        Self {
            url,
            exchange: None,
            routing_key: None,
            consumed_queues: Vec::new(),
            consumed_exchange: None,
            topology: Topology::new(),
            source_topology: Topology::new(),
            connection_name: None,
            confirm_timeout: Duration::from_secs(30),
            tls: Tls::new(),
        }
    }

    /// A builder for the broker at `url` with the source's `tls` settings,
    /// which knows the routes the source declared (`source_topology`).
    pub(crate) fn for_source(url: AmqpUrl, tls: Tls, source_topology: Topology) -> Self {
        Self {
            tls,
            source_topology,
            ..Self::new(Ok(url))
        }
    }

    /// Names the fanout exchange a broadcast source receives from: a
    /// destination equal to it is refused, as its dead letters would come
    /// back to every consumer of it.
    pub(crate) fn consumed_exchange(mut self, exchange: String) -> Self {
        self.consumed_exchange = Some(exchange);
        self
    }

    /// Publishes to `exchange`. `""` is the default exchange, which routes by
    /// queue name: then set [`routing_key`](Self::routing_key) to the
    /// dead-letter queue.
    pub fn exchange(mut self, exchange: impl Into<String>) -> Self {
        self.exchange = Some(exchange.into());
        self
    }

    /// Publishes with this routing key. By default, the name of the queue
    /// the message came from, so one direct exchange can serve many queues
    /// with one binding each.
    pub fn routing_key(mut self, routing_key: impl Into<String>) -> Self {
        self.routing_key = Some(routing_key.into());
        self
    }

    /// Names a queue whose messages this sink dead-letters. A destination
    /// that routes them back into it (the default exchange with the queue's
    /// name as routing key, or an exchange declared in the sink's
    /// [topology](Self::declare), or the source's, bound to the queue with
    /// the routing key the dead letters get) is refused by
    /// [`build`](Self::build): they would be consumed again, fail again,
    /// forever. A sink made by
    /// [`AmqpSource::dead_letter_sink`](crate::AmqpSource::dead_letter_sink)
    /// names the source's queue already; call it once per other queue.
    ///
    /// Whether or not it is called, a dead letter the sink's own settings
    /// would route back into the queue it came from is refused when written.
    pub fn consumed_queue(mut self, queue: impl Into<String>) -> Self {
        self.consumed_queues.push(queue.into());
        self
    }

    /// Declares `topology` (the exchange, the dead-letter queue, the binding)
    /// whenever the sink connects.
    pub fn declare(mut self, topology: Topology) -> Self {
        self.topology = topology;
        self
    }

    /// Names the sink's connection.
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = Some(name.into());
        self
    }

    /// TLS beyond the defaults for an `amqps://` URL (see [`Tls`]).
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = tls;
        self
    }

    /// How long to wait for the broker's confirm (default 30 s).
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// Checks the settings and connects (one attempt), so that a wrong
    /// password or a refused declaration shows here.
    pub async fn build(self) -> Result<AmqpDeadLetterSink, Error> {
        let url = self.url?;
        let exchange = self.exchange.ok_or_else(|| {
            ConfigError::new(
                "exchange",
                "is not set; call .exchange(\"orders.dlx\") (or .exchange(\"\") with .routing_key(\"orders.dlq\") for the default exchange)",
            )
        })?;
        check_name("exchange", &exchange)?;
        match &self.routing_key {
            Some(routing_key) => check_name("routing_key", routing_key)?,
            None if exchange.is_empty() => {
                return Err(ConfigError::new(
                    "routing_key",
                    "is not set, and the default exchange routes by queue name: the dead letters would go back to their own queue; set .routing_key(\"<dead-letter queue>\")",
                )
                .into());
            }
            None => {}
        }
        self.topology.validate()?;
        self.tls.check_for(&url)?;
        let routes = self.topology.joined(&self.source_topology);
        for queue in &self.consumed_queues {
            let routing_key = self.routing_key.as_deref().unwrap_or(queue);
            if routes.routes_into(&exchange, Some(routing_key), queue) {
                return Err(ConfigError::new(
                    "consumed_queue",
                    format!(
                        "`{queue}` is consumed, and exchange `{exchange}` with routing key \
                         `{routing_key}` routes its dead letters back into it, where they would \
                         be consumed again; publish them to a dead-letter queue of their own"
                    ),
                )
                .into());
            }
        }
        if let Some(consumed) = self
            .consumed_exchange
            .filter(|consumed| *consumed == exchange)
        {
            return Err(ConfigError::new(
                "exchange",
                format!(
                    "`{consumed}` is the fanout exchange the source receives from: every dead \
                     letter would come back to each of its consumers, this one included; publish \
                     them to an exchange of their own"
                ),
            )
            .into());
        }
        if self.confirm_timeout.is_zero() {
            return Err(ConfigError::new(
                "confirm_timeout",
                "is zero; give the broker time to confirm",
            )
            .into());
        }
        let sink = AmqpDeadLetterSink {
            url,
            exchange,
            routing_key: self.routing_key,
            topology: self.topology,
            routes,
            connection_name: self.connection_name,
            confirm_timeout: self.confirm_timeout,
            tls: self.tls,
            carrier: Carrier::keyless(Broker::Amqp),
            link: Mutex::new(None),
            reduced: AtomicU64::new(0),
            instance: random_instance(),
            written: AtomicU64::new(0),
        };
        sink.channel().await?;
        Ok(sink)
    }
}

impl AmqpDeadLetterSink {
    /// Starts building a sink for the broker at `url`. For the dead letters
    /// of an [`AmqpSource`](crate::AmqpSource), start from
    /// [`AmqpSource::dead_letter_sink`](crate::AmqpSource::dead_letter_sink)
    /// instead: it knows the broker, the TLS settings and what the source
    /// consumes.
    pub fn builder(url: impl Into<String>) -> AmqpDeadLetterSinkBuilder {
        AmqpDeadLetterSinkBuilder::new(AmqpUrl::parse(&url.into()))
    }

    /// Dead letters written without their original headers because those
    /// would not fit in one frame (see the [type docs](Self)).
    pub fn reduced_dead_letters(&self) -> u64 {
        self.reduced.load(Ordering::Relaxed)
    }

    /// The channel in confirm mode and the connection's `frame_max`,
    /// reconnecting if the channel is gone.
    async fn channel(&self) -> Result<(Channel, u32), Error> {
        let mut link = self.link.lock().await;
        if let Some(live) = link
            .as_ref()
            .filter(|live| live.channel.status().connected())
        {
            return Ok((live.channel.clone(), live.frame_max));
        }
        *link = None;
        let url = &self.url;
        let fail = |error| classify(error, url.endpoint(), url.vhost(), Operation::Other);
        let connection = open_within(
            url,
            self.connection_name.as_deref(),
            &self.tls,
            crate::connection::DEFAULT_CONNECT_TIMEOUT,
        )
        .await?;
        let channel = connection.create_channel().await.map_err(fail)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(fail)?;
        self.topology.declare_on(&channel, url).await?;
        let frame_max = connection.configuration().frame_max();
        *link = Some(Link {
            _connection: connection,
            channel: channel.clone(),
            frame_max,
        });
        Ok((channel, frame_max))
    }

    /// The dead letter's properties, reduced if they would not fit a frame;
    /// rejected if they do not fit even then.
    fn fitting_properties(
        &self,
        letter: &DeadLetter,
        frame_max: u32,
    ) -> Result<BasicProperties, DeadLetterError> {
        let origin = letter.message.metadata();
        let token = format!(
            "{:016x}-{}",
            self.instance,
            self.written.fetch_add(1, Ordering::Relaxed)
        );
        match fitting(letter, &self.carrier, frame_max, &token) {
            Fit::Full(properties) => Ok(properties),
            Fit::Reduced { properties, full } => {
                self.reduced.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    exchange = self.exchange,
                    source = %origin.source(),
                    position = %origin.position(),
                    header_bytes = full,
                    frame_max,
                    "the dead letter's headers do not fit in one frame; it is written without \
                     the original headers and with its error cut"
                );
                Ok(properties)
            }
            Fit::Rejected { reduced } => Err(DeadLetterError::rejected(format!(
                "its headers take {reduced} bytes even without the original headers, more \
                 than one frame of {frame_max} bytes holds"
            ))),
        }
    }

    async fn publish(&self, letter: &DeadLetter) -> Result<(), DeadLetterError> {
        let origin = letter.message.metadata();
        let routing_key = self
            .routing_key
            .as_deref()
            .unwrap_or_else(|| origin.source());
        if self
            .routes
            .routes_into(&self.exchange, Some(routing_key), origin.source())
        {
            return Err(Error::from(ConfigError::new(
                "routing_key",
                format!(
                    "routes the dead letter back into `{}`, the queue it came from, where it would \
                     be consumed again; publish dead letters to a queue of their own",
                    origin.source()
                ),
            ))
            .into());
        }
        let (channel, frame_max) = self.channel().await?;
        let url = &self.url;
        let fail = |error| classify(error, url.endpoint(), url.vhost(), Operation::Other);
        let properties = self.fitting_properties(letter, frame_max)?;
        let confirm = channel
            .basic_publish(
                short(&self.exchange),
                ShortString::try_new(routing_key).unwrap_or_default(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                letter.message.payload(),
                properties,
            )
            .await
            .map_err(fail)?;
        let confirmation = tokio::time::timeout(self.confirm_timeout, confirm)
            .await
            .map_err(|_| Error::NotConfirmed {
                endpoint: url.endpoint().to_owned(),
                reason: format!("no publisher confirm within {:?}", self.confirm_timeout),
            })?
            .map_err(fail)?;
        let refused = match confirmation {
            Confirmation::Ack(None) => return Ok(()),
            Confirmation::Ack(Some(returned)) => Error::NotConfirmed {
                endpoint: url.endpoint().to_owned(),
                reason: format!(
                    "no queue is bound to exchange `{}` with routing key `{routing_key}` ({}); declare and bind the dead-letter queue",
                    self.exchange, returned.reply_text
                ),
            },
            Confirmation::Nack(_) => Error::NotConfirmed {
                endpoint: url.endpoint().to_owned(),
                reason: format!(
                    "the broker refused it (nack) on exchange `{}`",
                    self.exchange
                ),
            },
            Confirmation::NotRequested => Error::NotConfirmed {
                endpoint: url.endpoint().to_owned(),
                reason: "the channel is not in confirm mode".into(),
            },
        };
        Err(refused.into())
    }
}

/// How a dead letter fits the connection's frames.
enum Fit {
    /// Whole.
    Full(BasicProperties),
    /// Reduced; `full` is the size its headers would have taken whole.
    Reduced {
        properties: BasicProperties,
        full: usize,
    },
    /// Not even reduced; `reduced` is the size its headers take then.
    Rejected { reduced: usize },
}

/// Frame type, channel, payload size and end marker.
const FRAME_OVERHEAD: usize = 8;

/// How `letter` fits frames of `frame_max` bytes (0: no limit): whole,
/// reduced, or not at all.
fn fitting(letter: &DeadLetter, carrier: &Carrier, frame_max: u32, token: &str) -> Fit {
    let full = properties(letter, carrier, Shape::Full, token);
    let room = usize::try_from(frame_max)
        .unwrap_or(usize::MAX)
        .saturating_sub(FRAME_OVERHEAD);
    let full_size = content_header_len(&full);
    if frame_max == 0 || full_size <= room {
        return Fit::Full(full);
    }
    let reduced = properties(letter, carrier, Shape::Reduced, token);
    match content_header_len(&reduced) {
        size if size <= room => Fit::Reduced {
            properties: reduced,
            full: full_size,
        },
        size => Fit::Rejected { reduced: size },
    }
}

/// What a dead letter carries of its original.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// Everything.
    Full,
    /// What fits the smallest frame: the properties, the envelope, the
    /// error cut; no other headers.
    Reduced,
}

/// Properties of the dead letter: persistent, the original properties, the
/// original headers (unless reduced), the envelope's fields and the
/// letter's `token` ([`headers::LETTER_ID`]), all as long strings.
fn properties(
    letter: &DeadLetter,
    carrier: &Carrier,
    shape: Shape,
    token: &str,
) -> BasicProperties {
    let mut envelope = Envelope::new(letter, carrier);
    let mut properties = BasicProperties::default().with_delivery_mode(PERSISTENT);
    let mut table = FieldTable::default();
    let mut omitted = 0;
    for (name, value) in envelope.headers() {
        // The properties a delivery's headers show under `amqp.` names go
        // back to being properties; one that cannot be a property (longer
        // than 255 bytes, not UTF-8: from another broker) stays a header.
        let property = || {
            std::str::from_utf8(value)
                .ok()
                .and_then(|text| ShortString::try_new(text).ok())
        };
        match (&*name, property()) {
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
            _ if shape == Shape::Reduced => {
                omitted += 1;
                continue;
            }
            _ => {}
        }
        match ShortString::try_new(&*name) {
            Ok(name) => {
                table.insert(
                    name,
                    AMQPValue::LongString(LongString::from(value.to_vec())),
                );
            }
            Err(_) => {
                omitted += 1;
                tracing::warn!(
                    header = &name[..name.floor_char_boundary(64)],
                    "header name longer than {MAX_NAME_BYTES} bytes left out of the dead letter"
                );
            }
        }
    }
    envelope.count_omitted(omitted);
    if shape == Shape::Reduced {
        envelope.cap_error(headers::DEAD_LETTER_ERROR_REDUCED_BYTES);
    }
    for (name, value) in envelope.fields() {
        table.insert(
            short(name),
            AMQPValue::LongString(LongString::from(value.to_vec())),
        );
    }
    table.insert(
        short(headers::LETTER_ID),
        AMQPValue::LongString(LongString::from(token)),
    );
    properties.with_headers(table)
}

/// A number no other sink (of this process or another) is likely to draw:
/// the standard library's randomly keyed hasher over the process id and
/// the time.
fn random_instance() -> u64 {
    use std::hash::BuildHasher;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    std::collections::hash_map::RandomState::new().hash_one((std::process::id(), now))
}

/// Reads a delivery of a dead-letter queue back as the letter an
/// [`AmqpDeadLetterSink`] wrote: its properties and headers as the
/// [`AmqpSource`](crate::AmqpSource) shows them, through
/// [`DeadLetter::read`] with no key slot (the delivery's routing key is the
/// letter's, not the original's).
///
/// A message the broker dead-lettered itself
/// ([`BrokerDeadLetterSink`](crate::BrokerDeadLetterSink)) carries
/// RabbitMQ's `x-death`, not the envelope, and is refused with
/// [`EnvelopeError::Missing`].
///
/// # Errors
///
/// [`EnvelopeError`] naming the envelope field that is missing, malformed
/// or repeated.
pub fn read_dead_letter(delivery: Delivery) -> Result<DeadLetter, EnvelopeError> {
    read_stored(delivery).0
}

/// The letter in `delivery`, and the id its sink gave it
/// ([`headers::LETTER_ID`], left out of the letter's headers), if any.
pub(crate) fn read_stored(
    delivery: Delivery,
) -> (Result<DeadLetter, EnvelopeError>, Option<String>) {
    let message = DeliveryReader::new(SourceName::from("")).read(delivery, 0);
    let token = message
        .headers()
        .get_str(headers::LETTER_ID)
        .map(str::to_owned);
    let letter = match token {
        None => DeadLetter::read(None, message.payload().clone(), message.headers()),
        Some(_) => {
            let others: intake_core::Headers = message
                .headers()
                .iter()
                .filter(|header| &*header.name != headers::LETTER_ID)
                .map(|header| (header.name.clone(), header.value.clone()))
                .collect();
            DeadLetter::read(None, message.payload().clone(), &others)
        }
    };
    (letter, token)
}

/// The size of the content header frame's payload that carries
/// `properties` (class, weight, body size, property flags, properties), as
/// AMQP 0-9-1 encodes it.
fn content_header_len(properties: &BasicProperties) -> usize {
    let short =
        |text: &Option<ShortString>| text.as_ref().map_or(0, |text| 1 + text.as_str().len());
    let octet = |value: &Option<u8>| usize::from(value.is_some());
    2 + 2
        + 8
        + 2
        + short(properties.content_type())
        + short(properties.content_encoding())
        + properties.headers().as_ref().map_or(0, table_len)
        + octet(properties.delivery_mode())
        + octet(properties.priority())
        + short(properties.correlation_id())
        + short(properties.reply_to())
        + short(properties.expiration())
        + short(properties.message_id())
        + properties.timestamp().map_or(0, |_| 8)
        + short(properties.kind())
        + short(properties.user_id())
        + short(properties.app_id())
        + short(properties.cluster_id())
}

fn table_len(table: &FieldTable) -> usize {
    4 + table
        .inner()
        .iter()
        .map(|(name, value)| 1 + name.as_str().len() + value_len(value))
        .sum::<usize>()
}

/// A field value with its type tag.
fn value_len(value: &AMQPValue) -> usize {
    1 + match value {
        AMQPValue::Boolean(_) | AMQPValue::ShortShortInt(_) | AMQPValue::ShortShortUInt(_) => 1,
        AMQPValue::ShortInt(_) | AMQPValue::ShortUInt(_) => 2,
        AMQPValue::LongInt(_) | AMQPValue::LongUInt(_) | AMQPValue::Float(_) => 4,
        AMQPValue::LongLongInt(_) | AMQPValue::Double(_) | AMQPValue::Timestamp(_) => 8,
        AMQPValue::DecimalValue(_) => 5,
        AMQPValue::ShortString(text) => 1 + text.as_str().len(),
        AMQPValue::LongString(text) => 4 + text.as_bytes().len(),
        AMQPValue::FieldArray(items) => 4 + items.as_slice().iter().map(value_len).sum::<usize>(),
        AMQPValue::FieldTable(table) => table_len(table),
        AMQPValue::ByteArray(bytes) => 4 + bytes.as_slice().len(),
        AMQPValue::Void => 0,
    }
}

#[async_trait::async_trait]
impl DeadLetterSink for AmqpDeadLetterSink {
    async fn write(&self, letter: &DeadLetter) -> Result<(), DeadLetterError> {
        let origin = letter.message.metadata();
        // A delivery tag: the message came from an AMQP queue, which the
        // acknowledgement that follows a written letter empties of it.
        if letter.reference.is_some() && matches!(origin.position(), Position::Tag(_)) {
            let refused = Error::ReferenceNotWritten {
                endpoint: self.url.endpoint().to_owned(),
                queue: origin.source().to_string(),
            };
            tracing::error!(
                exchange = self.exchange,
                source = %origin.source(),
                partition = origin.partition(),
                position = %origin.position(),
                payload_bytes = letter.reference.map_or(0, |sizes| sizes.payload_bytes),
                error = %refused,
                "the dead letter could not be written; the message stays in its queue",
            );
            return Err(refused.into());
        }
        self.publish(letter)
            .await
            .inspect_err(|error| match error.is_rejected() {
                true => tracing::warn!(
                    endpoint = self.url.endpoint(),
                    exchange = self.exchange,
                    %error,
                    "the dead letter does not fit a frame even reduced"
                ),
                false => tracing::warn!(
                    endpoint = self.url.endpoint(),
                    exchange = self.exchange,
                    %error,
                    "dead letter not confirmed; the original stays unacknowledged"
                ),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use intake_core::dead_letter::envelope;
    use intake_core::{Headers, Message, Metadata, Position};

    #[tokio::test]
    async fn a_sink_that_routes_into_the_consumed_queue_is_refused_before_connecting() {
        // Nothing listens on port 1: a refusal here is the build's.
        let url = "amqp://guest:guest@127.0.0.1:1/%2f";
        let refused = |builder: AmqpDeadLetterSinkBuilder| async move {
            match builder.consumed_queue("orders").build().await {
                Err(Error::Config(error)) => error,
                other => panic!("expected a config error, got {other:?}"),
            }
        };
        let through_default = refused(
            AmqpDeadLetterSink::builder(url)
                .exchange("")
                .routing_key("orders"),
        )
        .await;
        assert!(through_default.problem.contains("`orders`"));
        // A fanout bound to the queue, or a direct exchange bound with the
        // routing key the dead letters get (by default the queue's name).
        refused(
            AmqpDeadLetterSink::builder(url).exchange("dlx").declare(
                Topology::new()
                    .exchange(crate::Exchange::fanout("dlx"))
                    .bind("orders", "dlx", ""),
            ),
        )
        .await;
        refused(
            AmqpDeadLetterSink::builder(url).exchange("dlx").declare(
                Topology::new()
                    .exchange(crate::Exchange::direct("dlx"))
                    .bind("orders", "dlx", "orders"),
            ),
        )
        .await;
        let elsewhere = AmqpDeadLetterSink::builder(url)
            .exchange("dlx")
            .consumed_queue("orders")
            .declare(
                Topology::new()
                    .exchange(crate::Exchange::direct("dlx"))
                    .queue(crate::Queue::classic("orders.dlq"))
                    .bind("orders.dlq", "dlx", "orders"),
            )
            .build()
            .await;
        assert!(
            matches!(elsewhere, Err(Error::Unreachable { .. })),
            "{elsewhere:?}"
        );
    }

    /// The longest letter id a sink writes.
    const TOKEN: &str = "ffffffffffffffff-18446744073709551615";

    fn carrier() -> Carrier {
        Carrier::keyless(Broker::Amqp)
    }

    fn table_of(properties: &BasicProperties) -> std::collections::BTreeMap<String, String> {
        properties
            .headers()
            .clone()
            .unwrap_or_default()
            .inner()
            .iter()
            .map(|(name, value)| {
                let text = match value {
                    AMQPValue::LongString(text) => text.to_string(),
                    other => panic!("{name}: {other:?} is not a long string"),
                };
                (name.to_string(), text)
            })
            .collect()
    }

    #[test]
    fn a_producers_headers_never_pass_for_the_origin() {
        // The original has no routing key, so the envelope has none to set:
        // the producer's own `intake.origin.key` must not stand in.
        let headers: Headers = [
            (envelope::ORIGIN_KEY, Bytes::from_static(b"spoofed")),
            (envelope::ORIGIN_SOURCE, Bytes::from_static(b"spoofed")),
            (envelope::ERROR_MESSAGE, Bytes::from_static(b"spoofed")),
        ]
        .into_iter()
        .collect();
        let message = Message::new(
            Bytes::from_static(b"{}"),
            Metadata::new("orders".into(), 1, Position::Tag(5)),
        )
        .with_headers(headers);
        let properties = properties(
            &DeadLetter::new(message, "bad json", 1),
            &carrier(),
            Shape::Full,
            TOKEN,
        );
        let table = table_of(&properties);
        assert_eq!(table.get(envelope::ORIGIN_KEY), None);
        assert_eq!(table[envelope::ORIGIN_SOURCE], "orders");
        assert_eq!(table[envelope::ERROR_MESSAGE], "bad json");
        // Kept, under a name that cannot be taken for the origin.
        let kept = format!("{}{}", envelope::PRODUCER_PREFIX, envelope::ORIGIN_KEY);
        assert_eq!(table[&kept], "spoofed");
    }

    #[test]
    fn a_dead_letter_carries_its_origin_and_restores_properties() {
        let headers: Headers = [
            (headers::MESSAGE_ID, Bytes::from_static(b"m-7")),
            ("tenant", Bytes::from_static(b"acme")),
        ]
        .into_iter()
        .collect();
        let message = Message::new(
            Bytes::from_static(b"{}"),
            Metadata::new("orders".into(), 3, Position::Tag(42)),
        )
        .with_key(Bytes::from_static(b"orders.eu"))
        .with_headers(headers);
        let letter = DeadLetter::new(message, "bad json", 4);
        let properties = properties(&letter, &carrier(), Shape::Full, TOKEN);
        assert_eq!(
            properties.message_id().as_ref().map(ShortString::as_str),
            Some("m-7")
        );
        assert_eq!(*properties.delivery_mode(), Some(PERSISTENT));
        let table = table_of(&properties);
        assert_eq!(table[envelope::ORIGIN_BROKER], "amqp");
        assert_eq!(table[envelope::ORIGIN_SOURCE], "orders");
        assert_eq!(table[envelope::ORIGIN_PARTITION], "3");
        assert_eq!(table[envelope::ORIGIN_POSITION], "42");
        assert_eq!(table[envelope::ORIGIN_KEY], "orders.eu");
        assert_eq!(table[envelope::ERROR_MESSAGE], "bad json");
        assert_eq!(table[envelope::ATTEMPTS], "4");
        assert_eq!(table["tenant"], "acme");
        assert!(!table.contains_key(headers::MESSAGE_ID));
    }

    #[test]
    fn a_header_name_too_long_for_amqp_is_left_out_and_counted_even_when_multibyte() {
        // 300 bytes of 3-byte characters: byte 64 is inside a character.
        let name = "€".repeat(100);
        let headers: Headers = [
            (name.as_str(), Bytes::from_static(b"v")),
            ("tenant", Bytes::from_static(b"acme")),
        ]
        .into_iter()
        .collect();
        let message = Message::new(
            Bytes::from_static(b"{}"),
            Metadata::new("orders".into(), 1, Position::Tag(1)),
        )
        .with_headers(headers);
        let letter = DeadLetter::new(message, "bad", 1);
        // With a subscriber, so that the warning's fields are evaluated.
        let subscriber = tracing_subscriber::fmt().with_test_writer().finish();
        let properties = tracing::subscriber::with_default(subscriber, || {
            properties(&letter, &carrier(), Shape::Full, TOKEN)
        });
        let table = table_of(&properties);
        assert!(!table.keys().any(|key| key.starts_with('€')));
        assert_eq!(table["tenant"], "acme");
        assert_eq!(table[envelope::HEADERS_OMITTED], "1");
    }

    #[test]
    fn a_property_that_cannot_be_one_stays_a_header_instead_of_being_dropped() {
        // From another broker: a message id longer than an AMQP short
        // string (it was dropped), a correlation id that is not UTF-8 (it
        // was replaced by a lossy copy).
        let long_id = Bytes::from("m".repeat(300));
        let binary = Bytes::from_static(&[0xff, 0xfe]);
        let headers: Headers = [
            (headers::MESSAGE_ID, long_id.clone()),
            (headers::CORRELATION_ID, binary.clone()),
        ]
        .into_iter()
        .collect();
        let message = Message::new(
            Bytes::from_static(b"{}"),
            Metadata::new("orders".into(), 0, Position::Offset(3)),
        )
        .with_headers(headers);
        let letter = DeadLetter::new(message, "bad", 1);
        let properties = properties(&letter, &carrier(), Shape::Full, TOKEN);
        assert_eq!(properties.message_id(), &None);
        assert_eq!(properties.correlation_id(), &None);
        let mut delivery = Delivery::mock(
            1,
            ShortString::from("dlx"),
            ShortString::from("orders.dlq"),
            false,
            b"{}".to_vec(),
        );
        delivery.properties = properties;
        let read = read_dead_letter(delivery).expect("a dead letter");
        assert_eq!(
            read.message.headers().get(headers::MESSAGE_ID),
            Some(&long_id)
        );
        assert_eq!(
            read.message.headers().get(headers::CORRELATION_ID),
            Some(&binary)
        );
    }

    #[test]
    fn a_letter_that_fits_no_frame_even_reduced_is_rejected() {
        // A key from another broker, longer than any AMQP routing key.
        let message = Message::new(
            Bytes::from_static(b"{}"),
            Metadata::new("orders".into(), 0, Position::Offset(9)),
        )
        .with_key(vec![b'k'; 5_000]);
        let letter = DeadLetter::new(message, "bad", 1);
        assert!(matches!(
            fitting(&letter, &carrier(), 4096, TOKEN),
            Fit::Rejected { .. }
        ));
        // Its reference has no key, and fits.
        assert!(matches!(
            fitting(&letter.to_reference(), &carrier(), 4096, TOKEN),
            Fit::Full(_)
        ));
    }

    fn letter_with(
        headers: Vec<(String, Vec<u8>)>,
        key: Option<Vec<u8>>,
        source: String,
        error: String,
    ) -> DeadLetter {
        let headers: Headers = headers.into_iter().collect();
        let mut message = Message::new(
            Bytes::from_static(b"{}"),
            Metadata::new(source.as_str().into(), 7, Position::Tag(u64::MAX)),
        )
        .with_headers(headers);
        if let Some(key) = key {
            message = message.with_key(Bytes::from(key));
        }
        DeadLetter::new(message, error, u32::MAX)
    }

    fn header_name() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            ".{0,40}",
            Just(headers::MESSAGE_ID.to_owned()),
            Just(headers::CONTENT_TYPE.to_owned()),
            Just(envelope::ORIGIN_SOURCE.to_owned()),
            "[a-z]{300}",
        ]
    }

    /// Any letter: names, keys and sources of any length.
    fn any_letter() -> impl proptest::strategy::Strategy<Value = DeadLetter> {
        use proptest::prelude::*;
        (
            proptest::collection::vec(
                (
                    header_name(),
                    proptest::collection::vec(any::<u8>(), 0..3_000),
                ),
                0..8,
            ),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..2_000)),
            ".{0,400}",
            ".{0,5000}",
        )
            .prop_map(|(headers, key, source, error)| letter_with(headers, key, source, error))
    }

    /// A letter of a message from an AMQP queue: a queue name and a routing
    /// key of at most 255 bytes, headers as a delivery's (distinct names
    /// AMQP can carry, long-string values).
    fn amqp_letter() -> impl proptest::strategy::Strategy<Value = DeadLetter> {
        use proptest::prelude::*;
        (
            proptest::collection::btree_map(
                prop_oneof![
                    "[a-z.-]{1,40}",
                    Just(headers::MESSAGE_ID.to_owned()),
                    Just(headers::CORRELATION_ID.to_owned()),
                    Just(envelope::ORIGIN_SOURCE.to_owned()),
                    Just(envelope::VERSION.to_owned()),
                ],
                proptest::collection::vec(any::<u8>(), 0..3_000),
                0..8,
            ),
            proptest::option::of("[a-z.]{1,255}"),
            "[a-z.]{1,255}",
            ".{0,5000}",
        )
            .prop_map(|(headers, key, source, error)| {
                // A property comes as text of at most 255 bytes.
                let headers = headers
                    .into_iter()
                    .map(|(name, value)| match name.starts_with("amqp.") {
                        true => (name, value.escape_ascii().take(255).collect()),
                        false => (name, value),
                    })
                    .collect();
                letter_with(headers, key.map(String::into_bytes), source, error)
            })
    }

    fn sorted(headers: &Headers) -> Vec<(String, Bytes)> {
        let mut headers: Vec<_> = headers
            .iter()
            .map(|header| (header.name.to_string(), header.value.clone()))
            .collect();
        headers.sort();
        headers
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// The size the sink compares with `frame_max` is the size lapin
        /// writes on the wire.
        #[test]
        fn the_computed_header_size_is_what_lapin_encodes(letter in any_letter()) {
            for shape in [Shape::Full, Shape::Reduced] {
                let properties = properties(&letter, &carrier(), shape, TOKEN);
                let (encoded, _) = cookie_factory::r#gen(
                    lapin::protocol::basic::gen_properties(&properties),
                    Vec::new(),
                )
                .expect("the properties encode");
                // Class, weight and body size precede the properties.
                proptest::prop_assert_eq!(content_header_len(&properties), 12 + encoded.len());
            }
        }

        /// Whatever the letter, what the sink publishes fits the frame, and
        /// it is rejected only when even the reduced letter does not.
        #[test]
        fn what_the_sink_publishes_fits_the_frame(letter in any_letter()) {
            let room = 4096 - FRAME_OVERHEAD;
            match fitting(&letter, &carrier(), 4096, TOKEN) {
                Fit::Full(properties) => {
                    proptest::prop_assert!(content_header_len(&properties) <= room);
                }
                Fit::Reduced { properties, full } => {
                    proptest::prop_assert!(full > room);
                    proptest::prop_assert!(content_header_len(&properties) <= room);
                }
                Fit::Rejected { reduced } => proptest::prop_assert!(reduced > room),
            }
        }

        /// A letter from an AMQP queue is never rejected: even reduced, it
        /// fits the smallest frame a broker may negotiate (4096 bytes).
        #[test]
        fn a_letter_from_an_amqp_queue_fits_the_smallest_frame(letter in amqp_letter()) {
            let rejected = matches!(fitting(&letter, &carrier(), 4096, TOKEN), Fit::Rejected { .. });
            proptest::prop_assert!(!rejected, "rejected: {:?}", letter);
        }

        /// A letter published whole and delivered from the dead-letter
        /// queue reads back as the letter: origin, key, headers (properties
        /// among them), error, attempts, times.
        #[test]
        fn a_delivered_dead_letter_reads_back_as_the_letter(letter in amqp_letter()) {
            let Fit::Full(properties) = fitting(&letter, &carrier(), 0, TOKEN) else {
                return Err(proptest::test_runner::TestCaseError::fail("no frame limit"));
            };
            let mut delivery = Delivery::mock(
                1,
                ShortString::from("dlx"),
                ShortString::from("orders.dlq"),
                false,
                letter.message.payload().to_vec(),
            );
            delivery.properties = properties;
            let read = read_dead_letter(delivery)
                .map_err(|error| proptest::test_runner::TestCaseError::fail(error.to_string()))?;
            let (written, read_message) = (&letter.message, &read.message);
            proptest::prop_assert_eq!(read_message.payload(), written.payload());
            proptest::prop_assert_eq!(read_message.key(), written.key());
            proptest::prop_assert_eq!(sorted(read_message.headers()), sorted(written.headers()));
            proptest::prop_assert_eq!(read_message.metadata().source(), written.metadata().source());
            proptest::prop_assert_eq!(read_message.metadata().partition(), 7);
            proptest::prop_assert_eq!(read_message.metadata().position(), Position::Tag(u64::MAX));
            proptest::prop_assert_eq!(&read.error, &letter.error);
            proptest::prop_assert_eq!(read.attempts, u32::MAX);
            proptest::prop_assert_eq!(read.headers_omitted, 0);
            let origin = read.origin.expect("origin");
            proptest::prop_assert_eq!(origin.broker, Broker::Amqp);
        }
    }
}
