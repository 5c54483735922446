//! The deliveries this consumer holds: for each stream sequence handed to
//! the runtime and not yet acknowledged, its `$JS.ACK` reply subject (the
//! only way to acknowledge a JetStream delivery), its delivery count and
//! when the server last heard of it.
//!
//! Shared by the source (which adds what it delivers), the acker (which
//! acknowledges or naks by sequence and removes what the server confirmed),
//! the dead-letter sink (which terms a dead-lettered original) and the
//! progress task, which tells the server `+WPI` ("work in progress") for
//! every delivery held longer than half its `ack_wait`, so that a slow
//! handler, or a message waiting for a slot behind one, is not delivered
//! again while this consumer still holds it.
//!
//! One lock, taken once per fetched batch, per ack batch and per progress
//! tick, never across an await.
//!
//! # Why a window, not a hash map
//!
//! A consumer's stream sequences arrive in increasing order, and the acker
//! settles them in about that order. Held in a `HashMap`, each ack's lookup
//! and release probed a random bucket that the source's thread had written
//! last: in a profile of the throughput bench the two probes were the
//! acker's largest cost, more than publishing the acks (about 10 % of the
//! client's CPU, nearly all of it waiting for those cache lines). Held in
//! sequence order, a batch walks neighbouring slots, and a sequence's slot
//! is found by arithmetic (dense sequences: `sequence - first`) or, after
//! gaps, by a binary search. Redeliveries below the newest sequence, the
//! exception, go to a small map of their own.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_nats::Subject;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// One delivery held by this consumer.
#[derive(Clone, Debug)]
pub(crate) struct Held {
    /// The `$JS.ACK…` subject the server delivered it with.
    pub(crate) reply: Subject,
    /// The server's delivery count (1 for a first delivery).
    pub(crate) delivered: u32,
    /// When it was delivered or last reported in progress.
    extended_at: Instant,
}

/// A place in the window: a sequence, and its delivery while held.
#[derive(Debug)]
struct Slot {
    sequence: u64,
    held: Option<Held>,
}

/// Released slots the window may keep beyond one per held delivery before
/// it is compacted: with at most `2 × held + SLACK` slots its memory stays
/// proportional to what is held, whatever gaps a slow delivery at the
/// front leaves behind it, and a compaction (linear) comes only after at
/// least half as many releases as it visits.
const SLACK: usize = 64;

/// The held deliveries: `window` in increasing sequence order, released
/// slots left in place (`None`) until they reach the front or a compaction
/// removes them; `stragglers` those that arrived below the window's newest
/// sequence and had no slot there (redeliveries). A sequence is in one of
/// the two at most.
#[derive(Debug, Default)]
struct HeldSet {
    window: VecDeque<Slot>,
    /// Slots of `window` holding a delivery.
    live: usize,
    stragglers: HashMap<u64, Held>,
}

impl HeldSet {
    /// The index of `sequence`'s slot in the window, held or released.
    fn slot(&self, sequence: u64) -> Option<usize> {
        let first = self.window.front()?.sequence;
        let last = self.window.back()?.sequence;
        if sequence < first || sequence > last {
            return None;
        }
        // Sequences strictly increase along the window, so a run without
        // gaps from either end puts `sequence` at its distance from that
        // end; otherwise it lies somewhere before the front guess.
        let from_front = usize::try_from(sequence - first).unwrap_or(usize::MAX);
        if self
            .window
            .get(from_front)
            .is_some_and(|slot| slot.sequence == sequence)
        {
            return Some(from_front);
        }
        let from_back = usize::try_from(last - sequence)
            .ok()
            .and_then(|distance| (self.window.len() - 1).checked_sub(distance));
        if let Some(index) = from_back
            && self.window[index].sequence == sequence
        {
            return Some(index);
        }
        self.window
            .binary_search_by_key(&sequence, |slot| slot.sequence)
            .ok()
    }

    fn get(&self, sequence: u64) -> Option<&Held> {
        match self.slot(sequence) {
            Some(index) => self.window[index].held.as_ref(),
            None => self.stragglers.get(&sequence),
        }
    }

