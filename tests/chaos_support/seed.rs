//! Seeded randomness for the moments of kills and faults.
//!
//! The seed is fixed unless `INTAKE_CHAOS_SEED` overrides it, and every
//! failure prints it with the command that replays it. The moments are
//! points in the consumers' progress (so many ledger lines), not in time, so
//! a replay kills at the same points on a fast or a slow machine; what the
//! consumer was doing at that point (fetching, committing, retrying) still
//! depends on timing.

/// The seed when `INTAKE_CHAOS_SEED` is unset.
const DEFAULT_SEED: u64 = 0x1_2024_C4A0_5EED;

/// The suite's seed: `INTAKE_CHAOS_SEED` (decimal, or hex with `0x`), else
/// the default.
pub fn suite_seed() -> u64 {
    match std::env::var("INTAKE_CHAOS_SEED") {
        Ok(text) => {
            let text = text.trim();
            let parsed = match text.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => text.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("INTAKE_CHAOS_SEED={text:?} is not a u64"))
        }
        Err(_) => DEFAULT_SEED,
    }
}

/// SplitMix64: tiny, good enough to spread kill moments, and the same on
/// every platform (no dependency whose algorithm could change under us).
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator for one scenario: the suite's seed mixed with the
    /// scenario's name, so that scenarios running in parallel threads draw
    /// from streams of their own, whatever the order they start in.
    pub fn for_scenario(seed: u64, scenario: &str) -> Self {
        // FNV-1a of the name.
        let name_hash = scenario
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
                (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
            });
        Self {
            state: seed ^ name_hash,
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn fraction(&mut self) -> f64 {
        // The top 53 bits fill an f64's mantissa exactly.
        (self.next_u64() >> 11) as f64 / (1_u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_stay_in_range_and_streams_differ_by_scenario() {
        let mut kills = SplitMix64::for_scenario(1, "kill");
        let mut faults = SplitMix64::for_scenario(1, "fault");
        assert_ne!(kills.next_u64(), faults.next_u64());
        for _ in 0..1000 {
            assert!((0.0..1.0).contains(&kills.fraction()));
        }
    }
}
