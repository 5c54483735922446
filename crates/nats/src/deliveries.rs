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

use std::collections::HashMap;
use std::collections::hash_map::Entry;
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

/// The deliveries held, by stream sequence.
#[derive(Debug, Default)]
pub(crate) struct Deliveries {
    held: Mutex<HashMap<u64, Held>>,
}

impl Deliveries {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Held>> {
        // A panic while holding the lock leaves a consistent map (every
        // update is a single insert or remove).
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
        self.lock().get(&sequence).cloned()
    }

    /// Looks up each sequence and calls `found` with those held, under
    /// one lock (so keep `found` short).
    pub(crate) fn lookup(&self, sequences: &[u64], mut found: impl FnMut(u64, &Held)) {
        let held = self.lock();
        for sequence in sequences {
            if let Some(entry) = held.get(sequence) {
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
            // One probe per sequence, not a look and a removal.
            if let Entry::Occupied(entry) = held.entry(sequence)
                && entry.get().delivered == delivered
            {
                entry.remove();
            }
        }
    }

    /// Takes every held delivery (the source closes: each goes back).
    pub(crate) fn take_all(&self) -> Vec<(u64, Held)> {
        self.lock().drain().collect()
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
        for entry in held.values_mut() {
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
        counters: Arc<crate::counters::Counters>,
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
    use super::*;

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
}
