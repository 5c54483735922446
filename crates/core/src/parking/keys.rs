//! Which keys have messages parked, in their order: what keeps the order
//! per key while messages are parked.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::{ORIGIN, PARK_ID};
use crate::message::{Message, Position, SourceName};

/// A parked message, as the parking layer recognises it when it comes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ParkId {
    /// A moved copy, by the [`PARK_ID`] header it was written with.
    Moved(u64),
    /// An original the broker redelivers, by where it was delivered.
    Delivery { partition: u32, position: Position },
}

impl ParkId {
    /// How `message` would be known if it was parked: its park header if
    /// it carries one, otherwise its delivery.
    pub(super) fn of(message: &Message) -> Self {
        match message
            .headers()
            .get_str(PARK_ID)
            .and_then(|id| id.parse().ok())
        {
            Some(id) => ParkId::Moved(id),
            None => ParkId::Delivery {
                partition: message.metadata().partition(),
                position: message.metadata().position(),
            },
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    id: ParkId,
    /// When it came back to this process and began to run, as the first of
    /// its key.
    running_since: Option<SystemTime>,
    /// How often it was turned away, as a follower, by a first message of
    /// its key that was due and not back here.
    turned_away: u32,
    due: SystemTime,
    /// How long it was parked for: a broker may return it later than due
    /// by a fraction of that (a delay tier longer than asked), so it counts
    /// as overdue only past the larger of this and `overdue_after`.
    delay: Duration,
}

/// What the parking layer does with a message of a keyed source.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Admission {
    /// Its key has nothing parked: handle it.
    Run,
    /// It is the first parked message of its key, back: handle it, then
    /// report how it went.
    Head(ParkId),
    /// An earlier message of its key is parked: park this one behind it,
    /// for `delay`, without running it.
    Follow { delay: Duration },
}

type KeyId = (SourceName, Bytes);

/// The source whose key order `message` belongs to: where it was parked
/// from, if it is a parked copy that came back through a return
/// destination; otherwise where it was consumed.
pub(super) fn origin_of(message: &Message) -> SourceName {
    match message.headers().get_str(ORIGIN) {
        Some(origin) if origin != &**message.metadata().source() => SourceName::from(origin),
        _ => message.metadata().source().clone(),
    }
}

/// The parked messages of each key, oldest first.
pub(super) struct ParkedKeys {
    keys: Mutex<Keys>,
    /// Entries in `keys`: lets a message skip the lock while nothing is
    /// parked, the common case.
    parked: AtomicUsize,
    next_id: AtomicU64,
    /// At most this many entries are kept.
    capacity: usize,
    /// Whether the capacity was reached since it was last logged.
    full: std::sync::atomic::AtomicBool,
}

struct Keys {
    queues: HashMap<KeyId, VecDeque<Entry>>,
    next_sweep: SystemTime,
}

/// How often the whole map is swept of keys whose parked messages never
/// came back.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// How much later than the last parked message of its key a follower is
/// due: enough for every backend's mover to keep them apart.
const FOLLOW_GAP: Duration = Duration::from_millis(1);

/// The longest a follower waits behind its key's first parked message
/// that is due but not back here: it may be late, or another consumer of
/// the group may have taken it. The wait starts at [`FOLLOW_GAP`] and
/// doubles each time the same follower is turned away so, so a copy a
/// millisecond late costs a millisecond and one that went elsewhere about
/// twenty parks per follower until it is overdue, not one per millisecond.
fn late_head_wait(turned_away: u32, overdue_after: Duration) -> Duration {
    FOLLOW_GAP
        .saturating_mul(1u32 << turned_away.min(30))
        .min(overdue_after)
}

impl ParkedKeys {
    /// Keeps at most `capacity` parked messages.
    pub(super) fn with_capacity(capacity: usize) -> Self {
        // Ids unique across restarts of the process, so a copy parked by
        // an earlier run is never taken for one of this run.
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as u64);
        Self {
            keys: Mutex::new(Keys {
                queues: HashMap::new(),
                next_sweep: SystemTime::now() + SWEEP_EVERY,
            }),
            parked: AtomicUsize::new(0),
            next_id: AtomicU64::new(seed),
            capacity,
            full: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The most parked messages kept.
    pub(super) fn capacity(&self) -> usize {
        self.capacity
    }

    /// A fresh id for a park header.
    pub(super) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Messages parked and not yet back and done.
    pub(super) fn len(&self) -> usize {
        self.parked.load(Ordering::Relaxed)
    }

    /// Decides what to do with `message`, whose key is `key`. A key whose
    /// first parked message is overdue by `overdue_after` (it never came
    /// back: purged, or consumed elsewhere) is released from it.
    pub(super) fn admit(
        &self,
        message: &Message,
        key: &Bytes,
        overdue_after: Duration,
        now: SystemTime,
    ) -> Admission {
        if self.len() == 0 {
            return Admission::Run;
        }
        let id = ParkId::of(message);
        let mut keys = self.lock();
        if now >= keys.next_sweep {
            keys.next_sweep = now + SWEEP_EVERY;
            let mut released = 0;
            keys.queues.retain(|_, queue| {
                released += release_overdue(queue, overdue_after, now);
                !queue.is_empty()
            });
            self.parked.fetch_sub(released, Ordering::Relaxed);
        }
        let key_id = (origin_of(message), key.clone());
        let Some(queue) = keys.queues.get_mut(&key_id) else {
            return Admission::Run;
        };
        let released = release_overdue(queue, overdue_after, now);
        self.parked.fetch_sub(released, Ordering::Relaxed);
        let last_due = queue.iter().map(|entry| entry.due).max().unwrap_or(now);
        let Some(head) = queue.front_mut() else {
            keys.queues.remove(&key_id);
            return Admission::Run;
        };
        if head.id == id {
            head.running_since.get_or_insert(now);
            return Admission::Head(id);
        }
        let mut due = last_due.max(now) + FOLLOW_GAP;
        match head.running_since {
            // The head runs here: wait a quarter of how long it has run, so
            // a slow handler costs a few parks behind it, not one per
            // millisecond.
            Some(since) => {
                let running_for = now.duration_since(since).unwrap_or_default();
                due = due.max(now + (running_for / 4).min(overdue_after));
            }
            // Due and not back here: it is late, or another consumer of the
            // group took it.
            None if now >= head.due => {
                let turned_away = match queue.iter_mut().find(|entry| entry.id == id) {
                    Some(follower) => {
                        follower.turned_away = follower.turned_away.saturating_add(1);
                        follower.turned_away - 1
                    }
                    None => 0,
                };
                due = due.max(now + late_head_wait(turned_away, overdue_after));
            }
            None => {}
        }
        Admission::Follow {
            delay: due.duration_since(now).unwrap_or(FOLLOW_GAP),
        }
    }

    /// Records that a message of `key` (`source`) was parked as `parked`
    /// until `due`. `previous` is how it was known before this park (a
    /// message that came back and was parked again keeps its place in its
    /// key's order); a message parked for the first time goes last.
    pub(super) fn parked(
        &self,
        source: &SourceName,
        key: &Bytes,
        previous: ParkId,
        parked: ParkId,
        due: SystemTime,
        delay: Duration,
    ) {
        let mut keys = self.lock();
        let queue = keys
            .queues
            .entry((source.clone(), key.clone()))
            .or_default();
        match queue.iter_mut().find(|entry| entry.id == previous) {
            Some(entry) => {
                *entry = Entry {
                    id: parked,
                    running_since: None,
                    turned_away: entry.turned_away,
                    due,
                    delay,
                }
            }
            None if self.len() >= self.capacity => {
                if queue.is_empty() {
                    keys.queues.remove(&(source.clone(), key.clone()));
                }
                if !self.full.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        capacity = self.capacity,
                        "as many parked messages as the parking layer tracks (max_tracked): \
                         later messages of the keys of further parked messages do not wait \
                         for them",
                    );
                }
            }
            None => {
                queue.push_back(Entry {
                    id: parked,
                    running_since: None,
                    turned_away: 0,
                    due,
                    delay,
                });
                self.parked.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Records that the parked message `id` of `key` is done: the next one
    /// of its key may run when it comes back.
    pub(super) fn done(&self, source: &SourceName, key: &Bytes, id: ParkId) {
        let mut keys = self.lock();
        let key_id = (source.clone(), key.clone());
        let Some(queue) = keys.queues.get_mut(&key_id) else {
            return;
        };
        if let Some(index) = queue.iter().position(|entry| entry.id == id) {
            queue.remove(index);
            self.parked.fetch_sub(1, Ordering::Relaxed);
            self.full.store(false, Ordering::Relaxed);
        }
        if queue.is_empty() {
            keys.queues.remove(&key_id);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Keys> {
        // The map stays consistent whatever a panicking holder did: each
        // change is one insert or removal.
        self.keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Drops the first entries of `queue` that are overdue by `overdue_after`
/// (or by their own delay, if longer); returns how many.
fn release_overdue(queue: &mut VecDeque<Entry>, overdue_after: Duration, now: SystemTime) -> usize {
    let mut released = 0;
    while let Some(head) = queue.front() {
        if head.due + overdue_after.max(head.delay) > now {
            break;
        }
        tracing::warn!(
            parked = ?head.id,
            overdue_by = ?now.duration_since(head.due).unwrap_or_default(),
            "a parked message did not come back in time; later messages of its key no longer wait for it",
        );
        queue.pop_front();
        released += 1;
    }
    released
}
