//! [`KafkaPublisher`]: outputs to Kafka topics from an idempotent producer,
//! each confirmed by its delivery report.
//!
//! The producer is librdkafka's, driven by rdkafka's [`ThreadedProducer`]
//! with a context of this module's own rather than a `FutureProducer`: the
//! delivery callback resolves the output's receipt itself (one allocation per
//! output, the receipt's slot, handed to librdkafka as the message's opaque
//! pointer), counts the outputs awaiting confirmation, and wakes senders
//! waiting for room in the queue at once instead of after a fixed sleep.
//!
//! The [dead-letter sink](crate::KafkaDeadLetterSink) writes with a
//! `FutureProducer` of its own, one letter at a time: it shares the
//! settings ([`KafkaSettings`]) and the error style, not the producer. A
//! dead letter is rare and awaited alone; outputs are many and pipelined.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use intake_core::publish::{Confirmation, Output, PublishError, PublishErrorKind, Publisher};
use intake_core::{Headers, Position};
use rdkafka::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::Error;
use crate::settings::KafkaSettings;

/// How often a sender waiting for room in a full queue tries again even
/// without a wake-up: librdkafka frees a delivered message's room only after
/// its delivery callback returned, so the callback's wake-up can come a few
/// microseconds too early, and for the last message in the queue no other
/// wake-up follows.
const ROOM_RECHECK: Duration = Duration::from_millis(2);

/// The destination named by errors that concern every output (closing).
const EVERY_DESTINATION: &str = "<every destination>";

/// Publishes [`Output`]s to Kafka topics, each confirmed by the broker's
/// delivery report.
///
/// | intake | Kafka |
/// |---|---|
/// | destination | the topic |
/// | key | the record key; librdkafka's `murmur2_random` partitioner puts a key where Java producers put it |
/// | partition | [`Output::partition`] when set (a replay into its origin partition), else the key's |
/// | headers | the record headers, in order, names repeated as given |
/// | confirmation | the delivery report: partition and offset ([`Position::Offset`]) |
/// | order | idempotent producer (`enable.idempotence=true`: `acks=all`, retries keep order and add no duplicates), so outputs of one partition are stored in the order sent |
/// | buffer | librdkafka's queue, `queue.buffering.max.messages` (default 100,000) and `queue.buffering.max.kbytes` (default 65,536) |
///
/// [`send`](Publisher::send) hands the output to librdkafka, which batches
/// outputs for `linger.ms` (default 5 ms) and keeps many batches in flight.
/// When the queue is full it waits for room, in line behind senders that
/// found it full before (so one caller's outputs stay in order and none
/// waits forever), at most the [send timeout](KafkaPublisherBuilder::send_timeout)
/// (then [`Unavailable`](PublishErrorKind::Unavailable)). The receipt
/// resolves with the delivery report, which librdkafka gives within the
/// [delivery timeout](KafkaPublisherBuilder::delivery_timeout)
/// (`message.timeout.ms`, retries included).
///
/// Errors: not confirmed in time, the brokers unreachable, or a topic that
/// does not exist (where topics are not created on first use) or that this
/// client may not write to, is [`Unavailable`](PublishErrorKind::Unavailable):
/// every output to it fails until it is back, so its inputs are retried
/// rather than dead-lettered. An output the client or broker refuses
/// itself (larger than `message.max.bytes` or the topic's
/// `max.message.bytes`, an invalid record or topic name) is
/// [`Rejected`](PublishErrorKind::Rejected); a publisher
/// [closed](KafkaPublisher::close) or dropped with outputs unconfirmed, or
/// a producer librdkafka gave up on (a fatal idempotence error), is
/// [`Closed`](PublishErrorKind::Closed). Each has librdkafka's error as its
/// source; none shows a credential.
///
/// The broker refuses a whole batch when the batch is larger than the
/// topic's `max.message.bytes` (or when one of its records is invalid),
/// and librdkafka does not split it as Java's producer does: each output of
/// a refused batch is sent again alone, by a second producer made on first
/// need (`batch.num.messages=1`), so only an output refused by itself is
/// [`Rejected`](PublishErrorKind::Rejected) and the ones batched with it
/// are stored. A topic whose `max.message.bytes` is below the producer's
/// `batch.size` has most of its batches refused that way (logged once at
/// WARN): give such a publisher a smaller `batch.size`.
///
/// Clones share the producer. It connects on the first send. Dropping the
/// last clone ends the outputs still unconfirmed as
/// [`Closed`](PublishErrorKind::Closed) and blocks for up to about 0.6 s
/// while librdkafka stops: [`close`](Self::close) it first to let them be
/// confirmed.
///
/// ```no_run
/// use intake_core::publish::{Output, Publisher};
/// use intake_kafka::{KafkaPublisher, KafkaSettings};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let publisher = KafkaPublisher::builder(KafkaSettings::new("127.0.0.1:9092")).build()?;
/// let receipt = publisher
///     .send(Output::new("receipts", "paid").with_key("customer-7"))
///     .await?;
/// let confirmation = receipt.await?; // the delivery report
/// println!("stored at {:?}", confirmation.position);
/// publisher.close(std::time::Duration::from_secs(5)).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct KafkaPublisher {
    inner: Arc<Inner>,
}

