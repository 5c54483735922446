//! The one source of randomness of a simulated run: SplitMix64, seeded.
//!
//! Written out here rather than taken from `rand` so that a seed replays the
//! same schedule whatever version of `rand` the workspace resolves to.

use std::time::Duration;

/// A seeded pseudo-random stream (SplitMix64: tiny, fast, well mixed).
#[derive(Clone, Debug)]
pub struct SimRng {
    state: u64,
}

impl SimRng {
    /// The stream of `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.state)
    }

    /// An independent stream for one part of the scenario, so that adding a
    /// draw in one part does not shift every other part.
    pub fn fork(&mut self) -> SimRng {
        SimRng::new(self.next_u64())
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        // Multiply-shift: unbiased enough for scheduling, and branch-free.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }

    /// True with probability `percent` / 100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A duration uniform in `low_ms..=high_ms` milliseconds.
    pub fn millis(&mut self, low_ms: u64, high_ms: u64) -> Duration {
        Duration::from_millis(self.between(low_ms, high_ms))
    }

    /// One of `choices`, uniformly.
    pub fn pick<T: Copy>(&mut self, choices: &[T]) -> T {
        choices[self.below(choices.len() as u64) as usize]
    }
}

/// The SplitMix64 finalizer: also a good 64-bit hash step.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
