//! The operator console's admin API (feature `console`): [`Console`],
//! its settings, its views and the JSON routes that serve them; see
//! [`Console`] and `docs/CONSOLE.md`.

mod actions;
mod api;
mod audit;
mod control;
mod dead_letters;
mod group;
mod guard;
mod history;
mod letter_view;
mod outcomes;
mod page;
mod probe;
mod redaction;
mod ring;
mod settings;
mod view;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio_util::sync::CancellationToken;

pub use self::actions::MAX_SET;
pub use self::audit::{AUDIT_TARGET, AuditEntry};
pub use self::dead_letters::MAX_LETTERS;
pub use self::history::Sample;
use self::history::{History, Reading};
use self::outcomes::OutcomeSource;
use self::probe::{ErasedProbe, LagReading, RouteProbe};
pub use self::redaction::{Redaction, RedactionFn};
use self::ring::Ring;
pub use self::settings::{
    ConsoleSettings, ConsoleToken, DEFAULT_REPLAY_RATE, INSTANCE_ENV, MAX_SAMPLES, MIN_TOKEN_LEN,
    TOKEN_ENV,
};
use self::view::Now;
pub use self::view::{Liveness, ParkedTierView, PartitionPage, PartitionView, RouteView, RunState};
use super::health::Health;
use crate::lag::LagProbe;

/// The most partitions one page holds.
pub const MAX_PAGE: usize = 1_000;

/// The operator console's admin API (feature `console`): what each route
/// and partition of a running app is doing, and how it went over the last
/// minutes, as versioned JSON under `/console/api/v1/`, served by the
/// [`HealthService`](super::HealthService) on the health address (so by
/// the [`HealthListener`](super::HealthListener) too, or mounted in axum).
///
/// It adds nothing to the message path. What it shows of the routes is
/// what [`Health`] keeps already from the runtime's
/// [`ConsumerObserver`](crate::observer::ConsumerObserver) calls at each
/// commit tick: positions, counts in flight, the oldest unfinished
/// message, commits, liveness. Its history is sampled at a fixed interval
/// (5 s by default) into a ring per route of a fixed bound (15 minutes by
/// default): broker lag and parked backlog from the routes'
/// [`LagProbe`]s where given ([`Console::lag_probe`]), failures, dead
/// letters and parks from the metrics layer's counters where given
/// (`Console::metrics`, feature `metrics`).
///
/// Safe by default: every route of this slice only reads. Mutating routes
/// (pause, resume, replay, to come) need the bearer token of
/// [`ConsoleSettings::token`] (or `INTAKE_CONSOLE_TOKEN`, see
/// [`ConsoleSettings::from_env`]) and refuse cross-site requests; without
/// a token they are all refused. Bind the listener to loopback unless the
/// network in front of it is trusted. See `docs/CONSOLE.md` for each
/// route's JSON.
///
/// ```
/// use std::time::Duration;
/// use intake_core::app::{App, Console, ConsoleSettings, Health, HealthService};
/// use intake_core::backend::{Broker, RouteAddress};
/// use intake_core::consumer::Consumer;
/// use intake_core::memory::{MemoryBroker, Record};
/// use intake_core::{Payload, handler_fn};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let broker = MemoryBroker::new();
/// broker.create_topic("orders", 2)?;
/// let (source, acker) = broker.consumer("orders", "billing")?;
/// let probe = broker.lag_probe(&RouteAddress::new("orders", "billing")).await?;
///
/// let console = Console::new(
///     Health::default(),
///     ConsoleSettings::default().sample_interval(Duration::from_millis(20)),
/// )
/// .lag_probe("orders", probe);
/// // Served beside the probes: `HealthListener::bind("127.0.0.1:9898")`
/// // then `.serve(service, stop)`, or mounted in axum.
/// let service = HealthService::new(console.health().clone()).with_console(console.clone());
///
/// let app = App::new().console(console.clone()).route(
///     "orders",
///     Consumer::builder()
///         .commit_interval(Duration::from_millis(10))
///         .build(source, acker, handler_fn(async |Payload(_order): Payload| {}))?,
/// );
/// let stop = CancellationToken::new();
/// let running = tokio::spawn(app.run_until(stop.clone()));
/// broker.send("orders", Record::new("order 1"))?;
/// tokio::time::timeout(Duration::from_secs(30), async {
///     while broker.lag("orders", "billing")? > 0 {
///         tokio::time::sleep(Duration::from_millis(5)).await;
///     }
///     Ok::<_, intake_core::memory::MemoryError>(())
/// })
/// .await??;
/// console.sample().await;
/// assert!(!console.history("orders", 0).is_empty());
///
/// let request = http::Request::get("/console/api/v1/routes").body(())?;
/// let answer = service.respond_to(&request);
/// assert_eq!(answer.status(), 200);
/// assert!(answer.body().contains(r#""name":"orders""#));
/// stop.cancel();
/// running.await??;
/// # Ok(())
/// # }
/// ```
///
/// Cloning gives another handle to the same console.
#[derive(Clone, Debug)]
pub struct Console {
    inner: Arc<Shared>,
}

