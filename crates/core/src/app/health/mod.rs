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

mod check;
mod problem;
mod route;
mod settings;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use self::check::Check;
pub use self::check::PartHealth;
pub use self::problem::{HealthReport, Problem};
use self::route::RouteHealth;
pub(in crate::app) use self::route::RouteState;
pub use self::settings::HealthSettings;
use crate::observer::ConsumerObserver;

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
            state: Mutex::new(RouteState::default()),
            inner,
        });
        lock(&self.inner.routes).push((name.into(), route.clone()));
        route
    }

    /// What `f` makes of each route's state (by name, in the order
    /// added), each read under its lock: for the console.
    #[cfg(feature = "console")]
    pub(in crate::app) fn map_routes<R>(
        &self,
        mut f: impl FnMut(&str, &RouteState) -> R,
    ) -> Vec<R> {
        lock(&self.inner.routes)
            .iter()
            .map(|(name, route)| f(name, &lock(&route.state)))
            .collect()
    }

    /// What `f` makes of route `name`'s state, if it has one.
    #[cfg(feature = "console")]
    pub(in crate::app) fn with_route<R>(
        &self,
        name: &str,
        f: impl FnOnce(&RouteState) -> R,
    ) -> Option<R> {
        let route = lock(&self.inner.routes)
            .iter()
            .find(|(route, _)| route == name)
            .map(|(_, route)| route.clone())?;
        let state = lock(&route.state);
        Some(f(&state))
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
                    progress
                        .stalled_for(now, settings.stall_window)
                        .map(|since| Problem::Stalled {
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
