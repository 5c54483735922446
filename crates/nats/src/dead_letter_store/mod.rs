//! [`NatsDeadLetters`]: a JetStream dead-letter stream as a
//! [`DeadLetterLog`], the log of [`NatsDeadLetterStore`], and
//! [`NatsReplayPublisher`], which sends a replayed message back to the
//! subject it was consumed from.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream::{self, ErrorCode, context::GetStreamErrorKind, stream::Stream};
use bytes::Bytes;
use futures_util::StreamExt;
use intake_core::dead_letter::store::{
    DeadLetterLog, LetterId, LogStore, StoreError, StoredLetter,
};
use intake_core::publish::{Output, PublishError, PublishErrorKind, Publisher};
use intake_core::{BackoffPolicy, ConfigError, Exponential, Headers};

use crate::connection;
use crate::dead_letter::{NATS_HEADER_PREFIX, default_stream, default_subject};
use crate::error::{Error, boxed};
use crate::publisher::{NatsPublisher, NatsReceipt};
use crate::settings::NatsSettings;

/// The dead-letter store of a JetStream dead-letter stream.
pub type NatsDeadLetterStore = LogStore<NatsDeadLetters, NatsReplayPublisher>;

/// A JetStream dead-letter stream as a [`DeadLetterLog`] (its ids are
/// stream sequences, `41`), so that [`NatsDeadLetterStore`] (a [`LogStore`]
/// replaying through a [`NatsReplayPublisher`]) counts, lists, reads,
/// replays and purges what a
/// [`NatsDeadLetterSink`](crate::NatsDeadLetterSink) wrote. Build one with
/// [`NatsDeadLetters::builder`]; it is cheap to clone.
///
/// It reads the letters of one subject (the sink's default
/// `<stream>.<consumer>.dlq`, since the stream `<stream>_dlq` stores the
/// letters of every consumer of `<stream>`), or of the whole stream.
///
/// | store operation | JetStream |
/// |---|---|
/// | count everything | stream info: `messages`, or the subject's count (`subjects_filter`) |
/// | count with a filter, summary, list | `STREAM.MSG.GET` with `next_by_subj`, one entry per request, from the sequence after the cursor |
/// | read | `STREAM.MSG.GET` by sequence |
/// | replay | a publish to the original subject, confirmed, then `STREAM.MSG.DELETE` |
/// | purge | `STREAM.MSG.DELETE` |
///
/// Why message gets and not an ordered consumer: each get is one request
/// with one reply, bounded by the request timeout, leaves nothing on the
/// server (a consumer would have to be created, fed by flow control and
/// deleted, and an interrupted command would leave it behind), and skips
/// deleted sequences on the server's side. The cost is a round trip per
/// letter scanned: `intake dlq count` (a summary, so a scan) of 5,000
/// letters took 1.7 s on a local server (debug build, 2 busy cores).
/// Direct gets (`allow_direct`) would save nothing per letter and need a
/// stream setting the sink does not make.
///
/// A letter is read back as
/// [`read_dead_letter`](crate::read_dead_letter) reads it. The client
/// parses each entry's header block: an entry whose headers it cannot read
/// (not UTF-8, which no intake sink writes) fails the operation that meets
/// it; remove it with `nats stream rmm`.
///
/// ```no_run
/// use intake_core::dead_letter::store::{DeadLetterStore, Filter, Replay, Selection};
/// use intake_nats::{NatsDeadLetters, NatsPublisher};
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let url = "nats://127.0.0.1:4222";
/// let store = NatsDeadLetters::builder(url)
///     .dead_letters_of("ORDERS", "billing") // `ORDERS.billing.dlq` on `ORDERS_dlq`
///     .build()
///     .await?
///     .store(NatsPublisher::builder(url).build().await?);
/// println!("{} dead letters", store.count(&Filter::all()).await?);
/// let report = store
///     .replay(&Selection::Matching(Filter::all()), &Replay::to_origin())
///     .await?;
/// println!("{} back on their subjects, {} skipped", report.replayed, report.skipped.len());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct NatsDeadLetters {
    context: jetstream::Context,
    endpoint: Arc<str>,
    stream: Arc<str>,
    subject: Option<Arc<str>>,
    timeout: Duration,
}

