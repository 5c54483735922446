//! What the console shows of a route and its partitions: built from what
//! [`Health`](crate::app::Health) keeps at each commit tick and what the
//! route's lag probe last answered, at the moment of the question.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::probe::LagReading;
use crate::app::health::{HealthSettings, RouteState};
use crate::message::{PartitionKey, Position};

/// The most problems a route view lists (a route with thousands of stalled
/// partitions says how many more there are instead).
pub(super) const MAX_PROBLEMS: usize = 20;

/// Whether a route runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RunState {
    /// Not started yet.
    Starting,
    /// Running.
    Running,
    /// Draining: not ready, finishing what it holds.
    Stopping,
    /// Ended.
    Ended,
}

/// How a partition fares, by the rules of liveness (see
/// [`Health`](crate::app::Health)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Liveness {
    /// Nothing admitted waits: no work, or all of it committed.
    Idle,
    /// Work moves.
    Ok,
    /// Within the rebalance grace after the route's assignment changed:
    /// live whatever it does.
    Settling,
    /// Uncommitted work, a watermark that has not moved for the stall
    /// window and an oldest unfinished message older than it: the route
    /// fails liveness.
    Stalled,
    /// Paused through the consumer's control: it holds its position and
    /// starts nothing, on purpose; live.
    Paused,
}

/// A route, as the console shows it (`GET /console/api/v1/routes`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct RouteView {
    /// The route's name.
    pub name: String,
    /// The instance answering (see [`ConsoleSettings::instance`](super::ConsoleSettings::instance)).
    pub instance: String,
    /// Whether it runs.
    pub state: RunState,
    /// Whether health calls it ready.
    pub ready: bool,
    /// Whether health calls it live.
    pub live: bool,
    /// What health says is wrong (readiness and liveness), at most 20
    /// lines, the last saying how many more there are.
    pub problems: Vec<String>,
    /// Partitions assigned to this instance.
    pub partitions: usize,
    /// How many of them stall.
    pub stalled_partitions: usize,
    /// Deliveries held (queued or running) at the last commit tick.
    pub in_flight: usize,
    /// The consumer-level backoff level (0: not backing off).
    pub backoff_level: u32,
    /// Whether the last acknowledgement failed.
    pub acks_failing: bool,
    /// Milliseconds since an acknowledgement last succeeded.
    pub since_last_commit_ms: Option<u64>,
    /// Messages committed since the route started, as the acknowledgements
    /// tell (see `docs/CONSOLE.md`).
    pub committed_messages: u64,
    /// Broker lag summed over the partitions, from the route's lag probe
    /// (`None` without one, or when it did not answer).
    pub broker_lag: Option<u64>,
    /// Messages parked and not yet back, from the lag probe.
    pub parked_backlog: Option<u64>,
    /// The same per delay tier, with when the next is due back where the
    /// backend knows it (empty without a probe or a count).
    pub parked_tiers: Vec<ParkedTierView>,
    /// Milliseconds since the lag probe answered.
    pub lag_age_ms: Option<u64>,
    /// Every partition assigned to this instance is paused (and it has
    /// at least one).
    pub paused: bool,
}

/// One delay tier of a route's parked backlog (`GET .../routes`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ParkedTierView {
    /// The tier: a delay (`1s`), `exact` (each message its own due time)
    /// or `all` (the backend counts only the total).
    pub tier: String,
    /// Messages parked there.
    pub messages: u64,
    /// When the first of them is due back (Unix milliseconds), where the
    /// backend knows it.
    pub next_due_unix_ms: Option<u64>,
}

impl ParkedTierView {
    pub(super) fn new(tier: &crate::lag::ParkedTier) -> Self {
        Self {
            tier: tier.tier.clone(),
            messages: tier.messages,
            next_due_unix_ms: tier.next_due.and_then(|due| {
                due.duration_since(UNIX_EPOCH)
                    .ok()
                    .and_then(|since| u64::try_from(since.as_millis()).ok())
            }),
        }
    }
}

