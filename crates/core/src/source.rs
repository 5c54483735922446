//! Where deliveries come from: the [`Source`] trait and its events.
//!
//! A backend implements `Source` to fetch deliveries and to report partitions
//! being assigned to or revoked from this consumer. The runtime calls
//! [`Source::next`] only while its in-flight budget has room, and asks for no
//! more deliveries than the budget allows: that is how every backend gets
//! backpressure without a queue of its own.

use std::future::Future;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::consumer::DeliveryOrder;
use crate::error::BoxError;
use crate::message::{Message, PartitionKey, Position};

/// A source of deliveries: one consumer's connection to a broker.
///
/// # Cancel safety
///
/// The runtime drops a pending [`next`](Source::next) future when the consumer
/// shuts down. An implementation must not lose deliveries when that happens:
/// whatever it had already taken from the broker must stay unacknowledged
/// there (so it is redelivered) or be returned by the next call.
pub trait Source: Send + 'static {
    /// Waits for the next event.
    ///
    /// For deliveries, appends at most `max` messages to `deliveries` (which
    /// the runtime passes in empty and reuses, so a steady stream costs no
    /// allocation) and returns [`SourceEvent::Delivered`].
    ///
    /// `max` is 0 when the runtime may take no delivery (its in-flight
    /// budget is full, fetched deliveries wait for room in a shared budget,
    /// or a partition is over its uncommitted window and the source cannot
    /// [pause](Self::pause) it): the source must then deliver nothing and
    /// wait only for an assignment change (`Assigned`, `Revoked`), so a
    /// rebalance gets through even while every slot is taken. (Careful:
    /// `XREADGROUP COUNT 0` means "no limit" to Redis.)
    fn next(
        &mut self,
        deliveries: &mut Vec<Message>,
        max: usize,
    ) -> impl Future<Output = Result<SourceEvent, SourceError>> + Send;

    /// Stops fetching `partition` until [`resume`](Self::resume); returns
    /// whether the source does.
    ///
    /// The runtime asks when the partition has `max_uncommitted` deliveries
    /// between its committed position and its newest one
    /// (`ConsumerBuilder::max_uncommitted`): a message that does not finish
    /// holds the partition's watermark, and the commit engine must not grow
    /// without bound behind it. Paused, that partition waits and the others
    /// keep flowing. The default, `false`, says the source cannot pause one
    /// partition: the runtime then asks for no deliveries at all (`max` 0)
    /// until the partition is back under its window.
    ///
    /// Called between two calls of [`next`](Self::next), never while one is
    /// pending (the runtime drops a pending `next` first, which must lose
    /// nothing: see the cancel safety above). Deliveries of the partition
    /// that the source had already taken from the broker may still come
    /// after the pause, never be dropped; the runtime admits up to one
    /// in-flight budget (`max_in_flight`) of them past the window, and asks
    /// for none at all beyond that, so a source should not buffer more
    /// than [`Limits`] allow.
    fn pause(&mut self, partition: &PartitionKey) -> bool {
        let _ = partition;
        false
    }

    /// Fetches `partition` again after a [`pause`](Self::pause): the
    /// runtime calls it once the partition's window has room again (at
    /// three quarters of `max_uncommitted`, so that a window at its bound
    /// does not pause and resume the partition at every message).
    ///
    /// Also called, when the runtime had paused it, for a partition revoked
    /// or assigned afresh, so that a pause never outlives its assignment;
    /// by then the partition may no longer be this source's, which must
    /// then do nothing (and a source whose pauses end with the assignment
    /// may ignore the call). Called between two calls of
    /// [`next`](Self::next), like `pause`.
    fn resume(&mut self, partition: &PartitionKey) {
        let _ = partition;
    }

    /// What the consumer promises the source, told once before the first
    /// [`next`](Self::next): its in-flight budget (deliveries and bytes) and
    /// how long it drains a revoked partition. A source sizes from them what
    /// it buffers and what it asks the broker to send ahead (AMQP's
    /// prefetch, Kafka's hand-over queue, a pull batch) and how long a
    /// rebalance waits for the drain, so that each of these is set once, on
    /// the consumer. The default ignores them: a source that only reads what
    /// `next`'s `max` allows needs nothing more.
    fn set_limits(&mut self, limits: Limits) {
        let _ = limits;
    }

    /// Whether the source reaches its broker, for a source that reconnects
    /// on its own instead of returning transient errors (see
    /// [`Reachability`](crate::backend::Reachability)). Asked once, before
    /// the first [`next`](Self::next); the runtime reads the mark at each
    /// commit tick and reports it to the observer (health's readiness).
    /// The default, `None`, suits a source whose failures reach the
    /// runtime as errors.
    fn reachability(&self) -> Option<crate::backend::Reachability> {
        None
    }

    /// Releases the connection after the final commit (leave the group,
    /// close the channel). Called once, at the end of a run.
    fn close(&mut self) -> impl Future<Output = Result<(), SourceError>> + Send {
        async { Ok(()) }
    }
}