struct Inner {
    producer: ThreadedProducer<PublisherContext>,
    shared: Arc<Shared>,
    /// Senders that found the queue full, in the order they found it so.
    line: tokio::sync::Mutex<()>,
    send_timeout: Duration,
}

/// What the publisher and its delivery callback share.
struct Shared {
    /// Outputs handed to librdkafka whose delivery report has not come:
    /// counted up after librdkafka took the output and down in its delivery
    /// callback, so it is never above librdkafka's own count (and its bound),
    /// at most briefly below it.
    awaiting: AtomicIsize,
    /// Senders waiting for room.
    waiting: AtomicUsize,
    /// Woken when a delivery report frees room, if someone waits.
    room: Notify,
    closed: AtomicBool,
    /// `bootstrap.servers`, credentials hidden.
    brokers: Arc<str>,
    delivery_timeout: Duration,
}

impl fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shared = &self.inner.shared;
        f.debug_struct("KafkaPublisher")
            .field("brokers", &shared.brokers)
            .field("awaiting_confirmation", &self.awaiting_confirmation())
            .field("closed", &shared.closed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Builds a [`KafkaPublisher`] on the brokers of a [`KafkaSettings`]: every
/// librdkafka producer setting passes through it (TLS, SASL, `compression.type`,
/// `batch.size`, ...).
///
/// Defaults intake applies unless the settings say otherwise:
/// `linger.ms=5`, `partitioner=murmur2_random` (Java's partitioner for keyed
/// records), `queue.buffering.max.messages=100000`,
/// `queue.buffering.max.kbytes=65536` (64 MiB, not librdkafka's 1 GiB),
/// `message.timeout.ms` from [`delivery_timeout`](Self::delivery_timeout).
/// Always applied: `enable.idempotence=true`.
///
/// The producer is made in this one place ([`build`](Self::build)), so a
/// transactional variant can start from the same settings.
#[derive(Debug, Clone)]
pub struct KafkaPublisherBuilder {
    settings: KafkaSettings,
    linger: Duration,
    max_buffered: u32,
    max_buffered_kbytes: u32,
    send_timeout: Duration,
    delivery_timeout: Duration,
}

impl KafkaPublisher {
    /// A builder for a publisher on the brokers of `settings`.
    pub fn builder(settings: KafkaSettings) -> KafkaPublisherBuilder {
        KafkaPublisherBuilder {
            settings,
            linger: Duration::from_millis(5),
            max_buffered: 100_000,
            max_buffered_kbytes: 65_536,
            send_timeout: Duration::from_secs(10),
            delivery_timeout: Duration::from_secs(30),
        }
    }

    /// Outputs sent whose delivery report has not come yet (queued, in
    /// flight, or confirmed a moment ago). Never above the buffer's bound,
    /// `queue.buffering.max.messages`.
    pub fn awaiting_confirmation(&self) -> usize {
        usize::try_from(self.inner.shared.awaiting.load(Ordering::Acquire)).unwrap_or(0)
    }

    /// Closes the publisher (and its clones): sends from now on fail with
    /// [`Closed`](PublishErrorKind::Closed), and this waits up to `timeout`
    /// for the delivery reports of the outputs already sent.
    ///
    /// # Errors
    ///
    /// [`Unavailable`](PublishErrorKind::Unavailable) when outputs are still
    /// unconfirmed after `timeout`: their receipts resolve when librdkafka
    /// gives up on them (the delivery timeout), or with
    /// [`Closed`](PublishErrorKind::Closed) when the last clone is dropped.
    pub async fn close(&self, timeout: Duration) -> Result<(), PublishError> {
        self.inner.shared.closed.store(true, Ordering::Release);
        let producer = self.inner.producer.clone();
        let flushed = tokio::task::spawn_blocking(move || {
            let until = std::time::Instant::now() + timeout;
            producer.flush(timeout)?;
            // Outputs of refused batches sent again alone (their delivery
            // callbacks all ran once the first flush returned).
            match producer
                .context()
                .alone
                .as_ref()
                .and_then(|alone| alone.producer.get())
            {
                Some(Some(alone)) => {
                    alone.flush(until.saturating_duration_since(std::time::Instant::now()))
                }
                _ => Ok(()),
            }
        })
        .await
        // The flush did not finish: the runtime is shutting down.
        .unwrap_or(Err(KafkaError::Canceled));
        let left = self.awaiting_confirmation();
        match flushed {
            Ok(()) => {
                tracing::debug!(brokers = %self.inner.shared.brokers, "kafka publisher closed");
                Ok(())
            }
            Err(error) => {
                tracing::warn!(brokers = %self.inner.shared.brokers, left, ?timeout, "kafka publisher closed with outputs unconfirmed");
                Err(PublishError::new(
                    PublishErrorKind::Unavailable,
                    EVERY_DESTINATION,
                    format!(
                        "{left} outputs not confirmed within {timeout:?} of closing; they resolve when the delivery timeout ends"
                    ),
                )
                .with_source(error))
            }
        }
    }

    /// Waits for room in the queue, in line, and hands `record` over.
    async fn send_when_room(
        &self,
        mut record: Record<'_>,
        destination: &str,
    ) -> Result<(), PublishError> {
        let inner = &*self.inner;
        let shared = &*inner.shared;
        let deadline = Instant::now() + inner.send_timeout;
        shared.waiting.fetch_add(1, Ordering::AcqRel);
        let _waiting = Waiting(&shared.waiting);
        let no_room = |source: Option<KafkaError>| {
            tracing::warn!(
                brokers = %shared.brokers,
                destination,
                timeout = ?inner.send_timeout,
                "kafka publisher queue stayed full; the broker does not keep up or is unreachable"
            );
            let error = PublishError::new(
                PublishErrorKind::Unavailable,
                destination,
                format!(
                    "no room in the producer's queue within {:?} (queue.buffering.max.*): the brokers at {} do not confirm fast enough; publish again later",
                    inner.send_timeout, shared.brokers
                ),
            );
            match source {
                Some(source) => error.with_source(source),
                None => error,
            }
        };
        let Ok(_turn) = tokio::time::timeout_at(deadline, inner.line.lock()).await else {
            return Err(no_room(None));
        };
        loop {
            let room = shared.room.notified();
            tokio::pin!(room);
            // Registered before the attempt: a delivery between the attempt
            // and the wait still wakes it.
            room.as_mut().enable();
            if shared.closed.load(Ordering::Acquire) {
                return Err(closed(destination, None));
            }
            match inner.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((error @ KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _))
                    if Instant::now() >= deadline =>
                {
                    return Err(no_room(Some(error)));
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                    record = returned;
                }
                Err((error, _)) => return Err(refused(error, destination, &shared.brokers)),
            }
            let recheck = (Instant::now() + ROOM_RECHECK).min(deadline);
            let _ = tokio::time::timeout_at(recheck, room).await;
        }
    }
}

