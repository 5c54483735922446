//! [`NatsDeadLetterSink`]: a poison message is published to a dead-letter
//! subject with the envelope as NATS headers, confirmed by JetStream's
//! publish ack, and only then is the original ended with `+TERM`.
//!
//! # Carrier mapping
//!
//! | envelope | NATS message |
//! |---|---|
//! | payload | payload |
//! | original key (the subject) | header `intake.origin.key` (the letter's subject is the dead-letter subject) |
//! | original headers | headers, a name starting with `Nats-` carried as `intake.nats.<name>` (JetStream would act on `Nats-Msg-Id`, `Nats-Expected-*` in a publish) |
//! | envelope fields | headers; `intake.origin.broker` is `nats` |
//!
//! A NATS header value is text without line breaks: a line break in the
//! error text is written as `\n`; an original header that cannot be carried
//! (a name NATS refuses) is left out and counted in
//! `intake.headers.omitted`. JetStream stores at most 64 KiB of headers
//! with a message: a letter whose headers pass that is written reduced,
//! without the original headers (their count in `intake.headers.omitted`,
//! the error cut to 1 KiB). A letter larger than the server's
//! `max_payload` is rejected, so the dead-letter layer writes its
//! reference letter instead.
//!
//! # Reference letters and the stream's retention
//!
//! A reference letter has no payload: the original must stay where it
//! is. The sink reads the consumed stream's retention when it is built:
//!
//! - **limits** (the default): a terminated message stays stored until the
//!   stream's limits (`max_age`, `max_msgs`, `max_bytes`) remove it. The
//!   reference letter is written, its error text saying where the original
//!   is (stream and sequence) and for how long, and the original is
//!   terminated.
//! - **work-queue** or **interest**: the server deletes a message once it
//!   is acknowledged or terminated (on interest, once every consumer did),
//!   so after a reference letter the payload would be nowhere. The sink
//!   refuses such a reference (`DeadLetterError::rejected`): the
//!   dead-letter layer's fallback decides, by default the message is left
//!   unacknowledged and delivered again, logged at error, until an
//!   operator moves it or the letter fits (review R11). The same holds for
//!   a retention the sink could not read.
//!
//! # The broker's name
//!
//! A letter says `nats` as its origin's broker ([`Broker::Nats`]), its
//! position the stream sequence. See `docs/DEAD-LETTERS.md`.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::{HeaderMap, HeaderName, HeaderValue, Subject};
use bytes::Bytes;
use intake_core::dead_letter::envelope::{self, Broker, Carrier, Envelope, EnvelopeError};
use intake_core::{
    DeadLetter, Headers, Message, SourceName,
    backend::{DeadLetterError, DeadLetterSink},
};

use crate::acker::sequence;
use crate::confirm::Confirmations;
use crate::connection::Connection;
use crate::counters::NatsCounters;
use crate::deliveries::Deliveries;
use crate::error::{Error, boxed};

/// The name `intake.origin.broker` carries for a letter from NATS.
pub const BROKER_NAME: &str = "nats";
/// Original headers named `Nats-…` are carried under this prefix.
pub const NATS_HEADER_PREFIX: &str = "intake.nats.";
/// The most bytes of headers JetStream stores with a message (the server
/// refuses more: `header size exceeds maximum allowed of 64k`, 10097).
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// The error text of a reduced letter, as on AMQP.
const REDUCED_ERROR_BYTES: usize = 1024;

/// The default dead-letter subject of consumer `consumer` of `stream`.
pub fn default_subject(stream: &str, consumer: &str) -> String {
    format!("{stream}.{consumer}.dlq")
}

/// The default dead-letter stream of `stream`: it stores the default
/// subjects of every consumer of the stream (`<stream>.*.dlq`).
pub fn default_stream(stream: &str) -> String {
    format!("{stream}_dlq")
}

/// Builds a [`NatsDeadLetterSink`]; get one from
/// [`NatsSource::dead_letter_sink`](crate::NatsSource::dead_letter_sink),
/// prefilled with the source's connection, stream and consumer.
#[must_use]
pub struct NatsDeadLetterSinkBuilder {
    connection: Connection,
    source_stream: String,
    consumer: Option<String>,
    subject: Option<String>,
    stream: Option<String>,
    create_stream: bool,
    deliveries: Arc<Deliveries>,
    counters: Arc<NatsCounters>,
    confirm_timeout: Duration,
}