/// What a consumer promises its source: see [`Source::set_limits`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Most deliveries held at once (`ConsumerBuilder::max_in_flight`).
    pub max_in_flight: usize,
    /// Most bytes of messages held at once ([`Message::byte_size`];
    /// `ConsumerBuilder::max_in_flight_bytes`).
    pub max_in_flight_bytes: usize,
    /// How long a revoked partition's deliveries may run before the
    /// consumer gives up on them and makes its final commit
    /// (`ConsumerBuilder::revoke_timeout`).
    pub revoke_timeout: Duration,
    /// Which deliveries the consumer may run at once
    /// (`ConsumerBuilder::ordering`): a source that keeps an order for the
    /// consumer at a cost (Redis's order per key across the members of a
    /// group) need not when the consumer runs unordered anyway.
    pub ordering: DeliveryOrder,
}

impl Limits {
    /// Limits of `max_in_flight` deliveries, `max_in_flight_bytes` bytes and
    /// a `revoke_timeout` drain, for a consumer that keeps the order per key
    /// (the default; see [`with_ordering`](Self::with_ordering)).
    pub fn new(max_in_flight: usize, max_in_flight_bytes: usize, revoke_timeout: Duration) -> Self {
        Self {
            max_in_flight,
            max_in_flight_bytes,
            revoke_timeout,
            ordering: DeliveryOrder::default(),
        }
    }

    /// The same limits, for a consumer that runs its deliveries in
    /// `ordering`.
    pub fn with_ordering(mut self, ordering: DeliveryOrder) -> Self {
        self.ordering = ordering;
        self
    }
}

/// What [`Source::next`] reports.
#[derive(Debug)]
#[non_exhaustive]
pub enum SourceEvent {
    /// Deliveries were appended to the buffer.
    Delivered,
    /// These partitions are now this consumer's. Each starts a new
    /// generation: completions from an earlier assignment are ignored.
    ///
    /// Sources without explicit assignment (a Redis stream, an AMQP queue) may
    /// skip this event; a partition is assigned implicitly by its first
    /// delivery.
    Assigned(Vec<PartitionKey>),
    /// These partitions are being taken away. The runtime stops dispatching
    /// them, waits (bounded) for their in-flight messages, commits, and then
    /// completes the [`Revocation`].
    Revoked(Revocation),
    /// The source has nothing more to deliver, ever (a bounded test input).
    /// The runtime drains and stops as on shutdown.
    Exhausted,
}