/// The record handed to librdkafka, with the receipt's slot as its opaque.
type Record<'a> = BaseRecord<'a, [u8], [u8], Arc<Slot>>;

/// Counts a sender out of the waiting ones, however its send ends.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Publisher for KafkaPublisher {
    type Receipt = KafkaReceipt;

    async fn send(&self, output: Output) -> Result<KafkaReceipt, PublishError> {
        let shared = &*self.inner.shared;
        let partition = output.partition();
        let (destination, payload, key, headers) = output.into_parts();
        if shared.closed.load(Ordering::Acquire) {
            return Err(closed(&destination, None));
        }
        let slot = Arc::new(Slot::default());
        let mut record =
            BaseRecord::with_opaque_to(&destination, Arc::clone(&slot)).payload(payload.as_ref());
        if let Some(partition) = partition {
            // Above i32::MAX no Kafka partition exists: librdkafka refuses
            // it as an unknown partition, like any other it does not know.
            record = record.partition(i32::try_from(partition).unwrap_or(i32::MAX));
        }
        if let Some(key) = &key {
            record = record.key(key.as_ref());
        }
        if !headers.is_empty() {
            record = record.headers(kafka_headers(&headers));
        }
        let sent = if shared.waiting.load(Ordering::Acquire) == 0 {
            match self.inner.producer.send(record) {
                Ok(()) => Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                    self.send_when_room(returned, &destination).await
                }
                Err((error, _)) => Err(refused(error, &destination, &shared.brokers)),
            }
        } else {
            // Others wait for room: behind them.
            self.send_when_room(record, &destination).await
        };
        sent?;
        shared.awaiting.fetch_add(1, Ordering::AcqRel);
        Ok(KafkaReceipt { slot })
    }
}

