//! Readiness and liveness of an app's routes, from what the runtime reports
//! at each commit tick (a [`ConsumerObserver`]), never per message.
//!
//! - **Ready**: every route runs and is not stopping, has received an
//!   assignment (or has waited longer than [`HealthSettings::assignment_grace`]
//!   without one: a group with more members than partitions leaves some
//!   with none), its last acknowledgement succeeded, its source is not
//!   failing (an error reported since the last tick that saw progress) and
//!   reaches its broker (for a source that reconnects on its own, see
//!   [`Reachability`](crate::backend::Reachability)), and it has not been
//!   in consumer-level backoff, with no probe succeeding, for longer than
//!   [`HealthSettings::backoff_grace`] (everything failing for that long
//!   means this instance should get no traffic; a short backoff is normal),
//!   and it has not been starved of room in a shared budget for the stall
//!   window (routes whose caps add up to more than the shared budget can
//!   keep one of them from ever getting room while they stay busy; its
//!   waiting work is in no commit engine, so no partition stalls).
//! - **Live**: no partition is stalled, and acknowledgements have not kept
//!   failing. A partition stalls when it has uncommitted work, its
//!   watermark has not moved for [`HealthSettings::stall_window`], and its
//!   oldest unfinished message is older than the window too. For
//!   [`HealthSettings::rebalance_grace`] after a route's assignment
//!   changes, its partitions count as live, so liveness does not flap
//!   during rebalances. A route whose acknowledgements (commits) have all
//!   failed for the stall window is not live either, rebalance or not: its
//!   watermarks may move while nothing reaches the broker (a commit the
//!   broker refuses every time), and a restart is what clears a client
//!   stuck that way.
//!
//! A route's runtime that stops ticking altogether (a blocked executor) is
//! caught too: a stall is judged against the time of the question, not of
//! the last tick.
//!
//! Parts besides the routes (a Kafka parking's mover, an outbox relay)
//! count too, through the checks [`Health::add_check`] adds: each is asked
//! at every question and answers for itself ([`PartHealth`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::health_check::{Check, PartHealth};
use crate::acker::{AckBatch, AckError};
use crate::message::{PartitionKey, Position};
use crate::observer::{ConsumerObserver, PartitionSnapshot};
use crate::source::SourceError;

/// How health is judged: see [`Health`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthSettings {
    /// How long a partition with uncommitted work may go without its
    /// watermark moving (and its oldest unfinished message waiting) before
    /// it fails liveness; also how long acknowledgements (commits) may all
    /// fail before the route fails liveness. Default 5 minutes: longer than
    /// the slowest legitimate handler, and than a broker's failover.
    pub stall_window: Duration,
    /// How long after a route's assignment changes its partitions count as
    /// live whatever they do. Default 60 s.
    pub rebalance_grace: Duration,
    /// How long a route may wait for its first assignment before it counts
    /// as ready without one. Default 60 s.
    pub assignment_grace: Duration,
    /// How long a route may stay in consumer-level backoff before it stops
    /// counting as ready. Default 60 s.
    pub backoff_grace: Duration,
}

#[cfg(all(test, feature = "serde"))]
mod settings_tests {
    use super::*;

    #[test]
    fn health_settings_load_with_units_and_name_the_field_in_errors() {
        let settings: HealthSettings = serde_json::from_str(r#"{"stall_window": "90s"}"#).unwrap();
        assert_eq!(settings.stall_window, Duration::from_secs(90));
        assert_eq!(
            settings.rebalance_grace,
            HealthSettings::default().rebalance_grace
        );
        let error = serde_json::from_str::<HealthSettings>(r#"{"rebalance_grace": 5}"#)
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("`rebalance_grace`:"), "{error}");
    }
}

impl Default for HealthSettings {
    fn default() -> Self {
        Self {
            stall_window: Duration::from_secs(300),
            rebalance_grace: Duration::from_secs(60),
            assignment_grace: Duration::from_secs(60),
            backoff_grace: Duration::from_secs(60),
        }
    }
}

/// Every field optional (absent keeps the default), durations with a unit
/// (`"90s"`, `"5m"`), errors naming the field (feature `serde`).
#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for HealthSettings {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use crate::consumer::settings::duration;

