//! [`RedisDeadLetterSink`]: poison messages go to a dead-letter stream with
//! their origin, and leave the pending list in the same atomic step.
//!
//! The write and the acknowledgement run as one Lua script rather than a
//! `MULTI`/`EXEC` transaction. Both are atomic, so a crash can neither leave
//! the copy without the acknowledgement (a duplicate) nor the reverse (a
//! loss). But Redis does not roll a transaction back when one of its
//! commands fails at run time: an `XADD` refused with `WRONGTYPE` (the
//! dead-letter key holds a string) would fail while the `XACK` after it
//! still ran, and the message would be gone. A script stops at the first
//! failing call, so the original is acknowledged only if its copy was
//! written.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, LazyLock};

use intake_core::dead_letter::envelope::{Broker, Carrier, Envelope};
use intake_core::{
    ConfigError, DeadLetter, FirstDelivery,
    backend::{DeadLetterError, DeadLetterSink},
    parking::{ORIGIN, first_delivery_of},
};
use redis::Script;

use crate::connection::SharedConnection;
use crate::counters::RedisCounters;
use crate::error::Error;
use crate::settings::RedisSettings;
use crate::source::settings::{
    DEFAULT_PAYLOAD_FIELD, DeadLetterStream, Settings, default_consumer_name,
};
use crate::stream_id::StreamId;

/// Most field names and values a dead letter passes to Redis in one script
/// call, the envelope's fields included. Lua's `unpack` (and any call from a
/// script) fails near 8,000 values; an entry with more fields than fit is
/// written as a reduced letter: its payload and the envelope, without its
/// other fields (their number in `intake.headers.omitted`), counted in
/// [`RedisCounters::dead_letters_reduced`], rather than failing on every
/// attempt. Size is no limit of its own: every value is a copy of one Redis
/// already stored.
pub const MAX_DEAD_LETTER_VALUES: usize = 7_000;

/// `KEYS[1]` dead-letter stream, `KEYS[2]` source stream; `ARGV[1]` group,
/// `ARGV[2]` original id (empty: nothing to acknowledge), then the fields.
///
/// Returns the letter's id, or nil when the original is no longer pending
/// in the group: a write whose reply was lost (a call dropped midway, a
/// timeout) already wrote and acknowledged it, and writing again would
/// duplicate the letter. An error from `XPENDING` (the group is gone) does
/// not stop the write: the letter is all that is left of the entry then.
static WRITE_AND_ACK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if ARGV[2] ~= '' then
  local pending = redis.pcall('XPENDING', KEYS[2], ARGV[1], ARGV[2], ARGV[2], 1)
  if type(pending) == 'table' and pending.err == nil and #pending == 0 then
    return false
  end
end
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
if ARGV[2] ~= '' then
  redis.call('XACK', KEYS[2], ARGV[1], ARGV[2])
end
return id
",
    )
});