    fn insert(&mut self, sequence: u64, held: Held) {
        if let Some(index) = self.slot(sequence) {
            let slot = &mut self.window[index].held;
            if slot.is_none() {
                self.live += 1;
            }
            *slot = Some(held);
            return;
        }
        if !self.stragglers.is_empty()
            && let Some(straggler) = self.stragglers.get_mut(&sequence)
        {
            *straggler = held;
            return;
        }
        if self
            .window
            .back()
            .is_none_or(|slot| slot.sequence < sequence)
        {
            self.window.push_back(Slot {
                sequence,
                held: Some(held),
            });
            self.live += 1;
        } else {
            self.stragglers.insert(sequence, held);
        }
    }

    /// Removes `sequence` if it is held with delivery count `delivered`.
    fn release(&mut self, sequence: u64, delivered: u32) {
        if let Some(index) = self.slot(sequence) {
            let slot = &mut self.window[index].held;
            if slot
                .as_ref()
                .is_some_and(|held| held.delivered == delivered)
            {
                *slot = None;
                self.live -= 1;
            }
            return;
        }
        if !self.stragglers.is_empty()
            && let Some(straggler) = self.stragglers.get(&sequence)
            && straggler.delivered == delivered
        {
            self.stragglers.remove(&sequence);
        }
    }

    /// Drops released slots from the front, and compacts the window once
    /// released slots outnumber held ones by more than [`SLACK`].
    fn trim(&mut self) {
        while self.window.front().is_some_and(|slot| slot.held.is_none()) {
            self.window.pop_front();
        }
        if self.window.len() > 2 * self.live + SLACK {
            self.window.retain(|slot| slot.held.is_some());
        }
    }

    fn len(&self) -> usize {
        self.live + self.stragglers.len()
    }

    fn drain(&mut self) -> Vec<(u64, Held)> {
        let mut all = Vec::with_capacity(self.len());
        all.extend(
            self.window
                .drain(..)
                .filter_map(|slot| Some((slot.sequence, slot.held?))),
        );
        all.extend(self.stragglers.drain());
        self.live = 0;
        all
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = &mut Held> {
        self.window
            .iter_mut()
            .filter_map(|slot| slot.held.as_mut())
            .chain(self.stragglers.values_mut())
    }
}

/// The deliveries held, by stream sequence.
#[derive(Debug, Default)]
pub(crate) struct Deliveries {
    held: Mutex<HeldSet>,
}

impl Deliveries {
    fn lock(&self) -> MutexGuard<'_, HeldSet> {
        // A panic while holding the lock leaves a consistent set: no
        // operation on it calls out while it is half-done.
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records deliveries handed to the runtime. A sequence delivered again
    /// while still held (the server redelivered it) takes the newer reply
    /// subject and count.
    pub(crate) fn hold(&self, delivered: impl IntoIterator<Item = (u64, Subject, u32)>) {
        let now = Instant::now();
        let mut held = self.lock();
        for (sequence, reply, count) in delivered {
            held.insert(
                sequence,
                Held {
                    reply,
                    delivered: count,
                    extended_at: now,
                },
            );
        }
    }

    /// The held delivery of `sequence`, if any.
    pub(crate) fn get(&self, sequence: u64) -> Option<Held> {
        self.lock().get(sequence).cloned()
    }

    /// Looks up each sequence and calls `found` with those held, under
    /// one lock (so keep `found` short).
    pub(crate) fn lookup(&self, sequences: &[u64], mut found: impl FnMut(u64, &Held)) {
        let held = self.lock();
        for sequence in sequences {
            if let Some(entry) = held.get(*sequence) {
                found(*sequence, entry);
            }
        }
    }

    /// Forgets deliveries the server confirmed as settled, each given as
    /// `(sequence, delivery count)`. A sequence the server delivered again
    /// meanwhile (a nak's redelivery can arrive before the nak's
    /// confirmation) is held under its newer count and stays.
    pub(crate) fn release(&self, settled: impl IntoIterator<Item = (u64, u32)>) {
        let mut held = self.lock();
        for (sequence, delivered) in settled {
            held.release(sequence, delivered);
        }
        held.trim();
    }

    /// Takes every held delivery (the source closes: each goes back).
    pub(crate) fn take_all(&self) -> Vec<(u64, Held)> {
        self.lock().drain()
    }

