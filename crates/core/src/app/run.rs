//! How an [`App`] runs: its startup hooks, its routes under one stop token
//! with the background tasks beside them, the drain on the first stop
//! request and the stop at once on the second, then the background tasks
//! and the shutdown hooks, and the verdict.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::task::{Id, JoinSet};
use tokio_util::sync::CancellationToken;

use super::{
    App, AppError, AppReport, Background, BoxFuture, Health, Hook, Route, RouteOutcome,
    RouteReport, RouteStart, Signals,
};
use crate::consumer::{RunError, RunReport, SharedBudget};
use crate::error::{BoxError, ConfigError, chain_for_log};

/// How long the background tasks get to finish once told to stop, before
/// they are aborted.
const BACKGROUND_STOP: Duration = Duration::from_secs(5);

/// What stops the app: the first fires a drain, the second a stop at once.
pub(super) struct Trigger {
    pub(super) first: BoxFuture<()>,
    pub(super) second: BoxFuture<()>,
    /// The signal listener behind the two, kept for as long as the app runs.
    pub(super) _signals: Option<Signals>,
}

impl<S> App<S> {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.routes.is_empty() {
            return Err(ConfigError::new(
                "routes",
                "is empty: add at least one with `App::route`",
            ));
        }
        for (index, route) in self.routes.iter().enumerate() {
            if self.routes[..index].iter().any(|r| r.name == route.name) {
                return Err(ConfigError::new(
                    "routes",
                    format!("name `{}` is used twice; name each route once", route.name),
                ));
            }
        }
        Ok(())
    }

    pub(super) async fn run_inner(self, mut trigger: Trigger) -> Result<AppReport, AppError> {
        self.validate().map_err(AppError::Config)?;
        let App {
            state: _,
            routes,
            budget,
            drain_deadline,
            health,
            startup,
            shutdown,
            background,
            control: _,
            group: _,
            #[cfg(feature = "console")]
                console: _,
        } = self;
        run_startup_hooks(startup, &mut trigger.first).await?;

        let mut running = RunningRoutes::start(routes, &health, &budget, drain_deadline);
        let companions = Companions::start(background);
        if let Some(health) = &health {
            health.started();
        }
        tracing::info!(routes = running.names.len(), "app started");
        running.supervise(&mut trigger, health.as_ref()).await;

        companions.stop().await;
        if let Some(health) = &health {
            health.ended();
        }
        let hook_failure = run_shutdown_hooks(shutdown).await;
        running.verdict(budget.as_ref(), hook_failure)
    }
}

/// Runs the startup hooks in order; the first that fails, or a stop
/// request meanwhile, keeps the app from starting.
async fn run_startup_hooks(
    startup: Vec<Hook>,
    stop: &mut Pin<Box<dyn Future<Output = ()> + Send>>,
) -> Result<(), AppError> {
    for hook in startup {
        let name = hook.name;
        tokio::select! {
            result = (hook.run)() => if let Err(error) = result {
                tracing::error!(hook = %name, error = %chain_for_log(&*error), "a startup hook failed; the app does not start");
                return Err(AppError::Startup { hook: name, error });
            },
            () = &mut *stop => {
                tracing::info!(hook = %name, "stopped while starting; the app does not start");
                return Err(AppError::StoppedWhileStarting { hook: name });
            }
        }
    }
    Ok(())
}

/// Runs every shutdown hook in order, even after one failed; the first
/// failure is the app's.
async fn run_shutdown_hooks(shutdown: Vec<Hook>) -> Option<(String, BoxError)> {
    let mut first_failure = None;
    for hook in shutdown {
        if let Err(error) = (hook.run)().await {
            tracing::error!(hook = %hook.name, error = %chain_for_log(&*error), "a shutdown hook failed");
            if first_failure.is_none() {
                first_failure = Some((hook.name, error));
            }
        }
    }
    first_failure
}

/// The routes' tasks, one per route, and what each ended with.
struct RunningRoutes {
    /// Told to every route when the app drains.
    token: CancellationToken,
    set: JoinSet<Result<RunReport, RunError>>,
    /// Per route, in the order added: its task, name and outcome.
    ids: Vec<Id>,
    names: Vec<String>,
    outcomes: Vec<Option<RouteOutcome>>,
    /// The first route that failed, with its error.
    failure: Option<(usize, RunError)>,
    draining: bool,
    /// Whether a second stop request dropped the routes.
    abandoned: bool,
}

impl RunningRoutes {
    fn start(
        routes: Vec<Route>,
        health: &Option<Health>,
        budget: &Option<SharedBudget>,
        drain_deadline: Option<Duration>,
    ) -> Self {
        let token = CancellationToken::new();
        let mut set = JoinSet::new();
        let mut ids = Vec::with_capacity(routes.len());
        let mut names = Vec::with_capacity(routes.len());
        for route in routes {
            let run = (route.start)(RouteStart {
                shutdown: token.clone(),
                health: health.clone().map(|health| (health, route.name.clone())),
                budget: budget.clone(),
                drain_deadline,
            });
            ids.push(set.spawn(run).id());
            names.push(route.name);
        }
        let outcomes = names.iter().map(|_| None).collect();
        Self {
            token,
            set,
            ids,
            names,
            outcomes,
            failure: None,
            draining: false,
            abandoned: false,
        }
    }