/// Writes dead letters to a Redis stream (`<stream>:dlq` by default) and
/// acknowledges the original entry atomically.
///
/// A dead letter is an entry of the payload field, the original's other
/// fields (a name in the `intake.` namespace as `intake.producer.<name>`, so
/// none passes for the origin) and the dead-letter
/// [envelope](intake_core::dead_letter::envelope): origin (stream, id,
/// group, consumer, key), error class and text, attempts and times.
/// `docs/DEAD-LETTERS.md` has the table; [`DeadLetter::read`] with no key
/// slot reads an entry of the stream back.
///
/// A parked copy that came back through its group's return stream
/// (`<stream>:<group>:returned`, see [`RedisParking`](crate::RedisParking))
/// is a dead letter of the entry it was first delivered as: it goes to the
/// dead-letter stream of the stream it was first consumed from, and its
/// origin names that stream and that entry's id, as the copy's park fields
/// say ([`ORIGIN`](intake_core::parking::ORIGIN),
/// [`ORIGIN_POSITION`](intake_core::parking::ORIGIN_POSITION)); the copy
/// itself is what the letter acknowledges. A copy that names its origin
/// stream but not the entry (parked by hand, or by an intake before the
/// field) names where it is: the return stream and its id there, never a
/// mix of the two. The fields are followed only on an entry read from the
/// return stream of the stream they name, for the sink's group (the default
/// name, or one set with
/// [`return_stream`](RedisDeadLetterSinkBuilder::return_stream)), and only
/// to one of the [consumed streams](RedisDeadLetterSinkBuilder::consumed_stream):
/// on any other entry a producer wrote them, and the letter is the entry's
/// own. A letter whose message the parking layer marked as a returned copy
/// ([`Metadata::parked_from`](intake_core::Metadata::parked_from), a
/// dead-letter layer inside the parking layer) names that first delivery.
///
/// # Reference letters
///
/// When a letter cannot be written, the dead-letter layer asks for a
/// reference letter instead: origin and sizes, no payload, "the original is
/// at its origin". The sink refuses it ([`Error::ReferenceNotWritten`],
/// logged at error level) where the entry it would name goes away with the
/// acknowledgement that follows: under the source's
/// [`delete_acked`](crate::RedisStreamsSourceBuilder::delete_acked), and
/// for a parked copy in a return stream that names no first delivery (the
/// mover trims acknowledged copies). The policy's fallback then decides;
/// without one the entry stays pending, is claimed again after
/// `claim_min_idle`, and is dead-lettered whole once the destination takes
/// it (past `max_deliveries`, by the source). A stream that producers trim
/// (`XADD MAXLEN`) keeps a reference's original only until it is trimmed:
/// the sink cannot see that.
///
/// Build one with
/// [`RedisStreamsSource::dead_letter_sink`](crate::RedisStreamsSource::dead_letter_sink)
/// (prefilled from the source) or [`RedisDeadLetterSink::builder`], and
/// hand it to the dead-letter layer; it is cheap to clone.
#[derive(Clone)]
pub struct RedisDeadLetterSink {
    connection: SharedConnection,
    destination: Arc<Destination>,
}

/// Where a sink writes, and what it writes into each letter.
struct Destination {
    /// The group whose pending entry a letter acknowledges; `None` for a
    /// broadcast reader's letters (nothing to acknowledge).
    group: Option<Arc<str>>,
    payload_field: Arc<str>,
    stream: DeadLetterStream,
    /// The streams the consumer reads: the only origins a parked copy's
    /// field may name.
    consumed: HashSet<String>,
    /// Return streams set by hand: (origin, return stream).
    returns: Vec<(String, String)>,
    /// Whether the consumer deletes the entries of the consumed streams
    /// once acknowledged (its source's `delete_acked`).
    deletes_acked: bool,
    carrier: Carrier,
    counters: Arc<RedisCounters>,
}

impl fmt::Debug for RedisDeadLetterSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisDeadLetterSink")
            .field("endpoint", self.connection.connector().endpoint())
            .field("group", &self.destination.group)
            .field("dead_letter_stream", &self.destination.stream)
            .finish()
    }
}

impl RedisDeadLetterSink {
    /// A builder of a sink on a connection of its own to the server of
    /// `settings` (a [`RedisSettings`], or just the URL), for a process that writes dead letters without consuming
    /// (a consumer's is [`RedisStreamsSource::dead_letter_sink`]). Name the
    /// group whose entries it acknowledges with
    /// [`group`](RedisDeadLetterSinkBuilder::group) and the streams those
    /// entries come from with
    /// [`consumed_stream`](RedisDeadLetterSinkBuilder::consumed_stream).
    ///
    /// [`RedisStreamsSource::dead_letter_sink`]: crate::RedisStreamsSource::dead_letter_sink
    pub fn builder(settings: impl Into<RedisSettings>) -> RedisDeadLetterSinkBuilder {
        RedisDeadLetterSinkBuilder::new(settings.into())
    }