    /// How many deliveries are held.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Reply subjects of deliveries not extended for `older_than`, marked
    /// extended now.
    fn due(&self, older_than: Duration, due: &mut Vec<Subject>) {
        let now = Instant::now();
        let mut held = self.lock();
        for entry in held.iter_mut() {
            if now.saturating_duration_since(entry.extended_at) >= older_than {
                entry.extended_at = now;
                due.push(entry.reply.clone());
            }
        }
    }
}

/// The task that reports held deliveries in progress; stopped when dropped.
#[derive(Debug)]
pub(crate) struct ProgressTask {
    task: JoinHandle<()>,
}

impl ProgressTask {
    /// Every `ack_wait / 4`, sends `+WPI` for each delivery held longer
    /// than `ack_wait / 2`: a delivery is reported at the latest when 3/4
    /// of its `ack_wait` have passed, with a quarter left for the report to
    /// arrive.
    pub(crate) fn start(
        client: async_nats::Client,
        deliveries: Arc<Deliveries>,
        ack_wait: Duration,
        counters: Arc<crate::counters::NatsCounters>,
    ) -> Self {
        let tick = (ack_wait / 4).max(Duration::from_millis(10));
        let older_than = ack_wait / 2;
        let task = tokio::spawn(async move {
            let mut interval = tokio::time::interval(tick);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut due = Vec::new();
            loop {
                interval.tick().await;
                deliveries.due(older_than, &mut due);
                if due.is_empty() {
                    continue;
                }
                let reported = due.len();
                for reply in due.drain(..) {
                    // Unconfirmed on purpose: a lost report costs at most a
                    // redelivery (a duplicate), never a loss, and the next
                    // tick reports again.
                    if let Err(error) = client
                        .publish(reply, bytes::Bytes::from_static(b"+WPI"))
                        .await
                    {
                        tracing::warn!(%error, "could not report a delivery in progress");
                    }
                }
                counters.add_progress_reports(reported);
                tracing::debug!(reported, "reported held deliveries in progress");
            }
        });
        Self { task }
    }
}

impl Drop for ProgressTask {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn reply(sequence: u64, delivered: u32) -> Subject {
        Subject::from(format!("$JS.ACK.s.c.{delivered}.{sequence}.1.0.0"))
    }