impl fmt::Debug for NatsDeadLetters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsDeadLetters")
            .field("endpoint", &self.endpoint)
            .field("stream", &self.stream)
            .field("subject", &self.subject)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The default of [`NatsDeadLettersBuilder::request_timeout`].
const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

impl NatsDeadLetters {
    /// A builder of the dead-letter stream's reader on a connection of its
    /// own, made with `settings` ([`NatsSettings`]), or to the server(s) at
    /// a URL (`nats://[user:password@|token@]host[:port]`, several
    /// separated by commas, `tls://` for TLS).
    pub fn builder(settings: impl Into<NatsSettings>) -> NatsDeadLettersBuilder {
        NatsDeadLettersBuilder {
            settings: settings.into(),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            stream: None,
            subject: None,
        }
    }

    /// The store of this stream, replaying through `publisher` (see
    /// [`NatsReplayPublisher`] for where a replay goes).
    pub fn store(self, publisher: NatsPublisher) -> NatsDeadLetterStore {
        let replay = NatsReplayPublisher::new(self.context.clone(), publisher, self.timeout);
        LogStore::new(self, replay)
    }

    /// The dead-letter stream.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The subject whose letters it reads, `None` for the whole stream.
    pub fn subject(&self) -> Option<&str> {
        self.subject.as_deref()
    }

    /// The subject filter of a scan: the store's subject, or every subject.
    fn filter(&self) -> &str {
        self.subject.as_deref().unwrap_or(">")
    }

    fn failed(&self, operation: &'static str, what: String, error: BoxedCause) -> StoreError {
        let error = match error {
            BoxedCause::TimedOut => Error::Unconfirmed {
                endpoint: self.endpoint.to_string(),
                what,
                waited: self.timeout,
            },
            BoxedCause::Client(source) => Error::JetStream {
                endpoint: self.endpoint.to_string(),
                operation: what,
                transient: true,
                source,
            },
        };
        StoreError::broker(operation, &*self.stream, error)
    }

    /// Runs `request` within the request timeout.
    async fn bounded<T, E>(
        &self,
        operation: &'static str,
        what: impl FnOnce() -> String,
        request: impl Future<Output = Result<T, E>>,
    ) -> Result<Result<T, E>, StoreError> {
        tokio::time::timeout(self.timeout, request)
            .await
            .map_err(|_| self.failed(operation, what(), BoxedCause::TimedOut))
    }

    /// The stream with its info, `None` when it does not exist (no letter
    /// was ever written: the sink creates it with the first).
    async fn info(&self, operation: &'static str) -> Result<Option<Stream>, StoreError> {
        let what = || format!("get the info of stream `{}`", self.stream);
        match self
            .bounded(operation, what, self.context.get_stream(&*self.stream))
            .await?
        {
            Ok(stream) => Ok(Some(stream)),
            Err(error)
                if matches!(error.kind(), GetStreamErrorKind::JetStream(ref js)
                    if js.error_code() == ErrorCode::STREAM_NOT_FOUND) =>
            {
                Ok(None)
            }
            Err(error) => Err(self.failed(operation, what(), BoxedCause::Client(boxed(error)))),
        }
    }

    /// The first entry of the store's subject at or after `sequence`.
    async fn first_from(
        &self,
        stream: &Stream<()>,
        sequence: u64,
    ) -> Result<Option<StoredLetter>, StoreError> {
        let what = || format!("read stream `{}` from sequence {sequence}", self.stream);
        let got = self
            .bounded(
                "list",
                what,
                stream.get_first_raw_message_by_subject(self.filter(), sequence),
            )
            .await?;
        match got {
            Ok(message) => Ok(Some(stored(message))),
            Err(error) if gone(error.kind()) => Ok(None),
            Err(error) => Err(self.failed("list", what(), BoxedCause::Client(boxed(error)))),
        }
    }
}

