//! [`NatsPublisher`]: outputs published to JetStream subjects, each
//! confirmed by the stream's publish ack. The mapping, the bound, order
//! and duplicates are described on the type.

mod builder;

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind as ClientKind};
use async_nats::{HeaderMap, HeaderName, HeaderValue, Subject};
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use intake_core::publish::{Confirmation, Output, PublishError, PublishErrorKind, Publisher};
use intake_core::{Headers, Position};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

pub use self::builder::NatsPublisherBuilder;
use crate::connection::ConnectionEvents;

/// Publishes [`Output`]s to JetStream, each confirmed by the stream's
/// publish ack. Clones share the connection and the bound.
///
/// # Mapping onto JetStream
///
/// | [`Output`] | NATS message |
/// |---|---|
/// | destination | the subject (a stream must store it) |
/// | key | the subject's last token: `<destination>.<key>`, since this crate's source reads a message's key from its subject; `.`, `*`, `>`, whitespace and control characters in the key become `_`, so a key is always exactly one token. No key: the destination itself. [`ignore_keys`](NatsPublisherBuilder::ignore_keys) publishes to the destination whatever the key |
/// | headers | NATS headers, unchanged (a name given twice is sent twice); a name or value NATS cannot carry (a value that is not UTF-8 or holds a line break) rejects the output, because the crate's source could not read it back |
/// | confirmation | the publish ack: the stream sequence as [`Position::Offset`], no partition |
///
/// Headers named `Nats-…` are passed on as they are, so JetStream acts on
/// them: an output forwarded from a JetStream message keeps its
/// `Nats-Msg-Id`, which lets the destination stream drop the copy a retried
/// relay publishes again.
///
/// # Pipelining, the bound and order
///
/// [`send`](Publisher::send) hands the output to the one connection of the
/// publisher and returns at once with a [`NatsReceipt`]; many outputs are on
/// the wire at once, each acknowledged by the stream on its own. At most
/// [`max_unconfirmed`](NatsPublisherBuilder::max_unconfirmed) outputs
/// (default 1,000) await their ack: a send past that waits for room, at most
/// [`send_timeout`](NatsPublisherBuilder::send_timeout). Outputs sent one
/// after another are written in that order on the one connection, and the
/// server stores a connection's messages to a stream in the order it reads
/// them.
///
/// # Duplicates
///
/// A receipt that ends unavailable leaves the output stored or not (the
/// ack may be what was lost), so publishing it again may store it twice.
/// JetStream drops a second message with the same `Nats-Msg-Id` within the
/// stream's duplicate window (2 minutes by default):
/// [`message_id_header`](NatsPublisherBuilder::message_id_header) takes each
/// output's id from one of its headers. It is off by default, because only
/// the application knows what identifies an output: an id made per send
/// would never match the copy published again, and one made from the
/// content would drop two equal outputs meant to be two.
///
/// # The dead-letter sink
///
/// [`NatsDeadLetterSink`](crate::NatsDeadLetterSink) publishes the same way
/// (a JetStream publish, its ack awaited within a timeout), but one letter
/// at a time on its source's connection, with the envelope as headers; a
/// publisher has a connection of its own (built with the same settings as a
/// source: URL credentials, TLS, reconnect backoff), keeps many outputs in
/// flight, and sends headers as given.
///
/// # Example
///
/// ```no_run
/// use intake_core::publish::{Output, Publisher};
/// use intake_nats::NatsPublisher;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let publisher = NatsPublisher::builder("nats://127.0.0.1:4222")
///    .max_unconfirmed(1_000)
///    .build()
///    .await?;
/// // Stored on `receipts.customer-7`, read back with that subject as the key.
/// let confirmation = publisher
///    .publish(Output::new("receipts", "paid").with_key("customer-7"))
///    .await?;
/// println!("stored at {:?}", confirmation.position);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct NatsPublisher {
    inner: Arc<Inner>,
}

/// What a publisher's clones share; the broker keeps it weakly to close
/// the publishers it made.
pub(crate) struct Inner {
    context: jetstream::Context,
    client: async_nats::Client,
    endpoint: Arc<str>,
    events: Arc<ConnectionEvents>,
    /// One permit per output awaiting its ack.
    permits: Arc<Semaphore>,
    max_unconfirmed: usize,
    send_timeout: Duration,
    ack_timeout: Duration,
    message_id_header: Option<Arc<str>>,
    key_token: bool,
    closed: AtomicBool,
    /// To the task that awaits every publish ack (see [`await_acks`]).
    in_flight: mpsc::UnboundedSender<InFlight>,
}