fn kafka_headers(headers: &Headers) -> OwnedHeaders {
    headers.iter().fold(
        OwnedHeaders::new_with_capacity(headers.len()),
        |kafka, header| {
            kafka.insert(Header {
                key: &header.name,
                value: Some(header.value.as_ref()),
            })
        },
    )
}

/// Resolves with an output's delivery report: see [`KafkaPublisher`].
#[must_use = "a receipt does nothing unless awaited; dropping it does not cancel the output"]
pub struct KafkaReceipt {
    slot: Arc<Slot>,
}

impl fmt::Debug for KafkaReceipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaReceipt").finish_non_exhaustive()
    }
}

impl Future for KafkaReceipt {
    type Output = Result<Confirmation, PublishError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self
            .slot
            .state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        match &mut *state {
            SlotState::Pending(waker) => {
                match waker {
                    Some(waker) if waker.will_wake(cx.waker()) => {}
                    _ => *waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            SlotState::Done(_) => match std::mem::replace(&mut *state, SlotState::Taken) {
                SlotState::Done(outcome) => Poll::Ready(outcome),
                _ => Poll::Pending,
            },
            SlotState::Taken => Poll::Ready(Err(PublishError::new(
                PublishErrorKind::Closed,
                "",
                "the receipt was awaited again after it resolved",
            ))),
        }
    }
}

/// Where the delivery callback leaves an output's outcome for its receipt.
#[derive(Default)]
struct Slot {
    state: Mutex<SlotState>,
}

enum SlotState {
    Pending(Option<Waker>),
    Done(Result<Confirmation, PublishError>),
    Taken,
}

impl Default for SlotState {
    fn default() -> Self {
        SlotState::Pending(None)
    }
}

impl Slot {
    fn complete(&self, outcome: Result<Confirmation, PublishError>) {
        let waker = {
            let mut state = self
                .state
                .lock()
                .unwrap_or_else(|poison| poison.into_inner());
            match std::mem::replace(&mut *state, SlotState::Done(outcome)) {
                SlotState::Pending(waker) => waker,
                // librdkafka reports each message once; keep the first.
                earlier => {
                    *state = earlier;
                    None
                }
            }
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// The producer's context: delivery reports and client errors.
struct PublisherContext {
    shared: Arc<Shared>,
    /// Where outputs the broker refused as part of a batch are sent again,
    /// each alone: `None` in that producer's own context.
    alone: Option<Alone>,
}

/// A second producer, made on first need, that sends one output per batch
/// (`batch.num.messages=1`): the broker judges each alone.
///
/// The broker refuses a whole batch when the batch is larger than the
/// topic's `max.message.bytes` (or when one of its records is invalid, the
/// others failing with `_INVALID_DIFFERENT_RECORD`), and librdkafka, unlike
/// Java's producer, does not split it: every output in it fails the same
/// way, the one too large and the ones batched with it, or a batch of small
/// outputs larger than a small limit with no output too large at all. Sent
/// again alone, only an output that is refused by itself ends as
/// [`Rejected`](PublishErrorKind::Rejected); the others are stored.
struct Alone {
    settings: KafkaSettings,
    producer: std::sync::OnceLock<Option<ThreadedProducer<PublisherContext>>>,
    /// A refused batch was logged at WARN (then at DEBUG).
    warned: AtomicBool,
}

impl Alone {
    fn new(settings: &KafkaSettings) -> Self {
        Self {
            settings: settings.clone().set("batch.num.messages", "1"),
            producer: std::sync::OnceLock::new(),
            warned: AtomicBool::new(false),
        }
    }

    /// The producer, made now if it was not before; `None` if librdkafka
    /// refused to make it (logged).
    fn producer(&self, shared: &Arc<Shared>) -> Option<&ThreadedProducer<PublisherContext>> {
        self.producer
            .get_or_init(|| {
                let context = PublisherContext {
                    shared: Arc::clone(shared),
                    alone: None,
                };
                self.settings
                    .client_config()
                    .create_with_context(context)
                    .inspect_err(|error| {
                        tracing::error!(brokers = %shared.brokers, %error, "the kafka producer for outputs sent alone could not be made");
                    })
                    .ok()
            })
            .as_ref()
    }

    /// Sends the output of `message` again, alone, to the partition it was
    /// placed in, with `slot` as its receipt. Gives `slot` back if it could
    /// not.
    fn resend(
        &self,
        shared: &Arc<Shared>,
        message: &rdkafka::message::BorrowedMessage<'_>,
        slot: Arc<Slot>,
    ) -> Result<(), Arc<Slot>> {
        use rdkafka::Message as _;
        let Some(producer) = self.producer(shared) else {
            return Err(slot);
        };
        let mut record = BaseRecord::with_opaque_to(message.topic(), slot)
            .partition(message.partition())
            .payload(message.payload().unwrap_or_default());
        if let Some(key) = message.key() {
            record = record.key(key);
        }
        if let Some(timestamp) = message.timestamp().to_millis() {
            record = record.timestamp(timestamp);
        }
        if let Some(headers) = message.headers() {
            // Copied by librdkafka, names never read as UTF-8 here.
            record = record.headers(headers.detach());
        }
        producer.send(record).map_err(|(error, record)| {
            tracing::debug!(brokers = %shared.brokers, %error, "an output refused in a batch could not be sent again alone");
            record.delivery_opaque
        })
    }
}

/// Whether the broker refused `error`'s output as part of a batch, so that
/// it may be stored when sent alone.
fn refused_in_batch(error: &KafkaError) -> bool {
    matches!(
        error,
        KafkaError::MessageProduction(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::MessageBatchTooLarge
                | RDKafkaErrorCode::InvalidDifferentRecord
        )
    )
}

impl ClientContext for PublisherContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
            // The idempotent producer cannot go on: every send and every
            // unconfirmed output fails as closed.
            tracing::error!(brokers = %self.shared.brokers, %error, reason, "fatal kafka producer error; make a new publisher");
        } else {
            // Connection losses and timeouts: librdkafka reconnects and
            // retries by itself, until the delivery timeout.
            tracing::warn!(brokers = %self.shared.brokers, %error, reason, "kafka producer error");
        }
    }
}

impl ProducerContext for PublisherContext {
    type DeliveryOpaque = Arc<Slot>;

