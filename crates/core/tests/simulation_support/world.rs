//! One simulated run: the memory broker, the consumers of one group on it,
//! and the driver that plays a [`Scenario`]'s schedule on tokio's paused
//! clock, checking the [`Ledger`] at every step.

use std::fmt;
use std::time::Duration;

use intake_core::consumer::{Consumer, RunError, RunReport};
use intake_core::dead_letter::{DeadLetterLayer, FailurePolicy};
use intake_core::memory::{Faults, MemoryBroker, MemoryDeadLetterSink, Record};
use intake_core::retry::RetryLayer;
use intake_core::{BoxError, Constant, Disabled, HandlerError, Message};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;
use tower::timeout::TimeoutLayer;

use super::instruments::{Group, Recorded, RecordedAcker, RecordedSource, SharedLedger, id_of};
use super::ledger::{InstanceId, Ledger, Stats};
use super::rng::mix;
use super::scenario::{ConsumerPlan, Event, HORIZON, MAX_CONSUMERS, Scenario};
use super::seeded_backoff::SeededBackoff;

const TOPIC: &str = "simulated";
const GROUP: &str = "simulation";

/// How often the driver looks at the group's committed offsets between
/// events.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(25);

/// How long the drain may take (virtual time) before the run counts as
/// stalled.
const DRAIN_LIMIT: Duration = Duration::from_secs(600);

/// What a seed that kept the contract did.
#[derive(Clone, Copy, Debug)]
pub struct SeedOutcome {
    pub stats: Stats,
    /// Folds every recorded event: a replay of the seed must match it.
    pub fingerprint: u64,
}

/// A seed that broke the contract (or could not run).
#[derive(Debug)]
pub struct SeedFailure {
    pub seed: u64,
    pub problems: Vec<String>,
    pub scenario: String,
}

impl fmt::Display for SeedFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "seed {} broke the contract:", self.seed)?;
        for problem in &self.problems {
            writeln!(f, "  - {problem}")?;
        }
        writeln!(f, "{}", self.scenario)?;
        write!(
            f,
            "replay: INTAKE_SIM_SEED={} cargo test -p intake-core --test simulation -- --nocapture \
             (RUST_LOG=debug for the runtime's logs)",
            self.seed
        )
    }
}