        fn stall_window<'de, D: serde::Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Duration>, D::Error> {
            duration(d, "stall_window")
        }
        fn rebalance_grace<'de, D: serde::Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Duration>, D::Error> {
            duration(d, "rebalance_grace")
        }
        fn assignment_grace<'de, D: serde::Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Duration>, D::Error> {
            duration(d, "assignment_grace")
        }
        fn backoff_grace<'de, D: serde::Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Duration>, D::Error> {
            duration(d, "backoff_grace")
        }

        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            #[serde(default, deserialize_with = "stall_window")]
            stall_window: Option<Duration>,
            #[serde(default, deserialize_with = "rebalance_grace")]
            rebalance_grace: Option<Duration>,
            #[serde(default, deserialize_with = "assignment_grace")]
            assignment_grace: Option<Duration>,
            #[serde(default, deserialize_with = "backoff_grace")]
            backoff_grace: Option<Duration>,
        }

        let raw = Raw::deserialize(deserializer)?;
        let defaults = HealthSettings::default();
        Ok(HealthSettings {
            stall_window: raw.stall_window.unwrap_or(defaults.stall_window),
            rebalance_grace: raw.rebalance_grace.unwrap_or(defaults.rebalance_grace),
            assignment_grace: raw.assignment_grace.unwrap_or(defaults.assignment_grace),
            backoff_grace: raw.backoff_grace.unwrap_or(defaults.backoff_grace),
        })
    }
}