impl std::fmt::Debug for NatsDeadLetterSinkBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsDeadLetterSinkBuilder")
            .field("endpoint", &self.connection.endpoint)
            .field("source_stream", &self.source_stream)
            .field("consumer", &self.consumer)
            .field("subject", &self.subject)
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

impl NatsDeadLetterSinkBuilder {
    pub(crate) fn new(
        connection: Connection,
        source_stream: String,
        consumer: Option<String>,
        deliveries: Arc<Deliveries>,
        counters: Arc<NatsCounters>,
        confirm_timeout: Duration,
    ) -> Self {
        Self {
            connection,
            source_stream,
            consumer,
            subject: None,
            stream: None,
            create_stream: true,
            deliveries,
            counters,
            confirm_timeout,
        }
    }

    /// Publishes letters to `subject` (default `<stream>.<consumer>.dlq`).
    pub fn subject(mut self, subject: impl Into<String>) -> Self {
        self.subject = Some(subject.into());
        self
    }

    /// The stream to create for the subject when no stream stores it yet
    /// (default `<stream>_dlq`, storing `<stream>.*.dlq` for the default
    /// subject, the subject alone otherwise).
    pub fn stream(mut self, stream: impl Into<String>) -> Self {
        self.stream = Some(stream.into());
        self
    }

    /// Fails the build instead of creating a stream when no stream stores
    /// the subject.
    pub fn no_create(mut self) -> Self {
        self.create_stream = false;
        self
    }

    /// How long a letter's publish ack and the original's term may take
    /// (default the source's ack timeout).
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// Checks the destination (creating its stream if missing) and returns
    /// the sink.
    ///
    /// # Errors
    ///
    /// [`Error::DeadLetterLoop`] when the consumed stream itself stores the
    /// subject; [`Error::JetStream`] when the stream cannot be found or
    /// created.
    pub async fn build(self) -> Result<NatsDeadLetterSink, Error> {
        let endpoint = self.connection.endpoint.to_string();
        let default = self.subject.is_none();
        let subject = match self.subject {
            Some(subject) => subject,
            None => match &self.consumer {
                Some(consumer) => default_subject(&self.source_stream, consumer),
                None => format!("{}.dlq", self.source_stream),
            },
        };
        let context = jetstream::new(self.connection.client.clone());
        let stored_by = match context.stream_by_subject(subject.clone()).await {
            Ok(stream) => Some(stream),
            Err(error)
                if error.kind() == jetstream::context::GetStreamByNameErrorKind::NotFound =>
            {
                None
            }
            Err(error) => {
                return Err(Error::JetStream {
                    endpoint,
                    operation: format!("say which stream stores dead-letter subject `{subject}`"),
                    transient: true,
                    source: boxed(error),
                });
            }
        };
        let stream = match stored_by {
            Some(stream) if stream == self.source_stream => {
                return Err(Error::DeadLetterLoop { subject, stream });
            }
            Some(stream) => stream,
            None if !self.create_stream => {
                return Err(Error::JetStream {
                    endpoint,
                    operation: format!("find a stream storing dead-letter subject `{subject}`"),
                    transient: false,
                    source: "no stream stores the subject; create one or allow the sink to".into(),
                });
            }
            None => {
                let name = self
                    .stream
                    .clone()
                    .unwrap_or_else(|| default_stream(&self.source_stream));
                let subjects = match default {
                    true => vec![format!("{}.*.dlq", self.source_stream)],
                    false => vec![subject.clone()],
                };
                let config = jetstream::stream::Config {
                    name: name.clone(),
                    subjects,
                    storage: jetstream::stream::StorageType::File,
                    ..Default::default()
                };
                context
                    .get_or_create_stream(config)
                    .await
                    .map_err(|error| Error::JetStream {
                        endpoint: endpoint.clone(),
                        operation: format!(
                            "create dead-letter stream `{name}` for subject `{subject}`"
                        ),
                        transient: false,
                        source: boxed(error),
                    })?;
                tracing::info!(stream = %name, %subject, "created the dead-letter stream");
                name
            }
        };
        let origin_retention = match context.get_stream(&self.source_stream).await {
            Ok(mut stream) => match stream.info().await {
                Ok(info) => OriginRetention::of(info.config.retention),
                Err(error) => OriginRetention::unknown(&self.source_stream, &error),
            },
            Err(error) => OriginRetention::unknown(&self.source_stream, &error),
        };
        let mut carrier = Carrier::keyless(Broker::Nats);
        if let Some(consumer) = &self.consumer {
            carrier = carrier.with_group(consumer.as_str());
        }
        Ok(NatsDeadLetterSink {
            context,
            subject: Subject::from(subject),
            stream,
            carrier,
            source_stream: self.source_stream.as_str().into(),
            origin_retention,
            deliveries: self.deliveries,
            counters: self.counters,
            terms: tokio::sync::Mutex::new(Confirmations::new(self.connection.client.clone())),
            client: self.connection.client,
            endpoint,
            confirm_timeout: self.confirm_timeout,
        })
    }
}

