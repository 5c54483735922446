//! The dead-letter envelope: one set of field names, the same on every
//! carrier, that records next to the original message where it came from,
//! why it failed, how often, and when. `docs/DEAD-LETTERS.md` has the table.
//!
//! A sink describes itself once as a [`Carrier`] (its broker, whether its
//! records have a key slot, the group it writes for), builds an [`Envelope`]
//! for each letter, and maps the envelope's `(name, value)` pairs onto its
//! carrier: Kafka headers, Redis stream fields, AMQP headers, memory-broker
//! headers. No sink spells a field name itself. [`read`] (also
//! [`DeadLetter::read`]) turns what any sink wrote back into a
//! [`DeadLetter`].
//!
//! Every name of the envelope starts with `intake.`. A producer's own header
//! in that namespace is carried as `intake.producer.<name>` and restored on
//! read: no producer header can pass for an envelope field (an origin
//! cannot be spoofed), and nothing of the producer's is lost.
//!
//! ```
//! use bytes::Bytes;
//! use intake_core::dead_letter::envelope::{self, Broker, Carrier, Envelope};
//! use intake_core::{DeadLetter, Headers, Message, Metadata, Position};
//!
//! let message = Message::new("{not json", Metadata::new("orders".into(), 2, Position::Offset(41)))
//!     .with_key("customer-7");
//! let letter = DeadLetter::new(message, "expected value at line 1 column 2", 3);
//!
//! // A sink of a carrier with a key slot (a Kafka topic, say).
//! let carrier = Carrier::keyed(Broker::Kafka).with_group("billing");
//! let envelope = Envelope::new(&letter, &carrier);
//! let headers: Headers = envelope
//!     .pairs()
//!     .map(|(name, value)| (name.into_owned(), Bytes::copy_from_slice(value)))
//!     .collect();
//! assert_eq!(headers.get_str(envelope::ORIGIN_SOURCE), Some("orders"));
//! assert_eq!(headers.get_str(envelope::ORIGIN_POSITION), Some("41"));
//!
//! // Read back from what the carrier holds: key slot, payload, headers.
//! let read = DeadLetter::read(envelope.key().cloned(), envelope.payload().clone(), &headers)?;
//! assert_eq!(read.message.metadata().position(), Position::Offset(41));
//! assert_eq!(read.message.key().map(|key| &key[..]), Some(&b"customer-7"[..]));
//! assert_eq!(read.attempts, 3);
//! # Ok::<(), intake_core::dead_letter::EnvelopeError>(())
//! ```

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::{DeadLetter, PayloadReference};
use crate::error::ErrorClass;
use crate::message::{Headers, Message, Metadata, Position, payload_preview};