    fn delivery(&self, result: &DeliveryResult<'_>, slot: Arc<Slot>) {
        use rdkafka::Message as _;
        let shared = &*self.shared;
        let slot = match (result, &self.alone) {
            // Also while closing: sending alone is how these are confirmed.
            (Err((error, message)), Some(alone)) if refused_in_batch(error) => {
                if !alone.warned.swap(true, Ordering::AcqRel) {
                    tracing::warn!(
                        brokers = %shared.brokers,
                        destination = message.topic(),
                        %error,
                        "the broker refused a batch of outputs; each is sent again alone (a topic whose max.message.bytes is below the producer's batch.size refuses batches of small outputs too: lower batch.size for it)"
                    );
                }
                // Still awaiting confirmation: the output is counted until
                // the second producer reports on it.
                match alone.resend(&self.shared, message, slot) {
                    Ok(()) => return,
                    Err(slot) => slot,
                }
            }
            _ => slot,
        };
        shared.awaiting.fetch_sub(1, Ordering::AcqRel);
        let outcome = match result {
            Ok(message) => Ok(Confirmation::at(
                u32::try_from(message.partition()).ok(),
                (message.offset() >= 0).then(|| Position::Offset(message.offset())),
            )),
            Err((error, message)) => {
                let destination = message.topic();
                tracing::debug!(brokers = %shared.brokers, destination, %error, "kafka output not confirmed");
                Err(delivery_failed(error.clone(), destination, shared))
            }
        };
        slot.complete(outcome);
        if shared.waiting.load(Ordering::Acquire) > 0 {
            shared.room.notify_waiters();
        }
    }
}

/// What a librdkafka error code means for one output.
fn kind_of(code: RDKafkaErrorCode) -> PublishErrorKind {
    use RDKafkaErrorCode as Code;
    match code {
        // This output, as it is, is refused every time.
        Code::MessageSizeTooLarge
        | Code::InvalidMessageSize
        | Code::MessageBatchTooLarge
        | Code::InvalidMessage
        | Code::InvalidRecord
        | Code::InvalidTopic
        | Code::InvalidArgument
        | Code::InvalidTimestamp
        | Code::PolicyViolation
        | Code::UnsupportedForMessageFormat => PublishErrorKind::Rejected,
        // Purged by close or drop, or a producer librdkafka gave up on.
        Code::PurgeQueue | Code::PurgeInflight | Code::Fatal => PublishErrorKind::Closed,
        // Anything else, a destination missing or not allowed among them
        // (`destination_missing`): that says nothing about the output (a
        // topic deleted and created again, a migration, an ACL not granted
        // yet), and every output to it fails the same way until it is
        // back, so failing each input for good would dead-letter them all.
        // They are retried, after the consumer's backoff.
        _ => PublishErrorKind::Unavailable,
    }
}

/// Whether `code` says the destination topic is missing, or this client
/// may not write to it (rather than anything about the output itself).
/// An unknown partition is one of a topic deleted under an output the
/// partitioner had placed (outputs name no partition of their own).
fn destination_missing(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as Code;
    matches!(
        code,
        Code::UnknownTopic
            | Code::UnknownTopicOrPartition
            | Code::UnknownPartition
            | Code::TopicAuthorizationFailed
            | Code::ClusterAuthorizationFailed
    )
}

/// An output librdkafka refused when it was handed over.
fn refused(error: KafkaError, destination: &str, brokers: &str) -> PublishError {
    let kind = match &error {
        KafkaError::MessageProduction(code) => kind_of(*code),
        // A topic name with a NUL byte, which no broker takes.
        KafkaError::Nul(_) => PublishErrorKind::Rejected,
        _ => PublishErrorKind::Unavailable,
    };
    let what = match kind {
        PublishErrorKind::Rejected => format!(
            "the Kafka client refused the output for {brokers} (too large for `message.max.bytes`, or an invalid topic name); sending it again fails the same way"
        ),
        PublishErrorKind::Closed => return closed(destination, Some(error)),
        _ if error.rdkafka_error_code().is_some_and(destination_missing) => missing(brokers),
        _ => format!("the Kafka client for {brokers} could not take the output; publish again"),
    };
    PublishError::new(kind, destination, what).with_source(error)
}

/// An output whose delivery report is a failure.
fn delivery_failed(error: KafkaError, destination: &str, shared: &Shared) -> PublishError {
    let kind = match &error {
        KafkaError::MessageProduction(code) => kind_of(*code),
        _ => PublishErrorKind::Unavailable,
    };
    let brokers = &shared.brokers;
    let what = match kind {
        PublishErrorKind::Rejected => format!(
            "the Kafka broker at {brokers} refused the output itself (too large for the topic, or an invalid record); sending it again fails the same way"
        ),
        PublishErrorKind::Closed => return closed(destination, Some(error)),
        _ if error.rdkafka_error_code().is_some_and(destination_missing) => missing(brokers),
        _ => format!(
            "not confirmed by the Kafka broker at {brokers} within {:?} (message.timeout.ms); it may or may not be stored; publish again",
            shared.delivery_timeout
        ),
    };
    PublishError::new(kind, destination, what).with_source(error)
}

/// What an output to a missing (or forbidden) destination is told.
fn missing(brokers: &str) -> String {
    format!(
        "the topic does not exist at {brokers} (or this client may not write to it): the output is not stored; publish again once the topic is back"
    )
}

fn closed(destination: &str, source: Option<KafkaError>) -> PublishError {
    let error = PublishError::new(
        PublishErrorKind::Closed,
        destination,
        "the Kafka publisher was closed (or its producer failed for good) before the output was confirmed; make a new publisher",
    );
    match source {
        Some(source) => error.with_source(source),
        None => error,
    }
}

impl KafkaPublisherBuilder {
    /// How long librdkafka gathers outputs into a batch before sending it
    /// (`linger.ms`, default 5 ms, unless the settings set it): longer makes
    /// fewer, larger requests at the cost of latency.
    pub fn linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// The most outputs sent but not yet confirmed
    /// (`queue.buffering.max.messages`, default 100,000, unless the settings
    /// set it): a send beyond it waits for room.
    pub fn max_buffered(mut self, outputs: u32) -> Self {
        self.max_buffered = outputs;
        self
    }

