//! An application: several consumers (routes) run and stopped as one
//! service, under one shared in-flight budget, with startup and shutdown
//! hooks and a graceful stop on SIGTERM or Ctrl-C.
//!
//! Each route is a [`Consumer`] built as usual (its own source, acker,
//! handler and [`ConsumerBuilder`](crate::ConsumerBuilder) settings, any
//! backend); the app names it and runs every route's
//! [`Consumer::run`] in one [`JoinSet`](tokio::task::JoinSet) on the
//! current runtime: one task per route, none per message.
//!
//! ```
//! use intake_core::app::App;
//! use intake_core::consumer::{Consumer, SharedBudget};
//! use intake_core::memory::{MemoryBroker, Record};
//! use intake_core::{Payload, handler_fn};
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = MemoryBroker::new();
//! broker.create_topic("orders", 2)?;
//! broker.create_topic("payments", 2)?;
//! broker.send("orders", Record::new("order 1"))?;
//!
//! let (orders, orders_acker) = broker.consumer("orders", "billing")?;
//! let (payments, payments_acker) = broker.consumer("payments", "audit")?;
//! let app = App::new()
//!     .shared_budget(SharedBudget::new(256, 64 << 20)?)
//!     .on_startup("warm up", async || Ok::<_, std::io::Error>(()))
//!     .route(
//!         "orders",
//!         Consumer::builder().max_in_flight(192).build(
//!             orders,
//!             orders_acker,
//!             handler_fn(async |Payload(order): Payload| {
//!                 tracing::info!(?order, "billed");
//!             }),
//!         )?,
//!     )
//!     .route(
//!         "payments",
//!         Consumer::builder().max_in_flight(64).build(
//!             payments,
//!             payments_acker,
//!             handler_fn(async |Payload(payment): Payload| {
//!                 tracing::info!(?payment, "audited");
//!             }),
//!         )?,
//!     );
//!
//! // `app.run()` stops on SIGTERM or Ctrl-C; a token stops it here.
//! let stop = CancellationToken::new();
//! let running = tokio::spawn(app.run_until(stop.clone()));
//! while broker.lag("orders", "billing")? > 0 {
//!     tokio::time::sleep(std::time::Duration::from_millis(5)).await;
//! }
//! stop.cancel();
//! let report = running.await??;
//! assert_eq!(report.route("orders").and_then(|route| route.report()).map(|run| run.succeeded), Some(1));
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "console")]
mod console;
mod control;
mod health;
#[cfg(feature = "health")]
mod http;
mod report;
mod run;
mod signals;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceExt};

use crate::acker::Acker;
use crate::consumer::{Consumer, RunError, RunReport, SharedBudget, Shutdown};
use crate::error::{BoxError, HandlerError};
use crate::handler::{Handler, HandlerFn, Settles, handler_fn_with_state};
use crate::message::Message;
use crate::source::Source;

#[cfg(feature = "console")]
pub use console::{
    AUDIT_TARGET, AuditEntry, Console, ConsoleSettings, ConsoleToken, DEFAULT_REPLAY_RATE,
    INSTANCE_ENV, Liveness, MAX_LETTERS, MAX_PAGE, MAX_SAMPLES, MAX_SET, MIN_TOKEN_LEN,
    ParkedTierView, PartitionPage, PartitionView, Redaction, RedactionFn, RouteView, RunState,
    Sample, TOKEN_ENV,
};
pub use control::AppControl;
pub use health::{Health, HealthReport, HealthSettings, PartHealth, Problem};
#[cfg(feature = "health-server")]
pub use http::HealthListener;
#[cfg(feature = "health")]
pub use http::HealthService;
pub use report::{AppError, AppReport, RouteOutcome, RouteReport};
use run::Trigger;
pub use signals::Signals;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What a route needs to start: built once, when the app starts.
struct RouteStart {
    shutdown: CancellationToken,
    /// The route's health observer, when the app reports health.
    health: Option<(Health, String)>,
    budget: Option<SharedBudget>,
    drain_deadline: Option<Duration>,
}

/// A route with its types erased: the consumer, and how to run it.
struct Route {
    name: String,
    start: Box<dyn FnOnce(RouteStart) -> BoxFuture<Result<RunReport, RunError>> + Send>,
}

