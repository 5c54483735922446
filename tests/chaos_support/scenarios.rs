//! The chaos scenarios. Each produces ids `0..N` into a source of its own,
//! runs `ledger consume` children while breaking them (SIGKILL) or their
//! broker (restart, killed connections), lets a last run drain, and then
//! requires every id in the ledger at least once: zero lost. Duplicates are
//! allowed (at-least-once, docs/CONTRACT.md §5 and §9) and counted.
//!
//! Each scenario prints one summary line (`chaos BACKEND SCENARIO: …`)
//! before its assertions, so the figures are there whether it passes or not.

use std::fmt::Display;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::backends::Backend;
use super::child::{ChildProcess, RunCounts};
use super::effects_db::{self, EffectsStats};
use super::ledger_file::{DuplicateCauses, GracefulStop, LedgerStats, Progress, end_torn_line};
use super::ledger_program::{self, Consume, Relay};
use super::own_broker::OwnBroker;
use super::own_nats::OwnServer;
use super::seed::{SplitMix64, suite_seed};
use super::trickle::Trickle;
use intake_core::backend::testkit::skip_or_fail as skip;

/// A consumer that will be killed must not exit first; it never idles this
/// long within a scenario.
const NEVER_IDLE_EXIT: Duration = Duration::from_secs(3600);
/// From a start (or restart, or fault) until the ledger reaches the next
/// moment: a Kafka group join after a kill waits for the dead member's
/// session to expire first.
const PROGRESS_TIMEOUT: Duration = Duration::from_secs(90);
/// A draining consumer must have handled everything and gone idle by then.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(180);
/// The plaintext port of the Kafka broker fault scenario's own broker (it
/// takes the three after it too).
const OWN_KAFKA_PORT: u16 = 19392;
/// The client port of the NATS broker fault scenario's own server.
const OWN_NATS_PORT: u16 = 14392;

/// One scenario's run: names, seeded moments, logs, and the failure message
/// that tells how to replay it.
struct Scenario {
    /// The `#[test]` function, for the replay command.
    test: &'static str,
    backend: Backend,
    name: &'static str,
    seed: u64,
    moments: SplitMix64,
    /// Ledger files and child output; removed when the scenario passes.
    dir: PathBuf,
    source: String,
    group: String,
    /// The `--broker` URL: the backend's shared broker, unless the scenario
    /// runs one of its own.
    url: String,
    started: Instant,
}