/// Plays the scenario of `seed` on a fresh current-thread runtime whose
/// clock is paused: time moves only when every task waits, straight to the
/// next timer, so a run is as fast as its CPU work and replays exactly.
pub fn run_seed(seed: u64) -> Result<SeedOutcome, SeedFailure> {
    let scenario = Scenario::from_seed(seed);
    let fail = |problems: Vec<String>| SeedFailure {
        seed,
        problems,
        scenario: scenario.to_string(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .map_err(|error| fail(vec![format!("no runtime: {error}")]))?;
    runtime.block_on(async {
        let world = World::new(&scenario).map_err(|problem| fail(vec![problem]))?;
        world.run().await.map_err(fail)
    })
}

/// A consumer of the run.
struct Live {
    instance: InstanceId,
    shutdown: CancellationToken,
    task: JoinHandle<Result<RunReport, RunError>>,
    /// Shutting down gracefully (no longer counted as running).
    stopping: bool,
    /// When a stopping consumer is killed if it is still draining.
    kill_at: Option<Instant>,
    may_fail_fetching: bool,
}

struct World<'a> {
    scenario: &'a Scenario,
    broker: MemoryBroker,
    group: Group,
    faults: Faults,
    sink: MemoryDeadLetterSink,
    ledger: SharedLedger,
    live: Vec<Live>,
    produced: u32,
    start: Instant,
    /// Seeds each consumer's backoff policies in turn.
    jitter_draws: u64,
}

type Step = Result<(), Vec<String>>;

impl<'a> World<'a> {
    fn new(scenario: &'a Scenario) -> Result<Self, String> {
        let broker = MemoryBroker::builder()
            .rebalance_timeout(scenario.rebalance_timeout)
            .assignment(scenario.assignment)
            .build();
        broker
            .create_topic(TOPIC, scenario.partitions)
            .map_err(|error| error.to_string())?;
        let faults = broker
            .faults(TOPIC, GROUP)
            .map_err(|error| error.to_string())?;
        let sink = broker
            .dead_letter_sink(TOPIC, GROUP)
            .map_err(|error| error.to_string())?;
        let ledger = SharedLedger::new(Ledger::new(
            scenario.partitions,
            scenario.keys,
            scenario.messages.clone(),
        ));
        Ok(Self {
            scenario,
            group: Group {
                broker: broker.clone(),
                topic: TOPIC,
                group: GROUP,
            },
            broker,
            faults,
            sink,
            ledger,
            live: Vec::new(),
            produced: 0,
            start: Instant::now(),
            jitter_draws: 0,
        })
    }

    async fn run(mut self) -> Result<SeedOutcome, Vec<String>> {
        self.produce(self.scenario.initial_messages)?;
        for &(at, event) in &self.scenario.events {
            self.advance_until(self.start + at).await?;
            self.apply(event).await?;
        }
        self.advance_until(self.start + HORIZON).await?;
        self.drain().await?;
        self.stop_all().await?;

        let committed = self.group.committed();
        let high_watermarks = self
            .broker
            .high_watermarks(TOPIC)
            .map_err(|error| vec![error.to_string()])?;
        // A letter that stands in for one the sink failed to write carries
        // a reference to the message, not its payload: its id is read from
        // the message at its origin.
        let dead_letter_ids: Vec<u32> = self
            .broker
            .dead_letters(TOPIC, GROUP)
            .map_err(|error| vec![error.to_string()])?
            .iter()
            .map(|letter| match letter.reference {
                None => id_of(&letter.message),
                Some(_) => self.original_id(&letter.message),
            })
            .map(|id| id.unwrap_or(u32::MAX))
            .collect();
        let mut ledger = self.ledger.lock();
        ledger.final_checks(&committed, &high_watermarks, &dead_letter_ids);
        if !ledger.violations().is_empty() {
            return Err(ledger.violations().to_vec());
        }
        Ok(SeedOutcome {
            stats: ledger.stats,
            fingerprint: ledger.fingerprint(),
        })
    }

    /// The id of the message a reference letter stands for, read at its
    /// origin in the topic.
    fn original_id(&self, reference: &Message) -> Option<u32> {
        let metadata = reference.metadata();
        let intake_core::Position::Offset(offset) = metadata.position() else {
            return None;
        };
        let messages = self
            .broker
            .messages(TOPIC, metadata.partition(), offset)
            .ok()?;
        id_of(messages.first()?)
    }

    fn produce(&mut self, count: u32) -> Step {
        for _ in 0..count {
            let id = self.produced;
            let record =
                Record::new(id.to_string()).with_key(format!("k{}", self.ledger.lock().key_of(id)));
            let stored = self
                .broker
                .send(TOPIC, record)
                .map_err(|error| vec![format!("producing message {id}: {error}")])?;
            self.ledger
                .lock()
                .produced(id, stored.partition, stored.offset);
            self.produced += 1;
        }
        Ok(())
    }

    async fn apply(&mut self, event: Event) -> Step {
        match event {
            Event::Join(plan) => {
                if self.running() < MAX_CONSUMERS {
                    self.start_consumer(plan)?;
                }
            }
            Event::Crash { pick } => {
                if !self.live.is_empty() {
                    let index = (pick % self.live.len() as u64) as usize;
                    self.kill(index).await?;
                }
            }
            Event::Leave { pick, crash_after } => {
                let running: Vec<usize> = (0..self.live.len())
                    .filter(|&index| !self.live[index].stopping)
                    .collect();
                if !running.is_empty() {
                    let index = running[(pick % running.len() as u64) as usize];
                    let live = &mut self.live[index];
                    live.shutdown.cancel();
                    live.stopping = true;
                    live.kill_at = crash_after.map(|after| Instant::now() + after);
                    self.ledger.lock().stats.leaves += 1;
                }
            }
            Event::Produce { count } => self.produce(count)?,
            Event::FailFetches { count } => self.fault(|faults| faults.fail_next_fetches(count)),
            Event::FailCommits { count } => self.fault(|faults| faults.fail_next_commits(count)),
            Event::FailDeadLetterWrites { count } => {
                self.fault(|faults| faults.fail_next_dead_letter_writes(count));
            }
            Event::DelayCommits(delay) => self.fault(|faults| faults.delay_commits(delay)),
            Event::ClearFaults => self.faults.clear(),
        }
        self.checkpoint()
    }

    fn fault(&mut self, inject: impl FnOnce(&Faults)) {
        inject(&self.faults);
        self.ledger.lock().stats.faults += 1;
    }

    fn running(&self) -> usize {
        self.live.iter().filter(|live| !live.stopping).count()
    }

    fn next_seed(&mut self) -> u64 {
        self.jitter_draws += 1;
        mix(self.scenario.jitter_seed ^ self.jitter_draws)
    }

    /// Joins the group with a consumer built from `plan`, run as a task.
    fn start_consumer(&mut self, plan: ConsumerPlan) -> Step {
        let instance = self.ledger.lock().consumer_started(plan);
        let (source, acker) = self
            .broker
            .consumer(TOPIC, GROUP)
            .map_err(|error| vec![format!("joining the group: {error}")])?;
        let source = RecordedSource {
            inner: source,
            instance,
            ledger: self.ledger.clone(),
            group: self.group.clone(),
        };
        let acker = RecordedAcker {
            inner: acker,
            instance,
            ledger: self.ledger.clone(),
            group: self.group.clone(),
        };
        let (retry_seed, write_seed, backoff_seed) =
            (self.next_seed(), self.next_seed(), self.next_seed());
        let application = application(self.ledger.clone());
        let handler = ServiceBuilder::new()
            .layer(DeadLetterLayer::with_policy(
                FailurePolicy::dead_letter(self.sink.clone()).write_backoff(SeededBackoff::new(
                    Duration::from_millis(1),
                    Duration::from_millis(20),
                    Some(2),
                    write_seed,
                )),
            ))
            .layer(RetryLayer::new(SeededBackoff::new(
                Duration::from_millis(1),
                Duration::from_millis(50),
                Some(plan.retries),
                retry_seed,
            )))
            .option_layer(plan.attempt_timeout.map(TimeoutLayer::new))
            .service(application);
        let handler = Recorded {
            inner: handler,
            instance,
            ledger: self.ledger.clone(),
        };
        let reconnect = match plan.reconnect_retries {
            Some(retries) => Constant::new(plan.reconnect).max_retries(retries),
            None => Constant::new(plan.reconnect).retry_forever(),
        };
        let builder = Consumer::builder()
            .max_in_flight(plan.max_in_flight)
            .ordering(plan.ordering)
            .commit_interval(plan.commit_interval)
            .commit_batch(plan.commit_batch)
            .fetch_batch(plan.fetch_batch)
            .max_uncommitted(plan.max_uncommitted)
            .shutdown_deadline(plan.shutdown_deadline)
            .revoke_timeout(plan.revoke_timeout)
            .reconnect_backoff(reconnect);
        let builder = match plan.backoff {
            None => builder.backoff(Disabled),
            Some((min, max)) => builder.backoff(SeededBackoff::new(min, max, None, backoff_seed)),
        };
        let consumer = builder
            .build(source, acker, handler)
            .map_err(|error| vec![format!("consumer settings {plan:?} refused: {error}")])?;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(consumer.run(shutdown.clone()));
        self.live.push(Live {
            instance,
            shutdown,
            task,
            stopping: false,
            kill_at: None,
            may_fail_fetching: plan.reconnect_retries.is_some(),
        });
        Ok(())
    }

    /// Drops the run future of `live[index]`: a crash.
    async fn kill(&mut self, index: usize) -> Step {
        let live = self.live.remove(index);
        live.task.abort();
        let instance = live.instance;
        let may_fail = live.may_fail_fetching;
        match live.task.await {
            Err(error) if error.is_cancelled() => {
                self.ledger.lock().consumer_gone(instance, true);
                Ok(())
            }
            other => self.ended(instance, may_fail, other),
        }
    }

    /// Records how a consumer's run ended on its own.
    fn ended(
        &mut self,
        instance: InstanceId,
        may_fail_fetching: bool,
        result: Result<Result<RunReport, RunError>, tokio::task::JoinError>,
    ) -> Step {
        let mut ledger = self.ledger.lock();
        ledger.consumer_gone(instance, false);
        match result {
            Ok(Ok(_report)) => {}
            Ok(Err(RunError::Source { .. })) if may_fail_fetching => {}
            Ok(Err(error)) => {
                ledger.violation(format!("consumer {instance}'s run failed: {error}"));
            }
            Err(error) => {
                let panic = error.try_into_panic().map_or_else(
                    |_| "cancelled".to_owned(),
                    |payload| {
                        payload
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                            .unwrap_or_else(|| "a non-text panic".to_owned())
                    },
                );
                ledger.violation(format!("consumer {instance} panicked: {panic}"));
            }
        }
        Ok(())
    }

    /// Collects consumers whose run ended, and kills the stopping ones whose
    /// time is up.
    async fn reap(&mut self) -> Step {
        let now = Instant::now();
        let mut index = 0;
        while index < self.live.len() {
            let live = &self.live[index];
            if live.task.is_finished() {
                let live = self.live.remove(index);
                let result = live.task.await;
                self.ended(live.instance, live.may_fail_fetching, result)?;
            } else if live.kill_at.is_some_and(|at| at <= now) {
                self.kill(index).await?;
            } else {
                index += 1;
            }
        }
        Ok(())
    }

    /// Looks at the committed offsets and stops at the first violation.
    fn checkpoint(&mut self) -> Step {
        let committed = self.group.committed();
        let mut ledger = self.ledger.lock();
        ledger.observe_committed(&committed, "at a checkpoint");
        if ledger.violations().is_empty() {
            Ok(())
        } else {
            Err(ledger.violations().to_vec())
        }
    }

    async fn advance_until(&mut self, until: Instant) -> Step {
        loop {
            self.reap().await?;
            self.checkpoint()?;
            let now = Instant::now();
            if now >= until {
                return Ok(());
            }
            let mut wake = until.min(now + CHECKPOINT_EVERY);
            for at in self.live.iter().filter_map(|live| live.kill_at) {
                wake = wake.min(at);
            }
            tokio::time::sleep_until(wake).await;
        }
    }

    /// Ends the faults and runs until every message is handled and
    /// committed, starting a consumer whenever none is running.
    async fn drain(&mut self) -> Step {
        self.faults.clear();
        let limit = Instant::now() + DRAIN_LIMIT;
        loop {
            self.reap().await?;
            self.checkpoint()?;
            if self.running() == 0 {
                self.start_consumer(self.scenario.finisher)?;
            }
            let lag = self
                .broker
                .lag(TOPIC, GROUP)
                .map_err(|error| vec![error.to_string()])?;
            let unfinished = self.ledger.lock().unfinished();
            if unfinished == 0 && lag == 0 {
                return Ok(());
            }
            if Instant::now() >= limit {
                return Err(vec![format!(
                    "stalled: after {DRAIN_LIMIT:?} of draining, {unfinished} message(s) are \
                     unfinished and the lag is {lag}: {}",
                    self.ledger.lock().open_work()
                )]);
            }
            tokio::time::sleep(CHECKPOINT_EVERY * 2).await;
        }
    }

    /// Shuts every consumer down gracefully; a shutdown must end.
    async fn stop_all(&mut self) -> Step {
        for live in &self.live {
            live.shutdown.cancel();
        }
        for live in std::mem::take(&mut self.live) {
            let bound = Duration::from_secs(120);
            match tokio::time::timeout(bound, live.task).await {
                Ok(result) => self.ended(live.instance, live.may_fail_fetching, result)?,
                Err(_) => {
                    return Err(vec![format!(
                        "consumer {}'s graceful shutdown did not end within {bound:?}",
                        live.instance
                    )]);
                }
            }
        }
        self.checkpoint()
    }
}

/// The application: does what the message's plan says, counting calls.
///
/// Its errors are boxed `HandlerError`s, the error type `tower::timeout`
/// shares when it wraps it (the retry layer takes the class back out).
fn application(
    ledger: SharedLedger,
) -> impl tower::Service<Message, Response = (), Error = BoxError, Future: Send> + Clone + Send {
    tower::service_fn(move |message: Message| {
        let planned = id_of(&message).and_then(|id| ledger.lock().application_call(id));
        async move {
            let Some((plan, calls)) = planned else {
                return Err(HandlerError::permanent("the payload is not a message id").into());
            };
            if !plan.work.is_zero() {
                tokio::time::sleep(plan.work).await;
            }
            if plan.poison {
                return Err(HandlerError::permanent("poison message").into());
            }
            if calls < plan.failures {
                return Err(HandlerError::retryable("planned failure").into());
            }
            Ok(())
        }
    })
}
