//! Deterministic simulation of the consumer runtime on the memory broker.
//!
//! Each seed draws a scenario (topic, handler behaviour per message,
//! consumer settings, and a schedule of crashes, rebalances, and fetch,
//! commit and dead-letter faults) and plays it on tokio's paused clock over
//! the real runtime, commit engine, retry and dead-letter layers. Every seed
//! must keep the contract of docs/CONTRACT.md (§1–§8):
//!
//! - nothing is lost: every produced message is handled or dead-lettered,
//!   and in the end everything is committed;
//! - a committed offset never passes a message that was never finished, and
//!   no consumer hands its acker a watermark past a handler still running;
//! - duplicates stay within the bound derived in RELIABILITY.md;
//! - ordering, the in-flight budget and partition ownership hold.
//!
//! `INTAKE_SIM_SEEDS=N` runs seeds `0..N` (default 1,000; from
//! `INTAKE_SIM_FIRST_SEED`), `INTAKE_SIM_SEED=S` replays one seed. A
//! failure prints its seed, its scenario and the command that replays it.

mod simulation_support;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use simulation_support::{SeedFailure, SeedOutcome, Stats, run_seed};

/// Seeds run by default (the CI run).
const DEFAULT_SEEDS: u64 = 1_000;

/// A seed that runs this long on the wall clock is reported as hung: with a
/// paused clock only a busy loop can take that long.
const HUNG_AFTER: Duration = Duration::from_secs(60);

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    match value.trim().parse() {
        Ok(parsed) => Some(parsed),
        Err(_) => panic!("{name}={value:?} is not a number"),
    }
}

/// The seeds to run: one replayed seed, or a range.
fn seeds() -> std::ops::Range<u64> {
    if let Some(seed) = env_u64("INTAKE_SIM_SEED") {
        return seed..seed + 1;
    }
    let first = env_u64("INTAKE_SIM_FIRST_SEED").unwrap_or(0);
    first..first + env_u64("INTAKE_SIM_SEEDS").unwrap_or(DEFAULT_SEEDS)
}

/// Totals over many seeds.
#[derive(Debug, Default)]
struct Summary {
    seeds: u64,
    totals: Stats,
    most_duplicates: (u64, u64),
    longest_virtual: (u64, u64),
}

impl Summary {
    fn add(&mut self, seed: u64, outcome: &SeedOutcome) {
        let stats = &outcome.stats;
        let totals = &mut self.totals;
        self.seeds += 1;
        totals.messages += stats.messages;
        totals.consumers += stats.consumers;
        totals.crashes += stats.crashes;
        totals.leaves += stats.leaves;
        totals.faults += stats.faults;
        totals.assignments += stats.assignments;
        totals.handler_calls += stats.handler_calls;
        totals.handler_failures += stats.handler_failures;
        totals.dead_lettered += stats.dead_lettered;
        totals.duplicates += stats.duplicates;
        totals.duplicate_bound += stats.duplicate_bound;
        totals.commits += stats.commits;
        totals.refused_commits += stats.refused_commits;
        totals.virtual_millis += stats.virtual_millis;
        if stats.most_duplicates_in_one_assignment.0 > totals.most_duplicates_in_one_assignment.0 {
            totals.most_duplicates_in_one_assignment = stats.most_duplicates_in_one_assignment;
        }
        if stats.duplicates > self.most_duplicates.1 {
            self.most_duplicates = (seed, stats.duplicates);
        }
        if stats.virtual_millis > self.longest_virtual.1 {
            self.longest_virtual = (seed, stats.virtual_millis);
        }
    }
}