/// The health of an app's routes: give it to
/// [`App::health`](super::App::health), ask it with [`is_live`](Self::is_live)
/// and [`is_ready`](Self::is_ready), or serve it (with the `health`
/// feature, as a tower service or a small HTTP listener).
///
/// Cloning gives another handle to the same health.
///
/// Readiness and liveness of an app's routes, from what the runtime reports
/// at each commit tick (a [`ConsumerObserver`]), never per message.
///
/// - **Ready**: every route runs and is not stopping, has received an
///   assignment (or has waited longer than [`HealthSettings::assignment_grace`]
///   without one: a group with more members than partitions leaves some
///   with none), its last acknowledgement succeeded, its source is not
///   failing (an error reported since the last tick that saw progress) and
///   reaches its broker (for a source that reconnects on its own, see
///   [`Reachability`](crate::backend::Reachability)), and it has not been
///   in consumer-level backoff, with no probe succeeding, for longer than
///   [`HealthSettings::backoff_grace`] (everything failing for that long
///   means this instance should get no traffic; a short backoff is normal),
///   and it has not been starved of room in a shared budget for the stall
///   window (routes whose caps add up to more than the shared budget can
///   keep one of them from ever getting room while they stay busy; its
///   waiting work is in no commit engine, so no partition stalls).
/// - **Live**: no partition is stalled, and acknowledgements have not kept
///   failing. A partition stalls when it has uncommitted work, its
///   watermark has not moved for [`HealthSettings::stall_window`], and its
///   oldest unfinished message is older than the window too. For
///   [`HealthSettings::rebalance_grace`] after a route's assignment
///   changes, its partitions count as live, so liveness does not flap
///   during rebalances. A route whose acknowledgements (commits) have all
///   failed for the stall window is not live either, rebalance or not: its
///   watermarks may move while nothing reaches the broker (a commit the
///   broker refuses every time), and a restart is what clears a client
///   stuck that way.
///
/// A route's runtime that stops ticking altogether (a blocked executor) is
/// caught too: a stall is judged against the time of the question, not of
/// the last tick.
///
/// Parts besides the routes (a Kafka parking's mover, an outbox relay)
/// count too, through the checks [`Health::add_check`] adds: each is asked
/// at every question and answers for itself ([`PartHealth`]).
#[derive(Clone, Debug, Default)]
pub struct Health {
    inner: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    settings: HealthSettings,
    routes: Mutex<Vec<(String, Arc<RouteHealth>)>>,
    checks: Mutex<Vec<(String, Check)>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("settings", &self.settings)
            .field("routes", &self.routes)
            .field(
                "checks",
                &lock(&self.checks)
                    .iter()
                    .map(|(name, _)| name.clone())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// A route's state, as its observer last saw it.
pub(crate) struct RouteHealth {
    state: Mutex<RouteState>,
    /// The route's own observer (metrics), which hears everything first.
    inner: Option<Arc<dyn ConsumerObserver>>,
}

#[derive(Debug)]
struct RouteState {
    started_at: Option<Instant>,
    stopping: bool,
    ended: bool,
    assigned: bool,
    assignment_changed_at: Option<Instant>,
    ack_failing: bool,
    /// Since when every acknowledgement has failed (the first failure
    /// after the last success).
    ack_failing_since: Option<Instant>,
    source_failing: bool,
    /// Since when the source has not reached its broker, at the last tick.
    unreachable_since: Option<Instant>,
    /// Since when the consumer has been backing off without a successful
    /// probe, at the last tick.
    backing_off_since: Option<Instant>,
    /// The backoff level at the last tick.
    backoff_level: u32,
    /// Since when the route has asked its shared budget for room and got
    /// none, as the runtime last reported.
    starved_since: Option<Instant>,
    partitions: HashMap<PartitionKey, PartitionProgress>,
}

#[derive(Debug)]
struct PartitionProgress {
    watermark: Option<Position>,
    uncommitted: usize,
    last_progress: Instant,
    /// When the oldest unfinished message became unfinished, as far as the
    /// last tick could tell.
    oldest_since: Option<Instant>,
}

/// Why a route is not ready, or not live.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// The route has not started, or has ended.
    NotRunning,
    /// The route is draining.
    Stopping,
    /// No assignment yet (within the assignment grace).
    NoAssignment,
    /// The last acknowledgement failed.
    AcksFailing,
    /// Fetching fails.
    SourceFailing,
    /// The source cannot reach its broker (it keeps reconnecting).
    Unreachable {
        /// How long it has not reached it.
        since: Duration,
    },
    /// The consumer has been backing off (everything it handles fails)
    /// for longer than the backoff grace.
    BackingOff {
        /// How long it has been backing off.
        since: Duration,
    },
    /// The route has asked its shared budget for room and got none, for
    /// the stall window: the other routes sharing it hold it all.
    Starved {
        /// How long it has waited.
        since: Duration,
    },
    /// Every acknowledgement (commit) has failed for the stall window.
    CommitsFailing {
        /// How long since the first of these failures.
        since: Duration,
    },
    /// A part besides the routes said so ([`Health::add_check`]).
    Part {
        /// What it said.
        reason: String,
    },
    /// A partition's watermark has not moved for the stall window.
    Stalled {
        /// The partition.
        partition: PartitionKey,
        /// How long since it last moved.
        since: Duration,
    },
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::NotRunning => f.write_str("not running"),
            Problem::Stopping => f.write_str("stopping"),
            Problem::NoAssignment => f.write_str("no assignment yet"),
            Problem::AcksFailing => f.write_str("acknowledgements failing"),
            Problem::SourceFailing => f.write_str("fetching failing"),
            Problem::Unreachable { since } => {
                write!(f, "broker unreachable for {since:?}")
            }
            Problem::BackingOff { since } => {
                write!(f, "backing off for {since:?}")
            }
            Problem::Starved { since } => {
                write!(f, "no room in the shared budget for {since:?}")
            }
            Problem::CommitsFailing { since } => {
                write!(f, "commits failing for {since:?}")
            }
            Problem::Part { reason } => f.write_str(reason),
            Problem::Stalled { partition, since } => {
                write!(f, "partition {partition} stalled for {since:?}")
            }
        }
    }
}