impl Scenario {
    fn new(test: &'static str, backend: Backend, name: &'static str) -> Self {
        let seed = suite_seed();
        // Names of their own per run: nothing left over from an earlier run
        // (offsets, pending entries, queued messages) can be mistaken for
        // this one's.
        let stamp = format!(
            "{}-{}",
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| since.as_millis()),
            std::process::id()
        );
        let dir =
            std::env::temp_dir().join(format!("intake-chaos-{}-{name}-{stamp}", backend.name()));
        let scenario = Self {
            test,
            backend,
            name,
            seed,
            moments: SplitMix64::for_scenario(seed, &format!("{}-{name}", backend.name())),
            source: format!("chaos-{}-{name}-{stamp}", backend.name()),
            group: format!("chaos-{}-{name}-{stamp}-group", backend.name()),
            dir,
            url: backend.url(),
            started: Instant::now(),
        };
        let created = fs::create_dir_all(&scenario.dir);
        scenario.check(
            created.map_err(|error| format!("cannot create {}: {error}", scenario.dir.display())),
        );
        scenario
    }

    /// Fails the test with what went wrong, the seed and how to replay it,
    /// and where the logs are (they are kept).
    fn fail(&self, what: impl Display) -> ! {
        panic!(
            "chaos {} {}: {what}\n  source {} group {}\n  seed {:#x}; replay: \
             INTAKE_CHAOS_SEED={:#x} INTAKE_REQUIRE_BROKERS=1 cargo test --all-features --test \
             chaos -- --nocapture --exact {}\n  (the seed fixes the kill moments as points in the \
             progress; what the consumer was doing then still depends on timing)\n  logs and \
             ledgers: {}",
            self.backend.name(),
            self.name,
            self.source,
            self.group,
            self.seed,
            self.seed,
            self.test,
            self.dir.display()
        )
    }

    fn check<T>(&self, result: Result<T, String>) -> T {
        result.unwrap_or_else(|error| self.fail(error))
    }

    fn produce(&self, count: u64) {
        let produced = ledger_program::produce(
            &self.url,
            &self.source,
            count,
            self.backend.partitions(),
            &self.dir,
        );
        self.check(produced);
    }

    fn ledger(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.tsv"))
    }

    fn consume(&self, ledger: &Path, idle_exit: Duration) -> Consume {
        Consume {
            backend: self.backend,
            url: self.url.clone(),
            source: self.source.clone(),
            group: self.group.clone(),
            ledger: ledger.to_path_buf(),
            idle_exit,
            fail_every: None,
            effects_db: None,
            later: None,
            // Every consumer keeps each key's order, so that the ledger
            // shows whether the order held (docs/CONTRACT.md §11).
            key_order: true,
        }
    }

    fn spawn(&self, consume: &Consume, label: &str) -> ChildProcess {
        self.check(consume.spawn(label, &self.dir))
    }

    /// The seeded moment of the `nth` (from 1) of `of` kills or faults, as a
    /// count of distinct ids handled: a uniform point in the `nth` of
    /// `of + 1` equal slices of the backlog. Every kill lands while work
    /// remains, and the last slice is left for the drain, however fast the
    /// machine. (Moments in time would not do: a consumer that handles tens
    /// of thousands of messages a second is done before the fifth kill.)
    fn moment(&mut self, nth: u32, of: u32, messages: u64) -> u64 {
        let slice = messages as f64 / f64::from(of + 1);
        ((f64::from(nth - 1) + self.moments.fraction()) * slice) as u64
    }

    fn read_ledgers(&self, files: &[PathBuf], produced: u64) -> LedgerStats {
        self.check(LedgerStats::read(files, produced))
    }

    fn elapsed_secs(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    /// Zero lost, and nothing in the ledger that was never produced.
    fn assert_nothing_lost(&self, stats: &LedgerStats) {
        if stats.lost() > 0 {
            self.fail(format!(
                "{} of {} ids are in no ledger (lost): {}",
                stats.lost(),
                stats.produced,
                stats.first_missing()
            ));
        }
        if !stats.foreign_ids.is_empty() {
            self.fail(format!(
                "the ledger holds ids that were never produced: {:?}",
                stats.foreign_ids
            ));
        }
    }

    /// Fails unless every key's ids were first handled in ascending order,
    /// where the contract promises it for this backend through what the
    /// scenario does (docs/CONTRACT.md §11).
    fn assert_key_order(&self, stats: &LedgerStats, promised: bool) {
        if promised && stats.key_order.broken_keys > 0 {
            self.fail(format!(
                "{} keys lost their order: an id was first handled after a later id of its key \
                 (key, later id, earlier id): {:?}",
                stats.key_order.broken_keys, stats.key_order.first_breaks
            ));
        }
    }

    /// Cleans up after a passed scenario; `INTAKE_CHAOS_KEEP=1` keeps the
    /// logs and ledgers for a look (their path is printed).
    fn pass(self) {
        self.backend.remove_source(&self.source, &self.dir);
        if std::env::var("INTAKE_CHAOS_KEEP").is_ok_and(|keep| keep == "1") {
            println!(
                "chaos {} {}: kept {}",
                self.backend.name(),
                self.name,
                self.dir.display()
            );
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Whether the scenario `name` runs: all do, unless `INTAKE_CHAOS_ONLY`
/// names some (`INTAKE_CHAOS_ONLY=parking,kill`), to rerun one while
/// working on it.
fn selected(name: &str) -> bool {
    match std::env::var("INTAKE_CHAOS_ONLY") {
        Ok(only) => only.split(',').any(|wanted| wanted.trim() == name),
        Err(_) => true,
    }
}

/// The SIGKILL scenario's parameters.
#[derive(Clone, Copy, Debug)]
pub struct Kills {
    pub messages: u64,
    pub kills: u32,
    /// `--fail-every`: retries in flight when the kills land.
    pub fail_every: Option<u32>,
    /// `--effects-db`: the exactly-once variant (issue 8).
    pub effects_db: bool,
}

/// Produce, then start `ledger consume`, let it handle messages up to a
/// seeded moment, SIGKILL it, restart; `kills` times. Then a last run drains
/// (exit 0, final line) and the ledger must hold every id.
///
/// With `effects_db`, the table of effects must moreover hold every id
/// exactly once although the ledger shows redeliveries.
pub fn sigkill_restarts(test: &'static str, backend: Backend, plan: Kills) {
    let name = if plan.effects_db {
        "effects-db"
    } else {
        "kill"
    };
    if plan.effects_db
        && let Err(why) = effects_db::reachable()
    {
        skip(&format!("{test} ({name})"), &why);
        return;
    }
    if !selected(name) {
        return;
    }
    let mut scenario = Scenario::new(test, backend, name);
    scenario.produce(plan.messages);
    let ledger = scenario.ledger("ledger");
    let mut consume = scenario.consume(&ledger, NEVER_IDLE_EXIT);
    consume.fail_every = plan.fail_every;
    consume.effects_db = plan.effects_db.then(effects_db::url);

    let mut progress = Progress::new(std::slice::from_ref(&ledger), plan.messages);
    let mut killed_at = Vec::new();
    for kill in 1..=plan.kills {
        scenario.check(end_torn_line(&ledger));
        // At least one new id: the run got going before it dies.
        let kill_at = scenario
            .moment(kill, plan.kills, plan.messages)
            .max(progress.distinct() + 1);
        let mut run = scenario.spawn(&consume, &format!("run-{kill}"));
        scenario.check(run.wait_for_progress(&mut progress, kill_at, PROGRESS_TIMEOUT));
        scenario.check(run.sigkill());
        killed_at.push(progress.distinct());
    }

    scenario.check(end_torn_line(&ledger));
    consume.idle_exit = backend.drain_idle_exit();
    let mut last = scenario.spawn(&consume, "drain");
    let counts = scenario.check(last.expect_clean_exit(DRAIN_TIMEOUT));

    let stats = scenario.read_ledgers(std::slice::from_ref(&ledger), plan.messages);
    let effects = plan.effects_db.then(|| {
        let rows = effects_db::rows_per_id(&scenario.group, &scenario.source);
        EffectsStats::from_rows(&scenario.check(rows), plan.messages)
    });
    let mut summary = format!(
        "chaos {} {name}: produced={} kills={} lost={} keys_out_of_order={} \
         duplicate_deliveries={} duplicated_ids={} per_crash={:.1} torn_lines={} fail_every={} \
         last_run=[{}] elapsed={}s seed={:#x}",
        backend.name(),
        plan.messages,
        plan.kills,
        stats.lost(),
        stats.key_order.broken_keys,
        stats.duplicate_deliveries,
        stats.duplicated_ids,
        stats.duplicate_deliveries as f64 / f64::from(plan.kills),
        stats.torn_lines,
        plan.fail_every
            .map_or_else(|| "off".to_owned(), |every| every.to_string()),
        counts_text(counts),
        scenario.elapsed_secs(),
        scenario.seed
    );
    if let Some(effects) = &effects {
        summary.push_str(&format!(
            " effects_rows={} effects_missing={} effects_repeated_ids={}",
            effects.rows, effects.missing_count, effects.repeated_count
        ));
    }
    println!("{summary}");
    println!(
        "chaos {} {name}: distinct ids handled at each kill: {killed_at:?}",
        backend.name()
    );

    scenario.assert_nothing_lost(&stats);
    scenario.assert_key_order(&stats, backend.keeps_key_order_through_kills());
    if let Some(effects) = effects {
        if !effects.exactly_once() {
            scenario.fail(format!(
                "ledger_effects does not hold each id exactly once: {} rows for {} ids; \
                 missing {} (first {:?}), repeated {} (first {:?}), foreign {}",
                effects.rows,
                plan.messages,
                effects.missing_count,
                effects.missing,
                effects.repeated_count,
                effects.repeated,
                effects.foreign
            ));
        }
        if stats.duplicate_deliveries == 0 {
            // Not a failure of the program, but the scenario proved less
            // than it should: no kill caused a redelivery to dedupe.
            println!(
                "chaos {} {name}: note: no redelivery in the ledger, exactly-once was not \
                 exercised",
                backend.name()
            );
        }
    }
    if plan.effects_db {
        effects_db::remove_rows(&scenario.group, &scenario.source);
    }
    scenario.pass();
}

/// One consumer runs while the broker side breaks its connections (Redis,
/// RabbitMQ) or crashes (Kafka: a broker of the scenario's own, SIGKILLed
/// and started again), `faults` times at seeded moments; it must carry on,
/// drain and exit 0 with every id in the ledger.
pub fn broker_faults(test: &'static str, backend: Backend, messages: u64, faults: u32) {
    if !selected(backend.fault_name()) {
        return;
    }
    let mut scenario = Scenario::new(test, backend, backend.fault_name());
    if let Err(why) = backend.fault_available(&scenario.dir) {
        skip(&format!("{test} ({})", backend.fault_name()), &why);
        return;
    }
    // Kafka's fault takes the whole broker down: never the one that every
    // other test shares.
    let own_kafka = matches!(backend, Backend::Kafka(_)).then(|| {
        let broker = scenario.check(
            OwnBroker::start(OWN_KAFKA_PORT)
                .map_err(|error| format!("the scenario's own Kafka broker: {error}")),
        );
        scenario.url = format!("kafka://{}", broker.brokers());
        broker
    });
    // The same for NATS: a server of the scenario's own, crashed and
    // started again on its storage.
    let own_nats = (backend == Backend::Nats).then(|| {
        let server = scenario.check(
            OwnServer::start(OWN_NATS_PORT)
                .map_err(|error| format!("the scenario's own NATS server: {error}")),
        );
        scenario.url = server.url();
        server
    });
    scenario.produce(messages);
    let ledger = scenario.ledger("ledger");
    // Idleness while the broker is away or the consumer reconnects is not
    // the end of the work.
    let consume = scenario.consume(&ledger, backend.outage_idle_exit());
    let mut consumer = scenario.spawn(&consume, "consumer");
    let mut progress = Progress::new(std::slice::from_ref(&ledger), messages);
    let mut done = Vec::new();
    for fault in 1..=faults {
        let fault_at = scenario.moment(fault, faults, messages);
        scenario.check(consumer.wait_for_progress(&mut progress, fault_at, PROGRESS_TIMEOUT));
        let at = progress.distinct();
        let injected = match &own_nats {
            Some(server) => super::backends::crash_nats(server),
            None => backend.inject_fault(consumer.pid(), &scenario.dir, own_kafka.as_ref()),
        };
        done.push(format!("at {at} ids: {}", scenario.check(injected)));
    }
    let counts = scenario.check(consumer.expect_clean_exit(DRAIN_TIMEOUT));

    let stats = scenario.read_ledgers(std::slice::from_ref(&ledger), messages);
    println!(
        "chaos {} {}: produced={messages} faults={faults} lost={} duplicate_deliveries={} \
         duplicated_ids={} per_fault={:.1} run=[{}] elapsed={}s seed={:#x}",
        backend.name(),
        backend.fault_name(),
        stats.lost(),
        stats.duplicate_deliveries,
        stats.duplicated_ids,
        stats.duplicate_deliveries as f64 / f64::from(faults),
        counts_text(counts),
        scenario.elapsed_secs(),
        scenario.seed
    );
    println!(
        "chaos {} {}: faults: {}",
        backend.name(),
        backend.fault_name(),
        done.join("; ")
    );
    scenario.assert_nothing_lost(&stats);
    scenario.pass();
    drop(own_kafka);
    drop(own_nats);
}

/// Two consumers share one group; once both handle messages, one is
/// SIGKILLed. The survivor takes over what the dead one held and drains
/// everything: every id in one of the two ledgers.
pub fn two_consumers_one_killed(test: &'static str, backend: Backend, messages: u64) {
    if !selected("two-consumers") {
        return;
    }
    let mut scenario = Scenario::new(test, backend, "two-consumers");
    scenario.produce(messages);
    // A ledger each: two processes appending to one file could interleave
    // partial lines.
    let survivor_ledger = scenario.ledger("survivor");
    let victim_ledger = scenario.ledger("victim");
    let both = [survivor_ledger.clone(), victim_ledger.clone()];
    // The survivor goes idle only after the group gave it the dead
    // consumer's share.
    let mut survivor = scenario.spawn(
        &scenario.consume(&survivor_ledger, backend.drain_idle_exit()),
        "survivor",
    );
    let mut victim = scenario.spawn(&scenario.consume(&victim_ledger, NEVER_IDLE_EXIT), "victim");
    // The kill lands inside the victim's own share (about half the ids),
    // counted in its own ledger: a moment in the whole backlog could come
    // after the victim finished its partitions (Kafka hands out whole
    // partitions, handled in bursts), leaving nothing to take over.
    let kill_at = (messages as f64 * (0.05 + 0.15 * scenario.moments.fraction())) as u64;
    let mut by_victim = Progress::new(std::slice::from_ref(&victim_ledger), messages);
    scenario.check(victim.wait_for_progress(&mut by_victim, kill_at.max(1), PROGRESS_TIMEOUT));
    scenario.check(survivor.check_running());
    scenario.check(victim.sigkill());
    let survivor_ids_at_kill =
        Progress::new(std::slice::from_ref(&survivor_ledger), messages).distinct();
    // Nobody joins: the group must hand the dead member's share to the
    // survivor alone (Kafka once the dead member's session expires, Redis
    // once its pending entries are idle long enough to claim, RabbitMQ at
    // once).
    let counts = scenario.check(survivor.expect_clean_exit(DRAIN_TIMEOUT));

    let stats = scenario.read_ledgers(&both, messages);
    // The victim's ledger ends where it died.
    let victim_stats = scenario.read_ledgers(std::slice::from_ref(&victim_ledger), messages);
    println!(
        "chaos {} two-consumers: produced={messages} kills=1 lost={} duplicate_deliveries={} \
         duplicated_ids={} victim_ids={} survivor_ids_at_kill={survivor_ids_at_kill} \
         survivor=[{}] elapsed={}s seed={:#x}",
        backend.name(),
        stats.lost(),
        stats.duplicate_deliveries,
        stats.duplicated_ids,
        victim_stats.distinct,
        counts_text(counts),
        scenario.elapsed_secs(),
        scenario.seed
    );
    scenario.assert_nothing_lost(&stats);
    let survivor_ids = Progress::new(std::slice::from_ref(&survivor_ledger), messages).distinct();
    if survivor_ids <= survivor_ids_at_kill {
        scenario.fail(format!(
            "the survivor handled nothing after the kill ({survivor_ids} ids): the victim's share \
             was not taken over"
        ));
    }
    scenario.pass();
}

/// The rolling restart's parameters.
#[derive(Clone, Copy, Debug)]
pub struct Rolling {
    /// Instances in the group at any time.
    pub instances: usize,
    /// Ids a second the producer sends throughout.
    pub per_second: u64,
    /// Distinct ids each new instance must handle (in its own ledger)
    /// before the next one is stopped: it has joined and got work.
    pub progress: u64,
    /// `--fail-every`: retries waiting in backoff when a SIGTERM lands,
    /// work the drain must finish.
    pub fail_every: Option<u32>,
}

/// How long a SIGTERMed instance may take to drain and exit: the ledger's
/// shutdown deadline (10 s) and the Kafka client's close (5 s), plus room
/// on a busy machine. A graceful stop never took close to it.
const GRACEFUL_EXIT_TIMEOUT: Duration = Duration::from_secs(30);

/// A rolling restart as Kubernetes does it: `instances` consumers in one
/// group (one Kafka group, one Redis consumer group, one AMQP queue, one
/// NATS durable consumer) while a producer keeps producing; one at a time,
/// an instance is SIGTERMed, must drain and exit 0, and its replacement
/// must handle messages before the next one goes. Then the producer stops,
/// the group catches up, and every instance is SIGTERMed.
///
/// Nothing may be lost. Duplicates are counted and attributed: those of ids
/// a stopped instance had handled, handled again by another after its
/// SIGTERM, are the handover's (a graceful stop finishes and commits what
/// it started, so the goal is none); the rest come from elsewhere (a
/// rebalance when the replacement joins, one instance handling an id twice).
pub fn rolling_restart(test: &'static str, backend: Backend, plan: Rolling) {
    if !selected("rolling-restart") {
        return;
    }
    let scenario = Scenario::new(test, backend, "rolling-restart");
    // Creates the topic, queue or stream; the trickle fills it.
    scenario.produce(0);
    let mut trickle = Trickle::start(backend, &scenario.url, &scenario.source, plan.per_second);
    // Progress follows ids below this: ten minutes of producing.
    let ids_bound = plan.per_second * 600;

    // One ledger per instance, replacements included: the file says who
    // handled what.
    let consume = |ledger: &Path| Consume {
        fail_every: plan.fail_every,
        ..scenario.consume(ledger, NEVER_IDLE_EXIT)
    };
    let mut ledgers = Vec::new();
    let mut slots = Vec::new();
    for _ in 0..plan.instances {
        let index = ledgers.len();
        let ledger = scenario.ledger(&format!("instance-{}", index + 1));
        let child = scenario.spawn(&consume(&ledger), &format!("instance-{}", index + 1));
        ledgers.push(ledger);
        slots.push((index, child));
    }
    for (index, child) in &mut slots {
        let mut own = Progress::new(&ledgers[*index..=*index], ids_bound);
        scenario.check(child.wait_for_progress(&mut own, plan.progress, PROGRESS_TIMEOUT));
    }

    let mut stops = Vec::new();
    let mut drains = Vec::new();
    let mut takeovers = Vec::new();
    for slot in 0..plan.instances {
        let lengths_at_sigterm = ledgers.iter().map(|file| file_length(file)).collect();
        let stopped = slots[slot].0;
        stops.push(GracefulStop {
            stopped,
            lengths_at_sigterm,
        });
        let sent = Instant::now();
        scenario.check(slots[slot].1.sigterm());
        scenario.check(slots[slot].1.expect_clean_exit(GRACEFUL_EXIT_TIMEOUT));
        drains.push(sent.elapsed());

        let index = ledgers.len();
        let ledger = scenario.ledger(&format!("instance-{}", index + 1));
        let started = Instant::now();
        let mut replacement = scenario.spawn(&consume(&ledger), &format!("instance-{}", index + 1));
        ledgers.push(ledger);
        let mut own = Progress::new(&ledgers[index..=index], ids_bound);
        scenario.check(replacement.wait_for_progress(&mut own, plan.progress, PROGRESS_TIMEOUT));
        takeovers.push(started.elapsed());
        slots[slot] = (index, replacement);
        for (_, child) in &mut slots {
            scenario.check(child.check_running());
        }
        scenario.check(trickle.confirmed().map(drop));
    }

    let produced = scenario.check(trickle.stop());
    // The group catches up: what stopped instances had fetched and not
    // started comes back to the others (at once, or after the claim delay
    // or ack_wait).
    let mut all = Progress::new(&ledgers, produced);
    let (_, first) = &mut slots[0];
    scenario.check(first.wait_for_progress(&mut all, produced, DRAIN_TIMEOUT));
    for (_, child) in &mut slots {
        scenario.check(child.sigterm());
    }
    for (_, child) in &mut slots {
        scenario.check(child.expect_clean_exit(GRACEFUL_EXIT_TIMEOUT));
    }

    let stats = scenario.read_ledgers(&ledgers, produced);
    let causes = scenario.check(DuplicateCauses::attribute(&ledgers, &stops, produced));
    let seconds = |times: &[Duration]| {
        times
            .iter()
            .map(|time| format!("{:.1}", time.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(",")
    };
    println!(
        "chaos {} rolling-restart: produced={produced} instances={} restarts={} lost={} \
         duplicate_deliveries={} duplicated_ids={} handover_duplicates={} per_restart={:.1} \
         by_restart={:?} other_duplicates={} drains_s=[{}] takeovers_s=[{}] elapsed={}s \
         seed={:#x}",
        backend.name(),
        plan.instances,
        stops.len(),
        stats.lost(),
        stats.duplicate_deliveries,
        stats.duplicated_ids,
        causes.handover(),
        causes.handover() as f64 / stops.len() as f64,
        causes.per_stop,
        causes.other,
        seconds(&drains),
        seconds(&takeovers),
        scenario.elapsed_secs(),
        scenario.seed
    );
    scenario.assert_nothing_lost(&stats);
    scenario.pass();
}

/// The length of `file` now (0 if it does not exist yet).
fn file_length(file: &Path) -> u64 {
    fs::metadata(file).map_or(0, |metadata| metadata.len())
}

fn counts_text(counts: RunCounts) -> String {
    format!(
        "processed={} retried={} dead_lettered={}",
        counts.processed, counts.retried, counts.dead_lettered
    )
}

/// What both relay scenarios run: the destination, the relay to it (not
/// started), and `ledger consume` reading the destination into `ledger`.
struct RelayRig {
    to: String,
    relay: Relay,
    ledger: PathBuf,
    reader: ChildProcess,
}

impl RelayRig {
    fn start(scenario: &mut Scenario, exactly_once: bool) -> Self {
        let to = format!("{}-relayed", scenario.source);
        // Creates the destination (an empty produce), so that its reader
        // can start before the first relay.
        scenario.check(ledger_program::produce(
            &scenario.url,
            &to,
            0,
            scenario.backend.partitions(),
            &scenario.dir,
        ));
        let relay = Relay {
            backend: scenario.backend,
            url: scenario.url.clone(),
            source: scenario.source.clone(),
            group: scenario.group.clone(),
            to: to.clone(),
            idle_exit: NEVER_IDLE_EXIT,
            exactly_once,
        };
        let ledger = scenario.ledger("relayed");
        let mut read = scenario.consume(&ledger, NEVER_IDLE_EXIT);
        read.source.clone_from(&to);
        read.group = format!("{}-reader", scenario.group);
        let reader = scenario.spawn(&read, "reader");
        Self {
            to,
            relay,
            ledger,
            reader,
        }
    }
}

/// Starts `relay` `kills` times and SIGKILLs it at seeded moments of the
/// reader's progress; returns the distinct ids read at each kill.
fn kill_relays(
    scenario: &mut Scenario,
    relay: &Relay,
    progress: &mut Progress,
    messages: u64,
    kills: u32,
) -> Vec<u64> {
    let mut killed_at = Vec::new();
    for kill in 1..=kills {
        let kill_at = scenario
            .moment(kill, kills, messages)
            .max(progress.distinct() + 1);
        let mut run = scenario.check(relay.spawn(&format!("relay-{kill}"), &scenario.dir));
        scenario.check(run.wait_for_progress(progress, kill_at, PROGRESS_TIMEOUT));
        scenario.check(run.sigkill());
        killed_at.push(progress.distinct());
    }
    killed_at
}

/// Produce, then run `ledger relay` from the scenario's source to a second
/// one while `ledger consume` reads the second into the ledger; SIGKILL the
/// relay at seeded moments of that ledger's progress, `kills` times, then
/// let a last relay drain and the reader read everything. Every id must reach the second
/// source at least once: an input is acknowledged only after its output
/// was confirmed, so a kill between the two repeats an output and loses
/// none.
pub fn relay_kills(test: &'static str, backend: Backend, messages: u64, kills: u32) {
    if !selected("relay-kill") {
        return;
    }
    let mut scenario = Scenario::new(test, backend, "relay-kill");
    scenario.produce(messages);
    let RelayRig {
        to,
        mut relay,
        ledger,
        mut reader,
    } = RelayRig::start(&mut scenario, false);

    let mut progress = Progress::new(std::slice::from_ref(&ledger), messages);
    let killed_at = kill_relays(&mut scenario, &relay, &mut progress, messages, kills);
    relay.idle_exit = backend.drain_idle_exit();
    let mut last = scenario.check(relay.spawn("relay-drain", &scenario.dir));
    let relayed = scenario.check(last.expect_clean_exit(DRAIN_TIMEOUT));
    // Everything is relayed and confirmed: the reader gets all of it, then
    // stops gracefully.
    scenario.check(reader.wait_for_progress(&mut progress, messages, DRAIN_TIMEOUT));
    scenario.check(reader.sigterm());
    let counts = scenario.check(reader.expect_clean_exit(DRAIN_TIMEOUT));

    let stats = scenario.read_ledgers(std::slice::from_ref(&ledger), messages);
    println!(
        "chaos {} relay-kill: produced={messages} kills={kills} lost={} keys_out_of_order={} \
         duplicate_outputs={} duplicated_ids={} last_relay=[{}] reader=[{}] elapsed={}s \
         seed={:#x}",
        backend.name(),
        stats.lost(),
        stats.key_order.broken_keys,
        stats.duplicate_deliveries,
        stats.duplicated_ids,
        counts_text(relayed),
        counts_text(counts),
        scenario.elapsed_secs(),
        scenario.seed
    );
    println!(
        "chaos {} relay-kill: distinct ids relayed at each kill: {killed_at:?}",
        backend.name()
    );
    scenario.assert_nothing_lost(&stats);
    scenario.assert_key_order(&stats, backend.keeps_key_order_through_kills());
    backend.remove_source(&to, &scenario.dir);
    scenario.pass();
}

/// [`relay_kills`] with `ledger relay --exactly-once` on Kafka: the relay
/// commits its offsets in the transactions that hold its outputs, and the
/// reader (`ledger consume`, `read_committed`) must see every id EXACTLY
/// once. A killed relay's open transaction is aborted when the next one
/// starts (the same transactional.id), so its outputs never reach the
/// reader, and the inputs it did not commit are relayed again.
///
/// The ids trickle in at `per_second` until `messages` are confirmed: a
/// relay commits a whole backlog in a transaction or two, so a backlog
/// produced up front would be relayed before the first kill.
pub fn relay_kills_exactly_once(
    test: &'static str,
    backend: Backend,
    messages: u64,
    per_second: u64,
    kills: u32,
) {
    if !selected("relay-kill-exactly-once") {
        return;
    }
    let mut scenario = Scenario::new(test, backend, "relay-kill-exactly-once");
    // Creates the source (an empty produce), so that the trickle can start
    // before the first relay.
    scenario.produce(0);
    let RelayRig {
        to,
        mut relay,
        ledger,
        mut reader,
    } = RelayRig::start(&mut scenario, true);
    let mut trickle = Trickle::start(backend, &scenario.url, &scenario.source, per_second);
    // Progress follows ids below this: far more than the trickle sends.
    let ids_bound = messages * 10;

    let mut progress = Progress::new(std::slice::from_ref(&ledger), ids_bound);
    let killed_at = kill_relays(&mut scenario, &relay, &mut progress, messages, kills);
    relay.idle_exit = backend.drain_idle_exit();
    let mut last = scenario.check(relay.spawn("relay-drain", &scenario.dir));
    while scenario.check(trickle.confirmed()) < messages {
        std::thread::sleep(Duration::from_millis(50));
    }
    let produced = scenario.check(trickle.stop());
    let relayed = scenario.check(last.expect_clean_exit(DRAIN_TIMEOUT));
    scenario.check(reader.wait_for_progress(&mut progress, produced, DRAIN_TIMEOUT));
    scenario.check(reader.sigterm());
    let counts = scenario.check(reader.expect_clean_exit(DRAIN_TIMEOUT));

    let stats = scenario.read_ledgers(std::slice::from_ref(&ledger), produced);
    println!(
        "chaos {} relay-kill-exactly-once: produced={produced} kills={kills} lost={} \
         duplicate_outputs={} duplicated_ids={} last_relay=[{}] reader=[{}] elapsed={}s seed={:#x}",
        backend.name(),
        stats.lost(),
        stats.duplicate_deliveries,
        stats.duplicated_ids,
        counts_text(relayed),
        counts_text(counts),
        scenario.elapsed_secs(),
        scenario.seed
    );
    println!(
        "chaos {} relay-kill-exactly-once: distinct ids relayed at each kill: {killed_at:?}",
        backend.name()
    );
    scenario.assert_nothing_lost(&stats);
    if stats.duplicate_deliveries > 0 {
        scenario.fail(format!(
            "{} outputs read more than once ({} ids): the read_committed output must hold each id exactly once",
            stats.duplicate_deliveries, stats.duplicated_ids
        ));
    }
    backend.remove_source(&to, &scenario.dir);
    scenario.pass();
}

/// The parking scenario's parameters (issue 18).
#[derive(Clone, Copy, Debug)]
pub struct Parking {
    pub messages: u64,
    pub kills: u32,
    /// `--later-every`: every K-th first attempt is parked.
    pub later_every: u32,
    /// `--later-secs`: how long each is parked.
    pub later: Duration,
}

/// `ledger consume --later-every K` parks every K-th first attempt through
/// the backend's own mechanism while it is SIGKILLed `kills` times at
/// seeded moments, with messages parked; a last run drains. No id may be
/// lost, and no parked copy may run before its due time (the fourth field
/// of its line; NATS hands the original back, which carries no due time,
/// so there the check is that none is lost).
pub fn parking_kills(test: &'static str, backend: Backend, plan: Parking) {
    let name = "parking";
    if !selected(name) {
        return;
    }
    let mut scenario = Scenario::new(test, backend, name);
    scenario.produce(plan.messages);
    let ledger = scenario.ledger("ledger");
    let mut consume = scenario.consume(&ledger, NEVER_IDLE_EXIT);
    consume.later = Some((plan.later_every, plan.later));
    // Parked copies are the same messages: their effects apply once
    // (issue 25: 48 of 20,000 ids twice on Redis, 863 on Kafka, before a
    // copy kept its first delivery's identity).
    let effects_db = match effects_db::reachable() {
        Ok(()) => true,
        Err(why) => {
            skip(&format!("{test} ({name}, exactly-once effects)"), &why);
            false
        }
    };
    consume.effects_db = effects_db.then(effects_db::url);

    let mut progress = Progress::new(std::slice::from_ref(&ledger), plan.messages);
    for kill in 1..=plan.kills {
        scenario.check(end_torn_line(&ledger));
        let kill_at = scenario
            .moment(kill, plan.kills, plan.messages)
            .max(progress.distinct() + 1);
        let mut run = scenario.spawn(&consume, &format!("run-{kill}"));
        scenario.check(run.wait_for_progress(&mut progress, kill_at, PROGRESS_TIMEOUT));
        scenario.check(run.sigkill());
    }
    scenario.check(end_torn_line(&ledger));
    // What the killed runs parked comes back up to `later` after the kill:
    // the last run waits for it.
    consume.idle_exit = backend
        .drain_idle_exit()
        .max(plan.later + Duration::from_secs(4));
    let mut last = scenario.spawn(&consume, "drain");
    let counts = scenario.check(last.expect_clean_exit(DRAIN_TIMEOUT));

    let stats = scenario.read_ledgers(std::slice::from_ref(&ledger), plan.messages);
    let effects = effects_db.then(|| {
        let rows = effects_db::rows_per_id(&scenario.group, &scenario.source);
        EffectsStats::from_rows(&scenario.check(rows), plan.messages)
    });
    println!(
        "chaos {} {name}: produced={} kills={} lost={} parked_lines={} early={} \
         duplicate_deliveries={} keys_out_of_order={} effects_rows={} effects_repeated_ids={} \
         later_every={} later={:?} last_run=[{}] elapsed={}s seed={:#x}",
        backend.name(),
        plan.messages,
        plan.kills,
        stats.lost(),
        stats.parked_lines,
        stats.early.len(),
        stats.duplicate_deliveries,
        stats.key_order.broken_keys,
        effects.as_ref().map_or(0, |effects| effects.rows),
        effects.as_ref().map_or(0, |effects| effects.repeated_count),
        plan.later_every,
        plan.later,
        counts_text(counts),
        scenario.elapsed_secs(),
        scenario.seed
    );
    scenario.assert_nothing_lost(&stats);
    if let Some(effects) = effects
        && !effects.exactly_once()
    {
        scenario.fail(format!(
            "parking broke exactly-once effects: {} rows for {} ids; missing {} (first {:?}), \
             repeated {} (first {:?}), foreign {}",
            effects.rows,
            plan.messages,
            effects.missing_count,
            effects.missing,
            effects.repeated_count,
            effects.repeated,
            effects.foreign
        ));
    }
    if effects_db {
        effects_db::remove_rows(&scenario.group, &scenario.source);
    }
    if !stats.early.is_empty() {
        scenario.fail(format!(
            "parked copies ran before their due time (id, ms early): {:?}",
            stats.early
        ));
    }
    if backend != Backend::Nats && stats.parked_lines == 0 {
        scenario.fail("no parked copy came back: nothing was parked".to_owned());
    }
    scenario.pass();
}