impl std::fmt::Debug for NatsPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsPublisher")
            .field("endpoint", &self.inner.endpoint)
            .field("unconfirmed", &self.unconfirmed())
            .field("max_unconfirmed", &self.inner.max_unconfirmed)
            .field("send_timeout", &self.inner.send_timeout)
            .field("ack_timeout", &self.inner.ack_timeout)
            .field("message_id_header", &self.inner.message_id_header)
            .field("key_token", &self.inner.key_token)
            .finish_non_exhaustive()
    }
}

/// What [`NatsBroker`](crate::NatsBroker) keeps of a publisher it made.
pub(crate) type PublisherHandle = Inner;

impl NatsPublisher {
    /// A weak handle on this publisher (and its clones).
    pub(crate) fn handle(&self) -> std::sync::Weak<Inner> {
        Arc::downgrade(&self.inner)
    }

    /// The publisher a handle still holds.
    pub(crate) fn from_handle(inner: Arc<Inner>) -> Self {
        Self { inner }
    }

    /// A builder for a publisher connecting with `settings`
    /// ([`NatsSettings`](crate::NatsSettings)), or to the server(s) at a
    /// URL (`nats://[user:password@|token@]host[:port]`, several separated
    /// by commas, `tls://` for TLS).
    pub fn builder(settings: impl Into<crate::NatsSettings>) -> NatsPublisherBuilder {
        NatsPublisherBuilder::new(settings.into())
    }

    /// Outputs sent whose publish ack has not come yet (nor timed out),
    /// whether or not their receipts are awaited: never more than
    /// [`max_unconfirmed`](Self::max_unconfirmed).
    pub fn unconfirmed(&self) -> usize {
        self.inner
            .max_unconfirmed
            .saturating_sub(self.inner.permits.available_permits())
    }

    /// The bound on [`unconfirmed`](Self::unconfirmed) outputs.
    pub fn max_unconfirmed(&self) -> usize {
        self.inner.max_unconfirmed
    }

    /// The server, as errors and logs show it (no credentials).
    pub fn endpoint(&self) -> &str {
        &self.inner.endpoint
    }

    /// The JetStream context of the publisher's connection, for a part
    /// that publishes through it and reads on the same connection (a
    /// group's control channel).
    pub(crate) fn context(&self) -> &jetstream::Context {
        &self.inner.context
    }

    /// The client of the publisher's connection (its state).
    pub(crate) fn client(&self) -> &async_nats::Client {
        &self.inner.client
    }

    /// Stops taking outputs (every send after it is
    /// [closed](PublishErrorKind::Closed)), waits for the acks of those
    /// already sent (at most the ack timeout), and closes the connection
    /// after flushing it. Clones are closed too.
    pub async fn close(&self) {
        let inner = &self.inner;
        if inner.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let all = u32::try_from(inner.max_unconfirmed).unwrap_or(u32::MAX);
        let waited = tokio::time::timeout(inner.ack_timeout, inner.permits.acquire_many(all)).await;
        if !matches!(waited, Ok(Ok(_))) {
            tracing::warn!(
                endpoint = %inner.endpoint,
                unconfirmed = self.unconfirmed(),
                "closing the publisher with outputs still unconfirmed; their receipts end closed, the outputs stored or not"
            );
        }
        inner.permits.close();
        if let Err(error) = inner.client.drain().await {
            tracing::debug!(endpoint = %inner.endpoint, %error, "draining the publisher's connection failed");
        }
        tracing::debug!(endpoint = %inner.endpoint, "closed the publisher");
    }
}

impl Inner {
    /// Where an output goes: its destination, plus its key as the last token.
    fn subject(&self, destination: &str, key: Option<&[u8]>) -> Result<Subject, PublishError> {
        if let Some(reason) = invalid_subject(destination) {
            return Err(PublishError::new(
                PublishErrorKind::Rejected,
                destination,
                format!("not a subject one can publish to: {reason}"),
            ));
        }
        match key.filter(|key| self.key_token && !key.is_empty()) {
            None => Ok(Subject::from(destination)),
            Some(key) => {
                let key = String::from_utf8_lossy(key);
                let mut subject = String::with_capacity(destination.len() + 1 + key.len());
                subject.push_str(destination);
                subject.push('.');
                subject.extend(key.chars().map(key_char));
                Ok(Subject::from(subject))
            }
        }
    }

