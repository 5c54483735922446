//! A scenario drawn from a seed: the topic, what each message's handler
//! does, the consumers' settings, and the schedule of crashes, rebalances and
//! faults.

use std::fmt;
use std::time::Duration;

use intake_core::DeliveryOrder;
use intake_core::memory::AssignmentStrategy;

use super::rng::SimRng;

/// What the handler does with one message, on every call.
#[derive(Clone, Copy, Debug)]
pub struct MessagePlan {
    /// How long each call takes before it answers.
    pub work: Duration,
    /// Calls that fail with a retryable error before calls succeed, counted
    /// over every attempt of every delivery.
    pub failures: u32,
    /// Every call fails with a permanent error: the message must end in the
    /// dead-letter topic.
    pub poison: bool,
}

/// The settings of one consumer, within the ranges the runtime accepts.
#[derive(Clone, Copy, Debug)]
pub struct ConsumerPlan {
    pub max_in_flight: usize,
    pub ordering: DeliveryOrder,
    pub commit_interval: Duration,
    pub commit_batch: usize,
    pub fetch_batch: usize,
    pub max_uncommitted: usize,
    pub shutdown_deadline: Duration,
    pub revoke_timeout: Duration,
    /// Consumer-level backoff `(min, max)`; `None` is `Disabled`.
    pub backoff: Option<(Duration, Duration)>,
    /// Delay between fetch attempts after a transient source error.
    pub reconnect: Duration,
    /// Fetch retries before the run gives up; `None` retries forever.
    pub reconnect_retries: Option<u32>,
    /// Retries of the retry layer around the handler.
    pub retries: u32,
    /// A per-attempt timeout (`tower::timeout`) inside the retry layer.
    pub attempt_timeout: Option<Duration>,
}

/// One step of the schedule.
#[derive(Clone, Copy, Debug)]
pub enum Event {
    /// A new consumer joins the group (a rebalance).
    Join(ConsumerPlan),
    /// A running consumer's run future is dropped, source and all, without
    /// a close: a crash. `pick` chooses among the live consumers.
    Crash { pick: u64 },
    /// A running consumer shuts down gracefully and leaves the group (a
    /// rebalance); with `crash_after`, it is killed if still draining then.
    Leave {
        pick: u64,
        crash_after: Option<Duration>,
    },
    /// `count` more messages are produced.
    Produce { count: u32 },
    /// The group's next `count` fetches fail.
    FailFetches { count: u32 },
    /// The group's next `count` commits fail.
    FailCommits { count: u32 },
    /// The group's next `count` dead-letter writes fail.
    FailDeadLetterWrites { count: u32 },
    /// Every commit takes this long from now on.
    DelayCommits(Duration),
    /// All injected faults end.
    ClearFaults,
}

/// Everything a seed decides.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub seed: u64,
    pub partitions: u32,
    pub keys: u32,
    pub assignment: AssignmentStrategy,
    pub rebalance_timeout: Duration,
    /// Messages produced before the first consumer starts.
    pub initial_messages: u32,
    /// The plan of every message that will be produced, by id.
    pub messages: Vec<MessagePlan>,
    /// The schedule, by time since the start.
    pub events: Vec<(Duration, Event)>,
    /// The consumer started for the final drain when none is left running.
    pub finisher: ConsumerPlan,
    /// The stream seeding backoff jitter.
    pub jitter_seed: u64,
}

/// How long the schedule lasts; the drain follows.
pub const HORIZON: Duration = Duration::from_secs(3);

/// At most this many consumers run at once (more `Join`s are skipped).
pub const MAX_CONSUMERS: usize = 4;

