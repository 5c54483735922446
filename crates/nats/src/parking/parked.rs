//! Parked messages that wait in this process until due, still held from
//! the server (see [`NatsParking`](crate::NatsParking) for why).
//!
//! A park goes through three hands:
//!
//! 1. [`NatsParking::park`](intake_core::parking::Parking::park) (the
//!    parking layer) *asks*: it keeps the message to give back, without
//!    its park headers and with the attempt it will run as, if there is
//!    room ([`ParkedHere::ask`]);
//! 2. the acker, given the runtime's `requeue_after` for that delivery,
//!    *parks* it here ([`ParkedHere::take_asked`], [`ParkedHere::wait`])
//!    instead of sending `-NAK`: the delivery stays held, so the progress
//!    task keeps reporting it (`+WPI`) and the server neither redelivers
//!    it nor counts a delivery;
//! 3. the source *gives it back* to the runtime once due
//!    ([`ParkedHere::give_back_due`]), as a delivery of the same stream
//!    sequence, acknowledged through the same reply subject.
//!
//! Room: the messages waiting here (and asked for) may hold at most
//! `max_bytes` ([`Message::byte_size`]; the runtime's
//! `max_in_flight_bytes`). A park for a message's own failure past that is
//! not asked for, and goes back to the server as a delayed `-NAK`. A
//! message that only waits behind its key is always kept: sent to the
//! server, each such wait would be one delivery more, counted toward
//! `max_deliveries` although it never failed (review R9). Those are at
//! most the consumer's `max_ack_pending` (every message kept here is
//! delivered and unacknowledged).
//!
//! One lock, taken once per park, per acker batch with parks, and per
//! source turn while something waits (an atomic count skips it otherwise);
//! never across an await.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use intake_core::Message;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::deliveries::Deliveries;

/// The parks of one source: asked for, and waiting until due.
#[derive(Debug)]
pub(crate) struct ParkedHere {
    inner: Mutex<Inner>,
    /// Entries in `asked` and `waiting` together: lets the hot paths skip
    /// the lock while nothing is parked.
    entries: AtomicUsize,
    max_bytes: AtomicUsize,
    /// How many may wait before they fill the consumer's `max_ack_pending`
    /// (with the budget's deliveries): only logged.
    room: AtomicUsize,
    /// Woken when a message starts to wait: the source may be sleeping
    /// past its due time.
    started: Notify,
}

#[derive(Debug, Default)]
struct Inner {
    /// Parks the parking layer asked for, by stream sequence, with the
    /// message to give back; the acker's `requeue_after` is still to come.
    asked: HashMap<u64, Message>,
    /// Waiting until due, by due time then sequence.
    waiting: BTreeMap<(Instant, u64), Message>,
    /// When each waiting sequence is due.
    due_of: HashMap<u64, Instant>,
    /// Bytes of the messages in `asked` and `waiting`.
    bytes: usize,
    /// Whether a park found no room since there last was some (logged
    /// once per such stretch).
    full: bool,
    /// Whether the waiting messages filled `room` since they last did not
    /// (logged once per such stretch).
    room_filled: bool,
}

impl ParkedHere {
    /// Room for `max_bytes` of parked messages.
    pub(crate) fn new(max_bytes: usize) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            entries: AtomicUsize::new(0),
            max_bytes: AtomicUsize::new(max_bytes),
            room: AtomicUsize::new(usize::MAX),
            started: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Each change below leaves the maps consistent before anything
        // that could panic.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The room, from the runtime's byte budget.
    pub(crate) fn set_max_bytes(&self, max_bytes: usize) {
        self.max_bytes.store(max_bytes, Ordering::Relaxed);
    }