struct Shared {
    health: Health,
    settings: ConsoleSettings,
    probes: Mutex<Vec<RouteProbe>>,
    /// Each route's last lag reading, by route name.
    lag: Mutex<HashMap<String, LagReading>>,
    outcomes: Mutex<OutcomeSource>,
    history: Mutex<History>,
    audit: Mutex<Ring<AuditEntry>>,
    dead_letters: dead_letters::Explorer,
    /// The app's routes' controls, once [`App::console`](super::App::console)
    /// attached them (`control.rs`).
    control: Mutex<Option<super::AppControl>>,
    /// The group's control, once the app has one (`control.rs`).
    group: Mutex<Option<crate::group_control::GroupControl>>,
    /// What the other instances published (`group.rs`).
    group_view: Mutex<group::GroupView>,
}

impl std::fmt::Debug for Shared {
    // Not the history: thousands of samples in a log line help no one.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("settings", &self.settings)
            .field("probes", &*lock(&self.probes))
            .finish_non_exhaustive()
    }
}

impl Console {
    /// A console showing the routes `health` watches (give the same health
    /// to the app, or use [`App::console`](super::App::console), which
    /// does), with `settings`.
    pub fn new(health: Health, settings: ConsoleSettings) -> Self {
        let history = History::new(settings.samples());
        Self {
            inner: Arc::new(Shared {
                health,
                settings,
                probes: Mutex::new(Vec::new()),
                lag: Mutex::new(HashMap::new()),
                outcomes: Mutex::new(OutcomeSource::default()),
                history: Mutex::new(history),
                audit: Mutex::new(Ring::new(audit::AUDIT_ENTRIES)),
                dead_letters: dead_letters::Explorer::default(),
                control: Mutex::new(None),
                group: Mutex::new(None),
                group_view: Mutex::new(group::GroupView::default()),
            }),
        }
    }

    /// The health it reads.
    pub fn health(&self) -> &Health {
        &self.inner.health
    }

    /// Its settings.
    pub fn settings(&self) -> &ConsoleSettings {
        &self.inner.settings
    }

    /// Asks `probe` for route `route`'s broker lag and parked backlog at
    /// each sample (within [`ConsoleSettings::probe_timeout`]): the
    /// routes view, the partitions view and the history show them. One
    /// query per sample interval, never per message.
    pub fn lag_probe(self, route: impl Into<String>, probe: impl LagProbe) -> Self {
        lock(&self.inner.probes).push(RouteProbe {
            route: route.into(),
            probe: Arc::new(probe) as Arc<dyn ErasedProbe>,
        });
        self
    }

    /// Reads failures, dead letters and parks per route from the
    /// [`Metrics`](crate::metrics::Metrics) registered in `registry` (with
    /// the default `intake` prefix) at each sample: the counters of a
    /// route are those its metrics layer keeps, labelled `handler` with
    /// the route's name (`metrics.layer("orders")` for the route
    /// `orders`).
    #[cfg(feature = "metrics")]
    pub fn metrics(self, registry: prometheus::Registry) -> Self {
        self.metrics_with_prefix(registry, "intake")
    }

    /// [`metrics`](Self::metrics) for metrics named `<prefix>_*`.
    #[cfg(feature = "metrics")]
    pub fn metrics_with_prefix(self, registry: prometheus::Registry, prefix: &str) -> Self {
        *lock(&self.inner.outcomes) = OutcomeSource::metrics(registry, prefix.to_owned());
        self
    }

