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

mod builder;
mod delivery;
mod errors;
mod receipt;

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

pub use self::builder::KafkaPublisherBuilder;
use self::delivery::{Alone, PublisherContext};
use self::errors::{closed, delivery_failed, refused};
pub use self::receipt::KafkaReceipt;
use self::receipt::Slot;

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