enum BoxedCause {
    TimedOut,
    Client(intake_core::BoxError),
}

/// The answers to a delete of a sequence the stream does not hold.
const NOT_THERE: [ErrorCode; 4] = [
    ErrorCode::NO_MESSAGE_FOUND,
    ErrorCode::SEQUENCE_NOT_FOUND,
    ErrorCode::STREAM_MESSAGE_DELETE_FAILED,
    ErrorCode::STREAM_NOT_FOUND,
];

/// Whether a message get found nothing: no such sequence, nothing after
/// it on the subject, or no stream at all.
fn gone(kind: jetstream::stream::RawMessageErrorKind) -> bool {
    match kind {
        jetstream::stream::RawMessageErrorKind::NoMessageFound => true,
        jetstream::stream::RawMessageErrorKind::JetStream(error) => {
            error.error_code() == ErrorCode::STREAM_NOT_FOUND
        }
        _ => false,
    }
}

/// An entry as the sink wrote it: payload, and headers with the original
/// `Nats-…` headers under their own names again.
fn stored(message: jetstream::message::StreamMessage) -> StoredLetter {
    let mut headers = Headers::new();
    for (name, values) in message.headers.iter() {
        let name: &str = name.as_ref();
        let name = name.strip_prefix(NATS_HEADER_PREFIX).unwrap_or(name);
        for value in values {
            headers.insert(
                name.to_owned(),
                Bytes::copy_from_slice(value.as_str().as_bytes()),
            );
        }
    }
    StoredLetter::read(
        LetterId::new(message.sequence.to_string()),
        None,
        message.payload,
        &headers,
    )
}

fn sequence_of(id: &LetterId) -> Result<u64, StoreError> {
    id.as_str()
        .parse::<u64>()
        .ok()
        .filter(|sequence| *sequence > 0)
        .ok_or_else(|| StoreError::InvalidId {
            id: id.as_str().to_owned(),
            expected: "a stream sequence, such as 41",
        })
}

/// Whether `subject` is one `filter` (a subject that may hold `*` and `>`
/// tokens) selects.
fn subject_matches(filter: &str, subject: &str) -> bool {
    let mut subject = subject.split('.');
    for token in filter.split('.') {
        match (token, subject.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (token, Some(given)) if token == given => {}
            _ => return false,
        }
    }
    subject.next().is_none()
}

#[async_trait::async_trait]
impl DeadLetterLog for NatsDeadLetters {
    fn name(&self) -> &str {
        self.subject.as_deref().unwrap_or(&self.stream)
    }

    async fn entries(&self) -> Result<u64, StoreError> {
        let Some(stream) = self.info("count").await? else {
            return Ok(0);
        };
        let Some(subject) = &self.subject else {
            return Ok(stream.cached_info().state.messages);
        };
        let what = || format!("count subject `{subject}` of stream `{}`", self.stream);
        let counted = self
            .bounded("count", what, async {
                let mut subjects = stream.info_with_subjects(&**subject).await.map_err(boxed)?;
                let mut total = 0u64;
                while let Some(entry) = subjects.next().await {
                    let (_, count) = entry.map_err(boxed)?;
                    total = total.saturating_add(count as u64);
                }
                Ok::<u64, intake_core::BoxError>(total)
            })
            .await?;
        counted.map_err(|error| self.failed("count", what(), BoxedCause::Client(error)))
    }

    /// The stream's last sequence: at or after the newest letter of the
    /// subject, which is all a scan's end needs (a deleted or other
    /// subject's sequence there ends the scan at the same place).
    async fn last(&self) -> Result<Option<LetterId>, StoreError> {
        let Some(stream) = self.info("read").await? else {
            return Ok(None);
        };
        let state = &stream.cached_info().state;
        Ok((state.messages > 0 && state.last_sequence > 0)
            .then(|| LetterId::new(state.last_sequence.to_string())))
    }