/// Runs `seeds` on up to two threads (each seed on its own runtime), stops
/// at the first failures, and watches for a seed that hangs.
fn run_seeds(seeds: std::ops::Range<u64>) -> (Summary, Vec<SeedFailure>) {
    let next = AtomicU64::new(seeds.start);
    let stop = AtomicBool::new(false);
    let summary = Mutex::new(Summary::default());
    let failures = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .clamp(1, 2);
    // What each worker runs, and since when: a seed still running long
    // after its start hangs (a busy loop never lets the paused clock move,
    // so no in-run timeout can catch it).
    let current: Mutex<Vec<Option<(u64, Instant)>>> = Mutex::new(vec![None; workers]);
    let finished_workers = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for worker in 0..workers {
            let (next, stop, summary, failures, current, finished_workers) = (
                &next,
                &stop,
                &summary,
                &failures,
                &current,
                &finished_workers,
            );
            scope.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= seeds.end {
                        break;
                    }
                    current.lock().expect("current")[worker] = Some((seed, Instant::now()));
                    let result = run_seed(seed);
                    current.lock().expect("current")[worker] = None;
                    match result {
                        Ok(outcome) => summary.lock().expect("summary").add(seed, &outcome),
                        Err(failure) => {
                            let mut failures = failures.lock().expect("failures");
                            failures.push(failure);
                            if failures.len() >= 3 {
                                stop.store(true, Ordering::Relaxed);
                            }
                        }
                    }
                }
                finished_workers.fetch_add(1, Ordering::Release);
            });
        }
        scope.spawn(|| {
            while finished_workers.load(Ordering::Acquire) < workers as u64 {
                std::thread::sleep(Duration::from_millis(200));
                let hung = current
                    .lock()
                    .expect("current")
                    .iter()
                    .flatten()
                    .find(|(_, at)| at.elapsed() > HUNG_AFTER)
                    .copied();
                if let Some((seed, _)) = hung {
                    eprintln!(
                        "seed {seed} has run for over {HUNG_AFTER:?}: it hangs. Replay: \
                         INTAKE_SIM_SEED={seed} cargo test -p intake-core --test simulation"
                    );
                    std::process::exit(101);
                }
            }
        });
    });
    (
        summary.into_inner().expect("summary"),
        failures.into_inner().expect("failures"),
    )
}

fn init_logs() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

#[test]
fn every_seed_keeps_the_contract_under_crashes_rebalances_and_faults() {
    init_logs();
    let seeds = seeds();
    let started = Instant::now();
    let (summary, failures) = run_seeds(seeds.clone());
    let totals = &summary.totals;
    println!(
        "simulation: {} seed(s) from {} in {:.1?}: {} messages, {} consumers, {} crashes, \
         {} graceful leaves, {} faults, {} assignments, {} handler calls ({} failed), \
         {} dead-lettered, {} commits ({} failed or refused); duplicates {} (bound {}), \
         most in one seed {} (seed {}), most after one handover {} (its bound {}); \
         longest run {} ms virtual (seed {})",
        summary.seeds,
        seeds.start,
        started.elapsed(),
        totals.messages,
        totals.consumers,
        totals.crashes,
        totals.leaves,
        totals.faults,
        totals.assignments,
        totals.handler_calls,
        totals.handler_failures,
        totals.dead_lettered,
        totals.commits,
        totals.refused_commits,
        totals.duplicates,
        totals.duplicate_bound,
        summary.most_duplicates.1,
        summary.most_duplicates.0,
        totals.most_duplicates_in_one_assignment.0,
        totals.most_duplicates_in_one_assignment.1,
        summary.longest_virtual.1,
        summary.longest_virtual.0,
    );
    if !failures.is_empty() {
        let report: Vec<String> = failures.iter().map(ToString::to_string).collect();
        panic!("{}", report.join("\n\n"));
    }
}

#[test]
fn a_seed_replays_exactly() {
    for seed in [1, 7, 42, 1_000_003] {
        let first = run_seed(seed).unwrap_or_else(|failure| panic!("{failure}"));
        let again = run_seed(seed).unwrap_or_else(|failure| panic!("{failure}"));
        assert_eq!(
            first.fingerprint, again.fingerprint,
            "seed {seed} did not replay to the same trace"
        );
        assert_eq!(first.stats.duplicates, again.stats.duplicates);
    }
}