    #[test]
    fn a_settled_delivery_does_not_release_its_redelivery() {
        let deliveries = Deliveries::default();
        deliveries.hold([(7, Subject::from("$JS.ACK.s.c.1.7.1.0.0"), 1)]);
        // The nak of delivery 1 was answered by a redelivery before its
        // confirmation.
        deliveries.hold([(7, Subject::from("$JS.ACK.s.c.2.7.2.0.0"), 2)]);
        deliveries.release([(7, 1)]);
        assert_eq!(deliveries.get(7).map(|held| held.delivered), Some(2));
        deliveries.release([(7, 2)]);
        assert!(deliveries.get(7).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_delivery_is_due_for_progress_once_per_period() {
        let deliveries = Deliveries::default();
        deliveries.hold([(7, Subject::from("$JS.ACK.s.c.1.7.7.0.0"), 1)]);
        let mut due = Vec::new();
        deliveries.due(Duration::from_secs(15), &mut due);
        assert!(due.is_empty(), "not yet");
        tokio::time::advance(Duration::from_secs(15)).await;
        deliveries.due(Duration::from_secs(15), &mut due);
        assert_eq!(due.len(), 1);
        due.clear();
        deliveries.due(Duration::from_secs(15), &mut due);
        assert!(due.is_empty(), "extended just now");
        deliveries.release([(7, 1)]);
        tokio::time::advance(Duration::from_secs(60)).await;
        deliveries.due(Duration::from_secs(15), &mut due);
        assert!(due.is_empty(), "released");
    }

    #[test]
    fn a_slow_delivery_at_the_front_does_not_grow_the_window_without_bound() {
        let deliveries = Deliveries::default();
        deliveries.hold([(1, reply(1, 1), 1)]);
        for sequence in 2..100_000 {
            deliveries.hold([(sequence, reply(sequence, 1), 1)]);
            deliveries.release([(sequence, 1)]);
        }
        let held = deliveries.lock();
        assert_eq!(held.len(), 1);
        assert!(held.window.len() <= 2 + SLACK, "{}", held.window.len());
        assert!(held.get(1).is_some());
    }

    #[test]
    fn sparse_sequences_and_redeliveries_below_the_window_are_found() {
        let deliveries = Deliveries::default();
        // A filtered consumer: every thousandth sequence.
        deliveries.hold((1..=10).map(|k| (k * 1000, reply(k * 1000, 1), 1)));
        deliveries.release([(3000, 1), (4000, 1)]);
        // Redeliveries of what was settled, and of what never was here.
        deliveries.hold([(3000, reply(3000, 2), 2), (3500, reply(3500, 2), 2)]);
        assert_eq!(deliveries.get(3000).map(|held| held.delivered), Some(2));
        assert_eq!(deliveries.get(3500).map(|held| held.delivered), Some(2));
        assert!(deliveries.get(4000).is_none());
        assert_eq!(deliveries.len(), 10);
        let mut found = Vec::new();
        deliveries.lookup(&[1000, 3500, 4000, 10_000, 10_001], |sequence, _| {
            found.push(sequence)
        });
        assert_eq!(found, [1000, 3500, 10_000]);
    }

    /// What happens to the set, for the model test.
    #[derive(Clone, Debug)]
    enum Operation {
        /// A new delivery, `gap` past the newest sequence so far.
        Deliver { gap: u64 },
        /// A redelivery of a sequence seen before, with a higher count.
        Redeliver(prop::sample::Index),
        /// The acker settles a sequence seen before, with the count it
        /// knew or an older one.
        Release(prop::sample::Index, bool),
    }

    fn operation() -> impl Strategy<Value = Operation> {
        prop_oneof![
            6 => (1..4u64).prop_map(|gap| Operation::Deliver { gap }),
            1 => any::<prop::sample::Index>().prop_map(Operation::Redeliver),
            6 => (any::<prop::sample::Index>(), any::<bool>())
                .prop_map(|(index, stale)| Operation::Release(index, stale)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any interleaving of deliveries, redeliveries and releases leaves
        /// what a plain map would hold, with the window bounded by what it
        /// holds.
        #[test]
        fn the_window_holds_what_a_map_would(
            batches in proptest::collection::vec(proptest::collection::vec(operation(), 1..60), 1..30)
        ) {
            let deliveries = Deliveries::default();
            let mut model: HashMap<u64, u32> = HashMap::new();
            // Every sequence delivered so far, with its newest count.
            let mut seen: Vec<(u64, u32)> = Vec::new();
            let mut newest = 0;
            for batch in batches {
                let mut releases = Vec::new();
                for operation in batch {
                    let delivered = match operation {
                        Operation::Deliver { gap } => {
                            newest += gap;
                            seen.push((newest, 1));
                            Some((newest, 1))
                        }
                        Operation::Redeliver(index) if !seen.is_empty() => {
                            let at = index.index(seen.len());
                            let entry = &mut seen[at];
                            entry.1 += 1;
                            Some(*entry)
                        }
                        Operation::Release(index, stale) if !seen.is_empty() => {
                            let (sequence, count) = seen[index.index(seen.len())];
                            releases.push((sequence, if stale { count - 1 } else { count }));
                            None
                        }
                        _ => None,
                    };
                    if let Some((sequence, count)) = delivered {
                        deliveries.hold([(sequence, reply(sequence, count), count)]);
                        model.insert(sequence, count);
                    }
                }
                // Releases come as the acker sends them: a batch after holds.
                for (sequence, count) in &releases {
                    if model.get(sequence) == Some(count) {
                        model.remove(sequence);
                    }
                }
                deliveries.release(releases);
                let held = deliveries.lock();
                prop_assert!(held.window.len() <= 2 * held.live + SLACK);
                prop_assert_eq!(held.len(), model.len());
                for (sequence, _) in &seen {
                    let found = held.get(*sequence);
                    prop_assert_eq!(
                        found.map(|held| held.delivered),
                        model.get(sequence).copied(),
                        "sequence {}", sequence
                    );
                    if let Some(found) = found {
                        prop_assert_eq!(found.reply.clone(), reply(*sequence, found.delivered));
                    }
                }
            }
            let mut drained: Vec<u64> = deliveries
                .take_all()
                .into_iter()
                .map(|(sequence, _)| sequence)
                .collect();
            drained.sort_unstable();
            let mut expected: Vec<u64> = model.keys().copied().collect();
            expected.sort_unstable();
            prop_assert_eq!(drained, expected);
            prop_assert_eq!(deliveries.len(), 0);
        }
    }
}