    /// The sink a source writes its own dead letters with (past
    /// `max_deliveries`, no payload field), on the source's connection.
    pub(crate) fn new(connection: SharedConnection, settings: &Settings) -> Self {
        Self::on(
            connection,
            settings.group.clone(),
            settings.consumer.clone(),
            settings.payload_field.clone(),
            settings.dead_letter_stream.clone(),
            settings
                .streams
                .iter()
                .map(|stream| stream.to_string())
                .collect(),
            Vec::new(),
            settings.delete_acked,
            settings.counters.clone(),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn on(
        connection: SharedConnection,
        group: Option<Arc<str>>,
        consumer: Arc<str>,
        payload_field: Arc<str>,
        stream: DeadLetterStream,
        consumed: HashSet<String>,
        returns: Vec<(String, String)>,
        deletes_acked: bool,
        counters: Arc<RedisCounters>,
    ) -> Self {
        let carrier = Carrier::keyless(Broker::Redis).with_consumer(consumer);
        let carrier = match &group {
            Some(group) => carrier.with_group(group.clone()),
            None => carrier,
        };
        Self {
            connection,
            destination: Arc::new(Destination {
                group,
                payload_field,
                stream,
                consumed,
                returns,
                deletes_acked,
                carrier,
                counters,
            }),
        }
    }

    /// The counters of the consumer this sink belongs to.
    pub(crate) fn counters(&self) -> &RedisCounters {
        &self.destination.counters
    }

    /// The dead-letter stream for entries of `stream`.
    pub fn stream_for(&self, stream: &str) -> String {
        self.destination.stream.name_for(stream)
    }

    /// Whether `source` is where the parked messages of `origin` come back
    /// for this sink's group.
    fn is_return_stream_of(&self, source: &str, origin: &str) -> bool {
        let destination = &self.destination;
        match destination
            .returns
            .iter()
            .find(|(stream, _)| stream == origin)
        {
            Some((_, returned)) => returned == source,
            None => destination.group.as_deref().is_some_and(|group| {
                source
                    .strip_prefix(origin)
                    .and_then(|rest| rest.strip_prefix(':'))
                    .and_then(|rest| rest.strip_prefix(group))
                    == Some(crate::RedisParking::RETURNED_SUFFIX)
            }),
        }
    }

    /// The stream `letter` is a dead letter of, when that is not the stream
    /// it was consumed from (a parked copy back through a return stream),
    /// with where it was first delivered if that is known.
    fn origin_of<'a>(&self, letter: &'a DeadLetter) -> Option<Origin<'a>> {
        let message = &letter.message;
        let consumed: &str = message.metadata().source();
        // The parking layer believed the copy's fields already.
        if let Some(first) = message.metadata().parked_from() {
            let origin: &str = &first.source;
            return (origin != consumed && self.destination.consumed.contains(origin)).then(|| {
                Origin {
                    stream: origin,
                    first: Some(first.clone()),
                }
            });
        }
        let origin = message.headers().get(ORIGIN)?;
        // The field comes from whoever wrote the entry: it is followed only
        // on an entry of its origin's return stream, where only the mover
        // writes, and only to a stream this consumer reads (which also
        // bounds its length).
        let known = std::str::from_utf8(origin).ok().filter(|origin| {
            *origin != consumed
                && self.destination.consumed.contains(*origin)
                && self.is_return_stream_of(consumed, origin)
        });
        let Some(origin) = known else {
            tracing::debug!(
                stream = consumed,
                origin_bytes = origin.len(),
                "the entry's park origin is not followed (no other stream this consumer \
                 reads, or the entry is not in that stream's return stream); \
                 dead-lettering it as an entry of the stream it was consumed from"
            );
            return None;
        };
        let first = first_delivery_of(message)
            .filter(|first| &*first.source == origin && first.partition == 0);
        Some(Origin {
            stream: origin,
            first,
        })
    }

    /// Refuses the reference letter `letter` (its envelope as it would be
    /// written) when the entry it names does not outlive the acknowledgement
    /// that follows: a stream whose acknowledged entries this consumer
    /// deletes, or a copy in a return stream that names no first delivery,
    /// which the parking's mover trims once acknowledged. (A reference
    /// carries no fields, so a copy is known by the stream it was read
    /// from; its first delivery only from the parking layer, a dead-letter
    /// layer inside it.)
    fn check_reference(&self, letter: &DeadLetter) -> Result<(), Error> {
        let metadata = letter.message.metadata();
        let (named, position) = match metadata.parked_from() {
            Some(first) => (&*first.source, first.position),
            None => (&**metadata.source(), metadata.position()),
        };
        let physical: &str = metadata.source();
        let copy = self
            .destination
            .consumed
            .iter()
            .any(|origin| origin != physical && self.is_return_stream_of(physical, origin));
        let why = if copy && metadata.parked_from().is_none() {
            "it is a parked copy in a return stream, which is trimmed once acknowledged"
        } else if self.destination.deletes_acked && self.destination.consumed.contains(named) {
            "the consumer deletes acknowledged entries (delete_acked)"
        } else {
            return Ok(());
        };
        let refused = Error::ReferenceNotWritten {
            endpoint: self.connection.connector().endpoint().clone(),
            stream: named.to_owned(),
            position: position.to_string(),
            why,
        };
        tracing::error!(
            stream = named,
            %position,
            payload_bytes = letter.reference.map_or(0, |sizes| sizes.payload_bytes),
            error = %refused,
            "the dead letter could not be written; the entry stays pending"
        );
        Err(refused)
    }