/// A partition of a route, as the console shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PartitionView {
    /// Topic, stream or queue.
    pub source: String,
    /// Partition number within it.
    pub partition: u32,
    /// The instance that owns it (this one: each instance shows its own).
    pub owner: String,
    /// When this instance first saw it assigned, in Unix milliseconds
    /// (at the resolution of the commit interval).
    pub assigned_at_unix_ms: u64,
    /// Milliseconds it has been assigned.
    pub assigned_for_ms: u64,
    /// The position handled: every message up to it is done (the
    /// watermark; a backend's position as text: an offset, a Redis stream
    /// id, an AMQP tag).
    pub handled: Option<String>,
    /// The position the broker last confirmed committed.
    pub committed: Option<String>,
    /// The newest position admitted.
    pub newest: Option<String>,
    /// Admitted messages the watermark has not passed.
    pub uncommitted: usize,
    /// Admitted messages whose handler has not finished.
    pub in_flight: usize,
    /// The oldest unfinished message's position.
    pub oldest_unfinished: Option<String>,
    /// How long it has been unfinished, in milliseconds.
    pub oldest_unfinished_age_ms: Option<u64>,
    /// Milliseconds since an acknowledgement carrying this partition's
    /// work succeeded.
    pub since_last_commit_ms: Option<u64>,
    /// Milliseconds since the watermark last moved (or had nothing to
    /// wait for).
    pub since_progress_ms: u64,
    /// How it fares.
    pub liveness: Liveness,
    /// How long it has stalled, in milliseconds, when it has.
    pub stalled_for_ms: Option<u64>,
    /// Broker lag of this partition, from the route's lag probe.
    pub broker_lag: Option<u64>,
    /// Paused through the consumer's control (`POST
    /// .../routes/{route}/pause`): it holds its position and fetches no
    /// more.
    pub paused: bool,
}

/// One page of a route's partitions (`GET
/// /console/api/v1/routes/{route}/partitions`), ordered by source and
/// partition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PartitionPage {
    /// The route.
    pub route: String,
    /// How many partitions the route has in all.
    pub total: usize,
    /// Where this page starts in the ordered list.
    pub offset: usize,
    /// The most this page could hold.
    pub limit: usize,
    /// The offset of the next page, `None` on the last one. A rebalance
    /// between two pages can shift the list.
    pub next_offset: Option<usize>,
    /// The partitions.
    pub partitions: Vec<PartitionView>,
}

/// The moment of a question: both clocks, to turn the runtime's instants
/// into ages and Unix times.
#[derive(Clone, Copy, Debug)]
pub(super) struct Now {
    pub(super) instant: Instant,
    pub(super) system: SystemTime,
}

impl Now {
    pub(super) fn new() -> Self {
        Self {
            instant: Instant::now(),
            system: SystemTime::now(),
        }
    }

    /// Milliseconds since `at`.
    pub(super) fn ms_since(&self, at: Instant) -> u64 {
        millis(self.instant.saturating_duration_since(at))
    }

    /// `at` in Unix milliseconds.
    pub(super) fn unix_ms(&self, at: Instant) -> u64 {
        let ago = self.instant.saturating_duration_since(at);
        self.system
            .checked_sub(ago)
            .and_then(|time| time.duration_since(UNIX_EPOCH).ok())
            .map_or(0, millis)
    }

    /// Now in Unix milliseconds.
    pub(super) fn unix_now_ms(&self) -> u64 {
        self.unix_ms(self.instant)
    }
}

/// `duration` in whole milliseconds (saturating).
pub(super) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Whether `state` is within the rebalance grace at `now`.
pub(super) fn settling(state: &RouteState, settings: &HealthSettings, now: Instant) -> bool {
    state
        .assignment_changed_at
        .is_some_and(|at| now.saturating_duration_since(at) < settings.rebalance_grace)
}