/// Whether the consumed stream keeps a message once it is terminated: what
/// a reference letter relies on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OriginRetention {
    /// Limits retention: kept until the stream's limits remove it.
    Keeps,
    /// Work-queue or interest retention (named), or a retention the sink
    /// could not read: deleted once acknowledged or terminated, as far as
    /// the sink knows.
    Deletes(&'static str),
}

impl OriginRetention {
    fn of(retention: jetstream::stream::RetentionPolicy) -> Self {
        match retention {
            jetstream::stream::RetentionPolicy::Limits => Self::Keeps,
            jetstream::stream::RetentionPolicy::WorkQueue => Self::Deletes("work-queue"),
            jetstream::stream::RetentionPolicy::Interest => Self::Deletes("interest"),
        }
    }

    fn unknown(stream: &str, error: &dyn std::fmt::Display) -> Self {
        tracing::warn!(
            %stream,
            %error,
            "could not read the consumed stream's retention: reference letters for its messages \
             are refused (their original may be deleted once terminated)"
        );
        Self::Deletes("unknown")
    }
}

/// Publishes dead letters to a JetStream subject, confirmed, then terms the
/// original. See `docs/DEAD-LETTERS.md`.
pub struct NatsDeadLetterSink {
    context: jetstream::Context,
    client: async_nats::Client,
    subject: Subject,
    stream: String,
    carrier: Carrier,
    source_stream: SourceName,
    origin_retention: OriginRetention,
    deliveries: Arc<Deliveries>,
    counters: Arc<NatsCounters>,
    terms: tokio::sync::Mutex<Confirmations>,
    endpoint: String,
    confirm_timeout: Duration,
}

impl std::fmt::Debug for NatsDeadLetterSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsDeadLetterSink")
            .field("endpoint", &self.endpoint)
            .field("subject", &self.subject)
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

impl NatsDeadLetterSink {
    /// The subject letters are published to.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// The stream that stores them.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// `letter` as NATS headers and payload: whole, or reduced (without the
    /// original headers) when its headers pass JetStream's limit for a
    /// message's header block; rejected when even that is over the limit
    /// or the whole is over the server's `max_payload`.
    fn message(&self, letter: &DeadLetter) -> Result<(HeaderMap, Bytes), DeadLetterError> {
        let envelope = Envelope::new(letter, &self.carrier);
        let (headers, header_bytes) = self.headers(&envelope)?;
        let (headers, header_bytes) = match header_bytes > MAX_HEADER_BYTES {
            false => (headers, header_bytes),
            true => {
                let noted = self.reduced_note(letter);
                let letter = noted.as_ref().unwrap_or(letter);
                let reduced = Envelope::new(letter, &self.carrier).reduced(REDUCED_ERROR_BYTES);
                let (headers, header_bytes) = self.headers(&reduced)?;
                if header_bytes > MAX_HEADER_BYTES {
                    return Err(DeadLetterError::rejected(format!(
                        "the letter's envelope alone is {header_bytes} bytes of headers, over JetStream's {MAX_HEADER_BYTES}"
                    )));
                }
                tracing::warn!(
                    omitted = letter.message.headers().len(),
                    "a dead letter's headers pass JetStream's limit: written without the original headers (counted in intake.headers.omitted)"
                );
                (headers, header_bytes)
            }
        };
        let payload = envelope.payload().clone();
        let size = payload.len() + header_bytes;
        let max_payload = self.client.server_info().max_payload;
        if max_payload > 0 && size > max_payload {
            return Err(DeadLetterError::rejected(format!(
                "the letter is {size} bytes, over the server's max_payload of {max_payload}"
            )));
        }
        Ok((headers, payload))
    }