/// A task that runs beside the routes (a lag exporter, a relay), stopped by
/// its token once every route has stopped.
struct Background {
    name: String,
    run: Box<dyn FnOnce(CancellationToken) -> BoxFuture<()> + Send>,
}

/// How long an app waits at its start to read the group's commands log to
/// its end before starting its routes anyway.
const GROUP_CATCH_UP: Duration = Duration::from_secs(30);

/// A startup or shutdown hook.
struct Hook {
    name: String,
    run: Box<dyn FnOnce() -> BoxFuture<Result<(), BoxError>> + Send>,
}

/// Several routes run as one service, with a state `S` their handler fns
/// share ([`with_state`](Self::with_state), [`handler`](Self::handler)). See
/// the [module docs](self).
#[must_use = "an App does nothing until `run` or `run_until` is awaited"]
pub struct App<S = ()> {
    state: S,
    routes: Vec<Route>,
    budget: Option<SharedBudget>,
    drain_deadline: Option<Duration>,
    health: Option<Health>,
    startup: Vec<Hook>,
    shutdown: Vec<Hook>,
    background: Vec<Background>,
    control: AppControl,
    /// The group's control, once given: the console's pause and resume go
    /// through it.
    group: Option<crate::group_control::GroupControl>,
    #[cfg(feature = "console")]
    console: Option<Console>,
}

impl Default for App<()> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> std::fmt::Debug for App<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field(
                "routes",
                &self.routes.iter().map(|r| &r.name).collect::<Vec<_>>(),
            )
            .field("budget", &self.budget)
            .field("drain_deadline", &self.drain_deadline)
            .finish_non_exhaustive()
    }
}

impl App<()> {
    /// An app with no route and no state yet.
    pub fn new() -> Self {
        Self::with_state(())
    }
}

impl<S> App<S> {
    /// An app whose handler fns share `state`: made with
    /// [`handler`](Self::handler), their [`State<T>`](crate::handler::State)
    /// arguments are taken from it ([`FromRef`](crate::handler::FromRef)).
    /// The state is held once per route and cloned per message, so make it
    /// cheap to clone: an `Arc` around what is not `Clone`, pools that are
    /// handles already.
    pub fn with_state(state: S) -> Self {
        Self {
            state,
            routes: Vec::new(),
            budget: None,
            drain_deadline: None,
            health: None,
            startup: Vec::new(),
            shutdown: Vec::new(),
            background: Vec::new(),
            control: AppControl::default(),
            group: None,
            #[cfg(feature = "console")]
            console: None,
        }
    }

    /// Pauses and resumes the routes' partitions while the app runs: each
    /// route's [`ConsumerControl`](crate::consumer::ConsumerControl) by
    /// name, those of routes added later too.
    pub fn control(&self) -> AppControl {
        self.control.clone()
    }

    /// The state the app's handler fns share.
    pub fn state(&self) -> &S {
        &self.state
    }

    /// `f` as a handler service whose [`State<T>`](crate::handler::State)
    /// arguments come from the app's state: [`handler_fn_with_state`] with
    /// a clone of it, made once. Wrap it in layers as any handler.
    ///
    /// [`handler_fn_with_state`]: crate::handler::handler_fn_with_state
    pub fn handler<F, Args>(&self, f: F) -> HandlerFn<F, Args, S>
    where
        S: Clone,
        F: Handler<Args, S>,
    {
        handler_fn_with_state(self.state.clone(), f)
    }

    /// Adds a route: a consumer, run under `name` (which the report and any
    /// error name). Its settings are its own, except the shared budget and
    /// the drain deadline when the app sets them.
    pub fn route<Src, A, H>(
        mut self,
        name: impl Into<String>,
        consumer: Consumer<Src, A, H>,
    ) -> Self
    where
        Src: Source,
        A: Acker,
        // `Settles`, as `ConsumerBuilder::build` asks: a handler that
        // returns outputs nothing publishes is refused there, with a message
        // naming `PublishLayer`; a `Response = ()` bound here would add a
        // second, bare type mismatch to it.
        H: Service<Message, Response: Settles> + Send + 'static,
        H::Error: Into<HandlerError> + Send + 'static,
        H::Future: Send + 'static,
    {
        let name = name.into();
        self.control.insert(name.clone(), consumer.control());
        self.routes.push(Route {
            name,
            start: Box::new(move |start: RouteStart| {
                // `()` is the only answer that settles (`Settles` is sealed):
                // nothing is dropped here.
                let mut consumer =
                    consumer.map_handler(|handler| handler.map_response(|_: H::Response| ()));
                if let Some(budget) = start.budget {
                    consumer.settings.shared_budget = Some(budget);
                }
                if let Some(deadline) = start.drain_deadline {
                    consumer.settings.shutdown_deadline = deadline;
                }
                if let Some((health, name)) = start.health {
                    let observer = health.register(name, consumer.settings.observer.take());
                    consumer.settings.observer = Some(observer);
                }
                Box::pin(consumer.run(start.shutdown))
            }),
        });
        self
    }