/// The envelope's version, `1`. A reader refuses a letter of a version it
/// does not know rather than misread it.
pub const VERSION: &str = "intake.dlq.version";
/// The broker the message was consumed from: `kafka`, `redis`, `amqp` or
/// `memory` ([`Broker`]); it says how to read the position.
pub const ORIGIN_BROKER: &str = "intake.origin.broker";
/// The topic, stream or queue the message was consumed from.
pub const ORIGIN_SOURCE: &str = "intake.origin.source";
/// Its partition, in decimal (Redis: 0; AMQP: the channel epoch).
pub const ORIGIN_PARTITION: &str = "intake.origin.partition";
/// Its position in the partition, as the broker prints it: a Kafka or
/// memory offset (`41`), a Redis entry id (`1700000000000-0`), an AMQP
/// delivery tag (`7`).
pub const ORIGIN_POSITION: &str = "intake.origin.position";
/// The consumer group that gave up on it (absent where there is none: AMQP,
/// Redis broadcast mode).
pub const ORIGIN_GROUP: &str = "intake.origin.group";
/// The consumer that gave up on it, where the backend names one (Redis).
pub const ORIGIN_CONSUMER: &str = "intake.origin.consumer";
/// Its key, raw, on carriers without a key slot (Redis, AMQP); absent when
/// it had none. On Kafka and the memory broker the record key is the key.
pub const ORIGIN_KEY: &str = "intake.origin.key";
/// The class of the last failure: `permanent` or `retryable` (retries used
/// up), as [`ErrorClass::as_str`] prints it.
pub const ERROR_CLASS: &str = "intake.error.class";
/// The last failure's text, at most [`DeadLetter::ERROR_LIMIT`] bytes.
pub const ERROR_MESSAGE: &str = "intake.error.message";
/// Attempts made before giving up, in decimal.
pub const ATTEMPTS: &str = "intake.attempts";
/// When the message first failed for good, in milliseconds since the Unix
/// epoch: the incoming message's own `intake.failed.first` when it carries
/// one (a replayed message), otherwise the same as [`FAILED_LAST`].
pub const FAILED_FIRST: &str = "intake.failed.first";
/// When it was given up this time, in milliseconds since the Unix epoch.
pub const FAILED_LAST: &str = "intake.failed.last";
/// How often the message was replayed from a dead-letter destination: the
/// incoming message's own `intake.replays`, 0 without one.
pub const REPLAYS: &str = "intake.replays";
/// How many of the original headers the letter leaves out (a reduced
/// letter: see `docs/DEAD-LETTERS.md`); absent when none are.
pub const HEADERS_OMITTED: &str = "intake.headers.omitted";
/// On a [reference letter](super::PayloadReference): the payload's length.
pub const REFERENCE_PAYLOAD_BYTES: &str = "intake.reference.payload_bytes";
/// On a reference letter: the key's length (0 without a key).
pub const REFERENCE_KEY_BYTES: &str = "intake.reference.key_bytes";
/// On a reference letter: how many headers the message had.
pub const REFERENCE_HEADERS: &str = "intake.reference.headers";
/// On a reference letter: the headers' names and values, in bytes.
pub const REFERENCE_HEADER_BYTES: &str = "intake.reference.header_bytes";

/// The namespace of the envelope's names. A producer's header in it is
/// carried under [`PRODUCER_PREFIX`].
pub const RESERVED_PREFIX: &str = "intake.";
/// A producer's header named `intake.…` is carried as
/// `intake.producer.intake.…` and restored on read.
pub const PRODUCER_PREFIX: &str = "intake.producer.";

/// The version this intake writes and reads.
pub const CURRENT_VERSION: u32 = 1;

/// Every field of the envelope, in the order a sink writes them.
const FIELDS: [&str; 19] = [
    VERSION,
    ORIGIN_BROKER,
    ORIGIN_SOURCE,
    ORIGIN_PARTITION,
    ORIGIN_POSITION,
    ORIGIN_GROUP,
    ORIGIN_CONSUMER,
    ORIGIN_KEY,
    ERROR_CLASS,
    ERROR_MESSAGE,
    ATTEMPTS,
    FAILED_FIRST,
    FAILED_LAST,
    REPLAYS,
    HEADERS_OMITTED,
    REFERENCE_PAYLOAD_BYTES,
    REFERENCE_KEY_BYTES,
    REFERENCE_HEADERS,
    REFERENCE_HEADER_BYTES,
];

/// The most fields an envelope has: a sink that counts what it passes to
/// its broker (Redis's script arguments) can reserve room for them.
pub const MAX_FIELDS: usize = FIELDS.len();

/// The broker a dead-lettered message was consumed from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Broker {
    /// Apache Kafka: positions are offsets.
    Kafka,
    /// Redis Streams: positions are entry ids.
    Redis,
    /// AMQP 0-9-1 (RabbitMQ): positions are delivery tags.
    Amqp,
    /// intake's in-process broker: positions are offsets.
    Memory,
    /// NATS JetStream: positions are stream sequences, carried as offsets.
    Nats,
}