/// A failure of the source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The broker could not be reached; the runtime retries with backoff.
    #[error("cannot reach the broker at {endpoint}")]
    Unreachable {
        /// Where the source tried to connect (credentials removed).
        endpoint: String,
        /// The underlying failure.
        #[source]
        source: BoxError,
    },
    /// The broker refused the credentials. Fix the user name, password or
    /// certificate; retrying will not help.
    #[error("the broker at {endpoint} refused the credentials")]
    Unauthorized {
        /// The broker (credentials removed).
        endpoint: String,
        /// The broker's answer.
        #[source]
        source: BoxError,
    },
    /// A topic, stream or queue does not exist and the source may not create
    /// it.
    #[error("{kind} `{name}` does not exist: {hint}")]
    NotFound {
        /// "topic", "stream" or "queue".
        kind: &'static str,
        /// Its name.
        name: String,
        /// What to do about it.
        hint: String,
    },
    /// The source is configured in a way that cannot work.
    #[error("invalid source configuration: {0}")]
    Config(String),
    /// A broker error that may pass (a lost connection, a timeout); the
    /// runtime retries with backoff.
    #[error("broker error (transient: the consumer retries after a backoff)")]
    Transient(#[source] BoxError),
    /// A broker error that will not pass by retrying.
    #[error("fatal broker error (retrying cannot fix it)")]
    Fatal(#[source] BoxError),
}

impl SourceError {
    /// Whether retrying [`Source::next`] after a backoff may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            SourceError::Unreachable { .. } | SourceError::Transient(_)
        )
    }
}

/// A partition's state when its revocation completed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RevokedPartition {
    /// The partition.
    pub partition: PartitionKey,
    /// The last position committed for it (every message up to and including
    /// it is done), if any message was.
    pub committed: Option<Position>,
    /// Messages of the partition that had not finished when the drain
    /// deadline passed; the next owner receives them again.
    pub unfinished: usize,
}

/// What the runtime did with a revocation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RevocationOutcome {
    /// Each revoked partition, drained and committed.
    pub partitions: Vec<RevokedPartition>,
}

impl RevocationOutcome {
    /// The outcome of a revocation of `partitions` (for a backend's tests of
    /// its rebalance handling; the runtime builds the real ones).
    pub fn new(partitions: Vec<RevokedPartition>) -> Self {
        Self { partitions }
    }
}

impl RevokedPartition {
    /// `partition`, committed up to `committed`, with `unfinished` messages
    /// left to its next owner.
    pub fn new(partition: PartitionKey, committed: Option<Position>, unfinished: usize) -> Self {
        Self {
            partition,
            committed,
            unfinished,
        }
    }
}

/// Why waiting on a revocation ended without an outcome.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RevocationError {
    /// The runtime stopped before it completed the revocation.
    #[error("the consumer stopped before completing the revocation")]
    Abandoned,
    /// The wait timed out.
    #[error("the revocation did not complete within {0:?}")]
    TimedOut(Duration),
}

enum RevocationState {
    Pending,
    Done(RevocationOutcome),
    Abandoned,
}

struct RevocationShared {
    state: Mutex<RevocationState>,
    changed: Condvar,
    notify: Notify,
}

impl RevocationShared {
    fn finish(&self, state: RevocationState) {
        let mut guard = self
            .state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if matches!(*guard, RevocationState::Pending) {
            *guard = state;
        }
        drop(guard);
        self.changed.notify_all();
        self.notify.notify_one();
    }

    fn take(&self) -> Option<Result<RevocationOutcome, RevocationError>> {
        let mut guard = self
            .state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        match std::mem::replace(&mut *guard, RevocationState::Abandoned) {
            RevocationState::Pending => {
                *guard = RevocationState::Pending;
                None
            }
            RevocationState::Done(outcome) => Some(Ok(outcome)),
            RevocationState::Abandoned => Some(Err(RevocationError::Abandoned)),
        }
    }
}

/// Partitions being revoked, and the means to tell the source that they were
/// drained and committed.
///
/// Dropping a `Revocation` without completing it releases the waiting source
/// with [`RevocationError::Abandoned`], so a rebalance callback never waits on
/// a runtime that is gone.
pub struct Revocation {
    partitions: Vec<PartitionKey>,
    shared: Arc<RevocationShared>,
}