    /// The most KiB of outputs sent but not yet confirmed
    /// (`queue.buffering.max.kbytes`, default 65,536 = 64 MiB, unless the
    /// settings set it).
    pub fn max_buffered_kbytes(mut self, kbytes: u32) -> Self {
        self.max_buffered_kbytes = kbytes;
        self
    }

    /// How long a send waits for room in a full buffer before it fails with
    /// [`Unavailable`](PublishErrorKind::Unavailable) (default 10 s).
    pub fn send_timeout(mut self, timeout: Duration) -> Self {
        self.send_timeout = timeout;
        self
    }

    /// How long an output may wait for its delivery report, queueing and
    /// retries included, before its receipt fails with
    /// [`Unavailable`](PublishErrorKind::Unavailable) (default 30 s;
    /// librdkafka's `message.timeout.ms`, unless the settings set it).
    pub fn delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = timeout;
        self
    }

    /// The producer's librdkafka settings: the given ones, intake's defaults
    /// where they say nothing, and idempotence.
    fn producer_settings(&self) -> Result<KafkaSettings, Error> {
        if self.settings.is_true("enable.idempotence") == Some(false) {
            return Err(Error::config(
                "enable.idempotence",
                "must be true: without it a retried batch can be stored twice or after a later one, and outputs lose their order; remove the setting",
            ));
        }
        if self.max_buffered == 0 || self.max_buffered_kbytes == 0 {
            return Err(Error::config(
                "max_buffered",
                "the buffer needs room for at least one output and 1 KiB",
            ));
        }
        let mut settings = self.settings.clone();
        let delivery_timeout = self.delivery_timeout.as_millis().to_string();
        let defaults = [
            ("linger.ms", self.linger.as_millis().to_string()),
            ("partitioner", "murmur2_random".to_owned()),
            (
                "queue.buffering.max.messages",
                self.max_buffered.to_string(),
            ),
            (
                "queue.buffering.max.kbytes",
                self.max_buffered_kbytes.to_string(),
            ),
            ("message.timeout.ms", delivery_timeout),
        ];
        let config = settings.client_config_mut();
        for (key, value) in defaults {
            if config.get(key).is_none() {
                config.set(key, value);
            }
        }
        config.set("enable.idempotence", "true");
        Ok(settings)
    }