    /// Takes a sample every [`ConsoleSettings::sample_interval`] until
    /// `stop` fires. [`App::console`](super::App::console) runs it beside
    /// the routes; run it yourself for consumers run without an app.
    pub async fn sample_until(self, stop: CancellationToken) {
        let mut ticks = tokio::time::interval(self.inner.settings.sample_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is at once: the first sample covers an interval.
        ticks.tick().await;
        let sampling = async {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    _ = ticks.tick() => {}
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = self.sample() => {}
                }
            }
        };
        // The other instances' status, when the group shares one.
        tokio::join!(sampling, self.follow_group_until(&stop));
    }

    /// Takes one sample of every route now: asks the lag probes (each
    /// within the probe timeout), reads the outcome counters, and adds a
    /// sample to each route's history.
    pub async fn sample(&self) {
        let probes: Vec<(String, Arc<dyn ErasedProbe>)> = lock(&self.inner.probes)
            .iter()
            .map(|probe| (probe.route.clone(), probe.probe.clone()))
            .collect();
        let timeout = self.inner.settings.probe_timeout;
        let readings =
            futures_util::future::join_all(probes.iter().map(|(route, probe)| async move {
                (route, probe::read(route, &**probe, timeout).await)
            }))
            .await;
        let mut fresh: HashMap<&str, (Option<u64>, Option<u64>)> = HashMap::new();
        {
            let mut lag = lock(&self.inner.lag);
            for (route, reading) in readings {
                if let Some(reading) = reading {
                    fresh.insert(route, (reading.total(), reading.parked));
                    lag.insert(route.clone(), reading);
                }
            }
        }
        let now = Now::new();
        let settings = self.inner.health.settings();
        let mut routes = self.inner.health.map_routes(|name, state| {
            let reading = Reading {
                committed: state.committed_messages,
                in_flight: state.in_flight,
                partitions: state.partitions.len(),
                stalled_partitions: view::stalled_count(state, &settings, now.instant),
                ..Reading::default()
            };
            (name.to_owned(), reading)
        });
        let names: Vec<String> = routes.iter().map(|(name, _)| name.clone()).collect();
        let outcomes = lock(&self.inner.outcomes).clone().read(&names);
        for (index, (name, reading)) in routes.iter_mut().enumerate() {
            reading.outcomes = outcomes.as_ref().and_then(|all| all.get(index).copied());
            if let Some((lag, parked)) = fresh.get(name.as_str()) {
                reading.broker_lag = *lag;
                reading.parked_backlog = *parked;
            }
        }
        {
            let mut history = lock(&self.inner.history);
            for (name, reading) in &routes {
                history.record(name, reading, now.instant, now.unix_now_ms());
            }
        }
        self.publish_status().await;
    }

    /// Every route, in the order added.
    pub fn routes(&self) -> Vec<RouteView> {
        self.route_views(None)
    }

    /// Route `name`, if the app has it.
    pub fn route(&self, name: &str) -> Option<RouteView> {
        self.route_views(Some(name)).into_iter().next()
    }

    fn route_views(&self, only: Option<&str>) -> Vec<RouteView> {
        let health = &self.inner.health;
        let readiness = health.readiness();
        let liveness = health.liveness();
        let lag = lock(&self.inner.lag).clone();
        let now = Now::new();
        let settings = health.settings();
        let instance = self.inner.settings.instance_id();
        let problems_of = |report: &super::HealthReport, name: &str| -> Vec<String> {
            report
                .routes
                .iter()
                .filter(|(route, _)| route == name)
                .flat_map(|(_, problems)| problems.iter().map(ToString::to_string))
                .collect()
        };
        let views = health.map_routes(|name, state| {
            if only.is_some_and(|only| only != name) {
                return None;
            }
            let ready = problems_of(&readiness, name);
            let live = problems_of(&liveness, name);
            let reading = lag.get(name);
            Some(RouteView {
                name: name.to_owned(),
                instance: instance.to_owned(),
                state: view::run_state(state),
                ready: ready.is_empty(),
                live: live.is_empty(),
                problems: view::bounded_problems(ready.into_iter().chain(live).collect()),
                partitions: state.partitions.len(),
                stalled_partitions: view::stalled_count(state, &settings, now.instant),
                in_flight: state.in_flight,
                backoff_level: state.backoff_level,
                acks_failing: state.ack_failing,
                since_last_commit_ms: state.last_commit_at.map(|at| now.ms_since(at)),
                committed_messages: state.committed_messages,
                broker_lag: reading.and_then(LagReading::total),
                parked_backlog: reading.and_then(|reading| reading.parked),
                parked_tiers: reading.map_or_else(Vec::new, |reading| {
                    reading
                        .parked_tiers
                        .iter()
                        .map(view::ParkedTierView::new)
                        .collect()
                }),
                lag_age_ms: reading.map(|reading| now.ms_since(reading.at)),
                paused: !state.partitions.is_empty()
                    && state.partitions.values().all(|watch| watch.paused),
            })
        });
        views.into_iter().flatten().collect()
    }

    /// Up to `limit` (at most [`MAX_PAGE`]) of route `route`'s partitions
    /// from `offset`, ordered by source and partition; `None` for a route
    /// the app does not have.
    pub fn partitions(&self, route: &str, offset: usize, limit: usize) -> Option<PartitionPage> {
        let lag = lock(&self.inner.lag).get(route).cloned();
        let settings = self.inner.health.settings();
        let instance = self.inner.settings.instance_id();
        let now = Now::new();
        let limit = limit.clamp(1, MAX_PAGE);
        self.inner.health.with_route(route, |state| {
            view::partition_page(
                route,
                state,
                &settings,
                lag.as_ref(),
                instance,
                now,
                (offset, limit),
            )
        })
    }

    /// Route `route`'s samples taken after `since_unix_ms` (0: all it
    /// keeps), oldest first.
    pub fn history(&self, route: &str, since_unix_ms: u64) -> Vec<Sample> {
        lock(&self.inner.history).samples(route, since_unix_ms)
    }

    /// Records `entry` in the audit log: the tracing target
    /// [`AUDIT_TARGET`] at info level, and the ring the API serves (the
    /// last 256 entries). Every console action calls it.
    pub fn audit(&self, entry: AuditEntry) {
        audit::log(&entry);
        lock(&self.inner.audit).push(entry);
    }

    /// The audit entries kept, oldest first.
    pub fn audit_log(&self) -> Vec<AuditEntry> {
        lock(&self.inner.audit).iter().cloned().collect()
    }

    /// The answer to `request` for a path under `/console/`: the web page
    /// (`/console/` and its assets) or the API; see `docs/CONSOLE.md`.
    pub fn respond<B>(&self, request: &http::Request<B>) -> http::Response<String> {
        if let Some(page) = page::respond(request) {
            return page;
        }
        api::respond(self, request)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
