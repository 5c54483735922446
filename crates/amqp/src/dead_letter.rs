//! [`AmqpDeadLetterSink`]: publish a copy of the poison message, with its
//! origin, to a dead-letter exchange, and resolve only on the broker's
//! publisher confirm.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use intake_core::{ConfigError, DeadLetter, DeadLetterError, DeadLetterSink};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use tokio::sync::Mutex;

use crate::connection::open_within;
use crate::error::{AmqpError, Operation, classify};
use crate::headers;
use crate::source::check_tls;
use crate::tls::Tls;
use crate::topology::{MAX_NAME_BYTES, Topology, check_name, short};
use crate::url::AmqpUrl;

/// AMQP `delivery-mode` 2: the broker writes the message to disk.
const PERSISTENT: u8 = 2;

/// Publishes dead letters to an exchange with publisher confirms.
///
/// Each dead letter is a copy of the original payload with the original
/// headers and properties, plus its origin under the `x-intake-` headers
/// (see [`headers`](crate::headers)): queue, channel epoch, delivery tag,
/// routing key, the last error, the attempt count and the time it was given
/// up. An original header in that namespace is kept under
/// `x-intake-producer.`, so that nothing a producer wrote can pass for the
/// origin. It is published persistent and `mandatory`, and [`write`] resolves
/// only when the broker confirmed it; a message that no queue is bound to
/// receive is an error, not a silent loss. The runtime acknowledges the
/// original only after that, so a failed write leaves it in its queue.
///
/// The headers of one message travel in one frame, so they must fit the
/// connection's `frame_max` (128 KiB on RabbitMQ by default; a broker
/// refuses a larger frame and closes the connection, so such a dead letter
/// could never be written). A dead letter whose headers would not fit is
/// written reduced: without the original headers (their number in
/// `x-intake-headers-left-out`), with the source and routing key cut to 255
/// bytes and the error to
/// [`DEAD_LETTER_ERROR_REDUCED_BYTES`](crate::headers::DEAD_LETTER_ERROR_REDUCED_BYTES),
/// which fits the smallest frame AMQP allows. It is logged and counted
/// ([`reduced_dead_letters`](AmqpDeadLetterSink::reduced_dead_letters)).
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
    connection_name: Option<String>,
    confirm_timeout: Duration,
    tls: Tls,
    link: Mutex<Option<Link>>,
    reduced: AtomicU64,
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

/// Builds an [`AmqpDeadLetterSink`]; see [`AmqpDeadLetterSink::builder`].
#[must_use = "a builder does nothing until `.connect().await`"]
pub struct AmqpDeadLetterSinkBuilder {
    url: String,
    exchange: Option<String>,
    routing_key: Option<String>,
    consumed_queues: Vec<String>,
    topology: Topology,
    connection_name: Option<String>,
    confirm_timeout: Duration,
    tls: Tls,
}

impl fmt::Debug for AmqpDeadLetterSinkBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpDeadLetterSinkBuilder")
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .finish_non_exhaustive()
    }
}

impl AmqpDeadLetterSinkBuilder {
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
    /// [topology](Self::declare) bound to the queue with the routing key
    /// the dead letters get) is refused by [`connect`](Self::connect): they
    /// would be consumed again, fail again, forever. Call it once per queue.
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
    pub async fn connect(self) -> Result<AmqpDeadLetterSink, AmqpError> {
        let url = AmqpUrl::parse(&self.url)?;
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
        check_tls(&self.tls, &url)?;
        for queue in &self.consumed_queues {
            let routing_key = self.routing_key.as_deref().unwrap_or(queue);
            if self
                .topology
                .routes_into(&exchange, Some(routing_key), queue)
            {
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
            connection_name: self.connection_name,
            confirm_timeout: self.confirm_timeout,
            tls: self.tls,
            link: Mutex::new(None),
            reduced: AtomicU64::new(0),
        };
        sink.channel().await?;
        Ok(sink)
    }
}

impl AmqpDeadLetterSink {
    /// Starts building a sink for the broker at `url`.
    pub fn builder(url: impl Into<String>) -> AmqpDeadLetterSinkBuilder {
        AmqpDeadLetterSinkBuilder {
            url: url.into(),
            exchange: None,
            routing_key: None,
            consumed_queues: Vec::new(),
            topology: Topology::new(),
            connection_name: None,
            confirm_timeout: Duration::from_secs(30),
            tls: Tls::new(),
        }
    }