impl Broker {
    /// The name the envelope carries: `kafka`, `redis`, `amqp`, `memory`,
    /// `nats`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Broker::Kafka => "kafka",
            Broker::Redis => "redis",
            Broker::Amqp => "amqp",
            Broker::Memory => "memory",
            Broker::Nats => "nats",
        }
    }

    /// The broker of that name, if intake knows it.
    pub fn from_name(name: &str) -> Option<Self> {
        [
            Broker::Kafka,
            Broker::Redis,
            Broker::Amqp,
            Broker::Memory,
            Broker::Nats,
        ]
        .into_iter()
        .find(|broker| broker.as_str() == name)
    }

    /// The broker a message at `position` came from: `preferred` when its
    /// positions have that form, otherwise the broker whose do (an offset
    /// is Kafka's).
    pub fn of(position: Position, preferred: Broker) -> Self {
        match position {
            _ if preferred.has_positions_like(position) => preferred,
            Position::Offset(_) => Broker::Kafka,
            Position::StreamId { .. } => Broker::Redis,
            Position::Tag(_) => Broker::Amqp,
        }
    }

    fn has_positions_like(self, position: Position) -> bool {
        matches!(
            (self, position),
            (
                Broker::Kafka | Broker::Memory | Broker::Nats,
                Position::Offset(_)
            ) | (Broker::Redis, Position::StreamId { .. })
                | (Broker::Amqp, Position::Tag(_))
        )
    }

    /// `text` as a position of this broker.
    fn position(self, text: &str) -> Option<Position> {
        match self {
            Broker::Kafka | Broker::Memory | Broker::Nats => {
                text.parse().ok().map(Position::Offset)
            }
            Broker::Redis => {
                let (ms, seq) = text.split_once('-')?;
                Some(Position::StreamId {
                    ms: ms.parse().ok()?,
                    seq: seq.parse().ok()?,
                })
            }
            Broker::Amqp => text.parse().ok().map(Position::Tag),
        }
    }
}

impl fmt::Display for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where and by whom a dead-lettered message was consumed, beyond its
/// metadata (source, partition, position).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Origin {
    /// The broker it was consumed from.
    pub broker: Broker,
    /// The consumer group that gave up on it, if the backend has groups.
    pub group: Option<Arc<str>>,
    /// The consumer that gave up on it, where the backend names one.
    pub consumer: Option<Arc<str>>,
}

impl Origin {
    /// A message consumed from `broker`, with no group or consumer named.
    pub fn new(broker: Broker) -> Self {
        Self {
            broker,
            group: None,
            consumer: None,
        }
    }

    /// Names the group that gave up on it.
    pub fn with_group(mut self, group: impl Into<Arc<str>>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Names the consumer that gave up on it.
    pub fn with_consumer(mut self, consumer: impl Into<Arc<str>>) -> Self {
        self.consumer = Some(consumer.into());
        self
    }
}

/// What a sink adds to the letters it writes: the broker its letters come
/// from, whether its records have a key slot, and the group (and consumer)
/// it writes for. Built once per sink.
#[derive(Clone, Debug)]
pub struct Carrier {
    broker: Broker,
    key_slot: bool,
    group: Option<Arc<str>>,
    consumer: Option<Arc<str>>,
}

impl Carrier {
    /// A carrier whose records have a key slot (a Kafka topic, a
    /// memory-broker topic): the letter's record key is the original key,
    /// not repeated in a field.
    pub fn keyed(broker: Broker) -> Self {
        Self {
            broker,
            key_slot: true,
            group: None,
            consumer: None,
        }
    }

    /// A carrier without a key slot (a Redis stream, an AMQP exchange,
    /// whose routing key routes the letter): the original key is carried
    /// in [`ORIGIN_KEY`].
    pub fn keyless(broker: Broker) -> Self {
        Self {
            key_slot: false,
            ..Self::keyed(broker)
        }
    }

