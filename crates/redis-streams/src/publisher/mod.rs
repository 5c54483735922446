//! [`RedisStreamsPublisher`]: outputs added to streams with `XADD`,
//! pipelined by one writer task, each confirmed by the reply to its own
//! `XADD`.
//!
//! `send` takes room in a bounded buffer (a semaphore of
//! [`max_pending`](RedisStreamsPublisherBuilder::max_pending) permits, each
//! held from the send until the output is answered)
//! and queues the output for the writer. The writer takes whatever is
//! queued, up to a pipeline's worth, sends it as one pipeline on its
//! connection and answers each receipt from its own reply, one pipeline at
//! a time: entries land in the order they were sent, and many outputs share
//! each round trip.
//!
//! The [dead-letter sink](crate::RedisDeadLetterSink) writes with the same
//! connection code and error classification, but each letter in a script
//! that also acknowledges the original; a publisher acknowledges nothing:
//! the runtime acknowledges an input once its outputs' receipts resolved
//! (see [`intake_core::publish`]).

mod builder;
mod receipt;
mod writer;

pub(crate) use self::writer::entry_fields;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use intake_core::publish::{Output, PublishError, PublishErrorKind, Publisher};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, TryAcquireError, mpsc, watch};
use tokio::time::Instant;

pub use self::builder::RedisStreamsPublisherBuilder;
pub use self::receipt::RedisStreamsReceipt;
use self::writer::Queued;
use crate::endpoint::Endpoint;

/// Publishes [`Output`]s to Redis streams: each output is one `XADD` to the
/// stream named by its destination, confirmed by the entry id Redis
/// answers ([`Position::StreamId`](intake_core::Position::StreamId)).
///
/// An entry's fields are what [`RedisStreamsSource`](crate::RedisStreamsSource)
/// decodes: the payload in the payload field (`payload` by default), then
/// the key in the key field (`key` by default; a source reads it back as
/// the key with `key_field("key")`), then every header as a field of its
/// own, in order. A key already carried by the first header of the key
/// field's name (an [`Output::forward`] of a message the source decoded) is
/// not written twice; a header of that name on an output without a key is
/// read back as its key.
///
/// Outputs sent one after another are added in that order: one writer
/// sends them as pipelines over one connection, one pipeline at a time.
/// Every wait is bounded: for room in the buffer
/// ([`send_timeout`](RedisStreamsPublisherBuilder::send_timeout)), in the
/// queue ([`queue_timeout`](RedisStreamsPublisherBuilder::queue_timeout))
/// and for a pipeline's reply, reconnecting included
/// ([`command_timeout`](crate::RedisSettings::command_timeout)): a
/// receipt is answered at most `queue_timeout + command_timeout` after its
/// send.
///
/// A receipt fails with
/// - [`Unavailable`](PublishErrorKind::Unavailable) when its pipeline
///   failed (connection lost, no reply within the command timeout): **the
///   entry may or may not have been added**, and publishing it again may add
///   it twice (at-least-once); when it waited longer than the queue timeout
///   (it was not sent); and for a refusal Redis lifts by itself (`READONLY`
///   after a failover, `OOM`, `MISCONF`, `LOADING`, …:
///   [`TRANSIENT_CODES`](crate::TRANSIENT_CODES));
/// - [`Rejected`](PublishErrorKind::Rejected) when Redis refused this
///   entry alone (`WRONGTYPE`: the key holds another type; `NOPERM`): the
///   other outputs of its pipeline are not affected;
/// - [`Closed`](PublishErrorKind::Closed) after [`close`](Self::close).
///
/// The publisher does not send a failed output again: outputs sent after
/// it may be added before the caller publishes it again. A
/// [`PublishLayer`](intake_core::publish::PublishLayer) in `Key` or
/// `Partition` order runs the next input of a key only once the outputs of
/// the one before are confirmed, so order per key holds across retries.
///
/// The connection reconnects by itself (a connection of its own, of the
/// self-reconnecting kind the acker uses, connected anew after `READONLY`).
/// Clones share the writer, the buffer and the connection; the writer
/// stops once every clone is dropped (after the outputs already sent) or
/// closed.
///
/// ```no_run
/// use intake_core::publish::{Output, Publisher};
/// use intake_redis_streams::RedisStreamsPublisher;
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let publisher = RedisStreamsPublisher::builder("redis://127.0.0.1:6379")
///     .max_len(1_000_000)
///     .build()
///     .await?;
/// let mut receipts = Vec::new();
/// for n in 0..100 {
///     let output = Output::new("receipts", format!("paid {n}")).with_key("customer-7");
///     receipts.push(publisher.send(output).await?); // in order, many in flight
/// }
/// for receipt in receipts {
///     let confirmation = receipt.await?; // the entry id Redis gave it
///     println!("{:?}", confirmation.position);
/// }
/// publisher.close().await;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisStreamsPublisher {
    shared: Arc<Shared>,
}