    async fn scan(
        &self,
        after: Option<&LetterId>,
        through: Option<&LetterId>,
        max: usize,
    ) -> Result<Vec<StoredLetter>, StoreError> {
        let mut next = match after.map(sequence_of).transpose()? {
            None => 1,
            Some(after) => match after.checked_add(1) {
                Some(next) => next,
                None => return Ok(Vec::new()),
            },
        };
        let through = through.map(sequence_of).transpose()?.unwrap_or(u64::MAX);
        let stream = self
            .context
            .get_stream_no_info(&*self.stream)
            .await
            .map_err(|error| {
                self.failed(
                    "list",
                    format!("open stream `{}`", self.stream),
                    BoxedCause::Client(boxed(error)),
                )
            })?;
        let mut entries = Vec::with_capacity(max.min(256));
        while entries.len() < max && next <= through {
            let Some(entry) = self.first_from(&stream, next).await? else {
                break;
            };
            let sequence = sequence_of(&entry.id)?;
            if sequence > through {
                break;
            }
            entries.push(entry);
            match sequence.checked_add(1) {
                Some(after) => next = after,
                None => break,
            }
        }
        Ok(entries)
    }

    async fn get(&self, id: &LetterId) -> Result<Option<StoredLetter>, StoreError> {
        let sequence = sequence_of(id)?;
        let stream = self
            .context
            .get_stream_no_info(&*self.stream)
            .await
            .map_err(|error| {
                self.failed(
                    "read",
                    format!("open stream `{}`", self.stream),
                    BoxedCause::Client(boxed(error)),
                )
            })?;
        let what = || format!("read sequence {sequence} of stream `{}`", self.stream);
        match self
            .bounded("read", what, stream.get_raw_message(sequence))
            .await?
        {
            // A sequence of another subject is no letter of this store: a
            // purge by id must not delete another consumer's letter.
            Ok(message)
                if self
                    .subject
                    .as_deref()
                    .is_some_and(|filter| !subject_matches(filter, &message.subject)) =>
            {
                Ok(None)
            }
            Ok(message) => Ok(Some(stored(message))),
            Err(error) if gone(error.kind()) => Ok(None),
            Err(error) => Err(self.failed("read", what(), BoxedCause::Client(boxed(error)))),
        }
    }

    async fn remove(&self, ids: &[LetterId]) -> Result<u64, StoreError> {
        let sequences = ids.iter().map(sequence_of).collect::<Result<Vec<_>, _>>()?;
        if sequences.is_empty() {
            return Ok(0);
        }
        let stream = self
            .context
            .get_stream_no_info(&*self.stream)
            .await
            .map_err(|error| {
                self.failed(
                    "remove letters from",
                    format!("open stream `{}`", self.stream),
                    BoxedCause::Client(boxed(error)),
                )
            })?;
        let mut removed = 0;
        for sequence in sequences {
            let what = || format!("delete sequence {sequence} of stream `{}`", self.stream);
            match self
                .bounded("remove letters from", what, stream.delete_message(sequence))
                .await?
            {
                Ok(true) => removed += 1,
                Ok(false) => {}
                // Deleted meanwhile (another purge), or never there: a file
                // stream of nats-server 2.9 answers 10057 (delete failed), a
                // memory stream 10043 (sequence not found).
                Err(error)
                    if matches!(error.kind(), jetstream::stream::DeleteMessageErrorKind::JetStream(ref js)
                        if NOT_THERE.contains(&js.error_code())) => {}
                Err(error) => {
                    return Err(self.failed(
                        "remove letters from",
                        what(),
                        BoxedCause::Client(boxed(error)),
                    ));
                }
            }
        }
        Ok(removed)
    }
}