    /// Dead letters written without their original headers because those
    /// would not fit in one frame (see the [type docs](Self)).
    pub fn reduced_dead_letters(&self) -> u64 {
        self.reduced.load(Ordering::Relaxed)
    }

    /// The channel in confirm mode and the connection's `frame_max`,
    /// reconnecting if the channel is gone.
    async fn channel(&self) -> Result<(Channel, u32), AmqpError> {
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

    /// The dead letter's properties, reduced if they would not fit a frame.
    fn fitting_properties(&self, letter: &DeadLetter, frame_max: u32) -> BasicProperties {
        let full = properties(letter, Envelope::Full);
        let size = content_header_len(&full);
        // A frame carries 8 bytes besides its payload (type, channel, size,
        // end marker); 0 means no limit.
        let room = usize::try_from(frame_max)
            .unwrap_or(usize::MAX)
            .saturating_sub(FRAME_OVERHEAD);
        if frame_max == 0 || size <= room {
            return full;
        }
        self.reduced.fetch_add(1, Ordering::Relaxed);
        let origin = letter.message.metadata();
        tracing::warn!(
            exchange = self.exchange,
            source = %origin.source(),
            position = %origin.position(),
            header_bytes = size,
            frame_max,
            "the dead letter's headers do not fit in one frame; it is written without the \
             original headers and with its error cut"
        );
        properties(letter, Envelope::Reduced)
    }

    async fn publish(&self, letter: &DeadLetter) -> Result<(), AmqpError> {
        let origin = letter.message.metadata();
        let routing_key = self
            .routing_key
            .as_deref()
            .unwrap_or_else(|| origin.source());
        if self
            .topology
            .routes_into(&self.exchange, Some(routing_key), origin.source())
        {
            return Err(ConfigError::new(
                "routing_key",
                format!(
                    "routes the dead letter back into `{}`, the queue it came from, where it would \
                     be consumed again; publish dead letters to a queue of their own",
                    origin.source()
                ),
            )
            .into());
        }
        let (channel, frame_max) = self.channel().await?;
        let url = &self.url;
        let fail = |error| classify(error, url.endpoint(), url.vhost(), Operation::Other);
        let properties = self.fitting_properties(letter, frame_max);
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
            .map_err(|_| AmqpError::NotConfirmed {
                reason: format!("no publisher confirm within {:?}", self.confirm_timeout),
            })?
            .map_err(fail)?;
        match confirmation {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) => Err(AmqpError::NotConfirmed {
                reason: format!(
                    "no queue is bound to exchange `{}` with routing key `{routing_key}` ({}); declare and bind the dead-letter queue",
                    self.exchange, returned.reply_text
                ),
            }),
            Confirmation::Nack(_) => Err(AmqpError::NotConfirmed {
                reason: format!(
                    "the broker refused it (nack) on exchange `{}`",
                    self.exchange
                ),
            }),
            Confirmation::NotRequested => Err(AmqpError::NotConfirmed {
                reason: "the channel is not in confirm mode".into(),
            }),
        }
    }
}

/// What a dead letter carries of its original.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Envelope {
    /// Everything.
    Full,
    /// What fits the smallest frame: the properties and the origin, short.
    Reduced,
}

/// The prefix of the origin headers intake writes (`x-intake-source`, …).
const ORIGIN_NAMESPACE: &str = "x-intake-";

/// Frame type, channel, payload size and end marker.
const FRAME_OVERHEAD: usize = 8;