    /// Writes `letter` and acknowledges the original; the letter's id, or
    /// `None` when the original was acknowledged already (by an earlier
    /// write whose reply was lost): written once, never twice. `with_payload`
    /// is false for an entry that had no payload field, so that the copy
    /// holds exactly the original fields.
    pub(crate) async fn write_letter(
        &self,
        letter: &DeadLetter,
        with_payload: bool,
    ) -> Result<Option<StreamId>, Error> {
        let metadata = letter.message.metadata();
        let stream: &str = metadata.source();
        let original = StreamId::from_position(metadata.position());
        let group = self.destination.group.as_deref();
        let found = self.origin_of(letter);
        let origin = found.as_ref().map(|found| found.stream);
        let dead_letters = self.stream_for(origin.unwrap_or(stream));
        let letter = match found {
            Some(Origin { first, .. }) if letter.message.metadata().parked_from().is_none() => {
                // The envelope names the first delivery when there is one,
                // otherwise the copy where it is; the copy is what the
                // script acknowledges either way (`original` above).
                let mut of_origin = letter.clone();
                of_origin.message.metadata_mut().set_parked_from(first);
                Cow::Owned(of_origin)
            }
            _ => Cow::Borrowed(letter),
        };
        if letter.reference.is_some() {
            self.check_reference(&letter)?;
        }
        if dead_letters == stream || Some(dead_letters.as_str()) == origin {
            // A sink built without the consumed streams (or for others)
            // cannot refuse this destination when built: written, the
            // letter would be read and fail again, forever, and its
            // original acknowledged.
            return Err(ConfigError::new(
                "dead_letter_stream",
                format!(
                    "sends the dead letters of `{stream}` back into `{stream}`, where they \
                     would be consumed again; choose another dead-letter stream"
                ),
            )
            .into());
        }

        let mut envelope = Envelope::new(&letter, &self.destination.carrier);
        let values =
            2 * (usize::from(with_payload) + envelope.header_count() + envelope.field_count());
        if values > MAX_DEAD_LETTER_VALUES {
            tracing::warn!(
                stream,
                position = %metadata.position(),
                omitted = envelope.header_count(),
                "the entry has too many fields for one dead letter; writing it without them \
                 (the original stays in the stream)"
            );
            // Redis limits the number of values, not their size: the error
            // stays as long as the envelope allows.
            envelope = envelope.reduced(DeadLetter::ERROR_LIMIT);
        }

        let mut invocation = WRITE_AND_ACK.prepare_invoke();
        invocation.key(&dead_letters).key(stream);
        invocation.arg(group.unwrap_or_default());
        match (original, group) {
            (Some(id), Some(_)) => invocation.arg(id),
            _ => invocation.arg(""),
        };
        if with_payload {
            invocation
                .arg(&*self.destination.payload_field)
                .arg(envelope.payload().as_ref());
        }
        for (name, value) in envelope.pairs() {
            invocation.arg(&*name).arg(value);
        }
        let mut connection = self.connection.get();
        let written: Result<Option<String>, _> = invocation.invoke_async(&mut connection).await;
        let id = match written {
            Ok(None) => return Ok(None),
            Ok(Some(id)) => {
                if envelope.is_reduced() {
                    self.destination.counters.add_dead_letters_reduced(1);
                }
                id
            }
            Err(error) => {
                // The caller tries again later; by then over a connection to
                // the new master if a failover made this server a replica.
                self.connection.replace_if_replica(&error).await;
                return Err(self
                    .connection
                    .connector()
                    .key_error(error, "XADD", &dead_letters));
            }
        };
        StreamId::parse(id.as_bytes())
            .map(Some)
            .ok_or_else(|| Error::UnexpectedReply {
                command: "XADD",
                detail: format!("`{id}` is not an entry id"),
            })
    }
}