    /// Until every route has ended: a route that fails or panics drains the
    /// others, the first stop request drains them all, the second drops
    /// them.
    async fn supervise(&mut self, trigger: &mut Trigger, health: Option<&Health>) {
        loop {
            tokio::select! {
                joined = self.set.join_next_with_id() => {
                    let Some(joined) = joined else { break };
                    self.ended(joined);
                    let failed = self.outcomes.iter().flatten().any(RouteOutcome::is_failure);
                    if failed && !self.draining {
                        self.drain(health);
                    }
                }
                () = &mut trigger.first, if !self.draining => {
                    tracing::info!("stop requested: draining the routes");
                    self.drain(health);
                }
                () = &mut trigger.second, if self.draining && !self.abandoned => {
                    tracing::warn!("second stop request: stopping at once; what the routes hold stays unacknowledged");
                    self.abandoned = true;
                    self.set.abort_all();
                }
            }
        }
    }

    fn drain(&mut self, health: Option<&Health>) {
        self.draining = true;
        if let Some(health) = health {
            health.stopping();
        }
        self.token.cancel();
    }

    /// Records how a route's task ended.
    fn ended(&mut self, joined: Result<(Id, Result<RunReport, RunError>), tokio::task::JoinError>) {
        let (id, outcome) = match joined {
            Ok((id, Ok(report))) => (id, RouteOutcome::Finished(report)),
            Ok((id, Err(error))) => {
                let report = error.report().clone();
                if let Some(index) = self.index(id) {
                    tracing::error!(route = %self.names[index], error = %chain_for_log(&error), "a route failed; stopping the others");
                    if self.failure.is_none() {
                        self.failure = Some((index, error));
                    }
                }
                (id, RouteOutcome::Failed(report))
            }
            Err(join) if join.is_panic() => {
                if let Some(index) = self.index(join.id()) {
                    tracing::error!(route = %self.names[index], "a route panicked; stopping the others");
                }
                (join.id(), RouteOutcome::Panicked)
            }
            // Aborted by a second stop request.
            Err(join) => (join.id(), RouteOutcome::Abandoned),
        };
        if let Some(index) = self.index(id) {
            self.outcomes[index] = Some(outcome);
        }
    }

    fn index(&self, id: Id) -> Option<usize> {
        self.ids.iter().position(|i| *i == id)
    }

    /// The app's report, or the first reason the run failed: a route's
    /// error, a route's panic, a stop at once, a shutdown hook's failure.
    fn verdict(
        self,
        budget: Option<&SharedBudget>,
        hook_failure: Option<(String, BoxError)>,
    ) -> Result<AppReport, AppError> {
        let report = AppReport {
            routes: self
                .names
                .into_iter()
                .zip(self.outcomes)
                .map(|(name, outcome)| RouteReport {
                    name,
                    outcome: outcome.unwrap_or(RouteOutcome::Abandoned),
                })
                .collect(),
            peak_shared_messages: budget.map(SharedBudget::peak_messages),
            peak_shared_bytes: budget.map(SharedBudget::peak_bytes),
        };
        if let Some((index, error)) = self.failure {
            return Err(AppError::Route {
                route: report.routes[index].name.clone(),
                error,
                report: Box::new(report),
            });
        }
        if let Some(route) = report
            .routes
            .iter()
            .find(|route| matches!(route.outcome, RouteOutcome::Panicked))
        {
            return Err(AppError::RoutePanicked {
                route: route.name.clone(),
                report: Box::new(report),
            });
        }
        if self.abandoned {
            return Err(AppError::StoppedAtOnce {
                report: Box::new(report),
            });
        }
        if let Some((hook, error)) = hook_failure {
            return Err(AppError::Shutdown {
                hook,
                error,
                report: Box::new(report),
            });
        }
        Ok(report)
    }
}

/// The background tasks, told to stop once every route has stopped.
struct Companions {
    stop: CancellationToken,
    set: JoinSet<()>,
}

impl Companions {
    fn start(background: Vec<Background>) -> Self {
        let stop = CancellationToken::new();
        let mut set = JoinSet::new();
        for task in background {
            let name = task.name;
            let run = (task.run)(stop.clone());
            let told = stop.clone();
            set.spawn(async move {
                run.await;
                if !told.is_cancelled() {
                    tracing::warn!(task = %name, "a background task ended while the routes run");
                }
            });
        }
        Self { stop, set }
    }

    /// Tells them to stop and gives them [`BACKGROUND_STOP`] before
    /// aborting them.
    async fn stop(mut self) {
        self.stop.cancel();
        let stopped = tokio::time::timeout(BACKGROUND_STOP, async {
            while self.set.join_next().await.is_some() {}
        })
        .await;
        if stopped.is_err() {
            tracing::warn!(
                within = ?BACKGROUND_STOP,
                "background tasks did not stop when told to; aborting them"
            );
            self.set.abort_all();
        }
    }
}
