//! The history: one [`Sample`] per route at each sample interval, in a
//! [`Ring`] per route of a fixed bound ([`ConsoleSettings::samples`](super::ConsoleSettings::samples)),
//! so the console holds the same memory after a day as after an hour.
//!
//! A sample holds what changed since the one before (messages committed,
//! failures, dead letters, parks) and what the moment shows (broker lag,
//! parked backlog, in flight, stalled partitions). Counts come from
//! cumulative counters read at each sample, never from the message path.

use std::time::Instant;

use serde::Serialize;

use super::outcomes::Outcomes;
use super::ring::Ring;
use super::view::millis;

/// What a route did during one sample interval, and where it stood at its
/// end.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Sample {
    /// When it was taken, in Unix milliseconds.
    pub at_unix_ms: u64,
    /// Milliseconds since the sample before (or since sampling started).
    pub interval_ms: u64,
    /// Messages committed during the interval (every outcome that
    /// completes a message: handled, dead-lettered, parked, ignored).
    pub committed: u64,
    /// `committed` per second.
    pub committed_per_s: f64,
    /// Messages handed to the handler during the interval, from the
    /// metrics layer's counters (`None` without a metrics registry).
    pub handled: Option<u64>,
    /// `handled` per second.
    pub handled_per_s: Option<f64>,
    /// Final failures during the interval, dead-lettered and discarded
    /// ones included, from the metrics layer's counters (`None` without a
    /// metrics registry).
    pub failed: Option<u64>,
    /// Messages dead-lettered during the interval (metrics layer).
    pub dead_lettered: Option<u64>,
    /// Messages parked during the interval (metrics layer).
    pub parked: Option<u64>,
    /// Broker lag summed over the partitions (lag probe; `None` without
    /// one, or when it did not answer).
    pub broker_lag: Option<u64>,
    /// Messages parked and not yet back (lag probe).
    pub parked_backlog: Option<u64>,
    /// Deliveries held at the last commit tick.
    pub in_flight: usize,
    /// Partitions assigned.
    pub partitions: usize,
    /// Partitions that stall.
    pub stalled_partitions: usize,
}

/// A route's cumulative counters and state at one sample, as read.
#[derive(Clone, Debug, Default)]
pub(super) struct Reading {
    pub(super) committed: u64,
    pub(super) outcomes: Option<Outcomes>,
    pub(super) broker_lag: Option<u64>,
    pub(super) parked_backlog: Option<u64>,
    pub(super) in_flight: usize,
    pub(super) partitions: usize,
    pub(super) stalled_partitions: usize,
}

/// One route's samples, and the counters of its last one.
#[derive(Debug)]
struct RouteHistory {
    name: String,
    samples: Ring<Sample>,
    last: Option<(Instant, u64, Option<Outcomes>)>,
}

/// Every route's history.
#[derive(Debug)]
pub(super) struct History {
    routes: Vec<RouteHistory>,
    capacity: usize,
    /// When sampling started: the first sample's interval starts there.
    started: Instant,
}

