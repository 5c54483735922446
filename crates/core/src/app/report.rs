//! What an app did, and how it can fail.

use crate::consumer::{RunError, RunReport};
use crate::error::{BoxError, ConfigError};

/// How one route ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RouteOutcome {
    /// It ran to its end (drained after a stop, or its source was
    /// exhausted).
    Finished(RunReport),
    /// It failed (its error is logged, and returned as the app's error when
    /// it was the first); what it did before.
    Failed(RunReport),
    /// Its task panicked: nothing is known of what it did; what it held is
    /// unacknowledged and the broker delivers it again.
    Panicked,
    /// It was stopped at once (a second signal) before it had drained: what
    /// it held is unacknowledged and the broker delivers it again.
    Abandoned,
}

impl RouteOutcome {
    /// Its run's report, unless it panicked or was abandoned.
    pub fn report(&self) -> Option<&RunReport> {
        match self {
            RouteOutcome::Finished(report) | RouteOutcome::Failed(report) => Some(report),
            RouteOutcome::Panicked | RouteOutcome::Abandoned => None,
        }
    }

    pub(super) fn is_failure(&self) -> bool {
        matches!(self, RouteOutcome::Failed(_) | RouteOutcome::Panicked)
    }
}

/// One route's name and outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RouteReport {
    /// The route's name, as given to [`App::route`](super::App::route).
    pub name: String,
    /// How it ended.
    pub outcome: RouteOutcome,
}

impl RouteReport {
    /// Its run's report, unless it panicked or was abandoned.
    pub fn report(&self) -> Option<&RunReport> {
        self.outcome.report()
    }
}

/// What an app did: each route's outcome, in the order the routes were
/// added.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AppReport {
    /// Each route, in the order added.
    pub routes: Vec<RouteReport>,
    /// With a shared budget: the most deliveries all routes held at once.
    pub peak_shared_messages: Option<u64>,
    /// With a shared budget: the most bytes all routes held at once.
    pub peak_shared_bytes: Option<u64>,
}

impl AppReport {
    /// The route named `name`.
    pub fn route(&self, name: &str) -> Option<&RouteReport> {
        self.routes.iter().find(|route| route.name == name)
    }
}

/// Why an app did not run, or ended with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AppError {
    /// The app's own settings are wrong (no route, a name used twice).
    #[error("the app is misconfigured")]
    Config(#[source] ConfigError),
    /// The signal handlers could not be installed.
    #[error("the stop signals could not be listened to")]
    Signals(#[source] std::io::Error),
    /// A startup hook failed: no route started, nothing was consumed.
    #[error("startup hook `{hook}` failed; the app did not start")]
    Startup {
        /// The hook's name.
        hook: String,
        /// Its error.
        #[source]
        error: BoxError,
    },
    /// A stop was requested while startup hook `hook` ran: no route
    /// started.
    #[error("stopped while startup hook `{hook}` ran; the app did not start")]
    StoppedWhileStarting {
        /// The hook that was running.
        hook: String,
    },
    /// A route failed; the others were drained.
    #[error("route `{route}` failed")]
    Route {
        /// The route's name.
        route: String,
        /// Its error.
        #[source]
        error: RunError,
        /// What every route did.
        report: Box<AppReport>,
    },
    /// A route's task panicked; the others were drained.
    #[error("route `{route}` panicked")]
    RoutePanicked {
        /// The route's name.
        route: String,
        /// What every route did.
        report: Box<AppReport>,
    },
    /// A second stop request stopped the app before its routes drained.
    #[error("stopped at once before the routes drained")]
    StoppedAtOnce {
        /// What every route did (the abandoned ones say so).
        report: Box<AppReport>,
    },
    /// Every route stopped, and a shutdown hook failed (the later hooks
    /// still ran).
    #[error("shutdown hook `{hook}` failed")]
    Shutdown {
        /// The first hook that failed.
        hook: String,
        /// Its error.
        #[source]
        error: BoxError,
        /// What every route did.
        report: Box<AppReport>,
    },
}

impl AppError {
    /// What the routes did, when they ran.
    pub fn report(&self) -> Option<&AppReport> {
        match self {
            AppError::Route { report, .. }
            | AppError::RoutePanicked { report, .. }
            | AppError::StoppedAtOnce { report }
            | AppError::Shutdown { report, .. } => Some(report),
            AppError::Config(_)
            | AppError::Signals(_)
            | AppError::Startup { .. }
            | AppError::StoppedWhileStarting { .. } => None,
        }
    }
}