impl std::fmt::Debug for Revocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Revocation")
            .field("partitions", &self.partitions)
            .finish()
    }
}

impl Revocation {
    /// A revocation of `partitions`, and the handle its source waits on.
    pub fn new(partitions: Vec<PartitionKey>) -> (Self, RevocationHandle) {
        let shared = Arc::new(RevocationShared {
            state: Mutex::new(RevocationState::Pending),
            changed: Condvar::new(),
            notify: Notify::new(),
        });
        (
            Self {
                partitions,
                shared: shared.clone(),
            },
            RevocationHandle { shared },
        )
    }

    /// The partitions being revoked.
    pub fn partitions(&self) -> &[PartitionKey] {
        &self.partitions
    }

    /// Reports that the partitions were drained and committed.
    pub fn complete(self, outcome: RevocationOutcome) {
        self.shared.finish(RevocationState::Done(outcome));
    }
}

impl Drop for Revocation {
    fn drop(&mut self) {
        self.shared.finish(RevocationState::Abandoned);
    }
}

/// The source's side of a [`Revocation`]: wait until the runtime has drained
/// and committed the revoked partitions.
pub struct RevocationHandle {
    shared: Arc<RevocationShared>,
}

impl RevocationHandle {
    /// Waits for the outcome.
    pub async fn wait(self) -> Result<RevocationOutcome, RevocationError> {
        loop {
            let notified = self.shared.notify.notified();
            if let Some(result) = self.shared.take() {
                return result;
            }
            notified.await;
        }
    }

    /// Blocks the calling thread for at most `timeout`. For rebalance
    /// callbacks that run on a client library's own thread.
    pub fn wait_blocking(self, timeout: Duration) -> Result<RevocationOutcome, RevocationError> {
        let deadline = crate::deadline::after_std(std::time::Instant::now(), timeout);
        let mut guard = self
            .shared
            .state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        loop {
            match std::mem::replace(&mut *guard, RevocationState::Abandoned) {
                RevocationState::Done(outcome) => return Ok(outcome),
                RevocationState::Abandoned => return Err(RevocationError::Abandoned),
                RevocationState::Pending => *guard = RevocationState::Pending,
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(RevocationError::TimedOut(timeout));
            }
            guard = self
                .shared
                .changed
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(|poison| poison.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_completed_revocation_reaches_the_waiting_source() {
        let (revocation, handle) = Revocation::new(vec![PartitionKey::new("t", 0)]);
        let waiter = tokio::spawn(handle.wait());
        revocation.complete(RevocationOutcome::default());
        assert_eq!(waiter.await.ok(), Some(Ok(RevocationOutcome::default())));
    }

    #[test]
    fn a_dropped_revocation_releases_a_blocked_callback() {
        let (revocation, handle) = Revocation::new(vec![PartitionKey::new("t", 0)]);
        let thread = std::thread::spawn(move || handle.wait_blocking(Duration::from_secs(10)));
        drop(revocation);
        assert_eq!(thread.join().ok(), Some(Err(RevocationError::Abandoned)));
    }

    #[test]
    fn a_blocking_wait_of_duration_max_returns_a_completed_outcome() {
        let (revocation, handle) = Revocation::new(vec![PartitionKey::new("t", 0)]);
        revocation.complete(RevocationOutcome::default());
        assert_eq!(
            handle.wait_blocking(Duration::MAX),
            Ok(RevocationOutcome::default())
        );
    }

    #[test]
    fn a_blocked_wait_is_bounded() {
        let (_revocation, handle) = Revocation::new(vec![]);
        let waited = handle.wait_blocking(Duration::from_millis(20));
        assert_eq!(
            waited,
            Err(RevocationError::TimedOut(Duration::from_millis(20)))
        );
    }
}
