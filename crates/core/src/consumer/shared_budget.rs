//! One in-flight budget shared by several consumers.
//!
//! Each consumer keeps its own budget (`max_in_flight`, which also caps its
//! share here, and `max_in_flight_bytes`); a [`SharedBudget`] bounds what
//! all of them hold together. A consumer takes room from it when it admits a
//! fetched batch (one atomic compare-and-swap per batch), gives it back as
//! each delivery is freed (one atomic subtraction), and, when the shared
//! budget is spent, parks until another consumer frees room: the freeing side
//! wakes the parked consumers, nothing polls.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Waker;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::ConfigError;

/// Bits of the packed state that count bytes; the bits above count messages.
const BYTE_BITS: u32 = 40;
const BYTE_MASK: u64 = (1 << BYTE_BITS) - 1;

/// The largest byte limit a [`SharedBudget`] accepts (1 TiB less one byte).
pub const MAX_SHARED_BYTES: u64 = BYTE_MASK;

/// The largest message limit a [`SharedBudget`] accepts.
pub const MAX_SHARED_MESSAGES: usize = 1 << 23;

fn pack(messages: u64, bytes: u64) -> u64 {
    (messages << BYTE_BITS) | (bytes & BYTE_MASK)
}

fn unpack(state: u64) -> (u64, u64) {
    (state >> BYTE_BITS, state & BYTE_MASK)
}

/// An in-flight budget (messages and bytes) shared by several consumers.
///
/// Give the same budget to each consumer's
/// [`ConsumerBuilder::shared_budget`](crate::ConsumerBuilder::shared_budget)
/// (the [`App`](crate::app::App) does it for its routes): together they hold
/// at most `max_messages` deliveries and `max_bytes` bytes
/// ([`Message::byte_size`](crate::Message::byte_size)), and each still at most
/// its own `max_in_flight`, so a hot consumer cannot take the room another
/// one needs when its own cap is below the shared limit. As with a
/// consumer's own byte budget, one message larger than `max_bytes` gets
/// through when nothing else is held.
///
/// Cloning gives another handle to the same budget.
///
/// ```
/// use intake_core::consumer::{Consumer, SharedBudget};
///
/// let budget = SharedBudget::new(512, 256 << 20)?;
/// let orders = Consumer::builder().max_in_flight(384).shared_budget(budget.clone());
/// let payments = Consumer::builder().max_in_flight(384).shared_budget(budget.clone());
/// # drop((orders, payments));
/// # Ok::<_, intake_core::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct SharedBudget {
    inner: Arc<Inner>,
}

struct Inner {
    max_messages: u64,
    max_bytes: u64,
    /// Messages (high bits) and bytes (low bits) held, changed together.
    state: AtomicU64,
    /// The most messages held at once.
    peak_messages: AtomicU64,
    /// The most bytes held at once.
    peak_bytes: AtomicU64,
    /// How many consumers wait for room (so a release looks at `parked`
    /// only when someone waits).
    waiting: AtomicUsize,
    parked: Mutex<Vec<Waker>>,
}

impl std::fmt::Debug for SharedBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (messages, bytes) = self.held();
        f.debug_struct("SharedBudget")
            .field("max_messages", &self.inner.max_messages)
            .field("max_bytes", &self.inner.max_bytes)
            .field("held_messages", &messages)
            .field("held_bytes", &bytes)
            .finish()
    }
}

impl SharedBudget {
    /// A budget of `max_messages` deliveries and `max_bytes` bytes held at
    /// once by all the consumers that share it.
    pub fn new(max_messages: usize, max_bytes: u64) -> Result<Self, ConfigError> {
        if max_messages == 0 || max_messages > MAX_SHARED_MESSAGES {
            return Err(ConfigError::new(
                "shared_budget.max_messages",
                format!("is {max_messages}; use 1 to {MAX_SHARED_MESSAGES}"),
            ));
        }
        if max_bytes == 0 || max_bytes > MAX_SHARED_BYTES {
            return Err(ConfigError::new(
                "shared_budget.max_bytes",
                format!("is {max_bytes}; use 1 to {MAX_SHARED_BYTES}"),
            ));
        }
        Ok(Self {
            inner: Arc::new(Inner {
                max_messages: max_messages as u64,
                max_bytes,
                state: AtomicU64::new(0),
                peak_messages: AtomicU64::new(0),
                peak_bytes: AtomicU64::new(0),
                waiting: AtomicUsize::new(0),
                parked: Mutex::new(Vec::new()),
            }),
        })
    }

    /// The message limit.
    pub fn max_messages(&self) -> usize {
        self.inner.max_messages as usize
    }