/// Publishes a replayed letter's message through a [`NatsPublisher`],
/// to the subject it was consumed from.
///
/// A NATS letter's origin is a stream and its key the subject the message
/// was stored on ([`NatsSource`](crate::NatsSource) reads the key from the
/// subject), so a replay "to its origin" (an [`Output`] whose destination
/// names a stream) is published to the key as the subject, exactly; the
/// source then reads the same key again. An output to any other
/// destination (`Replay::to("SUBJECT")`) is published to that subject,
/// exactly: the original subject is no token of another.
///
/// Whether a destination names a stream is asked of the server once per
/// destination (a stream info request, bounded by the request timeout).
#[derive(Clone)]
pub struct NatsReplayPublisher {
    context: jetstream::Context,
    publisher: NatsPublisher,
    timeout: Duration,
    streams: Arc<Mutex<HashMap<Arc<str>, bool>>>,
}

impl fmt::Debug for NatsReplayPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsReplayPublisher")
            .field("publisher", &self.publisher)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl NatsReplayPublisher {
    fn new(context: jetstream::Context, publisher: NatsPublisher, timeout: Duration) -> Self {
        Self {
            context,
            publisher,
            timeout,
            streams: Arc::default(),
        }
    }

    /// Whether `destination` is the name of a stream on the server.
    async fn is_stream(&self, destination: &Arc<str>) -> Result<bool, PublishError> {
        if let Some(known) = self
            .streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(destination)
        {
            return Ok(*known);
        }
        // A subject with dots or wildcards is never a stream's name.
        let is_stream = match destination.contains(['.', '*', '>', ' ']) {
            true => false,
            false => {
                let asked =
                    tokio::time::timeout(self.timeout, self.context.get_stream(&**destination))
                        .await
                        .map_err(|_| {
                            PublishError::new(
                                PublishErrorKind::Unavailable,
                                &**destination,
                                format!(
                                    "the server did not say within {:?} whether it is a stream",
                                    self.timeout
                                ),
                            )
                        })?;
                match asked {
                    Ok(_) => true,
                    Err(error)
                        if matches!(error.kind(), GetStreamErrorKind::JetStream(ref js)
                            if js.error_code() == ErrorCode::STREAM_NOT_FOUND) =>
                    {
                        false
                    }
                    Err(_) => {
                        return Err(PublishError::new(
                            PublishErrorKind::Unavailable,
                            &**destination,
                            "the server could not say whether it is a stream",
                        ));
                    }
                }
            }
        };
        self.streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(destination.clone(), is_stream);
        Ok(is_stream)
    }
}

impl Publisher for NatsReplayPublisher {
    type Receipt = NatsReceipt;

    async fn send(&self, output: Output) -> Result<NatsReceipt, PublishError> {
        let is_stream = self.is_stream(output.destination_shared()).await?;
        let (destination, payload, key, headers) = output.into_parts();
        let subject: Arc<str> = match (is_stream, key) {
            (false, _) => destination,
            (true, Some(key)) => match std::str::from_utf8(&key) {
                Ok(subject) => subject.into(),
                Err(_) => {
                    return Err(PublishError::new(
                        PublishErrorKind::Rejected,
                        &*destination,
                        "the letter's original subject is not UTF-8",
                    ));
                }
            },
            (true, None) => {
                return Err(PublishError::new(
                    PublishErrorKind::Rejected,
                    &*destination,
                    "the letter has no original subject to publish to; replay it to a subject",
                ));
            }
        };
        // Without a key the publisher sends to the subject as it is.
        self.publisher
            .send(Output::new(subject, payload).with_headers(headers))
            .await
    }
}

/// Builds [`NatsDeadLetters`]; see [`NatsDeadLetters::builder`]. How it
/// connects is its [`NatsSettings`], as a source's.
#[must_use = "a builder does nothing until `.build().await`"]
pub struct NatsDeadLettersBuilder {
    settings: NatsSettings,
    request_timeout: Duration,
    stream: Option<String>,
    subject: Option<String>,
}

impl fmt::Debug for NatsDeadLettersBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsDeadLettersBuilder")
            .field("settings", &self.settings)
            .field("stream", &self.stream)
            .field("subject", &self.subject)
            .finish_non_exhaustive()
    }
}