    /// One in-flight budget (messages and bytes) for all the routes
    /// together; each route still holds at most its own `max_in_flight`,
    /// which keeps a hot route from taking all of it (see
    /// [`SharedBudget`]).
    pub fn shared_budget(mut self, budget: SharedBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Reports every route's readiness and liveness to `health` (see
    /// [`Health`]): each route's consumer gets an observer that forwards to
    /// the one it had (metrics) and judges its progress at each commit tick.
    /// Routes are ready once they run and have an assignment, and not ready
    /// from the moment a stop begins.
    pub fn health(mut self, health: Health) -> Self {
        self.health = Some(health);
        self
    }

    /// Shows the routes in `console` (feature `console`): the app reports
    /// to the console's [`Health`] (in place of one given to
    /// [`health`](Self::health)), and the console's sampler runs beside the
    /// routes as a [background](Self::background) task. Serve it with
    /// [`HealthService::with_console`].
    #[cfg(feature = "console")]
    pub fn console(mut self, console: Console) -> Self {
        self.health = Some(console.health().clone());
        console.attach_control(self.control.clone());
        if let Some(group) = &self.group {
            console.attach_group(group.clone());
        }
        self.console = Some(console.clone());
        self.background("console history", move |stop| console.sample_until(stop))
    }

    /// Follows the group's commands log beside the routes (a
    /// [background](Self::background) task): a pause or a resume sent by
    /// any instance of the group, this one included, reaches this
    /// instance's routes (see [`GroupControl`](crate::group_control::GroupControl)).
    /// Before the routes start, a startup hook reads the log to its end
    /// ([`GroupControl::catch_up`](crate::group_control::GroupControl::catch_up),
    /// at most 30 s), so that a partition the group paused is never
    /// fetched here first.
    /// With a [`Console`] too, the console's pause and resume go through
    /// the group.
    pub fn group_control(mut self, group: crate::group_control::GroupControl) -> Self {
        #[cfg(feature = "console")]
        if let Some(console) = &self.console {
            console.attach_group(group.clone());
        }
        self.group = Some(group.clone());
        let routes = self.control.clone();
        let catching_up = (group.clone(), routes.clone());
        self.on_startup("group control: read the group's commands", move || async move {
            let (group, routes) = catching_up;
            // Bounded: a commands log out of reach must not keep the
            // routes from starting; the pauses then apply once it is read.
            match group.catch_up(&routes, GROUP_CATCH_UP).await {
                Ok(read) => tracing::info!(instance = %group.instance(), records = read, "read the group's commands before starting the routes"),
                Err(error) => tracing::error!(
                    instance = %group.instance(),
                    error = %crate::error::ErrorChain::new(&error),
                    "starting the routes without the group's commands read to their end: a pause of the group takes effect once they are"
                ),
            }
            Ok::<(), BoxError>(())
        })
        .background("group control", move |stop| group.apply_until(routes, stop))
    }

    /// How long the routes' handlers get to finish once a stop begins: the
    /// [`shutdown_deadline`](crate::ConsumerBuilder::shutdown_deadline) of
    /// every route, in place of its own.
    pub fn drain_deadline(mut self, deadline: Duration) -> Self {
        self.drain_deadline = Some(deadline);
        self
    }

    /// Runs `hook` before any route starts (connect, migrate, warm up), in
    /// the order added. If one fails, the app does not start: no route
    /// consumes anything, the later hooks do not run, and
    /// [`AppError::Startup`] names it.
    pub fn on_startup<F, Fut, E>(mut self, name: impl Into<String>, hook: F) -> Self
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError>,
    {
        self.startup.push(Hook::new(name, hook));
        self
    }

    /// Runs `task` beside the routes, from after the startup hooks until
    /// every route has stopped: then its token is cancelled, and it has 5 s
    /// to return before it is aborted (before the shutdown hooks run). For
    /// what a service runs next to its consumers, such as a broker-lag
    /// exporter (`move |stop| exporter.run(Duration::from_secs(15), stop)`
    /// with a `LagExporter` of the `metrics` feature) or a heartbeat:
    ///
    /// ```
    /// use std::time::Duration;
    /// use intake_core::app::App;
    ///
    /// let app = App::new().background("heartbeat", |stop| async move {
    ///     let mut ticks = tokio::time::interval(Duration::from_secs(30));
    ///     loop {
    ///         tokio::select! {
    ///             () = stop.cancelled() => return,
    ///             _ = ticks.tick() => tracing::info!("alive"),
    ///         }
    ///     }
    /// });
    /// # drop(app);
    /// ```
    ///
    /// A task that returns early is logged; the routes keep running.
    pub fn background<F, Fut>(mut self, name: impl Into<String>, task: F) -> Self
    where
        F: FnOnce(CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.background.push(Background {
            name: name.into(),
            run: Box::new(move |stop| Box::pin(task(stop))),
        });
        self
    }

    /// Runs `hook` after every route has stopped (drained, failed or been
    /// stopped at once), in the order added; every hook runs even if an
    /// earlier one failed.
    pub fn on_shutdown<F, Fut, E>(mut self, name: impl Into<String>, hook: F) -> Self
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError>,
    {
        self.shutdown.push(Hook::new(name, hook));
        self
    }

    /// Runs the app until SIGTERM or SIGINT (Ctrl-C), then drains: fetching
    /// stops, running handlers get the drain deadline, finished work is
    /// committed. A second signal stops at once: the routes are dropped,
    /// what they held stays unacknowledged (the broker delivers it again),
    /// and their outcome is [`RouteOutcome::Abandoned`].
    ///
    /// A route that fails stops the others (drained) and the app returns
    /// [`AppError::Route`] naming it.
    ///
    /// A third signal ends the process at once (a shutdown hook that hangs,
    /// say). Once `run` has returned, the signals have their default effect
    /// back: the next one ends the process (status 128 + its number), so a
    /// step after the run that hangs can be ended with Ctrl-C; a later run
    /// listens again. See [`Signals`].
    pub async fn run(self) -> Result<AppReport, AppError> {
        let signals = Signals::install().map_err(AppError::Signals)?;
        self.run_with(signals).await
    }

    /// Runs the app until `shutdown` fires (a [`CancellationToken`] or any
    /// future), then drains, as [`run`](Self::run) does on a signal; for
    /// services that handle signals themselves. Drop the returned future to
    /// stop at once (what the routes hold stays unacknowledged).
    pub async fn run_until(self, shutdown: impl Into<Shutdown>) -> Result<AppReport, AppError> {
        self.run_until_or_abort(shutdown, Shutdown::never()).await
    }

    /// Runs the app until `drain` fires, then drains; if `stop_now` fires
    /// while it drains, stops at once as a second signal does in
    /// [`run`](Self::run).
    pub async fn run_until_or_abort(
        self,
        drain: impl Into<Shutdown>,
        stop_now: impl Into<Shutdown>,
    ) -> Result<AppReport, AppError> {
        self.run_inner(Trigger {
            first: drain.into().into_future(),
            second: stop_now.into().into_future(),
            _signals: None,
        })
        .await
    }

    /// Runs the app until `signals` deliver one (drain) or two (stop at
    /// once): [`run`](Self::run) with signals installed beforehand, and
    /// handed back to their default effect when it returns.
    pub async fn run_with(self, signals: Signals) -> Result<AppReport, AppError> {
        self.run_inner(Trigger {
            first: Box::pin(signals.drain_token().cancelled_owned()),
            second: Box::pin(signals.stop_now_token().cancelled_owned()),
            _signals: Some(signals),
        })
        .await
    }
}

impl Hook {
    fn new<F, Fut, E>(name: impl Into<String>, hook: F) -> Self
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError>,
    {
        Self {
            name: name.into(),
            run: Box::new(move || Box::pin(async move { hook().await.map_err(Into::into) })),
        }
    }
}
