//! Writing a letter: one Lua script writes it to the dead-letter stream and
//! acknowledges the original, and an entry with more fields than one script
//! call takes is written as a reduced letter.
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
use std::sync::LazyLock;

use intake_core::dead_letter::envelope::Envelope;
use intake_core::{ConfigError, DeadLetter};
use redis::Script;

use super::RedisDeadLetterSink;
use super::origin::Origin;
use crate::error::Error;
use crate::stream_id::StreamId;

/// Most field names and values a dead letter passes to Redis in one script
/// call, the envelope's fields included. Lua's `unpack` (and any call from a
/// script) fails near 8,000 values; an entry with more fields than fit is
/// written as a reduced letter: its payload and the envelope, without its
/// other fields (their number in `intake.headers.omitted`), counted in
/// [`RedisCounters::dead_letters_reduced`](crate::RedisCounters::dead_letters_reduced),
/// rather than failing on every attempt. Size is no limit of its own:
/// every value is a copy of one Redis already stored.
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

impl RedisDeadLetterSink {
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
