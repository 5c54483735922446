//! The dead-letter sinks. [`AmqpDeadLetterSink`]: publish a copy of the
//! poison message, with its origin, to a dead-letter exchange, and resolve
//! only on the broker's publisher confirm. [`BrokerDeadLetterSink`]
//! (`broker_rejection.rs`): reject it without requeue into the queue's own
//! dead-letter exchange.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use intake_core::dead_letter::envelope::Carrier;
use intake_core::{
    ConfigError, DeadLetter, Position,
    backend::{DeadLetterError, DeadLetterSink},
};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::ShortString;
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use tokio::sync::Mutex;

use crate::connection::open_within;
use crate::error::{Error, Operation, classify};
use crate::tls::Tls;
use crate::topology::{Topology, short};
use crate::url::AmqpUrl;

mod broker_rejection;
mod builder;
mod frame;
mod read;
#[cfg(test)]
mod tests;

pub use broker_rejection::BrokerDeadLetterSink;
pub use builder::AmqpDeadLetterSinkBuilder;
pub use read::read_dead_letter;
pub(crate) use read::read_stored;

use self::frame::{Fit, fitting};

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
/// [`BrokerDeadLetterSink`].
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
    connect_timeout: Duration,
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

impl AmqpDeadLetterSink {
    /// Starts building a sink for the broker `settings` describe (a URL
    /// alone converts into [`AmqpSettings`](crate::AmqpSettings)). For the
    /// dead letters of an [`AmqpSource`](crate::AmqpSource), start from
    /// [`AmqpSource::dead_letter_sink`](crate::AmqpSource::dead_letter_sink)
    /// instead: it knows the broker's settings and what the source
    /// consumes.
    pub fn builder(settings: impl Into<crate::AmqpSettings>) -> AmqpDeadLetterSinkBuilder {
        AmqpDeadLetterSinkBuilder::new(settings.into())
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
            self.connect_timeout,
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