    /// The envelope's headers and the size of their header block.
    fn headers(&self, envelope: &Envelope<'_>) -> Result<(HeaderMap, usize), DeadLetterError> {
        let mut omitted = 0;
        let mut headers = HeaderMap::new();
        let mut size = "NATS/1.0\r\n\r\n".len();
        for (name, value) in envelope.headers() {
            let name = match name.starts_with("Nats-") || name.starts_with("nats-") {
                true => format!("{NATS_HEADER_PREFIX}{name}"),
                false => name.into_owned(),
            };
            match (
                HeaderName::try_from(name.as_str()),
                header_value(value, false),
            ) {
                (Ok(header), Some(value)) => {
                    size += name.len() + value.as_str().len() + 4;
                    headers.append(header, value);
                }
                _ => omitted += 1,
            }
        }
        let mut fields = Vec::with_capacity(envelope::MAX_FIELDS);
        let omitted_text;
        for (name, value) in envelope.fields() {
            let value = match name {
                envelope::ERROR_MESSAGE => header_value(value, true),
                envelope::HEADERS_OMITTED if omitted > 0 => None,
                _ => header_value(value, false),
            };
            if name == envelope::HEADERS_OMITTED && omitted > 0 {
                continue;
            }
            let Some(value) = value else {
                return Err(DeadLetterError::rejected(format!(
                    "envelope field `{name}` is no NATS header value (not UTF-8, or a line break)"
                )));
            };
            fields.push((name, value));
        }
        if omitted > 0 {
            // The envelope's own count (a reduced letter's) plus the headers
            // NATS cannot carry.
            let counted = envelope
                .fields()
                .find(|(name, _)| *name == envelope::HEADERS_OMITTED)
                .and_then(|(_, value)| std::str::from_utf8(value).ok()?.parse::<u64>().ok())
                .unwrap_or(0);
            omitted_text = (counted + omitted as u64).to_string();
            fields.push((
                envelope::HEADERS_OMITTED,
                HeaderValue::from(omitted_text.as_str()),
            ));
            tracing::warn!(
                omitted,
                "a dead letter leaves out headers NATS cannot carry (counted in intake.headers.omitted)"
            );
        }
        for (name, value) in fields {
            size += name.len() + value.as_str().len() + 4;
            headers.append(HeaderName::from_static(name), value);
        }
        Ok((headers, size))
    }

    /// Ends the original of a letter written for this consumer with
    /// `+TERM`, confirmed. Best effort: the runtime acknowledges it anyway
    /// once the write returned.
    async fn term(&self, letter: &DeadLetter) {
        let metadata = letter.message.metadata();
        if letter.origin.is_some() || metadata.source() != &self.source_stream {
            return;
        }
        let Some(sequence) = sequence(metadata.position()) else {
            return;
        };
        let Some(held) = self.deliveries.get(sequence) else {
            return;
        };
        let mut terms = self.terms.lock().await;
        match terms
            .send(
                [(held.reply, Bytes::from_static(b"+TERM"))],
                self.confirm_timeout,
            )
            .await
        {
            Ok(()) => self.counters.add_term(),
            Err(unconfirmed) => tracing::warn!(
                sequence,
                error = %unconfirmed.into_error(&self.endpoint, "a term", self.confirm_timeout),
                "the original of a dead letter was not terminated; it is acknowledged instead"
            ),
        }
    }
}

/// `bytes` as a NATS header value: UTF-8 without line breaks. With
/// `escape`, line breaks are written as `\r` and `\n` instead of refused.
fn header_value(bytes: &[u8], escape: bool) -> Option<HeaderValue> {
    let text = std::str::from_utf8(bytes).ok()?;
    if !text.contains(['\r', '\n']) {
        return text.parse().ok();
    }
    if !escape {
        return None;
    }
    text.replace('\r', "\\r").replace('\n', "\\n").parse().ok()
}

/// `error` followed by `note`, in at most [`DeadLetter::ERROR_LIMIT`]
/// bytes: the error is cut (at a character boundary) to make room.
fn with_note(error: &str, note: &str) -> String {
    let room = DeadLetter::ERROR_LIMIT.saturating_sub(note.len() + 1);
    let mut end = error.len().min(room);
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} {note}", &error[..end])
}