    /// Names the consumer group whose letters the sink writes.
    pub fn with_group(mut self, group: impl Into<Arc<str>>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Names the consumer whose letters the sink writes.
    pub fn with_consumer(mut self, consumer: impl Into<Arc<str>>) -> Self {
        self.consumer = Some(consumer.into());
        self
    }

    /// The broker the sink's letters come from.
    pub fn broker(&self) -> Broker {
        self.broker
    }

    /// Whether the carrier's records have a key slot.
    pub fn has_key_slot(&self) -> bool {
        self.key_slot
    }

    /// The group the sink writes for.
    pub fn group(&self) -> Option<&Arc<str>> {
        self.group.as_ref()
    }

    /// The consumer the sink writes for.
    pub fn consumer(&self) -> Option<&Arc<str>> {
        self.consumer.as_ref()
    }
}

/// A dead letter as its carrier holds it: the payload, the key for the key
/// slot, the producer's headers (`intake.…` names moved under
/// [`PRODUCER_PREFIX`]) and the envelope's fields. Built for each write;
/// numbers are formatted once.
pub struct Envelope<'a> {
    letter: &'a DeadLetter,
    key_slot: bool,
    origin: Origin,
    error: Cow<'a, str>,
    /// Where the message was first delivered: a parked copy's origin, not
    /// the place the copy came back through.
    source: &'a str,
    partition: String,
    position: String,
    attempts: String,
    first: String,
    last: String,
    replays: String,
    omitted: u32,
    omitted_text: String,
    reference: Option<[String; 4]>,
    with_headers: bool,
}

impl fmt::Debug for Envelope<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Envelope")
            .field(
                "fields",
                &self.fields().map(|(name, _)| name).collect::<Vec<_>>(),
            )
            .field("headers", &self.header_count())
            .finish_non_exhaustive()
    }
}

impl<'a> Envelope<'a> {
    /// The envelope of `letter` written by a sink of `carrier`.
    ///
    /// The origin is the letter's own when it has one (a letter read back
    /// and written again keeps it), otherwise the carrier's; its source,
    /// partition and position are those of the message's first delivery
    /// ([`Metadata::parked_from`](crate::Metadata::parked_from) of a parked
    /// copy that came back). The error is cut to
    /// [`DeadLetter::ERROR_LIMIT`] bytes.
    pub fn new(letter: &'a DeadLetter, carrier: &Carrier) -> Self {
        let metadata = letter.message.metadata();
        let (source, partition, position) = match metadata.parked_from() {
            Some(first) => (&*first.source, first.partition, first.position),
            None => (
                &**metadata.source(),
                metadata.partition(),
                metadata.position(),
            ),
        };
        let origin = match &letter.origin {
            Some(origin) => Origin {
                broker: Broker::of(position, origin.broker),
                ..origin.clone()
            },
            None => Origin {
                broker: Broker::of(position, carrier.broker),
                group: carrier.group.clone(),
                consumer: carrier.consumer.clone(),
            },
        };
        let reference = letter.reference.map(|sizes| {
            [
                sizes.payload_bytes,
                sizes.key_bytes,
                sizes.headers,
                sizes.header_bytes,
            ]
            .map(|size| size.to_string())
        });
        let omitted = letter.headers_omitted;
        Self {
            letter,
            key_slot: carrier.key_slot,
            origin,
            error: capped_error(&letter.error, DeadLetter::ERROR_LIMIT),
            source,
            partition: partition.to_string(),
            position: position.to_string(),
            attempts: letter.attempts.to_string(),
            first: epoch_millis(letter.first_failed_at).to_string(),
            last: epoch_millis(letter.failed_at).to_string(),
            replays: letter.replays.to_string(),
            omitted,
            omitted_text: omitted.to_string(),
            reference,
            with_headers: true,
        }
    }