/// The stream a parked copy is a dead letter of, and where it was first
/// delivered when its fields say.
struct Origin<'a> {
    stream: &'a str,
    first: Option<FirstDelivery>,
}

/// Builds a [`RedisDeadLetterSink`]; see [`RedisDeadLetterSink::builder`]
/// and [`RedisStreamsSource::dead_letter_sink`].
///
/// A builder from a source starts with the source's group, consumer name,
/// payload field, dead-letter stream and streams, and shares the source's
/// connection for acknowledgements (and its counters). A builder of
/// [`RedisDeadLetterSink::builder`] opens a connection of its own with the
/// [`RedisSettings`] it was given.
///
/// [`RedisStreamsSource::dead_letter_sink`]: crate::RedisStreamsSource::dead_letter_sink
#[derive(Clone)]
#[must_use = "a builder does nothing until `.build().await`"]
pub struct RedisDeadLetterSinkBuilder {
    server: Server,
    consumed: Vec<String>,
    /// Return streams set by hand: (origin, return stream).
    returns: Vec<(String, String)>,
    deletes_acked: bool,
    group: Option<String>,
    consumer: Option<String>,
    payload_field: String,
    dead_letter_stream: DeadLetterStream,
}

/// Where a sink writes: a connection of its own, or its source's.
#[derive(Clone)]
enum Server {
    Settings(RedisSettings),
    /// The source's connection and counters.
    Source(Box<SharedConnection>, Arc<RedisCounters>),
}

impl fmt::Debug for RedisDeadLetterSinkBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("RedisDeadLetterSinkBuilder");
        match &self.server {
            Server::Settings(settings) => debug.field("connection", settings),
            Server::Source(shared, _) => {
                debug.field("source_endpoint", shared.connector().endpoint())
            }
        };
        debug
            .field("consumed", &self.consumed)
            .field("return_streams", &self.returns)
            .field("deletes_acked", &self.deletes_acked)
            .field("group", &self.group)
            .field("consumer", &self.consumer)
            .field("payload_field", &self.payload_field)
            .field("dead_letter_stream", &self.dead_letter_stream)
            .finish_non_exhaustive()
    }
}

impl RedisDeadLetterSinkBuilder {
    fn new(settings: RedisSettings) -> Self {
        Self {
            server: Server::Settings(settings),
            consumed: Vec::new(),
            returns: Vec::new(),
            deletes_acked: false,
            group: None,
            consumer: None,
            payload_field: DEFAULT_PAYLOAD_FIELD.to_owned(),
            dead_letter_stream: DeadLetterStream::default(),
        }
    }

    /// A builder prefilled from a source: its checked settings, and its
    /// connection and counters.
    pub(crate) fn from_source(connection: SharedConnection, settings: &Settings) -> Self {
        Self {
            server: Server::Source(Box::new(connection), settings.counters.clone()),
            consumed: settings.streams.iter().map(|s| s.to_string()).collect(),
            returns: Vec::new(),
            deletes_acked: settings.delete_acked,
            group: settings.group.as_deref().map(str::to_owned),
            consumer: Some(settings.consumer.to_string()),
            payload_field: settings.payload_field.to_string(),
            dead_letter_stream: settings.dead_letter_stream.clone(),
        }
    }

    /// Where dead letters go (default: the source stream's name plus
    /// `:dlq`). A destination that is one of the
    /// [consumed streams](Self::consumed_stream) is refused by
    /// [`build`](Self::build); a letter the destination would send back
    /// into the stream it came from is refused when written.
    pub fn dead_letter_stream(mut self, stream: DeadLetterStream) -> Self {
        self.dead_letter_stream = stream;
        self
    }

    /// Names a stream whose entries this sink dead-letters (a builder from
    /// a source names the source's streams). Call it once per stream.
    pub fn consumed_stream(mut self, stream: impl Into<String>) -> Self {
        self.consumed.push(stream.into());
        self
    }