impl NatsDeadLettersBuilder {
    /// The dead letters the default sink of `consumer` on `stream` writes:
    /// subject `<stream>.<consumer>.dlq` on stream `<stream>_dlq`.
    pub fn dead_letters_of(self, stream: &str, consumer: &str) -> Self {
        self.stream(default_stream(stream))
            .subject(default_subject(stream, consumer))
    }

    /// The dead-letter stream to read, by its own name (every subject,
    /// unless [`subject`](Self::subject) names one).
    pub fn stream(mut self, stream: impl Into<String>) -> Self {
        self.stream = Some(stream.into());
        self
    }

    /// Reads only the letters on `subject` (`*` and `>` allowed).
    pub fn subject(mut self, subject: impl Into<String>) -> Self {
        self.subject = Some(subject.into());
        self
    }

    /// Reads every subject of the stream.
    pub fn every_subject(mut self) -> Self {
        self.subject = None;
        self
    }

    /// How long each request may take (default 5 s): every store operation
    /// is a sequence of requests, each bounded by it.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Checks the settings, then connects.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for no stream, an empty name or subject, or a zero
    /// timeout, before connecting; [`Error::InvalidUrl`],
    /// [`Error::Unreachable`], [`Error::Unauthorized`], [`Error::Tls`],
    /// [`Error::Credentials`] when connecting fails. A stream that does not
    /// exist yet is no error: it holds no letters.
    pub async fn build(self) -> Result<NatsDeadLetters, Error> {
        let stream = match self.stream {
            Some(stream) if !stream.is_empty() => stream,
            Some(_) => return Err(ConfigError::new("stream", "is empty").into()),
            None => {
                return Err(ConfigError::new(
                    "stream",
                    "is not set; name the dead-letter stream (`stream`) or its source and \
                     consumer (`dead_letters_of`)",
                )
                .into());
            }
        };
        if self.subject.as_deref() == Some("") {
            return Err(ConfigError::new("subject", "is empty").into());
        }
        if self.request_timeout.is_zero() {
            return Err(ConfigError::new("request_timeout", "more than zero").into());
        }
        let settings = self
            .settings
            .connect_settings(self.request_timeout, store_reconnect_backoff)?;
        let connection = connection::connect(&settings).await?;
        let context = jetstream::ContextBuilder::new()
            .timeout(self.request_timeout)
            .build(connection.client);
        Ok(NatsDeadLetters {
            context,
            endpoint: connection.endpoint,
            stream: stream.into(),
            subject: self.subject.map(Into::into),
            timeout: self.request_timeout,
        })
    }
}

/// A store's reconnect backoff when its settings set none: 100 ms doubling
/// to 5 s, forever.
fn store_reconnect_backoff() -> Arc<dyn BackoffPolicy> {
    Arc::new(Exponential::new(Duration::from_millis(100), Duration::from_secs(5)).retry_forever())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_selects_subjects_token_by_token() {
        assert!(subject_matches("ORDERS.billing.dlq", "ORDERS.billing.dlq"));
        assert!(!subject_matches("ORDERS.billing.dlq", "ORDERS.audit.dlq"));
        assert!(subject_matches("ORDERS.*.dlq", "ORDERS.audit.dlq"));
        assert!(!subject_matches("ORDERS.*.dlq", "ORDERS.a.b.dlq"));
        assert!(subject_matches("ORDERS.>", "ORDERS.a.b.dlq"));
        assert!(!subject_matches("ORDERS.>", "ORDERS"));
        assert!(!subject_matches("ORDERS.billing", "ORDERS.billing.dlq"));
    }

    #[test]
    fn an_id_is_a_positive_stream_sequence() {
        for id in ["", "0", "-1", "1-0", "x"] {
            assert!(
                matches!(
                    sequence_of(&LetterId::new(id)),
                    Err(StoreError::InvalidId { .. })
                ),
                "{id}"
            );
        }
        assert_eq!(sequence_of(&LetterId::new("41")).ok(), Some(41));
    }
}
