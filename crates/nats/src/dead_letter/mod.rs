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
//! A letter says `nats` as its origin's broker
//! ([`Broker::Nats`](intake_core::dead_letter::envelope::Broker::Nats)), its
//! position the stream sequence. See `docs/DEAD-LETTERS.md`.

use std::sync::Arc;
use std::time::Duration;

use async_nats::Subject;
use async_nats::jetstream;
use bytes::Bytes;
use intake_core::dead_letter::envelope::Carrier;
use intake_core::{
    DeadLetter, SourceName,
    backend::{DeadLetterError, DeadLetterSink},
};

use crate::acker::sequence;
use crate::confirm::Confirmations;
use crate::counters::NatsCounters;
use crate::deliveries::Deliveries;
use crate::error::{Error, boxed};

mod builder;
mod headers;
mod read;
mod retention;

pub use builder::NatsDeadLetterSinkBuilder;
pub use read::read_dead_letter;

use retention::OriginRetention;

/// The name `intake.origin.broker` carries for a letter from NATS.
pub const BROKER_NAME: &str = "nats";
/// Original headers named `Nats-…` are carried under this prefix.
pub const NATS_HEADER_PREFIX: &str = "intake.nats.";
/// The most bytes of headers JetStream stores with a message (the server
/// refuses more: `header size exceeds maximum allowed of 64k`, 10097).
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// The default dead-letter subject of consumer `consumer` of `stream`.
pub fn default_subject(stream: &str, consumer: &str) -> String {
    format!("{stream}.{consumer}.dlq")
}

/// The default dead-letter stream of `stream`: it stores the default
/// subjects of every consumer of the stream (`<stream>.*.dlq`).
pub fn default_stream(stream: &str) -> String {
    format!("{stream}_dlq")
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