    /// Sets where the parked messages of consumed stream `stream` come back
    /// for the sink's group, when the parking was given another name than
    /// the default [`RedisParking::return_stream`](crate::RedisParking::return_stream)
    /// (its [`return_stream`](crate::RedisParkingBuilder::return_stream)):
    /// only an entry read from there has its park fields followed to
    /// `stream`.
    pub fn return_stream(
        mut self,
        stream: impl Into<String>,
        return_stream: impl Into<String>,
    ) -> Self {
        let (stream, return_stream) = (stream.into(), return_stream.into());
        self.returns.retain(|(origin, _)| *origin != stream);
        self.returns.push((stream, return_stream));
        self
    }

    /// Whether the consumer deletes the entries of the consumed streams once
    /// acknowledged (the source's
    /// [`delete_acked`](crate::RedisStreamsSourceBuilder::delete_acked); a
    /// builder from a source has it). A reference letter of such an entry,
    /// which would leave the payload at an origin that deletes it, is then
    /// refused ([`Error::ReferenceNotWritten`]): the entry stays pending.
    pub fn deletes_acked(mut self, deletes: bool) -> Self {
        self.deletes_acked = deletes;
        self
    }

    /// The consumer group whose pending entry each letter acknowledges, in
    /// the same atomic step as the write. Without one, nothing is
    /// acknowledged (a broadcast reader's letters).
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// The consumer name the letters record as their origin's (default
    /// `<hostname>-<pid>-<n>`).
    pub fn consumer(mut self, consumer: impl Into<String>) -> Self {
        self.consumer = Some(consumer.into());
        self
    }

    /// The field that carries each letter's payload (default `payload`).
    pub fn payload_field(mut self, field: impl Into<String>) -> Self {
        self.payload_field = field.into();
        self
    }

    /// Checks the settings, then connects (unless the sink shares its
    /// source's connection).
    ///
    /// Fails with [`Error::Config`] for an empty name or a dead-letter
    /// stream that is one of the consumed streams, before connecting, and
    /// with a typed error for a bad URL, an unreachable server or refused
    /// credentials.
    pub async fn build(self) -> Result<RedisDeadLetterSink, Error> {
        if matches!(&self.group, Some(group) if group.is_empty()) {
            return Err(ConfigError::new("group", "is empty").into());
        }
        if matches!(&self.consumer, Some(consumer) if consumer.is_empty()) {
            return Err(ConfigError::new("consumer", "is empty").into());
        }
        if self.payload_field.is_empty() {
            return Err(ConfigError::new("payload_field", "is empty").into());
        }
        self.dead_letter_stream.check(&self.consumed)?;
        let (connection, counters) = match self.server {
            Server::Source(connection, counters) => (*connection, counters),
            Server::Settings(settings) => {
                let connector = settings.connector()?;
                let connection = SharedConnection::new(connector.shared().await?, connector);
                (connection, Arc::default())
            }
        };
        let consumer = self.consumer.unwrap_or_else(default_consumer_name);
        Ok(RedisDeadLetterSink::on(
            connection,
            self.group.map(Arc::from),
            consumer.into(),
            self.payload_field.into(),
            self.dead_letter_stream,
            self.consumed.into_iter().collect(),
            self.returns,
            self.deletes_acked,
            counters,
        ))
    }
}

#[async_trait::async_trait]
impl DeadLetterSink for RedisDeadLetterSink {
    async fn write(&self, letter: &DeadLetter) -> Result<(), DeadLetterError> {
        let Some(id) = self.write_letter(letter, true).await? else {
            tracing::debug!(
                stream = %letter.message.metadata().source(),
                position = %letter.message.metadata().position(),
                "the original was acknowledged already (by an earlier write whose reply \
                 was lost); no second dead letter"
            );
            return Ok(());
        };
        let metadata = letter.message.metadata();
        // The dead-letter layer logs the decision (with the error) at warn;
        // this adds where the letter went, for whoever follows one up.
        tracing::debug!(
            stream = %metadata.source(),
            position = %metadata.position(),
            attempts = letter.attempts,
            dead_letter_id = %id.position(),
            error = %letter.error,
            "message dead-lettered"
        );
        Ok(())
    }
}