    /// The letter this envelope is for.
    pub fn letter(&self) -> &'a DeadLetter {
        self.letter
    }

    /// The payload to write: the original's (empty in a reference letter).
    pub fn payload(&self) -> &'a Bytes {
        self.letter.message.payload()
    }

    /// The key for the record's key slot: the original key on a carrier
    /// with one, `None` on a carrier without (the key is then a field).
    pub fn key(&self) -> Option<&'a Bytes> {
        self.letter.message.key().filter(|_| self.key_slot)
    }

    /// The producer's headers as carried: in their order, a name in the
    /// `intake.` namespace under [`PRODUCER_PREFIX`]; none in a reduced
    /// letter.
    pub fn headers(&self) -> impl Iterator<Item = (Cow<'a, str>, &'a Bytes)> + use<'a> {
        let headers = self.letter.message.headers();
        let shown = if self.with_headers { headers.len() } else { 0 };
        headers
            .iter()
            .take(shown)
            .map(|header| (carried_name(&header.name), &header.value))
    }

    /// How many producer headers [`headers`](Self::headers) yields.
    pub fn header_count(&self) -> usize {
        match self.with_headers {
            true => self.letter.message.headers().len(),
            false => 0,
        }
    }

    /// The envelope's fields, in a fixed order; optional ones only when
    /// they have a value.
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, &[u8])> + '_ {
        let letter = self.letter;
        let key = letter.message.key().filter(|_| !self.key_slot);
        let reference = self.reference.as_ref();
        let values: [Option<&[u8]>; MAX_FIELDS] = [
            Some(VERSION_TEXT.as_bytes()),
            Some(self.origin.broker.as_str().as_bytes()),
            Some(self.source.as_bytes()),
            Some(self.partition.as_bytes()),
            Some(self.position.as_bytes()),
            self.origin.group.as_deref().map(str::as_bytes),
            self.origin.consumer.as_deref().map(str::as_bytes),
            key.map(|key| &key[..]),
            Some(letter.class.as_str().as_bytes()),
            Some(self.error.as_bytes()),
            Some(self.attempts.as_bytes()),
            Some(self.first.as_bytes()),
            Some(self.last.as_bytes()),
            Some(self.replays.as_bytes()),
            (self.omitted > 0).then_some(self.omitted_text.as_bytes()),
            reference.map(|sizes| sizes[0].as_bytes()),
            reference.map(|sizes| sizes[1].as_bytes()),
            reference.map(|sizes| sizes[2].as_bytes()),
            reference.map(|sizes| sizes[3].as_bytes()),
        ];
        FIELDS
            .into_iter()
            .zip(values)
            .filter_map(|(name, value)| value.map(|value| (name, value)))
    }

    /// How many fields [`fields`](Self::fields) yields.
    pub fn field_count(&self) -> usize {
        self.fields().count()
    }

    /// The producer's headers, then the envelope's fields: everything a
    /// carrier without a key slot or payload of its own needs besides the
    /// payload, as `(name, value)` pairs.
    pub fn pairs(&self) -> impl Iterator<Item = (Cow<'a, str>, &[u8])> + '_ {
        self.headers()
            .map(|(name, value)| (name, &value[..]))
            .chain(
                self.fields()
                    .map(|(name, value)| (Cow::Borrowed(name), value)),
            )
    }

    /// The reduced letter for a carrier that cannot take this one: no
    /// producer headers (their number in [`HEADERS_OMITTED`]) and the error
    /// cut to `error_limit` bytes. Origin, times and payload stay whole.
    pub fn reduced(mut self, error_limit: usize) -> Self {
        if self.with_headers {
            self.with_headers = false;
            let headers = self.letter.message.headers().len();
            self.count_omitted(headers);
        }
        self.cap_error(error_limit);
        self
    }

    /// Cuts the error to `limit` bytes (with a note of how much was cut),
    /// for a carrier with less room than [`DeadLetter::ERROR_LIMIT`].
    pub fn cap_error(&mut self, limit: usize) {
        if self.error.len() > limit {
            self.error = Cow::Owned(capped_error(&self.error, limit).into_owned());
        }
    }

    /// Counts `headers` producer headers the carrier could not take (a name
    /// it cannot carry) in [`HEADERS_OMITTED`].
    pub fn count_omitted(&mut self, headers: usize) {
        if headers == 0 {
            return;
        }
        // Saturates: a count past `u32::MAX` still says "that many or more".
        let headers = u32::try_from(headers).unwrap_or(u32::MAX);
        self.omitted = self.omitted.saturating_add(headers);
        self.omitted_text = self.omitted.to_string();
    }

    /// Whether this is a reduced letter.
    pub fn is_reduced(&self) -> bool {
        !self.with_headers
    }
}

/// [`CURRENT_VERSION`] as the envelope carries it.
const VERSION_TEXT: &str = "1";