impl History {
    /// An empty history keeping `capacity` samples per route.
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            routes: Vec::new(),
            capacity,
            started: Instant::now(),
        }
    }

    /// Records route `name`'s sample from `reading`, taken at `now`
    /// (`unix_ms` in Unix milliseconds).
    pub(super) fn record(&mut self, name: &str, reading: &Reading, now: Instant, unix_ms: u64) {
        let index = match self.routes.iter().position(|route| route.name == name) {
            Some(index) => index,
            None => {
                self.routes.push(RouteHistory {
                    name: name.to_owned(),
                    samples: Ring::new(self.capacity),
                    last: None,
                });
                self.routes.len() - 1
            }
        };
        let route = &mut self.routes[index];
        let (since, committed_before, outcomes_before) =
            route
                .last
                .unwrap_or((self.started, 0, Some(Outcomes::default())));
        let elapsed = now.saturating_duration_since(since);
        let committed = reading.committed.saturating_sub(committed_before);
        // Counters only grow; one that shrank (a registry swapped) counts
        // as starting again.
        let delta = |now: u64, before: u64| now.checked_sub(before).unwrap_or(now);
        let outcomes = reading.outcomes.map(|now| {
            let before = outcomes_before.unwrap_or_default();
            Outcomes {
                handled: delta(now.handled, before.handled),
                failed: delta(now.failed, before.failed),
                dead_lettered: delta(now.dead_lettered, before.dead_lettered),
                parked: delta(now.parked, before.parked),
            }
        });
        let seconds = elapsed.as_secs_f64();
        let per_s = |count: u64| {
            if seconds > 0.0 {
                count as f64 / seconds
            } else {
                0.0
            }
        };
        route.samples.push(Sample {
            at_unix_ms: unix_ms,
            interval_ms: millis(elapsed),
            committed,
            committed_per_s: per_s(committed),
            handled: outcomes.map(|o| o.handled),
            handled_per_s: outcomes.map(|o| per_s(o.handled)),
            failed: outcomes.map(|o| o.failed),
            dead_lettered: outcomes.map(|o| o.dead_lettered),
            parked: outcomes.map(|o| o.parked),
            broker_lag: reading.broker_lag,
            parked_backlog: reading.parked_backlog,
            in_flight: reading.in_flight,
            partitions: reading.partitions,
            stalled_partitions: reading.stalled_partitions,
        });
        route.last = Some((now, reading.committed, reading.outcomes));
    }

    /// Route `name`'s samples taken after `since_unix_ms`, oldest first.
    pub(super) fn samples(&self, name: &str, since_unix_ms: u64) -> Vec<Sample> {
        self.routes
            .iter()
            .find(|route| route.name == name)
            .map(|route| {
                route
                    .samples
                    .iter()
                    .filter(|sample| sample.at_unix_ms > since_unix_ms)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// How many samples a route keeps at most.
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.capacity
    }

    /// How many samples route `name` holds.
    #[cfg(test)]
    fn len(&self, name: &str) -> usize {
        self.routes
            .iter()
            .find(|route| route.name == name)
            .map_or(0, |route| route.samples.len())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn each_route_keeps_at_most_its_bound_of_samples_with_deltas_of_the_counters() {
        let mut history = History::new(180);
        let start = history.started;
        for tick in 1..=1_000u64 {
            let reading = Reading {
                committed: tick * 10,
                outcomes: Some(Outcomes {
                    handled: tick * 12,
                    failed: tick,
                    dead_lettered: tick / 2,
                    parked: 0,
                }),
                broker_lag: Some(tick),
                ..Reading::default()
            };
            let at = start + Duration::from_secs(5 * tick);
            history.record("orders", &reading, at, tick * 5_000);
            history.record("payments", &Reading::default(), at, tick * 5_000);
            assert!(history.len("orders") <= 180);
        }
        assert_eq!(history.len("orders"), 180, "15 minutes at 5 s, no more");
        assert_eq!(history.len("payments"), 180);
        let samples = history.samples("orders", 0);
        assert_eq!(samples.len(), 180);
        assert_eq!(samples.first().map(|s| s.at_unix_ms), Some(821 * 5_000));
        let last = samples.last().expect("a sample");
        assert_eq!(last.committed, 10);
        assert!((last.committed_per_s - 2.0).abs() < 1e-9);
        assert_eq!(last.failed, Some(1));
        assert_eq!(last.handled, Some(12));
        assert_eq!(last.handled_per_s, Some(2.4));
        assert_eq!(last.interval_ms, 5_000);
        assert_eq!(last.broker_lag, Some(1_000));
        let recent = history.samples("orders", 995 * 5_000);
        assert_eq!(recent.len(), 5);
        assert!(history.samples("missing", 0).is_empty());
    }

    #[test]
    fn a_sample_is_small_enough_for_the_documented_bound() {
        // `MAX_SAMPLES` says under 2 MB per route.
        assert!(std::mem::size_of::<Sample>() < 200);
    }

    #[test]
    fn without_a_metrics_registry_outcomes_are_unknown_not_zero() {
        let mut history = History::new(4);
        let now = history.started + Duration::from_secs(1);
        history.record("orders", &Reading::default(), now, 1);
        let sample = &history.samples("orders", 0)[0];
        assert_eq!(sample.failed, None);
        assert_eq!(sample.handled_per_s, None);
        assert_eq!(sample.dead_lettered, None);
        assert_eq!(sample.parked, None);
        assert_eq!(history.capacity(), 4);
    }
}