/// Properties of the dead letter: persistent, the original properties, the
/// original headers (unless reduced) and the origin headers.
fn properties(letter: &DeadLetter, envelope: Envelope) -> BasicProperties {
    let message = &letter.message;
    let origin = message.metadata();
    let mut properties = BasicProperties::default().with_delivery_mode(PERSISTENT);
    let mut table = FieldTable::default();
    let mut left_out = 0i64;
    for header in message.headers() {
        let property = || ShortString::try_new(String::from_utf8_lossy(&header.value).into_owned());
        match &*header.name {
            headers::MESSAGE_ID => {
                if let Ok(value) = property() {
                    properties = properties.with_message_id(value);
                }
            }
            headers::CORRELATION_ID => {
                if let Ok(value) = property() {
                    properties = properties.with_correlation_id(value);
                }
            }
            headers::CONTENT_TYPE => {
                if let Ok(value) = property() {
                    properties = properties.with_content_type(value);
                }
            }
            _ if envelope == Envelope::Reduced => left_out += 1,
            name => {
                // The origin headers below would replace a producer's of the
                // same name, but not one the origin has no value for (a
                // routing key): intake's namespace is moved aside whole.
                let renamed;
                let name = if name.starts_with(ORIGIN_NAMESPACE) {
                    renamed = format!("{}{name}", headers::DEAD_LETTER_PRODUCER_PREFIX);
                    renamed.as_str()
                } else {
                    name
                };
                match ShortString::try_new(name) {
                    Ok(name) => {
                        table.insert(
                            name,
                            AMQPValue::LongString(LongString::from(header.value.to_vec())),
                        );
                    }
                    Err(_) => tracing::warn!(
                        header = &name[..name.floor_char_boundary(64)],
                        "header name longer than {MAX_NAME_BYTES} bytes left out of the dead letter"
                    ),
                }
            }
        }
    }
    let mut origin_header = |name: &str, value: AMQPValue| {
        table.insert(short(name), value);
    };
    let cut = |bytes: &[u8], limit: usize| -> Vec<u8> {
        match envelope {
            Envelope::Full => bytes.to_vec(),
            Envelope::Reduced => bytes[..bytes.len().min(limit)].to_vec(),
        }
    };
    origin_header(
        headers::DEAD_LETTER_SOURCE,
        AMQPValue::LongString(LongString::from(cut(
            origin.source().as_bytes(),
            MAX_NAME_BYTES,
        ))),
    );
    origin_header(
        headers::DEAD_LETTER_PARTITION,
        AMQPValue::LongLongInt(i64::from(origin.partition())),
    );
    origin_header(
        headers::DEAD_LETTER_POSITION,
        AMQPValue::LongString(LongString::from(origin.position().to_string())),
    );
    if let Some(key) = message.key() {
        origin_header(
            headers::DEAD_LETTER_ROUTING_KEY,
            AMQPValue::LongString(LongString::from(cut(key, MAX_NAME_BYTES))),
        );
    }
    let error = match envelope {
        Envelope::Full => letter.error.as_str(),
        Envelope::Reduced => {
            let error = letter.error.as_str();
            &error[..error.floor_char_boundary(headers::DEAD_LETTER_ERROR_REDUCED_BYTES)]
        }
    };
    origin_header(
        headers::DEAD_LETTER_ERROR,
        AMQPValue::LongString(LongString::from(error)),
    );
    if envelope == Envelope::Reduced {
        origin_header(
            headers::DEAD_LETTER_HEADERS_LEFT_OUT,
            AMQPValue::LongLongInt(left_out),
        );
    }
    origin_header(
        headers::DEAD_LETTER_ATTEMPTS,
        AMQPValue::LongLongInt(i64::from(letter.attempts)),
    );
    let failed_at_ms = letter
        .failed_at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
        });
    origin_header(
        headers::DEAD_LETTER_FAILED_AT_MS,
        AMQPValue::LongLongInt(failed_at_ms),
    );
    properties.with_headers(table)
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
        self.publish(letter).await.map_err(|error| {
            tracing::warn!(
                endpoint = self.url.endpoint(),
                exchange = self.exchange,
                %error,
                "dead letter not confirmed; the original stays unacknowledged"
            );
            DeadLetterError::from(error)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use intake_core::{Headers, Message, Metadata, Position};

    #[tokio::test]
    async fn a_sink_that_routes_into_the_consumed_queue_is_refused_before_connecting() {
        // Nothing listens on port 1: a refusal here is the build's.
        let url = "amqp://guest:guest@127.0.0.1:1/%2f";
        let refused = |builder: AmqpDeadLetterSinkBuilder| async move {
            match builder.consumed_queue("orders").connect().await {
                Err(AmqpError::Config(error)) => error,
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
            .connect()
            .await;
        assert!(
            matches!(elsewhere, Err(AmqpError::Unreachable { .. })),
            "{elsewhere:?}"
        );
    }

    #[test]
    fn a_producers_headers_never_pass_for_the_origin() {
        // The original has no routing key, so the origin has none to set:
        // the producer's own `x-intake-routing-key` must not stand in.
        let headers: Headers = [
            (
                headers::DEAD_LETTER_ROUTING_KEY,
                Bytes::from_static(b"spoofed"),
            ),
            (headers::DEAD_LETTER_SOURCE, Bytes::from_static(b"spoofed")),
            (headers::DEAD_LETTER_ERROR, Bytes::from_static(b"spoofed")),
        ]
        .into_iter()
        .collect();
        let message = Message::new(
            Bytes::from_static(b"{}"),
            Metadata::new("orders".into(), 1, Position::Tag(5)),
        )
        .with_headers(headers);
        let properties = properties(&DeadLetter::new(message, "bad json", 1), Envelope::Full);
        let table = properties.headers().clone().unwrap_or_default();
        let table = table.inner();
        let text = |name: &str| match table.get(name) {
            Some(AMQPValue::LongString(value)) => Some(value.to_string()),
            _ => None,
        };
        assert_eq!(text(headers::DEAD_LETTER_ROUTING_KEY), None);
        assert_eq!(text(headers::DEAD_LETTER_SOURCE).as_deref(), Some("orders"));
        assert_eq!(
            text(headers::DEAD_LETTER_ERROR).as_deref(),
            Some("bad json")
        );
        // Kept, under a name that cannot be taken for the origin.
        let kept = format!(
            "{}{}",
            headers::DEAD_LETTER_PRODUCER_PREFIX,
            headers::DEAD_LETTER_ROUTING_KEY
        );
        assert_eq!(text(&kept).as_deref(), Some("spoofed"));
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
        let properties = properties(&letter, Envelope::Full);
        assert_eq!(
            properties.message_id().as_ref().map(ShortString::as_str),
            Some("m-7")
        );
        assert_eq!(*properties.delivery_mode(), Some(PERSISTENT));
        let table = properties.headers().clone().unwrap_or_default();
        let table = table.inner();
        let text = |name: &str| match table.get(name) {
            Some(AMQPValue::LongString(value)) => value.to_string(),
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(text(headers::DEAD_LETTER_SOURCE), "orders");
        assert_eq!(text(headers::DEAD_LETTER_POSITION), "42");
        assert_eq!(text(headers::DEAD_LETTER_ROUTING_KEY), "orders.eu");
        assert_eq!(text(headers::DEAD_LETTER_ERROR), "bad json");
        assert_eq!(text("tenant"), "acme");
        assert_eq!(
            table.get(headers::DEAD_LETTER_ATTEMPTS),
            Some(&AMQPValue::LongLongInt(4))
        );
        assert_eq!(
            table.get(headers::DEAD_LETTER_PARTITION),
            Some(&AMQPValue::LongLongInt(3))
        );
        assert!(!table.contains_key(headers::MESSAGE_ID));
    }

    #[test]
    fn a_header_name_too_long_for_amqp_is_left_out_even_when_multibyte() {
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
        let properties =
            tracing::subscriber::with_default(subscriber, || properties(&letter, Envelope::Full));
        let table = properties.headers().clone().unwrap_or_default();
        assert!(
            !table
                .inner()
                .keys()
                .any(|key| key.as_str().starts_with('€'))
        );
        assert!(table.contains_key("tenant"));
        assert!(table.contains_key(headers::DEAD_LETTER_SOURCE));
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

    fn any_letter() -> impl proptest::strategy::Strategy<Value = DeadLetter> {
        use proptest::prelude::*;
        let name = prop_oneof![
            ".{0,40}",
            Just(headers::MESSAGE_ID.to_owned()),
            Just(headers::CONTENT_TYPE.to_owned()),
            "[a-z]{300}",
        ];
        (
            proptest::collection::vec(
                (name, proptest::collection::vec(any::<u8>(), 0..3_000)),
                0..8,
            ),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..2_000)),
            ".{0,400}",
            ".{0,5000}",
        )
            .prop_map(|(headers, key, source, error)| letter_with(headers, key, source, error))
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// The size the sink compares with `frame_max` is the size lapin
        /// writes on the wire.
        #[test]
        fn the_computed_header_size_is_what_lapin_encodes(letter in any_letter()) {
            for envelope in [Envelope::Full, Envelope::Reduced] {
                let properties = properties(&letter, envelope);
                let (encoded, _) = cookie_factory::r#gen(
                    lapin::protocol::basic::gen_properties(&properties),
                    Vec::new(),
                )
                .expect("the properties encode");
                // Class, weight and body size precede the properties.
                proptest::prop_assert_eq!(content_header_len(&properties), 12 + encoded.len());
            }
        }

        /// Whatever the original carried, the reduced dead letter fits the
        /// smallest frame a broker may negotiate (4096 bytes).
        #[test]
        fn a_reduced_dead_letter_fits_the_smallest_frame(letter in any_letter()) {
            let properties = properties(&letter, Envelope::Reduced);
            proptest::prop_assert!(content_header_len(&properties) <= 4096 - FRAME_OVERHEAD);
        }
    }
}
