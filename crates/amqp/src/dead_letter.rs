//! [`AmqpDeadLetterSink`]: publish a copy of the poison message, with its
//! origin, to a dead-letter exchange, and resolve only on the broker's
//! publisher confirm.

use std::fmt;
use std::time::{Duration, SystemTime};

use intake_core::{ConfigError, DeadLetter, DeadLetterError, DeadLetterSink};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use tokio::sync::Mutex;

use crate::connection::open_within;
use crate::error::{AmqpError, Operation, classify};
use crate::headers;
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
/// up. It is published persistent and `mandatory`, and [`write`] resolves
/// only when the broker confirmed it; a message that no queue is bound to
/// receive is an error, not a silent loss. The runtime acknowledges the
/// original only after that, so a failed write leaves it in its queue.
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
    link: Mutex<Option<Link>>,
}

struct Link {
    /// Kept so the connection lives as long as the channel is used.
    _connection: Connection,
    channel: Channel,
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
    topology: Topology,
    connection_name: Option<String>,
    confirm_timeout: Duration,
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
            link: Mutex::new(None),
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
            topology: Topology::new(),
            connection_name: None,
            confirm_timeout: Duration::from_secs(30),
        }
    }

    /// The channel in confirm mode, reconnecting if it is gone.
    async fn channel(&self) -> Result<Channel, AmqpError> {
        let mut link = self.link.lock().await;
        if let Some(live) = link
            .as_ref()
            .filter(|live| live.channel.status().connected())
        {
            return Ok(live.channel.clone());
        }
        *link = None;
        let url = &self.url;
        let fail = |error| classify(error, url.endpoint(), url.vhost(), Operation::Other);
        let connection = open_within(
            url,
            self.connection_name.as_deref(),
            crate::connection::DEFAULT_CONNECT_TIMEOUT,
        )
        .await?;
        let channel = connection.create_channel().await.map_err(fail)?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(fail)?;
        self.topology.declare_on(&channel, url).await?;
        *link = Some(Link {
            _connection: connection,
            channel: channel.clone(),
        });
        Ok(channel)
    }

    async fn publish(&self, letter: &DeadLetter) -> Result<(), AmqpError> {
        let origin = letter.message.metadata();
        let routing_key = self
            .routing_key
            .as_deref()
            .unwrap_or_else(|| origin.source());
        let channel = self.channel().await?;
        let url = &self.url;
        let fail = |error| classify(error, url.endpoint(), url.vhost(), Operation::Other);
        let confirm = channel
            .basic_publish(
                short(&self.exchange),
                ShortString::try_new(routing_key).unwrap_or_default(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                letter.message.payload(),
                properties(letter),
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

/// Properties of the dead letter: persistent, the original properties, the
/// original headers and the origin headers.
fn properties(letter: &DeadLetter) -> BasicProperties {
    let message = &letter.message;
    let origin = message.metadata();
    let mut properties = BasicProperties::default().with_delivery_mode(PERSISTENT);
    let mut table = FieldTable::default();
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
            name => match ShortString::try_new(name) {
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
            },
        }
    }
    let mut origin_header = |name: &str, value: AMQPValue| {
        table.insert(short(name), value);
    };
    origin_header(
        headers::DEAD_LETTER_SOURCE,
        AMQPValue::LongString(LongString::from(origin.source().as_bytes())),
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
            AMQPValue::LongString(LongString::from(key.to_vec())),
        );
    }
    origin_header(
        headers::DEAD_LETTER_ERROR,
        AMQPValue::LongString(LongString::from(letter.error.as_str())),
    );
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
        let properties = properties(&letter);
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
        let properties = tracing::subscriber::with_default(subscriber, || properties(&letter));
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
}
