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
use std::time::UNIX_EPOCH;

use intake_core::{DeadLetter, DeadLetterError, DeadLetterSink, Message};
use redis::Script;

use crate::config::Settings;
use crate::connection::SharedConnection;
use crate::entry::StreamId;
use crate::error::RedisStreamsError;
use crate::stats::RedisStreamsStats;

/// Names of the fields a dead letter carries besides the original ones.
pub mod fields {
    /// The stream the entry was read from.
    pub const STREAM: &str = "dlq.stream";
    /// The original entry id.
    pub const ID: &str = "dlq.id";
    /// The consumer group that gave up on it (empty in broadcast mode).
    pub const GROUP: &str = "dlq.group";
    /// The consumer that gave up on it.
    pub const CONSUMER: &str = "dlq.consumer";
    /// The last error, as text.
    pub const ERROR: &str = "dlq.error";
    /// Deliveries or attempts made.
    pub const ATTEMPTS: &str = "dlq.attempts";
    /// When it was given up, in milliseconds since the Unix epoch.
    pub const FAILED_AT: &str = "dlq.failed_at_ms";
    /// How many original fields (headers) were left out because, with
    /// them, the dead letter would not fit into one script call (see
    /// [`MAX_DEAD_LETTER_VALUES`](crate::MAX_DEAD_LETTER_VALUES)); only
    /// present then. The original entry stays in the source stream under
    /// its id (unless trimmed or deleted), to be read from there.
    pub const FIELDS_OMITTED: &str = "dlq.fields_omitted";
    /// A producer's own field whose name is one of the fields above keeps
    /// its value under this prefix (`dlq.producer.dlq.stream`): the origin
    /// fields appear once each and always tell the truth.
    pub const PRODUCER_PREFIX: &str = "dlq.producer.";

    /// The names the dead letter writes itself.
    pub(crate) const ORIGIN: [&str; 8] = [
        STREAM,
        ID,
        GROUP,
        CONSUMER,
        ERROR,
        ATTEMPTS,
        FAILED_AT,
        FIELDS_OMITTED,
    ];
}

/// Longest `dlq.error` text, in bytes: a longer error is cut at a character
/// boundary and marked ` … (truncated)`. Errors can quote whole payloads.
pub const MAX_DEAD_LETTER_ERROR_LEN: usize = 4_096;

/// Most field names and values a dead letter passes to Redis in one script
/// call, origin fields included. Lua's `unpack` (and any call from a script)
/// fails near 8,000 values; an entry with more fields than fit is
/// dead-lettered with its payload and origin but without its other fields
/// ([`fields::FIELDS_OMITTED`]), counted in
/// [`RedisStreamsStats::dead_letters_reduced`], rather than failing on every
/// attempt. Size is no limit of its own: every value is a copy of one Redis
/// already stored.
pub const MAX_DEAD_LETTER_VALUES: usize = 7_000;

/// `error`, cut to [`MAX_DEAD_LETTER_ERROR_LEN`] bytes at a character
/// boundary.
fn capped_error(error: &str) -> std::borrow::Cow<'_, str> {
    if error.len() <= MAX_DEAD_LETTER_ERROR_LEN {
        return error.into();
    }
    let mut end = MAX_DEAD_LETTER_ERROR_LEN;
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} … (truncated)", &error[..end]).into()
}

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
/// A dead letter holds the original fields (payload and headers) followed by
/// the [`fields`] that record its origin. Get one from
/// [`RedisStreamsSource::dead_letter_sink`](crate::RedisStreamsSource::dead_letter_sink)
/// and hand it to the dead-letter layer; it is cheap to clone.
#[derive(Clone)]
pub struct RedisDeadLetterSink {
    connection: SharedConnection,
    settings: Arc<Settings>,
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
        Self {
            connection,
            settings,
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

    /// Writes `message` with its origin and acknowledges the original.
    /// `with_payload` is false for an entry that had no payload field, so
    /// that the copy holds exactly the original fields.
    pub(crate) async fn write_message(
        &self,
        message: &Message,
        with_payload: bool,
        error: &str,
        attempts: u32,
        failed_at_ms: u128,
    ) -> Result<StreamId, RedisStreamsError> {
        let metadata = message.metadata();
        let stream: &str = metadata.source();
        let original = StreamId::from_position(metadata.position());
        let group = self.settings.group.as_deref();
        let dead_letters = self.stream_for(stream);

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
                .arg(message.payload().as_ref());
        }
        let headers = message.headers().len();
        let values = 2 * (usize::from(with_payload) + headers + fields::ORIGIN.len());
        let reduced = values > MAX_DEAD_LETTER_VALUES;
        if reduced {
            tracing::warn!(
                stream,
                position = %metadata.position(),
                omitted = headers,
                "the entry has too many fields for one dead letter; writing it without them \
                 (the original stays in the stream)"
            );
            invocation.arg(fields::FIELDS_OMITTED).arg(headers);
        } else {
            for header in message.headers() {
                if fields::ORIGIN.contains(&&*header.name) {
                    invocation
                        .arg(format!("{}{}", fields::PRODUCER_PREFIX, header.name))
                        .arg(header.value.as_ref());
                } else {
                    invocation.arg(&*header.name).arg(header.value.as_ref());
                }
            }
        }
        invocation
            .arg(fields::STREAM)
            .arg(stream)
            .arg(fields::ID)
            .arg(metadata.position().to_string())
            .arg(fields::GROUP)
            .arg(group.unwrap_or_default())
            .arg(fields::CONSUMER)
            .arg(&*self.settings.consumer)
            .arg(fields::ERROR)
            .arg(&*capped_error(error))
            .arg(fields::ATTEMPTS)
            .arg(attempts)
            .arg(fields::FAILED_AT)
            .arg(failed_at_ms.to_string());
        let mut connection = self.connection.get();
        let written: Result<String, _> = invocation.invoke_async(&mut connection).await;
        let id = match written {
            Ok(id) => {
                if reduced {
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
        StreamId::parse(id.as_bytes()).ok_or_else(|| RedisStreamsError::UnexpectedReply {
            command: "XADD",
            detail: format!("`{id}` is not an entry id"),
        })
    }
}

#[async_trait::async_trait]
impl DeadLetterSink for RedisDeadLetterSink {
    async fn write(&self, letter: &DeadLetter) -> Result<(), DeadLetterError> {
        let failed_at_ms = letter
            .failed_at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis());
        let id = self
            .write_message(
                &letter.message,
                true,
                &letter.error,
                letter.attempts,
                failed_at_ms,
            )
            .await?;
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