    /// The output's headers as NATS headers, with its message id.
    fn headers(&self, headers: &Headers, subject: &str) -> Result<Option<HeaderMap>, PublishError> {
        if headers.is_empty() {
            return Ok(None);
        }
        let rejected = |what: String| PublishError::new(PublishErrorKind::Rejected, subject, what);
        let mut map = HeaderMap::new();
        for header in headers.iter() {
            let name = HeaderName::try_from(&*header.name).map_err(|error| {
                rejected(format!(
                    "header name {:?} is no NATS header name",
                    header.name
                ))
                .with_source(error)
            })?;
            let value = header_value(&header.value).ok_or_else(|| {
                rejected(format!(
                    "the value of header {:?} is not UTF-8 without line breaks, which a NATS header cannot carry",
                    header.name
                ))
            })?;
            map.append(name, value);
        }
        if let Some(id_header) = &self.message_id_header
            && let Some(id) = headers.get(id_header).and_then(|id| header_value(id))
        {
            map.insert(async_nats::header::NATS_MESSAGE_ID, id);
        }
        Ok(Some(map))
    }

    fn closed(&self, subject: &str) -> Option<PublishError> {
        if self.closed.load(Ordering::Acquire) {
            return Some(PublishError::new(
                PublishErrorKind::Closed,
                subject,
                "the publisher was closed; build a new one",
            ));
        }
        let attempts = self.events.gave_up()?;
        Some(PublishError::new(
            PublishErrorKind::Closed,
            subject,
            format!(
                "gave up reconnecting to the NATS server at {} after {attempts} attempts (the reconnect backoff's cap); build a new publisher",
                self.endpoint
            ),
        ))
    }

    /// What a failed send means.
    fn send_error(&self, subject: &str, error: jetstream::context::PublishError) -> PublishError {
        let (kind, what) = match error.kind() {
            ClientKind::MaxPayloadExceeded => (
                PublishErrorKind::Rejected,
                "larger than the server's max_payload".to_owned(),
            ),
            ClientKind::TimedOut | ClientKind::MaxAckPending => (
                PublishErrorKind::Unavailable,
                format!(
                    "the client took no more outputs within {:?}; publish again",
                    self.send_timeout
                ),
            ),
            // What remains is the client's command channel being closed:
            // the connection ended for good.
            _ => (
                PublishErrorKind::Closed,
                "the connection is closed; build a new publisher".to_owned(),
            ),
        };
        PublishError::new(kind, subject, what).with_source(error)
    }

    /// What a failed publish ack means.
    fn ack_error(&self, subject: &str, error: jetstream::context::PublishError) -> PublishError {
        let (kind, what) = match error.kind() {
            ClientKind::TimedOut => (
                PublishErrorKind::Unavailable,
                format!(
                    "no publish ack from {} within {:?}; the output may be stored or not: publish again",
                    self.endpoint, self.ack_timeout
                ),
            ),
            ClientKind::BrokenPipe if self.closed.load(Ordering::Acquire) => (
                PublishErrorKind::Closed,
                "the publisher was closed before the ack came; the output may be stored or not"
                    .to_owned(),
            ),
            ClientKind::BrokenPipe => (
                PublishErrorKind::Unavailable,
                "the connection dropped the publish ack; the output may be stored or not: publish again"
                    .to_owned(),
            ),
            ClientKind::StreamNotFound => (
                PublishErrorKind::Rejected,
                "no stream stores this subject (no responders); create one or publish elsewhere"
                    .to_owned(),
            ),
            ClientKind::WrongLastMessageId | ClientKind::WrongLastSequence => (
                PublishErrorKind::Rejected,
                "the stream refused the output's expectation (a Nats-Expected-… header)".to_owned(),
            ),
            ClientKind::MaxPayloadExceeded => (
                PublishErrorKind::Rejected,
                "larger than the server's max_payload".to_owned(),
            ),
            _ => match jetstream_error(&error) {
                // 4xx: this message (too large for the stream, headers over
                // 64 KiB, a sealed stream); 5xx: the stream cannot store
                // now (storage, resources, a leader missing).
                Some(code) if (400..500).contains(&code) => (
                    PublishErrorKind::Rejected,
                    "the stream refused the output".to_owned(),
                ),
                Some(_) => (
                    PublishErrorKind::Unavailable,
                    "the stream could not store the output now; publish again".to_owned(),
                ),
                None => (
                    PublishErrorKind::Unavailable,
                    "the publish ack could not be read; the output may be stored or not: publish again"
                        .to_owned(),
                ),
            },
        };
        PublishError::new(kind, subject, what).with_source(error)
    }
}