impl NatsDeadLetterSink {
    /// `letter`, of a message of the consumed stream, with a note (first,
    /// so that the reduced letter's cut keeps it) of where the original
    /// headers it leaves out are: with the original while the stream's
    /// limits keep it, or lost on a stream that deletes it once terminated.
    fn reduced_note(&self, letter: &DeadLetter) -> Option<DeadLetter> {
        let metadata = letter.message.metadata();
        if letter.origin.is_some() || metadata.source() != &self.source_stream {
            return None;
        }
        let note = match self.origin_retention {
            OriginRetention::Keeps => format!(
                "[a reduced letter: the original headers did not fit; they stay with the original \
                 in stream `{}` at sequence {} while the stream's limits keep it]",
                self.source_stream,
                metadata.position()
            ),
            OriginRetention::Deletes(retention) => format!(
                "[a reduced letter: the original headers did not fit and are not kept anywhere: \
                 the stream's retention ({retention}) deletes the original once it is terminated]"
            ),
        };
        let mut noted = letter.clone();
        noted.error = format!("{note} {}", letter.error);
        Some(noted)
    }

    /// A reference letter for a message of the consumed stream, as it may
    /// be written: with a note of where its original stays, on a stream
    /// that keeps it; refused on one that deletes it once terminated.
    fn reference(&self, letter: &DeadLetter) -> Result<Option<DeadLetter>, DeadLetterError> {
        let metadata = letter.message.metadata();
        if letter.reference.is_none()
            || letter.origin.is_some()
            || metadata.source() != &self.source_stream
        {
            return Ok(None);
        }
        match self.origin_retention {
            OriginRetention::Keeps => {
                let mut noted = letter.clone();
                noted.error = with_note(
                    &letter.error,
                    &format!(
                        "[a reference letter: the letter did not fit the dead-letter subject; the \
                         original stays in stream `{}` at sequence {} while the stream's limits keep it]",
                        self.source_stream,
                        metadata.position()
                    ),
                );
                Ok(Some(noted))
            }
            OriginRetention::Deletes(retention) => {
                tracing::error!(
                    stream = %self.source_stream,
                    position = %metadata.position(),
                    retention,
                    "a reference letter is refused: the stream deletes the original once it is \
                     terminated, so the payload would be nowhere; the message stays in the stream"
                );
                Err(DeadLetterError::rejected(format!(
                    "a reference letter for sequence {} of stream `{}` is refused: its retention \
                     ({retention}) deletes the original once it is terminated, and the letter \
                     itself does not fit",
                    metadata.position(),
                    self.source_stream
                )))
            }
        }
    }
}

#[async_trait::async_trait]
impl DeadLetterSink for NatsDeadLetterSink {
    async fn write(&self, letter: &DeadLetter) -> Result<(), DeadLetterError> {
        let noted = self.reference(letter)?;
        let letter = noted.as_ref().unwrap_or(letter);
        let (headers, payload) = self.message(letter)?;
        let published = tokio::time::timeout(self.confirm_timeout, async {
            self.context
                .publish_with_headers(self.subject.clone(), headers, payload)
                .await
                .map_err(boxed)?
                .await
                .map_err(boxed)
        })
        .await
        .map_err(|_| {
            DeadLetterError::from(Error::Unconfirmed {
                endpoint: self.endpoint.clone(),
                what: format!("a dead letter on `{}`", self.subject),
                waited: self.confirm_timeout,
            })
        })?
        .map_err(|source: intake_core::BoxError| {
            DeadLetterError::from(Error::JetStream {
                endpoint: self.endpoint.clone(),
                operation: format!("store a dead letter on `{}`", self.subject),
                transient: true,
                source,
            })
        })?;
        if published.stream == *self.source_stream {
            tracing::error!(
                subject = %self.subject,
                stream = %published.stream,
                "a dead letter was stored by the consumed stream itself; it will be consumed again"
            );
        }
        self.term(letter).await;
        Ok(())
    }
}

/// Reads back a dead letter consumed from a dead-letter stream (with a
/// [`NatsSource`](crate::NatsSource), or any client whose message you turn
/// into an intake [`Message`]): the original payload, key, headers and
/// origin, the error, class, attempts and times.
///
/// Headers named `Nats-…` come back under their own names (the letter
/// carries them as `intake.nats.…`, since JetStream acts on them in a
/// publish).
///
/// # Errors
///
/// [`EnvelopeError`] naming the field that is missing, malformed or
/// repeated.
pub fn read_dead_letter(message: &Message) -> Result<DeadLetter, EnvelopeError> {
    let headers: Headers = message
        .headers()
        .iter()
        .map(|header| {
            let name: Arc<str> = match header.name.strip_prefix(NATS_HEADER_PREFIX) {
                Some(original) => original.into(),
                None => header.name.clone(),
            };
            (name, header.value.clone())
        })
        .collect();
    DeadLetter::read(None, message.payload().clone(), &headers)
}
