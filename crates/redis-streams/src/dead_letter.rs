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

use std::sync::{Arc, LazyLock};

use intake_core::dead_letter::envelope::{Broker, Carrier, Envelope};
use intake_core::{DeadLetter, DeadLetterError, DeadLetterSink};
use redis::Script;

use crate::connection::SharedConnection;
use crate::error::Error;
use crate::settings::Settings;
use crate::stats::RedisStreamsStats;
use crate::stream_id::StreamId;

/// Most field names and values a dead letter passes to Redis in one script
/// call, the envelope's fields included. Lua's `unpack` (and any call from a
/// script) fails near 8,000 values; an entry with more fields than fit is
/// written as a reduced letter: its payload and the envelope, without its
/// other fields (their number in `intake.headers.omitted`), counted in
/// [`RedisStreamsStats::dead_letters_reduced`], rather than failing on every
/// attempt. Size is no limit of its own: every value is a copy of one Redis
/// already stored.
pub const MAX_DEAD_LETTER_VALUES: usize = 7_000;

/// `KEYS[1]` dead-letter stream, `KEYS[2]` source stream; `ARGV[1]` group,
/// `ARGV[2]` original id (empty: nothing to acknowledge), then the fields.
static WRITE_AND_ACK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
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
/// slot reads an entry of the stream back. Get a sink from
/// [`RedisStreamsSource::dead_letter_sink`](crate::RedisStreamsSource::dead_letter_sink)
/// and hand it to the dead-letter layer; it is cheap to clone.
#[derive(Clone)]
pub struct RedisDeadLetterSink {
    connection: SharedConnection,
    settings: Arc<Settings>,
    carrier: Arc<Carrier>,
}

impl std::fmt::Debug for RedisDeadLetterSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisDeadLetterSink")
            .field("endpoint", self.connection.connector().endpoint())
            .field("group", &self.settings.group)
            .field("dead_letter_stream", &self.settings.dead_letter_stream)
            .finish()
    }
}

impl RedisDeadLetterSink {
    pub(crate) fn new(connection: SharedConnection, settings: Arc<Settings>) -> Self {
        let carrier = Carrier::keyless(Broker::Redis).with_consumer(settings.consumer.clone());
        let carrier = match &settings.group {
            Some(group) => carrier.with_group(group.clone()),
            None => carrier,
        };
        Self {
            connection,
            settings,
            carrier: Arc::new(carrier),
        }
    }

    /// The counters of the consumer this sink belongs to.
    pub(crate) fn stats(&self) -> &RedisStreamsStats {
        &self.settings.stats
    }

    /// The dead-letter stream for entries of `stream`.
    pub fn stream_for(&self, stream: &str) -> String {
        self.settings.dead_letter_stream.name_for(stream)
    }

    /// Writes `letter` and acknowledges the original. `with_payload` is
    /// false for an entry that had no payload field, so that the copy holds
    /// exactly the original fields.
    pub(crate) async fn write_letter(
        &self,
        letter: &DeadLetter,
        with_payload: bool,
    ) -> Result<StreamId, Error> {
        let metadata = letter.message.metadata();
        let stream: &str = metadata.source();
        let original = StreamId::from_position(metadata.position());
        let group = self.settings.group.as_deref();
        let dead_letters = self.stream_for(stream);

        let mut envelope = Envelope::new(letter, &self.carrier);
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
                .arg(&*self.settings.payload_field)
                .arg(envelope.payload().as_ref());
        }
        for (name, value) in envelope.pairs() {
            invocation.arg(&*name).arg(value);
        }
        let mut connection = self.connection.get();
        let written: Result<String, _> = invocation.invoke_async(&mut connection).await;
        let id = match written {
            Ok(id) => {
                if envelope.is_reduced() {
                    self.settings.stats.add_dead_letters_reduced(1);
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
        StreamId::parse(id.as_bytes()).ok_or_else(|| Error::UnexpectedReply {
            command: "XADD",
            detail: format!("`{id}` is not an entry id"),
        })
    }
}

#[async_trait::async_trait]
impl DeadLetterSink for RedisDeadLetterSink {
    async fn write(&self, letter: &DeadLetter) -> Result<(), DeadLetterError> {
        let id = self.write_letter(letter, true).await?;
        let metadata = letter.message.metadata();
        tracing::warn!(
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