/// The status code of the server's error behind a publish ack, if there is
/// one.
fn jetstream_error(error: &jetstream::context::PublishError) -> Option<usize> {
    std::error::Error::source(error)?
        .downcast_ref::<jetstream::Error>()
        .map(jetstream::Error::code)
}

/// Why `subject` cannot be published to, if it cannot: empty, whitespace
/// or control characters (they break the protocol's framing), an empty
/// token, or a wildcard token.
fn invalid_subject(subject: &str) -> Option<&'static str> {
    if subject.is_empty() {
        return Some("empty");
    }
    if subject.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Some("whitespace or a control character");
    }
    for token in subject.split('.') {
        match token {
            "" => return Some("an empty token (a leading, trailing or double `.`)"),
            "*" | ">" => return Some("a wildcard token"),
            _ => {}
        }
    }
    None
}

/// A key's character as it stands in the subject's last token.
fn key_char(c: char) -> char {
    match c {
        '.' | '*' | '>' => '_',
        c if c.is_whitespace() || c.is_control() => '_',
        c => c,
    }
}

/// `bytes` as a NATS header value: UTF-8 without line breaks.
fn header_value(bytes: &[u8]) -> Option<HeaderValue> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

impl Publisher for NatsPublisher {
    type Receipt = NatsReceipt;

    async fn send(&self, output: Output) -> Result<NatsReceipt, PublishError> {
        let inner = &self.inner;
        let (destination, payload, key, headers) = output.into_parts();
        let subject = inner.subject(&destination, key.as_deref())?;
        if let Some(closed) = inner.closed(&subject) {
            return Err(closed);
        }
        let headers = inner.headers(&headers, &subject)?;
        let deadline = tokio::time::Instant::now() + inner.send_timeout;
        let permit = match tokio::time::timeout_at(
            deadline,
            Arc::clone(&inner.permits).acquire_owned(),
        )
        .await
        {
            Ok(Ok(permit)) => permit,
            Ok(Err(_closed)) => {
                return Err(inner.closed(&subject).unwrap_or_else(|| {
                    PublishError::new(PublishErrorKind::Closed, &*subject, "closed")
                }));
            }
            Err(elapsed) => {
                tracing::debug!(
                    endpoint = %inner.endpoint,
                    %subject,
                    unconfirmed = inner.max_unconfirmed,
                    "no room for an output within the send timeout"
                );
                return Err(PublishError::new(
                    PublishErrorKind::Unavailable,
                    &*subject,
                    format!(
                        "{} outputs still await their publish ack after {:?}; the server is slow or unreachable: publish again later",
                        inner.max_unconfirmed, inner.send_timeout
                    ),
                )
                .with_source(elapsed));
            }
        };
        let mut message = jetstream::message::PublishMessage::build().payload(payload);
        if let Some(headers) = headers {
            message = message.headers(headers);
        }
        let ack = match tokio::time::timeout_at(
            deadline,
            inner.context.send_publish(subject.clone(), message),
        )
        .await
        {
            Ok(Ok(ack)) => ack,
            Ok(Err(error)) => return Err(inner.send_error(&subject, error)),
            Err(elapsed) => {
                return Err(PublishError::new(
                    PublishErrorKind::Unavailable,
                    &*subject,
                    format!(
                        "the client took no more outputs within {:?}; publish again",
                        inner.send_timeout
                    ),
                )
                .with_source(elapsed));
            }
        };
        let (reply, receipt) = oneshot::channel();
        let in_flight = InFlight {
            ack: ack.into_future(),
            permit,
            reply,
        };
        if inner.in_flight.send(in_flight).is_err() {
            // The task awaiting acks is gone: its runtime is shutting down.
            return Err(PublishError::new(
                PublishErrorKind::Closed,
                &*subject,
                "the runtime the publisher was built on is shutting down",
            ));
        }
        Ok(NatsReceipt {
            receipt,
            subject,
            inner: Arc::clone(inner),
        })
    }
}