    /// Keeps `message` (delivery `sequence`) to give back once the acker
    /// parks it: `false` when a park for its `own_failure` does not fit the
    /// room (the park then goes back to the server); one that only waits
    /// behind its key always fits.
    pub(crate) fn ask(&self, sequence: u64, message: Message, own_failure: bool) -> bool {
        let size = message.byte_size();
        let max_bytes = self.max_bytes.load(Ordering::Relaxed);
        let mut inner = self.lock();
        let replaced = inner.asked.get(&sequence).map_or(0, Message::byte_size);
        let bytes = inner.bytes - replaced;
        // One message always fits, however large: the room bounds how
        // many wait, not whether one can.
        if own_failure && bytes > 0 && bytes + size > max_bytes {
            if !inner.full {
                inner.full = true;
                tracing::warn!(
                    parked_bytes = bytes,
                    max_bytes,
                    "messages parked in this process fill its byte budget \
                     (max_in_flight_bytes): further parks for a message's own failure go back \
                     to the server as a delayed nak, each one a delivery more, to any instance \
                     of the group",
                );
            }
            return false;
        }
        if own_failure {
            inner.full = false;
        }
        inner.bytes = bytes + size;
        if inner.asked.insert(sequence, message).is_none() {
            self.entries.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// The message asked for with `sequence`, if any: the acker parks it
    /// ([`Self::wait`]) or, if it is no longer held, drops it.
    pub(crate) fn take_asked(&self, sequence: u64) -> Option<Message> {
        if self.entries.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut inner = self.lock();
        let message = inner.asked.remove(&sequence)?;
        inner.bytes -= message.byte_size();
        self.entries.fetch_sub(1, Ordering::Relaxed);
        Some(message)
    }

    /// Forgets what was asked for `sequences`, which the runtime finished
    /// otherwise (a park whose `requeue_after` never came).
    pub(crate) fn forget_asked(&self, sequences: &[u64]) {
        if self.entries.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut inner = self.lock();
        if inner.asked.is_empty() {
            return;
        }
        for sequence in sequences {
            if let Some(message) = inner.asked.remove(sequence) {
                inner.bytes -= message.byte_size();
                self.entries.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// How many parked messages the consumer's `max_ack_pending` leaves
    /// room for.
    pub(crate) fn set_room(&self, room: usize) {
        self.room.store(room, Ordering::Relaxed);
    }

    /// Parks `message` (delivery `sequence`) here until `due`.
    pub(crate) fn wait(&self, sequence: u64, message: Message, due: Instant) {
        let mut inner = self.lock();
        inner.bytes += message.byte_size();
        if let Some(earlier) = inner.due_of.insert(sequence, due)
            && let Some(replaced) = inner.waiting.remove(&(earlier, sequence))
        {
            inner.bytes -= replaced.byte_size();
            self.entries.fetch_sub(1, Ordering::Relaxed);
        }
        inner.waiting.insert((due, sequence), message);
        self.entries.fetch_add(1, Ordering::Relaxed);
        let room = self.room.load(Ordering::Relaxed);
        if inner.waiting.len() >= room {
            if !inner.room_filled {
                inner.room_filled = true;
                tracing::warn!(
                    parked = inner.waiting.len(),
                    room,
                    "parked messages fill the room the consumer's max_ack_pending keeps for them \
                     (park_room): the server sends nothing new beyond the budget until some are due",
                );
            }
        } else {
            inner.room_filled = false;
        }
        drop(inner);
        self.started.notify_one();
    }

    /// Whether delivery `sequence` waits here.
    pub(crate) fn is_waiting(&self, sequence: u64) -> bool {
        self.entries.load(Ordering::Relaxed) > 0 && self.lock().due_of.contains_key(&sequence)
    }

    /// How long delivery `sequence` still waits here, if it does.
    pub(crate) fn remaining(&self, sequence: u64, now: Instant) -> Option<Duration> {
        if self.entries.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let due = *self.lock().due_of.get(&sequence)?;
        Some(due.saturating_duration_since(now))
    }

    /// Moves the messages due by `now` that `deliveries` still holds to
    /// `ready`, oldest due first; drops those no longer held (their
    /// delivery was handed back or settled meanwhile). Returns when the
    /// next one is due.
    pub(crate) fn give_back_due(
        &self,
        now: Instant,
        deliveries: &Deliveries,
        ready: &mut std::collections::VecDeque<Message>,
    ) -> Option<Instant> {
        if self.entries.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut inner = self.lock();
        while let Some(entry) = inner.waiting.first_entry() {
            let (due, sequence) = *entry.key();
            if due > now {
                return Some(due);
            }
            let message = entry.remove();
            inner.due_of.remove(&sequence);
            inner.bytes -= message.byte_size();
            self.entries.fetch_sub(1, Ordering::Relaxed);
            if deliveries.get(sequence).is_some() {
                ready.push_back(message);
            }
        }
        None
    }

    /// Resolves once a message started to wait since the last call
    /// (at once if one did while nobody listened).
    pub(crate) async fn started(&self) {
        self.started.notified().await;
    }

    /// Forgets everything (the source closes; what was held is handed back).
    pub(crate) fn clear(&self) {
        let mut inner = self.lock();
        *inner = Inner::default();
        self.entries.store(0, Ordering::Relaxed);
    }

    /// Messages waiting here.
    pub(crate) fn waiting(&self) -> usize {
        if self.entries.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.lock().waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use async_nats::Subject;
    use bytes::Bytes;
    use intake_core::{Metadata, Position};

    use super::*;

    fn message(sequence: u64, payload: &'static [u8]) -> Message {
        let metadata = Metadata::new("S".into(), 0, Position::Offset(sequence as i64));
        Message::new(Bytes::from_static(payload), metadata)
    }

    fn held(deliveries: &Deliveries, sequence: u64) {
        deliveries.hold([(
            sequence,
            Subject::from(format!("$JS.ACK.S.c.1.{sequence}.1.0.0")),
            1,
        )]);
    }

    #[test]
    fn a_park_waits_until_due_and_comes_back_while_held() {
        let parked = ParkedHere::new(1 << 20);
        let deliveries = Deliveries::default();
        held(&deliveries, 7);
        held(&deliveries, 8);
        let now = Instant::now();
        assert!(parked.ask(7, message(7, b"a"), true));
        assert!(parked.ask(8, message(8, b"b"), true));
        let a = parked.take_asked(7).expect("asked");
        let b = parked.take_asked(8).expect("asked");
        parked.wait(8, b, now + Duration::from_secs(1));
        parked.wait(7, a, now + Duration::from_secs(2));
        assert!(parked.is_waiting(7) && parked.is_waiting(8));
        assert_eq!(
            parked.remaining(7, now + Duration::from_millis(500)),
            Some(Duration::from_millis(1_500))
        );
        let mut ready = VecDeque::new();
        assert_eq!(
            parked.give_back_due(now, &deliveries, &mut ready),
            Some(now + Duration::from_secs(1))
        );
        assert!(ready.is_empty());
        // 7 was handed back meanwhile (the source closed, or it was
        // settled): dropped, not given back.
        deliveries.release([(7, 1)]);
        assert_eq!(
            parked.give_back_due(now + Duration::from_secs(3), &deliveries, &mut ready),
            None
        );
        assert_eq!(ready.len(), 1);
        assert_eq!(&ready[0].payload()[..], b"b");
        assert_eq!(parked.waiting(), 0);
        assert_eq!(parked.lock().bytes, 0);
    }

    #[test]
    fn parks_past_the_room_are_refused_but_one_always_fits() {
        let big = message(1, b"0123456789");
        let size = big.byte_size();
        let parked = ParkedHere::new(size + size / 2);
        assert!(parked.ask(1, big, true), "the first fits");
        assert!(!parked.ask(2, message(2, b"0123456789"), true), "no room");
        assert!(
            parked.ask(4, message(4, b"0123456789"), false),
            "a message waiting behind its key is always kept"
        );
        parked.forget_asked(&[1, 4]);
        assert!(parked.ask(2, message(2, b"0123456789"), true), "room again");
        let lone = ParkedHere::new(1);
        assert!(lone.ask(3, message(3, b"larger than the room"), true));
    }
}