/// The name a producer's header is carried under.
fn carried_name(name: &str) -> Cow<'_, str> {
    match name.starts_with(RESERVED_PREFIX) {
        true => Cow::Owned(format!("{PRODUCER_PREFIX}{name}")),
        false => Cow::Borrowed(name),
    }
}

/// Milliseconds since the Unix epoch; 0 for earlier times.
fn epoch_millis(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
    })
}

/// The longest note [`capped_error`] appends: `… (` and ` bytes cut)` around
/// the decimal count.
const CUT_NOTE_BYTES: usize = "… (".len() + 20 + " bytes cut)".len();

/// `error` in at most `limit` bytes: cut at a character boundary, with a
/// note of how much was cut. An error already within the limit is left as
/// it is, so capping twice changes nothing.
pub(crate) fn capped_error(error: &str, limit: usize) -> Cow<'_, str> {
    if error.len() <= limit {
        return Cow::Borrowed(error);
    }
    let mut end = limit.saturating_sub(CUT_NOTE_BYTES);
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    let cut = error.len() - end;
    Cow::Owned(format!("{}… ({cut} bytes cut)", &error[..end]))
}

/// Why what a carrier holds cannot be read as a dead letter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// A field every letter has is missing; without [`VERSION`], this is
    /// not an intake dead letter at all.
    #[error("the dead letter has no `{field}` field")]
    Missing {
        /// The missing field.
        field: &'static str,
    },
    /// A field does not hold what it should.
    #[error("the dead letter's `{field}` field holds `{value}`, not {expected}")]
    Malformed {
        /// The field.
        field: &'static str,
        /// A bounded preview of its value.
        value: String,
        /// What it should hold.
        expected: &'static str,
    },
    /// A field appears more than once: the letter was changed after a sink
    /// wrote it, and which value is the origin cannot be told.
    #[error("the dead letter's `{field}` field appears more than once")]
    Duplicate {
        /// The field.
        field: &'static str,
    },
    /// The letter was written by a newer intake; read it with that version.
    #[error("the dead letter's envelope is version {version}; this intake reads version 1")]
    UnsupportedVersion {
        /// The letter's version.
        version: String,
    },
}

/// The fields found among a carrier's headers, by their index in [`FIELDS`].
struct Found<'h> {
    values: [Option<&'h Bytes>; MAX_FIELDS],
}

impl<'h> Found<'h> {
    fn index(field: &'static str) -> usize {
        FIELDS
            .iter()
            .position(|known| *known == field)
            .unwrap_or(MAX_FIELDS)
    }