/// How many of `state`'s partitions stall at `now`.
pub(super) fn stalled_count(state: &RouteState, settings: &HealthSettings, now: Instant) -> usize {
    if settling(state, settings, now) {
        return 0;
    }
    state
        .partitions
        .values()
        .filter(|watch| watch.stalled_for(now, settings.stall_window).is_some())
        .count()
}

/// Whether a route runs, from its state.
pub(super) fn run_state(state: &RouteState) -> RunState {
    match state.started_at {
        None => RunState::Starting,
        Some(_) if state.ended => RunState::Ended,
        Some(_) if state.stopping => RunState::Stopping,
        Some(_) => RunState::Running,
    }
}

/// One page of `state`'s partitions: `limit` of them from `offset`.
pub(super) fn partition_page(
    route: &str,
    state: &RouteState,
    settings: &HealthSettings,
    lag: Option<&LagReading>,
    instance: &str,
    now: Now,
    (offset, limit): (usize, usize),
) -> PartitionPage {
    let mut keys: Vec<&PartitionKey> = state.partitions.keys().collect();
    keys.sort_unstable();
    let total = keys.len();
    let end = offset.saturating_add(limit).min(total);
    let page = keys.get(offset..end).unwrap_or_default();
    let broker_lag: HashMap<&PartitionKey, u64> = lag
        .map(|reading| {
            reading
                .partitions
                .iter()
                .filter_map(|lag| Some((&lag.partition, lag.messages?)))
                .collect()
        })
        .unwrap_or_default();
    let settling = settling(state, settings, now.instant);
    let partitions = page
        .iter()
        .filter_map(|key| {
            let watch = state.partitions.get(*key)?;
            let commits = state.commits.get(*key);
            let stalled = (!settling)
                .then(|| watch.stalled_for(now.instant, settings.stall_window))
                .flatten();
            let liveness = match (settling, stalled) {
                _ if watch.paused => Liveness::Paused,
                (true, _) => Liveness::Settling,
                (false, Some(_)) => Liveness::Stalled,
                (false, None) if watch.uncommitted == 0 && watch.in_flight == 0 => Liveness::Idle,
                (false, None) => Liveness::Ok,
            };
            Some(PartitionView {
                source: key.source.to_string(),
                partition: key.partition,
                owner: instance.to_owned(),
                assigned_at_unix_ms: now.unix_ms(watch.assigned_at),
                assigned_for_ms: now.ms_since(watch.assigned_at),
                handled: watch.watermark.as_ref().map(Position::to_string),
                committed: commits
                    .and_then(|commits| commits.committed.as_ref())
                    .map(Position::to_string),
                newest: watch.newest.as_ref().map(Position::to_string),
                uncommitted: watch.uncommitted,
                in_flight: watch.in_flight,
                oldest_unfinished: watch.oldest_unfinished.as_ref().map(Position::to_string),
                oldest_unfinished_age_ms: watch.oldest_since.map(|at| now.ms_since(at)),
                since_last_commit_ms: commits
                    .and_then(|commits| commits.committed_at)
                    .map(|at| now.ms_since(at)),
                since_progress_ms: now.ms_since(watch.last_progress),
                liveness,
                stalled_for_ms: stalled.map(millis),
                broker_lag: broker_lag.get(*key).copied(),
                paused: watch.paused,
            })
        })
        .collect();
    PartitionPage {
        route: route.to_owned(),
        total,
        offset,
        limit,
        next_offset: (end < total).then_some(end),
        partitions,
    }
}

/// `problems` as lines, at most [`MAX_PROBLEMS`], the last one saying how
/// many more there were.
pub(super) fn bounded_problems(problems: Vec<String>) -> Vec<String> {
    if problems.len() <= MAX_PROBLEMS {
        return problems;
    }
    let more = problems.len() - (MAX_PROBLEMS - 1);
    let mut kept: Vec<String> = problems.into_iter().take(MAX_PROBLEMS - 1).collect();
    kept.push(format!("and {more} more"));
    kept
}
