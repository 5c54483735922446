//! Deterministic simulation of consumers on the memory broker: see
//! `tests/simulation.rs`.

mod instruments;
mod ledger;
mod rng;
mod scenario;
mod seeded_backoff;
mod world;

pub use ledger::Stats;
pub use world::{SeedFailure, SeedOutcome, run_seed};
