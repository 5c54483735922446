//! The consumer-level backoff gate: after a failure, pause intake, then let
//! one probe delivery through; its outcome decides whether to step back
//! toward normal or to back off deeper. (The policies that give the delays
//! are in [`crate::backoff`].)
//!
//! This is go-nsq's RDY model written as an explicit state machine, so that
//! the bugs that model had cannot be expressed:
//! - nsqio/go-nsq#128: a probe answered with "requeue without backoff" never
//!   left backoff. Here every probe outcome leads somewhere: success and
//!   failure to a new level, a neutral outcome straight to another probe.
//! - #129: a zero backoff still paused. Here a zero delay, or a [`Disabled`]
//!   policy, never pauses.
//! - #142/#147: the level kept growing past the maximum, so recovery took
//!   `level × max`. Here the level stops where the policy stops growing.
//! - Simultaneous failures during one backoff window raised the level once
//!   each. Here outcomes that arrive while backing off are ignored: one
//!   window, one step.
//! - A probe whose handler hangs would hold every other delivery back for
//!   good. Here a probe that outlives its deadline
//!   ([`ConsumerBuilder::probe_timeout`](super::ConsumerBuilder::probe_timeout))
//!   counts as a failed one and the gate reopens into backoff.
//!
//! [`Disabled`]: crate::backoff::Disabled

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backoff::BackoffPolicy;

/// Where the gate stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateState {
    /// Deliveries start freely.
    Normal,
    /// No delivery starts before `until`.
    BackingOff {
        /// When the next probe may start.
        until: Instant,
    },
    /// One probe delivery may start (or is running); the rest wait for its
    /// outcome.
    Probing {
        /// Whether the probe has started.
        in_flight: bool,
    },
    /// The policy is disabled: intake never pauses.
    Disabled,
}

/// What a finished delivery says about the consumer's health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// It succeeded.
    Success,
    /// It failed in a way that suggests the dependencies are unhealthy.
    Failure,
    /// It says nothing either way (ignored, permanently failed, requeued
    /// without backoff, interrupted).
    Neutral,
}

/// Whether a delivery may start now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Start it.
    Open,
    /// Start it as the probe.
    Probe,
    /// Hold it until the given time (or until the probe's outcome, if `None`).
    Closed(Option<Instant>),
}

/// The gate's state machine. See the [module docs](self).
pub struct BackoffGate {
    policy: Arc<dyn BackoffPolicy>,
    state: GateState,
    level: u32,
}

impl std::fmt::Debug for BackoffGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackoffGate")
            .field("state", &self.state)
            .field("level", &self.level)
            .finish()
    }
}

impl BackoffGate {
    /// A machine driven by `policy`; `Disabled` if the policy is.
    pub fn new(policy: Arc<dyn BackoffPolicy>) -> Self {
        let state = if policy.is_disabled() {
            GateState::Disabled
        } else {
            GateState::Normal
        };
        Self {
            policy,
            state,
            level: 0,
        }
    }

    /// The current state.
    pub fn state(&self) -> GateState {
        self.state
    }

    /// How deep the backoff is (0 = normal).
    pub fn level(&self) -> u32 {
        self.level
    }

    /// Whether a delivery may start at `now`. A `Probe` answer means the
    /// caller starts exactly one delivery and marks it as the probe.
    pub fn decide(&mut self, now: Instant) -> Decision {
        match self.state {
            GateState::Normal | GateState::Disabled => Decision::Open,
            GateState::BackingOff { until } if now < until => Decision::Closed(Some(until)),
            GateState::BackingOff { .. } | GateState::Probing { in_flight: false } => {
                self.state = GateState::Probing { in_flight: true };
                Decision::Probe
            }
            GateState::Probing { in_flight: true } => Decision::Closed(None),
        }
    }

    /// Records the outcome of a delivery; `probe` says whether it was the
    /// probe.
    pub fn record(&mut self, signal: Signal, probe: bool, now: Instant) {
        match self.state {
            GateState::Disabled | GateState::BackingOff { .. } => {}
            GateState::Normal => {
                if signal == Signal::Failure {
                    self.deepen(now);
                }
            }
            GateState::Probing { .. } if !probe => {}
            GateState::Probing { .. } => match signal {
                Signal::Success => {
                    self.level = self.level.saturating_sub(1);
                    if self.level == 0 {
                        self.state = GateState::Normal;
                    } else {
                        self.pause_for(self.level, now);
                    }
                }
                Signal::Failure => self.deepen(now),
                Signal::Neutral => self.state = GateState::Probing { in_flight: false },
            },
        }
    }

    /// A probe that outlived its deadline counts as a failed one: the gate
    /// reopens into backoff, and the next probe starts once that ends. Its
    /// handler keeps running, and its outcome no longer decides anything.
    pub fn probe_timed_out(&mut self, now: Instant) {
        if self.state == (GateState::Probing { in_flight: true }) {
            self.deepen(now);
        }
    }

    /// A probe that ended without an outcome (revoked, dropped) lets the next
    /// delivery probe instead.
    pub fn probe_abandoned(&mut self) {
        if self.state == (GateState::Probing { in_flight: true }) {
            self.state = GateState::Probing { in_flight: false };
        }
    }