impl Scenario {
    /// The scenario of `seed`.
    pub fn from_seed(seed: u64) -> Self {
        let mut rng = SimRng::new(seed);
        let mut topic = rng.fork();
        let mut handlers = rng.fork();
        let mut consumers = rng.fork();
        let mut schedule = rng.fork();

        let partitions = topic.between(1, 4) as u32;
        let keys = topic.between(1, 8) as u32;
        let assignment = if topic.percent(50) {
            AssignmentStrategy::Range
        } else {
            AssignmentStrategy::RoundRobin
        };
        let rebalance_timeout = topic.millis(50, 4_000);
        let initial_messages = topic.between(10, 100) as u32;

        let mut events = Vec::new();
        let starting = schedule.between(1, 3);
        for _ in 0..starting {
            events.push((Duration::ZERO, Event::Join(consumer_plan(&mut consumers))));
        }
        let mut produced = initial_messages;
        for _ in 0..schedule.between(3, 14) {
            let at = schedule.millis(1, HORIZON.as_millis() as u64);
            let roll = schedule.below(100);
            let event = match roll {
                0..=19 => Event::Join(consumer_plan(&mut consumers)),
                20..=39 => Event::Crash {
                    pick: schedule.next_u64(),
                },
                40..=51 => Event::Leave {
                    pick: schedule.next_u64(),
                    crash_after: schedule.percent(30).then(|| schedule.millis(1, 1_000)),
                },
                52..=63 => {
                    let count = schedule.between(1, 30) as u32;
                    produced += count;
                    Event::Produce { count }
                }
                64..=71 => Event::FailFetches {
                    count: schedule.between(1, 20) as u32,
                },
                72..=81 => Event::FailCommits {
                    count: schedule.between(1, 10) as u32,
                },
                82..=87 => Event::FailDeadLetterWrites {
                    count: schedule.between(1, 12) as u32,
                },
                88..=93 => Event::DelayCommits(schedule.millis(1, 400)),
                _ => Event::ClearFaults,
            };
            events.push((at, event));
        }
        // Stable: events drawn for the same instant keep their order.
        events.sort_by_key(|(at, _)| *at);

        let messages = (0..produced).map(|_| message_plan(&mut handlers)).collect();
        Self {
            seed,
            partitions,
            keys,
            assignment,
            rebalance_timeout,
            initial_messages,
            messages,
            events,
            finisher: consumer_plan(&mut consumers),
            jitter_seed: rng.next_u64(),
        }
    }
}

fn message_plan(rng: &mut SimRng) -> MessagePlan {
    let work = match rng.below(100) {
        0..=59 => Duration::ZERO,
        60..=84 => rng.millis(1, 20),
        85..=96 => rng.millis(20, 300),
        _ => rng.millis(300, 4_000),
    };
    let poison = rng.percent(4);
    let failures = match rng.below(100) {
        0..=79 => 0,
        80..=94 => rng.between(1, 3) as u32,
        _ => rng.between(4, 12) as u32,
    };
    MessagePlan {
        work,
        failures,
        poison,
    }
}

fn consumer_plan(rng: &mut SimRng) -> ConsumerPlan {
    let max_in_flight = rng.pick(&[1, 2, 3, 4, 8, 16]);
    let ordering = rng.pick(&[
        DeliveryOrder::Partition,
        DeliveryOrder::Key,
        DeliveryOrder::Unordered,
    ]);
    ConsumerPlan {
        max_in_flight,
        ordering,
        commit_interval: rng.millis(5, 100),
        commit_batch: rng.between(1, 32) as usize,
        fetch_batch: rng.between(1, 32) as usize,
        max_uncommitted: max_in_flight * rng.pick(&[1, 2, 8, 64]),
        shutdown_deadline: rng.millis(10, 3_000),
        revoke_timeout: rng.millis(10, 3_000),
        backoff: rng
            .percent(75)
            .then(|| (rng.millis(1, 20), rng.millis(20, 500))),
        reconnect: rng.millis(1, 50),
        reconnect_retries: rng.percent(15).then(|| rng.between(0, 3) as u32),
        retries: rng.between(0, 3) as u32,
        attempt_timeout: rng.percent(20).then(|| rng.millis(50, 1_000)),
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {}: {} partition(s), {} key(s), {:?} assignment, rebalance timeout {:?}, \
             {} initial message(s), {} in all",
            self.seed,
            self.partitions,
            self.keys,
            self.assignment,
            self.rebalance_timeout,
            self.initial_messages,
            self.messages.len()
        )?;
        for (at, event) in &self.events {
            writeln!(f, "  at {at:?}: {event:?}")?;
        }
        write!(f, "  drain with: {:?}", self.finisher)
    }
}
