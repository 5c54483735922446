//! [`RedisDeadLetterSink`]: poison messages go to a dead-letter stream with
//! their origin, and leave the pending list in the same atomic step.
//!
//! The parts: `builder.rs` ([`RedisDeadLetterSinkBuilder`]), `write.rs`
//! (the script that writes a letter and acknowledges its original in one
//! step, and the reduced letter of an entry with too many fields),
//! `origin.rs` (the stream a parked copy back through a return stream is a
//! dead letter of) and `reference.rs` (the reference letters refused).

mod builder;
mod origin;
mod reference;
mod write;

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use intake_core::dead_letter::envelope::{Broker, Carrier};
use intake_core::{
    DeadLetter,
    backend::{DeadLetterError, DeadLetterSink},
};

pub use self::builder::RedisDeadLetterSinkBuilder;
pub use self::write::MAX_DEAD_LETTER_VALUES;
use crate::connection::SharedConnection;
use crate::counters::RedisCounters;
use crate::settings::RedisSettings;
use crate::source::settings::{DeadLetterStream, Settings};

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
/// at its origin". The sink refuses it
/// ([`Error::ReferenceNotWritten`](crate::Error::ReferenceNotWritten),
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
    pub(super) fn on(
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