/// What the clones of a publisher share.
struct Shared {
    queue: mpsc::UnboundedSender<Queued>,
    /// One permit per output queued or awaiting its reply: the buffer's
    /// bound (the channel itself never holds more than there are permits).
    room: Arc<Semaphore>,
    max_pending: usize,
    send_timeout: Duration,
    /// Tells the writer to take no more outputs once the queued ones are
    /// sent.
    closing: Arc<Notify>,
    /// Turns true when the writer stopped.
    stopped: watch::Receiver<bool>,
    endpoint: Endpoint,
}

impl fmt::Debug for RedisStreamsPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStreamsPublisher")
            .field("endpoint", &self.shared.endpoint)
            .field("pending", &self.pending())
            .field("max_pending", &self.shared.max_pending)
            .field("send_timeout", &self.shared.send_timeout)
            .finish()
    }
}

impl RedisStreamsPublisher {
    /// A builder of a publisher on a connection of its own to the server of
    /// `settings`: a [`RedisSettings`](crate::RedisSettings), or just the
    /// URL (`redis://[user[:password]@]host[:port][/db]`, or `rediss://`
    /// for TLS).
    pub fn builder(settings: impl Into<crate::RedisSettings>) -> RedisStreamsPublisherBuilder {
        RedisStreamsPublisherBuilder::new(settings.into())
    }

    /// How many outputs were sent and have no answer yet (queued, or in a
    /// pipeline awaiting its reply): never more than
    /// [`max_pending`](Self::max_pending).
    pub fn pending(&self) -> usize {
        self.shared
            .max_pending
            .saturating_sub(self.shared.room.available_permits())
    }

    /// The buffer's bound: a send waits while this many outputs are
    /// pending.
    pub fn max_pending(&self) -> usize {
        self.shared.max_pending
    }

    /// The server it publishes to, without password.
    pub fn endpoint(&self) -> &Endpoint {
        &self.shared.endpoint
    }

    /// Refuses new sends ([`Closed`](PublishErrorKind::Closed)) and waits
    /// until every output already sent has its answer (each within the
    /// bound above), for every clone.
    pub async fn close(&self) {
        self.shared.room.close();
        self.shared.closing.notify_one();
        let mut stopped = self.shared.stopped.clone();
        // An error means the writer is gone, which is what we wait for.
        let _ = stopped.wait_for(|stopped| *stopped).await;
    }

    async fn room_for(&self, destination: &str) -> Result<OwnedSemaphorePermit, PublishError> {
        let room = &self.shared.room;
        match Arc::clone(room).try_acquire_owned() {
            Ok(permit) => return Ok(permit),
            Err(TryAcquireError::Closed) => return Err(closed(destination)),
            Err(TryAcquireError::NoPermits) => {}
        }
        let waited =
            tokio::time::timeout(self.shared.send_timeout, Arc::clone(room).acquire_owned()).await;
        match waited {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) => Err(closed(destination)),
            Err(_) => Err(PublishError::new(
                PublishErrorKind::Unavailable,
                destination,
                format!(
                    "no room within {:?}: {} outputs await Redis's reply (slow or unreachable); \
                     publish again later",
                    self.shared.send_timeout, self.shared.max_pending
                ),
            )),
        }
    }
}

fn closed(destination: &str) -> PublishError {
    PublishError::new(
        PublishErrorKind::Closed,
        destination,
        "the publisher was closed; make a new one",
    )
}

impl Publisher for RedisStreamsPublisher {
    type Receipt = RedisStreamsReceipt;

    async fn send(&self, output: Output) -> Result<RedisStreamsReceipt, PublishError> {
        let room = self.room_for(output.destination()).await?;
        let destination = Arc::clone(output.destination_shared());
        let (reply, answer) = tokio::sync::oneshot::channel();
        let queued = Queued {
            output,
            reply,
            sent_at: Instant::now(),
            room,
        };
        if self.shared.queue.send(queued).is_err() {
            return Err(closed(&destination));
        }
        Ok(RedisStreamsReceipt::new(answer, destination))
    }
}