type AckFuture = Pin<
    Box<
        dyn Future<
                Output = Result<jetstream::publish::PublishAck, jetstream::context::PublishError>,
            > + Send,
    >,
>;

type AckResult = Result<jetstream::publish::PublishAck, jetstream::context::PublishError>;

/// One output on the wire: its ack to await, its place among the
/// unconfirmed, and where its receipt waits.
struct InFlight {
    ack: AckFuture,
    permit: OwnedSemaphorePermit,
    reply: oneshot::Sender<AckResult>,
}

/// Awaits the publish ack of every output sent, and frees its place as soon
/// as the ack is in, whether or not anyone polls the receipt yet: a caller
/// that sends more outputs than the bound before awaiting any receipt (a
/// handler returning many outputs) must not wait for room that only its
/// own later awaits would free. Ends once the publisher and its clones are
/// dropped and every ack is in (or timed out).
async fn await_acks(mut incoming: mpsc::UnboundedReceiver<InFlight>) {
    let mut pending = FuturesUnordered::new();
    loop {
        tokio::select! {
            biased;
            Some(()) = pending.next(), if !pending.is_empty() => {}
            next = incoming.recv() => match next {
                Some(InFlight { ack, permit, reply }) => pending.push(async move {
                    let acked = ack.await;
                    drop(permit);
                    // A receipt dropped unawaited: nobody wants the answer.
                    let _ = reply.send(acked);
                }),
                None => break,
            },
        }
    }
    while pending.next().await.is_some() {}
}

/// The publish ack of one output, the future a
/// [`NatsPublisher`]'s [`send`](Publisher::send) returns: resolves with the
/// stream sequence the output was stored at, or with why it was not
/// confirmed, within the publisher's ack timeout from the send. The
/// output's place among the publisher's
/// [`max_unconfirmed`](NatsPublisher::max_unconfirmed) is freed when its ack
/// comes, whether the receipt is awaited then or later (or dropped).
#[must_use = "a receipt does nothing unless awaited: the output is confirmed only when it resolves"]
pub struct NatsReceipt {
    receipt: oneshot::Receiver<AckResult>,
    subject: Subject,
    inner: Arc<Inner>,
}

impl std::fmt::Debug for NatsReceipt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsReceipt")
            .field("subject", &self.subject)
            .finish_non_exhaustive()
    }
}

impl Future for NatsReceipt {
    type Output = Result<Confirmation, PublishError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let acked = std::task::ready!(Pin::new(&mut self.receipt).poll(cx));
        Poll::Ready(match acked {
            Ok(Ok(ack)) => {
                if ack.duplicate {
                    tracing::debug!(
                        subject = %self.subject,
                        stream = %ack.stream,
                        sequence = ack.sequence,
                        "the stream already held this message id; the output was not stored again"
                    );
                }
                Ok(Confirmation::at(
                    None,
                    i64::try_from(ack.sequence).ok().map(Position::Offset),
                ))
            }
            Ok(Err(error)) => {
                let error = self.inner.ack_error(&self.subject, error);
                tracing::debug!(error = %error, "an output was not confirmed");
                Err(error)
            }
            Err(_gone) => Err(PublishError::new(
                PublishErrorKind::Closed,
                &*self.subject,
                "the task awaiting publish acks is gone (its runtime shut down); the output may be stored or not",
            )),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_one_subject_token() {
        let chars: String = "a.b*c>d e\tf\u{7}g-h_i".chars().map(key_char).collect();
        assert_eq!(chars, "a_b_c_d_e_f_g-h_i");
    }

    #[test]
    fn only_subjects_one_can_publish_to_pass() {
        assert_eq!(invalid_subject("orders.created"), None);
        assert_eq!(invalid_subject("orders.a*b"), None);
        for bad in [
            "", "orders.", ".orders", "a..b", "a b", "a\r\nb", "a.*", "a.>",
        ] {
            assert!(invalid_subject(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn header_values_must_be_utf8_without_line_breaks() {
        assert!(header_value(b"plain value").is_some());
        assert!(header_value(b"two\r\nlines").is_none());
        assert!(header_value(&[0xff, 0xfe]).is_none());
    }
}