    fn deepen(&mut self, now: Instant) {
        // The level grows only while the policy still has a longer step, so
        // recovering from the cap takes as many probes as reaching it did.
        if self.policy.delay(self.level + 1).is_some() {
            self.level += 1;
        }
        if self.level == 0 {
            return;
        }
        self.pause_for(self.level, now);
    }

    fn pause_for(&mut self, level: u32, now: Instant) {
        match self.policy.delay(level) {
            Some(delay) if delay > Duration::ZERO => {
                self.state = GateState::BackingOff {
                    until: crate::deadline::after(now, delay),
                };
            }
            // A zero delay (or none) never pauses, not even down to one
            // probe at a time.
            _ => {
                self.level = 0;
                self.state = GateState::Normal;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backoff::{Constant, Disabled, Exponential};

    fn exponential() -> BackoffGate {
        BackoffGate::new(Arc::new(
            Exponential::new(Duration::from_secs(1), Duration::from_secs(4)).jitter(0.0),
        ))
    }

    #[test]
    fn probe_requeued_without_backoff_still_leaves_backoff() {
        let mut gate = exponential();
        let start = Instant::now();
        gate.record(Signal::Failure, false, start);
        let after = start + Duration::from_secs(2);
        assert_eq!(gate.decide(after), Decision::Probe);
        gate.record(Signal::Neutral, true, after);
        // Not stalled: the next delivery probes at once, and its success
        // returns the consumer to normal.
        assert_eq!(gate.decide(after), Decision::Probe);
        gate.record(Signal::Success, true, after);
        assert_eq!(gate.state(), GateState::Normal);
        assert_eq!(gate.decide(after), Decision::Open);
    }

    #[test]
    fn disabled_policy_never_pauses() {
        let mut gate = BackoffGate::new(Arc::new(Disabled));
        let now = Instant::now();
        for _ in 0..10 {
            gate.record(Signal::Failure, false, now);
            assert_eq!(gate.decide(now), Decision::Open);
        }
    }

    #[test]
    fn zero_delay_never_pauses() {
        let mut gate = BackoffGate::new(Arc::new(Constant::new(Duration::ZERO)));
        let now = Instant::now();
        for _ in 0..10 {
            gate.record(Signal::Failure, false, now);
            assert_eq!(gate.decide(now), Decision::Open);
        }
        assert_eq!(gate.state(), GateState::Normal);
    }

    #[test]
    fn simultaneous_failures_raise_the_level_once_per_window() {
        let mut gate = exponential();
        let now = Instant::now();
        for _ in 0..5 {
            gate.record(Signal::Failure, false, now);
        }
        assert_eq!(gate.level(), 1);
    }

    #[test]
    fn the_level_stops_growing_at_the_policys_cap() {
        let policy = Exponential::new(Duration::from_secs(1), Duration::from_secs(4))
            .jitter(0.0)
            .max_retries(3);
        let mut gate = BackoffGate::new(Arc::new(policy));
        let mut now = Instant::now();
        gate.record(Signal::Failure, false, now);
        for _ in 0..10 {
            now += Duration::from_secs(10);
            assert_eq!(gate.decide(now), Decision::Probe);
            gate.record(Signal::Failure, true, now);
        }
        assert_eq!(gate.level(), 3);
        // Three successful probes lead back to normal, not thirty.
        for _ in 0..3 {
            now += Duration::from_secs(10);
            assert_eq!(gate.decide(now), Decision::Probe);
            gate.record(Signal::Success, true, now);
        }
        assert_eq!(gate.state(), GateState::Normal);
    }

    #[test]
    fn outcomes_of_other_deliveries_do_not_decide_the_probe() {
        let mut gate = exponential();
        let now = Instant::now();
        gate.record(Signal::Failure, false, now);
        let later = now + Duration::from_secs(2);
        assert_eq!(gate.decide(later), Decision::Probe);
        gate.record(Signal::Failure, false, later);
        gate.record(Signal::Success, false, later);
        assert_eq!(gate.state(), GateState::Probing { in_flight: true });
        assert_eq!(gate.decide(later), Decision::Closed(None));
    }

    #[test]
    fn a_probe_past_its_deadline_reopens_the_gate_into_backoff() {
        let mut gate = exponential();
        let now = Instant::now();
        gate.record(Signal::Failure, false, now);
        let later = now + Duration::from_secs(2);
        assert_eq!(gate.decide(later), Decision::Probe);
        assert_eq!(
            gate.decide(later),
            Decision::Closed(None),
            "held for the probe"
        );
        gate.probe_timed_out(later);
        assert_eq!(gate.level(), 2, "as a failed probe");
        let after = later + Duration::from_secs(3);
        assert_eq!(gate.decide(after), Decision::Probe, "the next probe");
    }

    #[test]
    fn an_abandoned_probe_lets_the_next_delivery_probe() {
        let mut gate = exponential();
        let now = Instant::now();
        gate.record(Signal::Failure, false, now);
        let later = now + Duration::from_secs(2);
        assert_eq!(gate.decide(later), Decision::Probe);
        gate.probe_abandoned();
        assert_eq!(gate.decide(later), Decision::Probe);
    }
}
