//! Backoff with jitter drawn from the seed.
//!
//! The built-in [`Exponential`](intake_core::Exponential) jitters with
//! `rand::random`; a replay needs the same delays, so every policy of a
//! simulated run is this one: the same schedule, with jitter from a counter
//! mixed with the seed. The runtime's calls happen in a deterministic order,
//! so the n-th delay of a run is the same on every replay.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use intake_core::BackoffPolicy;

use super::rng::mix;

/// Delays from `min` doubling to `max`, ±50 % jitter from the seed, at most
/// `max_retries` retries (`None`: forever).
/// Clones share the draw counter, as the retry layer's clones of one
/// policy must.
#[derive(Clone, Debug)]
pub struct SeededBackoff {
    min: Duration,
    max: Duration,
    max_retries: Option<u32>,
    seed: u64,
    draws: Arc<AtomicU64>,
}

impl SeededBackoff {
    pub fn new(min: Duration, max: Duration, max_retries: Option<u32>, seed: u64) -> Self {
        Self {
            min,
            max,
            max_retries,
            seed,
            draws: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl BackoffPolicy for SeededBackoff {
    fn delay(&self, retry: u32) -> Option<Duration> {
        if self.max_retries.is_some_and(|cap| retry > cap) {
            return None;
        }
        let doublings = retry.saturating_sub(1).min(20);
        let base = self.min.saturating_mul(1 << doublings).min(self.max);
        let draw = mix(self.seed ^ self.draws.fetch_add(1, Ordering::Relaxed));
        // A factor in [0.5, 1.5).
        let factor = 0.5 + (draw >> 11) as f64 / (1u64 << 53) as f64;
        Some(base.mul_f64(factor).min(self.max))
    }
}