    /// Creates the producer and its polling thread. It connects on the first
    /// send.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for settings librdkafka refuses (a secret's value
    /// never shown), `enable.idempotence=false`, or an empty buffer.
    pub fn build(self) -> Result<KafkaPublisher, Error> {
        let settings = self.producer_settings()?;
        let brokers: Arc<str> = settings.endpoint().into();
        let delivery_timeout = settings
            .get("message.timeout.ms")
            .and_then(|ms| ms.parse().ok())
            .map_or(self.delivery_timeout, Duration::from_millis);
        let shared = Arc::new(Shared {
            awaiting: AtomicIsize::new(0),
            waiting: AtomicUsize::new(0),
            room: Notify::new(),
            closed: AtomicBool::new(false),
            brokers: Arc::clone(&brokers),
            delivery_timeout,
        });
        let context = PublisherContext {
            shared: Arc::clone(&shared),
            alone: Some(Alone::new(&settings)),
        };
        let producer: ThreadedProducer<PublisherContext> = settings
            .client_config()
            .create_with_context(context)
            .map_err(|error| Error::from_kafka(error, &brokers, Duration::ZERO))?;
        tracing::debug!(%brokers, ?delivery_timeout, send_timeout = ?self.send_timeout, "kafka publisher created");
        Ok(KafkaPublisher {
            inner: Arc::new(Inner {
                producer,
                shared,
                line: tokio::sync::Mutex::new(()),
                send_timeout: self.send_timeout,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotence_cannot_be_turned_off() {
        let built = KafkaPublisher::builder(
            KafkaSettings::new("127.0.0.1:9").set("enable.idempotence", "false"),
        )
        .build();
        assert!(
            matches!(built, Err(Error::Config { ref setting, .. }) if setting == "enable.idempotence"),
            "{built:?}"
        );
    }

    #[test]
    fn the_settings_win_over_intakes_defaults() {
        let builder = KafkaPublisher::builder(
            KafkaSettings::new("127.0.0.1:9")
                .set("linger.ms", "50")
                .set("partitioner", "consistent_random"),
        )
        .max_buffered(8);
        let settings = builder.producer_settings().expect("valid");
        assert_eq!(settings.get("linger.ms"), Some("50"));
        assert_eq!(settings.get("partitioner"), Some("consistent_random"));
        assert_eq!(settings.get("queue.buffering.max.messages"), Some("8"));
        assert_eq!(settings.get("message.timeout.ms"), Some("30000"));
        assert_eq!(settings.get("enable.idempotence"), Some("true"));
    }

    #[test]
    fn refusals_of_the_output_itself_are_rejected_and_the_rest_retryable() {
        use RDKafkaErrorCode as Code;
        for code in [
            Code::MessageSizeTooLarge,
            Code::InvalidTopic,
            Code::InvalidRecord,
        ] {
            assert_eq!(kind_of(code), PublishErrorKind::Rejected, "{code:?}");
        }
        // A missing or forbidden destination is no property of the output.
        for code in [
            Code::MessageTimedOut,
            Code::AllBrokersDown,
            Code::RequestTimedOut,
            Code::UnknownTopic,
            Code::UnknownTopicOrPartition,
            Code::UnknownPartition,
            Code::TopicAuthorizationFailed,
            Code::ClusterAuthorizationFailed,
        ] {
            assert_eq!(kind_of(code), PublishErrorKind::Unavailable, "{code:?}");
        }
        for code in [Code::PurgeQueue, Code::PurgeInflight, Code::Fatal] {
            assert_eq!(kind_of(code), PublishErrorKind::Closed, "{code:?}");
        }
    }
}