    fn optional(&self, field: &'static str) -> Option<&'h Bytes> {
        self.values.get(Self::index(field)).copied().flatten()
    }

    fn required(&self, field: &'static str) -> Result<&'h Bytes, EnvelopeError> {
        self.optional(field).ok_or(EnvelopeError::Missing { field })
    }

    fn text(&self, field: &'static str) -> Result<Option<&'h str>, EnvelopeError> {
        self.optional(field)
            .map(|value| {
                std::str::from_utf8(value).map_err(|_| malformed(field, value, "UTF-8 text"))
            })
            .transpose()
    }

    fn required_text(&self, field: &'static str) -> Result<&'h str, EnvelopeError> {
        self.text(field)?.ok_or(EnvelopeError::Missing { field })
    }

    fn number<N: std::str::FromStr>(
        &self,
        field: &'static str,
        expected: &'static str,
    ) -> Result<Option<N>, EnvelopeError> {
        self.optional(field)
            .map(|value| {
                std::str::from_utf8(value)
                    .ok()
                    .and_then(|text| text.parse().ok())
                    .ok_or_else(|| malformed(field, value, expected))
            })
            .transpose()
    }

    fn required_number<N: std::str::FromStr>(
        &self,
        field: &'static str,
        expected: &'static str,
    ) -> Result<N, EnvelopeError> {
        self.number(field, expected)?
            .ok_or(EnvelopeError::Missing { field })
    }

    fn time(&self, field: &'static str) -> Result<SystemTime, EnvelopeError> {
        let value = self.required(field)?;
        let millis: u64 = self.required_number(field, "milliseconds since the Unix epoch")?;
        UNIX_EPOCH
            .checked_add(Duration::from_millis(millis))
            .ok_or_else(|| malformed(field, value, "a time this system can represent"))
    }
}

fn malformed(field: &'static str, value: &[u8], expected: &'static str) -> EnvelopeError {
    EnvelopeError::Malformed {
        field,
        value: payload_preview(value, 64),
        expected,
    }
}

/// Reads a dead letter back from what its carrier holds: the record's key
/// slot (`None` on a carrier without one: Redis, AMQP), the payload, and the
/// headers or fields besides the payload, in the carrier's order.
///
/// The message comes back with its payload, key, producer headers (restored
/// names) and metadata (source, partition, position; the attempt is the
/// letter's attempts; no timestamp), and the letter with its error, class,
/// attempts, times, replays, reference, [`Origin`] and omitted-header count.
/// Names in the `intake.` namespace this version does not know are kept
/// among the headers.
///
/// # Errors
///
/// [`EnvelopeError`] naming the field that is missing, malformed or
/// repeated, or the version this intake cannot read.
pub fn read(
    key_slot: Option<Bytes>,
    payload: Bytes,
    carried: &Headers,
) -> Result<DeadLetter, EnvelopeError> {
    let mut found = Found {
        values: [None; MAX_FIELDS],
    };
    let mut headers: Vec<(Arc<str>, Bytes)> = Vec::with_capacity(carried.len());
    for header in carried {
        let name = &*header.name;
        if let Some(original) = name.strip_prefix(PRODUCER_PREFIX) {
            headers.push((Arc::from(original), header.value.clone()));
            continue;
        }
        match FIELDS.iter().position(|field| *field == name) {
            Some(index) => {
                if found.values[index].replace(&header.value).is_some() {
                    return Err(EnvelopeError::Duplicate {
                        field: FIELDS[index],
                    });
                }
            }
            None => headers.push((header.name.clone(), header.value.clone())),
        }
    }

    let version = found.required(VERSION)?;
    if version.as_ref() != VERSION_TEXT.as_bytes() {
        return Err(EnvelopeError::UnsupportedVersion {
            version: payload_preview(version, 64),
        });
    }
    let broker_name = found.required_text(ORIGIN_BROKER)?;
    let broker = Broker::from_name(broker_name).ok_or_else(|| {
        malformed(
            ORIGIN_BROKER,
            broker_name.as_bytes(),
            "`kafka`, `redis`, `amqp` or `memory`",
        )
    })?;
    let source = found.required_text(ORIGIN_SOURCE)?;
    let partition: u32 = found.required_number(ORIGIN_PARTITION, "a partition number")?;
    let position_text = found.required_text(ORIGIN_POSITION)?;
    let position = broker.position(position_text).ok_or_else(|| {
        malformed(
            ORIGIN_POSITION,
            position_text.as_bytes(),
            match broker {
                Broker::Redis => "a stream entry id",
                Broker::Amqp => "a delivery tag",
                Broker::Kafka | Broker::Memory | Broker::Nats => "an offset",
            },
        )
    })?;
    let class_name = found.required_text(ERROR_CLASS)?;
    let class = error_class(class_name).ok_or_else(|| {
        malformed(
            ERROR_CLASS,
            class_name.as_bytes(),
            "`permanent`, `retryable`, `ignore` or `interrupted`",
        )
    })?;
    let error = found.required_text(ERROR_MESSAGE)?;
    let attempts: u32 = found.required_number(ATTEMPTS, "an attempt count")?;
    let first_failed_at = found.time(FAILED_FIRST)?;
    let failed_at = found.time(FAILED_LAST)?;
    let replays: u32 = found.required_number(REPLAYS, "a replay count")?;
    let headers_omitted: u32 = found
        .number(HEADERS_OMITTED, "a header count")?
        .unwrap_or(0);
    let reference = read_reference(&found)?;
    let origin = Origin {
        broker,
        group: found.text(ORIGIN_GROUP)?.map(Arc::from),
        consumer: found.text(ORIGIN_CONSUMER)?.map(Arc::from),
    };
    let key = found.optional(ORIGIN_KEY).cloned().or(key_slot);

    let metadata = Metadata::new(source.into(), partition, position).with_attempt(attempts);
    let mut message =
        Message::new(payload, metadata).with_headers(headers.into_iter().collect::<Headers>());
    if let Some(key) = key {
        message = message.with_key(key);
    }
    Ok(DeadLetter {
        message,
        error: error.to_owned(),
        class,
        attempts,
        first_failed_at,
        failed_at,
        replays,
        reference,
        origin: Some(origin),
        headers_omitted,
    })
}

/// The reference sizes, when the letter is a reference letter: all four
/// fields or none.
fn read_reference(found: &Found<'_>) -> Result<Option<PayloadReference>, EnvelopeError> {
    let sizes = [
        REFERENCE_PAYLOAD_BYTES,
        REFERENCE_KEY_BYTES,
        REFERENCE_HEADERS,
        REFERENCE_HEADER_BYTES,
    ];
    if sizes.iter().all(|field| found.optional(field).is_none()) {
        return Ok(None);
    }
    let size = |field| found.required_number::<usize>(field, "a size in bytes");
    Ok(Some(PayloadReference {
        payload_bytes: size(REFERENCE_PAYLOAD_BYTES)?,
        key_bytes: size(REFERENCE_KEY_BYTES)?,
        headers: found.required_number(REFERENCE_HEADERS, "a header count")?,
        header_bytes: size(REFERENCE_HEADER_BYTES)?,
    }))
}

fn error_class(name: &str) -> Option<ErrorClass> {
    [
        ErrorClass::Permanent,
        ErrorClass::Retryable,
        ErrorClass::Ignore,
        ErrorClass::Interrupted,
    ]
    .into_iter()
    .find(|class| class.as_str() == name)
}

/// What an incoming message says of an earlier dead-lettering (a message
/// replayed from a dead-letter destination): when it first failed, and how
/// often it was replayed.
pub(super) fn earlier_failure(message: &Message) -> (Option<SystemTime>, u32) {
    let headers = message.headers();
    let number = |name| {
        headers
            .get_str(name)
            .and_then(|text| text.parse::<u64>().ok())
    };
    let first = number(FAILED_FIRST)
        .and_then(|millis| UNIX_EPOCH.checked_add(Duration::from_millis(millis)));
    let replays = number(REPLAYS).map_or(0, |replays| u32::try_from(replays).unwrap_or(u32::MAX));
    (first, replays)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_capped_once_is_not_cut_again() {
        let long = "é".repeat(5_000);
        let capped = capped_error(&long, DeadLetter::ERROR_LIMIT).into_owned();
        assert!(capped.len() <= DeadLetter::ERROR_LIMIT, "{}", capped.len());
        assert!(capped.ends_with(" bytes cut)"), "{capped}");
        assert!(matches!(
            capped_error(&capped, DeadLetter::ERROR_LIMIT),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn every_field_name_is_in_the_reserved_namespace_and_none_is_a_producer_name() {
        for field in FIELDS {
            assert!(field.starts_with(RESERVED_PREFIX), "{field}");
            assert!(!field.starts_with(PRODUCER_PREFIX), "{field}");
        }
    }

    #[test]
    fn a_position_is_read_as_its_broker_prints_it() {
        let cases = [
            (Broker::Kafka, Position::Offset(41)),
            (Broker::Memory, Position::Offset(0)),
            (Broker::Nats, Position::Offset(1)),
            (
                Broker::Redis,
                Position::StreamId {
                    ms: 1_700_000_000_000,
                    seq: 3,
                },
            ),
            (Broker::Amqp, Position::Tag(u64::MAX)),
        ];
        for (broker, position) in cases {
            assert_eq!(broker.position(&position.to_string()), Some(position));
            assert_eq!(Broker::of(position, broker), broker);
        }
        assert_eq!(
            Broker::of(Position::Offset(1), Broker::Redis),
            Broker::Kafka
        );
        assert_eq!(Broker::Redis.position("17"), None);
    }
}