    /// The byte limit.
    pub fn max_bytes(&self) -> u64 {
        self.inner.max_bytes
    }

    /// Messages and bytes held now by all the consumers sharing it.
    pub fn held(&self) -> (u64, u64) {
        unpack(self.inner.state.load(Ordering::Acquire))
    }

    /// The most messages held at once so far.
    pub fn peak_messages(&self) -> u64 {
        self.inner.peak_messages.load(Ordering::Acquire)
    }

    /// The most bytes held at once so far.
    pub fn peak_bytes(&self) -> u64 {
        self.inner.peak_bytes.load(Ordering::Acquire)
    }

    /// Takes room for the longest prefix of `sizes` that fits (at most
    /// `sizes.len()` deliveries); returns how many and their bytes.
    fn take_prefix(&self, sizes: impl Iterator<Item = u64> + Clone) -> (usize, u64) {
        let inner = &*self.inner;
        let mut current = inner.state.load(Ordering::SeqCst);
        loop {
            let (messages, bytes) = unpack(current);
            let mut count = 0u64;
            let mut taken = 0u64;
            for size in sizes.clone() {
                let size = size.min(BYTE_MASK);
                let fits_bytes = bytes + taken + size <= inner.max_bytes
                    // Nothing held anywhere: one message gets through alone.
                    || (messages == 0 && count == 0);
                if messages + count >= inner.max_messages || !fits_bytes {
                    break;
                }
                count += 1;
                taken += size;
            }
            if count == 0 {
                return (0, 0);
            }
            let next = pack(messages + count, (bytes + taken).min(BYTE_MASK));
            match inner.state.compare_exchange_weak(
                current,
                next,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => {
                    inner
                        .peak_messages
                        .fetch_max(messages + count, Ordering::AcqRel);
                    inner.peak_bytes.fetch_max(bytes + taken, Ordering::AcqRel);
                    return (count as usize, taken);
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// Gives back `messages` deliveries of `bytes` bytes, and wakes the
    /// consumers that wait for room.
    fn give_back(&self, messages: u64, bytes: u64) {
        if messages == 0 && bytes == 0 {
            return;
        }
        let inner = &*self.inner;
        inner
            .state
            .fetch_sub(pack(messages, bytes.min(BYTE_MASK)), Ordering::SeqCst);
        if inner.waiting.load(Ordering::SeqCst) > 0 {
            let mut parked = inner.parked.lock().unwrap_or_else(PoisonError::into_inner);
            // Under the lock: a consumer parking meanwhile counts itself
            // after this. Draining keeps the list's capacity, so parking
            // again allocates nothing; a wake only schedules the run.
            inner.waiting.store(0, Ordering::SeqCst);
            for waker in parked.drain(..) {
                waker.wake();
            }
        }
    }

    /// How many more deliveries fit now, at `average` bytes each (0: not
    /// known yet, count one).
    fn room(&self, average: u64) -> usize {
        let inner = &*self.inner;
        let (messages, bytes) = unpack(inner.state.load(Ordering::SeqCst));
        let by_count = inner.max_messages.saturating_sub(messages);
        let by_bytes = if messages == 0 {
            u64::MAX
        } else if bytes >= inner.max_bytes {
            0
        } else {
            (inner.max_bytes - bytes).checked_div(average).unwrap_or(1)
        };
        usize::try_from(by_count.min(by_bytes)).unwrap_or(usize::MAX)
    }

    /// Parks `waker` until room is freed, unless some is free now (checked
    /// after parking, so a release in between is not missed). Returns the
    /// room.
    fn park_unless_room(&self, waker: &Waker, average: u64) -> usize {
        {
            let mut parked = self
                .inner
                .parked
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !parked.iter().any(|other| other.will_wake(waker)) {
                parked.push(waker.clone());
            }
            self.inner.waiting.store(parked.len(), Ordering::SeqCst);
        }
        self.room(average)
    }
}

/// One consumer's share of a [`SharedBudget`]: what it took and has not
/// given back, returned when the run ends whatever way it ends (a dropped
/// run future included).
///
/// It also tracks whether the consumer is denied room: since when it has
/// asked and got none (the other consumers hold the budget), so the run can
/// report a consumer starved by the others (a route whose fetch buffer is
/// not in its commit engine, which neither stalls a partition nor fails a
/// commit).
#[derive(Debug)]
pub(crate) struct SharedLease {
    budget: SharedBudget,
    /// Wakes the consumer's run when room is freed.
    waker: Waker,
    messages: u64,
    bytes: u64,
    /// Admission left fetched deliveries waiting for room.
    blocked: bool,
    /// Since when the consumer has asked for room and got none, until it
    /// takes some.
    denied_since: Option<Instant>,
    /// Since when room was there when the consumer last sized a fetch,
    /// while it was denied before: it is fetching, not denied, unless what
    /// it fetches then finds no room again. An offer that lasted longer
    /// than [`IDLE_OFFER`] means the consumer had nothing to fetch: denied
    /// again, it is denied from then on, not from before it was idle.
    offered: Option<Instant>,
}

/// How long a consumer offered room may fetch nothing before it counts as
/// idle rather than starved (see [`SharedLease::denied_for`]).
const IDLE_OFFER: Duration = Duration::from_secs(1);

impl SharedLease {
    pub(crate) fn new(budget: SharedBudget, waker: Waker) -> Self {
        Self {
            budget,
            waker,
            messages: 0,
            bytes: 0,
            blocked: false,
            denied_since: None,
            offered: None,
        }
    }

    /// Takes room for the longest prefix of `sizes` that fits; returns its
    /// length. When not all fit, the consumer waits for room (see
    /// [`Self::blocked`]).
    pub(crate) fn take_prefix(
        &mut self,
        sizes: impl ExactSizeIterator<Item = u64> + Clone,
    ) -> usize {
        let wanted = sizes.len();
        let (count, bytes) = self.budget.take_prefix(sizes);
        self.messages += count as u64;
        self.bytes += bytes;
        self.blocked = count < wanted;
        if count > 0 {
            self.denied_since = None;
            self.offered = None;
        } else if wanted > 0 {
            self.denied();
        }
        count
    }

    /// The consumer asked for room and got none.
    #[cold]
    fn denied(&mut self) {
        let now = Instant::now();
        let idle = self
            .offered
            .take()
            .is_some_and(|at| now.saturating_duration_since(at) > IDLE_OFFER);
        if idle || self.denied_since.is_none() {
            self.denied_since = Some(now);
        }
    }

    /// Room was there for a fetch.
    #[inline]
    fn offered(&mut self) {
        // Only while denied: otherwise nothing reads it, and the clock is
        // not read per fetch.
        if self.denied_since.is_some() && self.offered.is_none() {
            self.offered = Some(Instant::now());
        }
    }

    /// How long the consumer has been denied room, as of `now`: `None`
    /// unless it asked and got none since it last took some, and was not
    /// offered any since.
    pub(crate) fn denied_for(&self, now: Instant) -> Option<Duration> {
        match self.denied_since {
            Some(since) if self.offered.is_none() => Some(now.saturating_duration_since(since)),
            _ => None,
        }
    }

    /// Whether [`denied_for`](Self::denied_for) is `Some`, without the
    /// clock.
    #[inline]
    pub(crate) fn is_denied(&self) -> bool {
        self.denied_since.is_some() && self.offered.is_none()
    }

    /// Gives back one delivery of `bytes` (freed, or turned away after room
    /// was taken for it).
    #[inline]
    pub(crate) fn give_back(&mut self, bytes: u64) {
        let bytes = bytes.min(self.bytes);
        if self.messages == 0 {
            return;
        }
        self.messages -= 1;
        self.bytes -= bytes;
        self.budget.give_back(1, bytes);
    }

    /// Whether fetched deliveries wait for room that is still not free (the
    /// consumer is then woken when some is).
    pub(crate) fn blocked(&mut self, average: u64) -> bool {
        if !self.blocked {
            return false;
        }
        let room = self.budget.park_unless_room(&self.waker, average);
        self.blocked = room == 0;
        self.blocked
    }

    /// How many deliveries a fetch may ask for; parks the consumer when none.
    pub(crate) fn fetch_limit(&mut self, average: u64) -> usize {
        let mut room = self.budget.room(average);
        if room == 0 {
            room = self.budget.park_unless_room(&self.waker, average);
        }
        if room > 0 {
            self.offered();
        } else {
            self.denied();
        }
        room
    }
}

impl Drop for SharedLease {
    fn drop(&mut self) {
        self.budget.give_back(self.messages, self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(list: &[u64]) -> impl ExactSizeIterator<Item = u64> + Clone + '_ {
        list.iter().copied()
    }

    #[test]
    fn consumers_together_hold_at_most_the_limits() {
        let budget = SharedBudget::new(3, 1_000).unwrap();
        let mut first = SharedLease::new(budget.clone(), Waker::noop().clone());
        let mut second = SharedLease::new(budget.clone(), Waker::noop().clone());
        assert_eq!(first.take_prefix(sizes(&[10, 10])), 2);
        assert_eq!(second.take_prefix(sizes(&[10, 10])), 1, "one message left");
        assert!(second.blocked(10));
        first.give_back(10);
        assert!(!second.blocked(10), "room came back");
        assert_eq!(second.take_prefix(sizes(&[10])), 1);
        assert_eq!(budget.held(), (3, 30));
        assert_eq!(budget.peak_messages(), 3);
    }

    #[test]
    fn bytes_limit_admission_and_a_large_message_passes_alone() {
        let budget = SharedBudget::new(100, 100).unwrap();
        let mut lease = SharedLease::new(budget.clone(), Waker::noop().clone());
        assert_eq!(lease.take_prefix(sizes(&[500, 1])), 1, "alone");
        assert_eq!(lease.take_prefix(sizes(&[1])), 0, "spent");
        lease.give_back(500);
        assert_eq!(lease.take_prefix(sizes(&[60, 30, 20])), 2);
        drop(lease);
        assert_eq!(
            budget.held(),
            (0, 0),
            "a dropped lease gives everything back"
        );
    }

    #[test]
    fn a_release_wakes_a_parked_consumer() {
        use std::sync::atomic::AtomicBool;
        use std::task::Wake;

        struct Flag(AtomicBool);
        impl Wake for Flag {
            fn wake(self: Arc<Self>) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let budget = SharedBudget::new(1, 100).unwrap();
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let mut holder = SharedLease::new(budget.clone(), Waker::noop().clone());
        let mut waiter = SharedLease::new(budget.clone(), Waker::from(flag.clone()));
        assert_eq!(holder.take_prefix(sizes(&[1])), 1);
        assert_eq!(waiter.fetch_limit(1), 0, "parked");
        holder.give_back(1);
        assert!(flag.0.load(Ordering::SeqCst), "woken by the release");
    }

    #[tokio::test(start_paused = true)]
    async fn a_consumer_denied_room_counts_from_its_first_refusal_until_it_takes_some() {
        let budget = SharedBudget::new(2, 1_000).unwrap();
        let mut holder = SharedLease::new(budget.clone(), Waker::noop().clone());
        let mut starved = SharedLease::new(budget.clone(), Waker::noop().clone());
        assert_eq!(holder.take_prefix(sizes(&[1, 1])), 2);
        assert!(!starved.is_denied(), "it has asked for nothing yet");

        assert_eq!(starved.fetch_limit(1), 0);
        assert!(starved.is_denied());
        tokio::time::advance(Duration::from_millis(300)).await;
        assert_eq!(starved.fetch_limit(1), 0, "asked again");
        let now = Instant::now();
        assert_eq!(starved.denied_for(now), Some(Duration::from_millis(300)));

        // Room for a moment: offered, so not denied while it fetches…
        holder.give_back(1);
        assert_eq!(starved.fetch_limit(1), 1);
        assert!(!starved.is_denied());
        assert_eq!(starved.denied_for(Instant::now()), None);
        // …but another consumer took it before its fetch came back: denied
        // since the first refusal, not since now.
        assert_eq!(holder.take_prefix(sizes(&[1])), 1);
        tokio::time::advance(Duration::from_millis(10)).await;
        assert_eq!(starved.take_prefix(sizes(&[1])), 0);
        assert_eq!(
            starved.denied_for(Instant::now()),
            Some(Duration::from_millis(310))
        );

        holder.give_back(1);
        assert_eq!(starved.take_prefix(sizes(&[1])), 1, "room at last");
        assert!(!starved.is_denied());
    }

    #[tokio::test(start_paused = true)]
    async fn a_consumer_offered_room_that_fetched_nothing_for_long_was_idle_not_starved() {
        let budget = SharedBudget::new(1, 1_000).unwrap();
        let mut holder = SharedLease::new(budget.clone(), Waker::noop().clone());
        let mut other = SharedLease::new(budget.clone(), Waker::noop().clone());
        assert_eq!(holder.take_prefix(sizes(&[1])), 1);
        assert_eq!(other.fetch_limit(1), 0);
        tokio::time::advance(Duration::from_secs(5)).await;
        holder.give_back(1);
        assert_eq!(other.fetch_limit(1), 1, "offered");
        // Nothing to fetch for a minute; meanwhile the holder takes the room.
        assert_eq!(holder.take_prefix(sizes(&[1])), 1);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(other.take_prefix(sizes(&[1])), 0);
        assert_eq!(
            other.denied_for(Instant::now()),
            Some(Duration::ZERO),
            "denied from now, not from before it was idle"
        );
    }

    #[test]
    fn limits_out_of_range_name_the_field() {
        let error = SharedBudget::new(0, 1).unwrap_err();
        assert_eq!(error.setting, "shared_budget.max_messages");
        let error = SharedBudget::new(1, 0).unwrap_err();
        assert_eq!(error.setting, "shared_budget.max_bytes");
    }
}