/// A health answer: each route's problems (empty when healthy).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthReport {
    /// Each route's name and problems, in the order added.
    pub routes: Vec<(String, Vec<Problem>)>,
}

impl HealthReport {
    /// Whether no route has a problem.
    pub fn is_healthy(&self) -> bool {
        self.routes.iter().all(|(_, problems)| problems.is_empty())
    }
}

impl std::fmt::Display for HealthReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (route, problems) in &self.routes {
            if problems.is_empty() {
                writeln!(f, "{route}: ok")?;
            } else {
                let list: Vec<String> = problems.iter().map(ToString::to_string).collect();
                writeln!(f, "{route}: {}", list.join(", "))?;
            }
        }
        Ok(())
    }
}

impl Health {
    /// Health judged with `settings`.
    pub fn new(settings: HealthSettings) -> Self {
        Self {
            inner: Arc::new(Shared {
                settings,
                routes: Mutex::new(Vec::new()),
                checks: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The settings.
    pub fn settings(&self) -> HealthSettings {
        self.inner.settings
    }

    /// Registers route `name`, whose consumer reports to the returned
    /// observer (which forwards everything to `inner` first, if any). The
    /// [`App`](super::App) does this for each route; call it for a
    /// [`Consumer`](crate::Consumer) run on its own, with
    /// [`ConsumerBuilder::observer`](crate::ConsumerBuilder::observer), and
    /// mark it [`started`](Self::started) when it runs.
    pub fn register(
        &self,
        name: impl Into<String>,
        inner: Option<Arc<dyn ConsumerObserver>>,
    ) -> Arc<dyn ConsumerObserver> {
        let route = Arc::new(RouteHealth {
            state: Mutex::new(RouteState {
                started_at: None,
                stopping: false,
                ended: false,
                assigned: false,
                assignment_changed_at: None,
                ack_failing: false,
                ack_failing_since: None,
                source_failing: false,
                unreachable_since: None,
                backing_off_since: None,
                backoff_level: 0,
                starved_since: None,
                partitions: HashMap::new(),
            }),
            inner,
        });
        lock(&self.inner.routes).push((name.into(), route.clone()));
        route
    }

    fn each_route(&self, mut f: impl FnMut(&mut RouteState)) {
        for (_, route) in lock(&self.inner.routes).iter() {
            f(&mut lock(&route.state));
        }
    }

    /// Adds part `name`, whose health `check` tells at every question: a
    /// [`PartHealth::NotLive`] answer fails liveness and readiness, a
    /// [`PartHealth::NotReady`] one readiness. The check is called on the
    /// asking thread: it must answer at once (read what the part recorded,
    /// never ask a broker). Reports list it after the routes, by `name`.
    pub fn add_check(
        &self,
        name: impl Into<String>,
        check: impl Fn() -> PartHealth + Send + Sync + 'static,
    ) {
        lock(&self.inner.checks).push((name.into(), Arc::new(check)));
    }

    /// Each part's problems, for readiness (`ready`) or liveness.
    fn parts(&self, ready: bool) -> Vec<(String, Vec<Problem>)> {
        lock(&self.inner.checks)
            .iter()
            .map(|(name, check)| {
                let problems = match check() {
                    PartHealth::NotLive(reason) => vec![Problem::Part { reason }],
                    PartHealth::NotReady(reason) if ready => vec![Problem::Part { reason }],
                    PartHealth::NotReady(_) | PartHealth::Healthy => Vec::new(),
                };
                (name.clone(), problems)
            })
            .collect()
    }

    /// Marks every registered route as running (from now on it may become
    /// ready).
    pub fn started(&self) {
        let now = Instant::now();
        self.each_route(|state| {
            state.started_at = Some(now);
            state.stopping = false;
            state.ended = false;
        });
    }

    /// Marks every route as stopping: not ready from now on (a load
    /// balancer stops sending work before the drain ends).
    pub fn stopping(&self) {
        self.each_route(|state| state.stopping = true);
    }

    /// Marks every route as ended.
    pub fn ended(&self) {
        self.each_route(|state| state.ended = true);
    }

    /// Readiness: each route's problems (see [`Health`]).
    pub fn readiness(&self) -> HealthReport {
        if lock(&self.inner.routes).is_empty() {
            return HealthReport {
                routes: vec![("app".to_owned(), vec![Problem::NotRunning])],
            };
        }
        let now = Instant::now();
        let grace = self.inner.settings.assignment_grace;
        let backoff_grace = self.inner.settings.backoff_grace;
        let stall_window = self.inner.settings.stall_window;
        self.report(true, |state| {
            let mut problems = Vec::new();
            match state.started_at {
                None => problems.push(Problem::NotRunning),
                Some(_) if state.ended => problems.push(Problem::NotRunning),
                Some(_) if state.stopping => problems.push(Problem::Stopping),
                Some(started) => {
                    if !state.assigned && now.saturating_duration_since(started) < grace {
                        problems.push(Problem::NoAssignment);
                    }
                    if state.ack_failing {
                        problems.push(Problem::AcksFailing);
                    }
                    if state.source_failing {
                        problems.push(Problem::SourceFailing);
                    }
                    if let Some(since) = state.unreachable_since {
                        problems.push(Problem::Unreachable {
                            since: now.saturating_duration_since(since),
                        });
                    }
                    if let Some(since) = state.backing_off_since {
                        let since = now.saturating_duration_since(since);
                        if since >= backoff_grace {
                            problems.push(Problem::BackingOff { since });
                        }
                    }
                    if let Some(since) = state.starved_since {
                        let since = now.saturating_duration_since(since);
                        if since >= stall_window {
                            problems.push(Problem::Starved { since });
                        }
                    }
                }
            }
            problems
        })
    }

    /// Liveness: each route's failing commits and stalled partitions. See
    /// [`Health`].
    pub fn liveness(&self) -> HealthReport {
        let now = Instant::now();
        let settings = self.inner.settings;
        self.report(false, |state| {
            // Judged before the rebalance grace: a route that rebalances
            // again and again must not hide commits that never succeed.
            let failing = state
                .ack_failing_since
                .map(|at| now.saturating_duration_since(at))
                .filter(|since| *since >= settings.stall_window)
                .map(|since| Problem::CommitsFailing { since });
            if state
                .assignment_changed_at
                .is_some_and(|at| now.saturating_duration_since(at) < settings.rebalance_grace)
            {
                return failing.into_iter().collect();
            }
            let mut stalled: Vec<Problem> = state
                .partitions
                .iter()
                .filter_map(|(partition, progress)| {
                    let since = now.saturating_duration_since(progress.last_progress);
                    let oldest_waits = progress.oldest_since.is_some_and(|at| {
                        now.saturating_duration_since(at) >= settings.stall_window
                    });
                    (progress.uncommitted > 0 && since >= settings.stall_window && oldest_waits)
                        .then(|| Problem::Stalled {
                            partition: partition.clone(),
                            since,
                        })
                })
                .collect();
            stalled.sort_by_key(ToString::to_string);
            failing.into_iter().chain(stalled).collect()
        })
    }

    /// Whether every route is ready.
    pub fn is_ready(&self) -> bool {
        self.readiness().is_healthy()
    }

    /// Whether every route is live.
    pub fn is_live(&self) -> bool {
        self.liveness().is_healthy()
    }

    /// Each route as `judge` sees it, then each part (for readiness when
    /// `ready`).
    fn report(
        &self,
        ready: bool,
        mut judge: impl FnMut(&RouteState) -> Vec<Problem>,
    ) -> HealthReport {
        let mut routes: Vec<(String, Vec<Problem>)> = lock(&self.inner.routes)
            .iter()
            .map(|(name, route)| (name.clone(), judge(&lock(&route.state))))
            .collect();
        routes.extend(self.parts(ready));
        HealthReport { routes }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl std::fmt::Debug for RouteHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteHealth")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl ConsumerObserver for RouteHealth {
    fn on_partitions(&self, partitions: &[PartitionSnapshot]) {
        if let Some(inner) = &self.inner {
            inner.on_partitions(partitions);
        }
        let now = Instant::now();
        let mut guard = lock(&self.state);
        let state = &mut *guard;
        let mut changed = partitions.len() != state.partitions.len();
        for snapshot in partitions {
            let stats = &snapshot.stats;
            let oldest_since = snapshot
                .oldest_unfinished_age
                .map(|age| now.checked_sub(age).unwrap_or(now));
            match state.partitions.get_mut(&stats.partition) {
                Some(progress) => {
                    if progress.watermark != stats.watermark || stats.uncommitted == 0 {
                        progress.last_progress = now;
                        state.source_failing = false;
                    }
                    progress.watermark = stats.watermark;
                    progress.uncommitted = stats.uncommitted;
                    progress.oldest_since = oldest_since;
                }
                None => {
                    changed = true;
                    state.partitions.insert(
                        stats.partition.clone(),
                        PartitionProgress {
                            watermark: stats.watermark,
                            uncommitted: stats.uncommitted,
                            last_progress: now,
                            oldest_since,
                        },
                    );
                }
            }
        }
        if changed {
            state.assignment_changed_at = Some(now);
        }
        if !partitions.is_empty() {
            state.assigned = true;
        }
    }

    fn on_in_flight(&self, in_flight: usize) {
        if let Some(inner) = &self.inner {
            inner.on_in_flight(in_flight);
        }
    }

    fn on_ack(&self, batch: &AckBatch, result: Result<(), &AckError>, elapsed: Duration) {
        if let Some(inner) = &self.inner {
            inner.on_ack(batch, result, elapsed);
        }
        let mut state = lock(&self.state);
        state.ack_failing = result.is_err();
        if result.is_ok() {
            // Acknowledging needs the broker: it answers again.
            state.source_failing = false;
            state.ack_failing_since = None;
        } else if state.ack_failing_since.is_none() {
            state.ack_failing_since = Some(Instant::now());
        }
    }

    fn on_revoked(&self, partition: &PartitionKey) {
        if let Some(inner) = &self.inner {
            inner.on_revoked(partition);
        }
        let mut state = lock(&self.state);
        state.partitions.remove(partition);
        state.assignment_changed_at = Some(Instant::now());
    }

    fn on_panic(&self, partition: &PartitionKey) {
        if let Some(inner) = &self.inner {
            inner.on_panic(partition);
        }
    }

    fn on_probe_timeout(&self) {
        if let Some(inner) = &self.inner {
            inner.on_probe_timeout();
        }
    }

    fn on_source_error(&self, error: &SourceError, retry_in: Option<Duration>) {
        if let Some(inner) = &self.inner {
            inner.on_source_error(error, retry_in);
        }
        lock(&self.state).source_failing = true;
    }

    fn on_reachability(&self, unreachable_for: Option<Duration>) {
        if let Some(inner) = &self.inner {
            inner.on_reachability(unreachable_for);
        }
        let now = Instant::now();
        lock(&self.state).unreachable_since =
            unreachable_for.map(|duration| now.checked_sub(duration).unwrap_or(now));
    }

    fn on_shared_budget_wait(&self, waited: Option<Duration>) {
        if let Some(inner) = &self.inner {
            inner.on_shared_budget_wait(waited);
        }
        let now = Instant::now();
        lock(&self.state).starved_since =
            waited.map(|waited| now.checked_sub(waited).unwrap_or(now));
    }

    fn on_backoff(&self, level: u32) {
        if let Some(inner) = &self.inner {
            inner.on_backoff(level);
        }
        let mut state = lock(&self.state);
        // A level that fell means a probe succeeded: the consumer recovers,
        // even if it stays above 0 for want of messages to probe with.
        if level == 0 || level < state.backoff_level {
            state.backing_off_since = None;
        } else if level > state.backoff_level && state.backing_off_since.is_none() {
            state.backing_off_since = Some(Instant::now());
        }
        state.backoff_level = level;
    }
}
