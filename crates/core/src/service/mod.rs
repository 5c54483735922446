//! A service: routes on one broker, wired with the safe stack by default.
//!
//! [`Service`] is the short way to an [`App`]: give it a [`Broker`] (one
//! value per backend, or the [`MemoryBroker`](crate::memory::MemoryBroker)
//! in tests) and a handler per route, and it derives each route's parts
//! from the broker and wires, around every handler, outermost first:
//!
//! 1. metrics (`metrics` feature) and a span per message;
//! 2. the route's dead-letter destination, for what fails for good;
//! 3. parking, for a handler's [`retry_later`](crate::HandlerError::retry_later)
//!    (on by default; [`Route::without_parking`] turns it off);
//! 4. retries with exponential backoff, for what may pass on the next try;
//! 5. a panic guard, so a panicking handler is a failed message, not a
//!    dead route;
//! 6. publishing, when the handler returns outputs: each is confirmed by
//!    the broker before its input is acknowledged.
//!
//! It runs until SIGTERM or Ctrl-C, drains, and shuts every part down in
//! order: the routes (their finished work committed), then what the
//! broker's parts run in the background (parking movers), then the HTTP
//! listener. With the `health-server` feature, [`http`](Service::http)
//! serves `/health/live`, `/health/ready` and `/metrics` on one address.
//!
//! Switching brokers changes the broker value only: the handlers, the
//! stack and the routes stay as they are.
//!
//! ```
//! use intake_core::memory::{MemoryBroker, Record};
//! use intake_core::service::{Route, Service};
//! use intake_core::{DeliveryOrder, HandlerError, Json, Key};
//! use serde::Deserialize;
//! use tokio_util::sync::CancellationToken;
//!
//! #[derive(Deserialize)]
//! struct Payment {
//!     cents: u64,
//! }
//!
//! async fn bill(Key(account): Key, Json(payment): Json<Payment>) -> Result<(), HandlerError> {
//!     if payment.cents == 0 {
//!         return Err(HandlerError::permanent("a payment of nothing")); // dead-lettered
//!     }
//!     tracing::info!(?account, cents = payment.cents, "billed");
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = MemoryBroker::new();
//! broker.create_topic("payments", 2)?;
//! broker.send("payments", Record::new(r#"{"cents":250}"#).with_key("account-1"))?;
//!
//! let stop = CancellationToken::new();
//! let service = Service::new("billing", broker.clone())
//!     .route_with("payments", Route::new().ordering(DeliveryOrder::Key), bill);
//! let running = tokio::spawn(service.run_until(stop.clone()));
//! while broker.lag("payments", "billing")? > 0 {
//!     tokio::time::sleep(std::time::Duration::from_millis(5)).await;
//! }
//! stop.cancel();
//! let report = running.await??;
//! assert_eq!(report.route("payments").and_then(|r| r.report()).map(|r| r.succeeded), Some(1));
//! # Ok(())
//! # }
//! ```

mod error;
mod response;
mod route;
#[cfg(feature = "serde")]
mod settings;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tower::{Service as TowerService, ServiceBuilder};

use crate::app::{App, AppReport, Health, HealthSettings};
use crate::backend::{Broker, RouteAddress};
use crate::catch_panic::CatchPanicLayer;
use crate::consumer::{SharedBudget, Shutdown};
use crate::dead_letter::DeadLetterLayer;
use crate::error::{BoxError, HandlerError};
use crate::handler::{Handler, HandlerFn};
use crate::message::Message;
use crate::parking::ParkingLayer;
use crate::retry::RetryLayer;
use crate::trace::TraceLayer;

pub use self::error::ServiceError;
pub use self::response::RouteResponse;
pub use self::route::Route;
#[cfg(feature = "serde")]
pub use self::settings::{RouteSettings, ServiceSettings};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Derives one route's parts and adds it to the app.
type RouteRecipe<B, S> =
    Box<dyn FnOnce(App<S>, Wiring<B>) -> BoxFuture<Result<App<S>, ServiceError>> + Send>;

/// What every route's wiring shares.
struct Wiring<B: Broker> {
    broker: B,
    group: Arc<str>,
    /// The broker's publisher, derived once, by the first route that
    /// publishes.
    publisher: Arc<tokio::sync::OnceCell<Arc<B::Publisher>>>,
    #[cfg(feature = "metrics")]
    metrics: crate::metrics::Metrics,
    /// Each route's settings from a config file, by source.
    #[cfg(feature = "serde")]
    routes: Arc<std::collections::BTreeMap<String, RouteSettings>>,
}

impl<B: Broker> Clone for Wiring<B> {
    fn clone(&self) -> Self {
        Self {
            broker: self.broker.clone(),
            group: Arc::clone(&self.group),
            publisher: Arc::clone(&self.publisher),
            #[cfg(feature = "metrics")]
            metrics: self.metrics.clone(),
            #[cfg(feature = "serde")]
            routes: Arc::clone(&self.routes),
        }
    }
}

impl<B: Broker> Wiring<B> {
    async fn publisher(&self, route: &str) -> Result<Arc<B::Publisher>, ServiceError> {
        self.publisher
            .get_or_try_init(|| async {
                self.broker
                    .publisher()
                    .await
                    .map(Arc::new)
                    .map_err(|error| ServiceError::Derive {
                        route: route.to_owned(),
                        broker: self.broker.kind(),
                        part: "publisher",
                        source: Box::new(error),
                    })
            })
            .await
            .cloned()
    }
}

/// Routes on one broker, wired with the safe stack and run as one app (see
/// the [module docs](self)).
#[must_use = "a Service does nothing until `run` or `run_until` is awaited"]
pub struct Service<B: Broker, S = ()> {
    name: Arc<str>,
    broker: B,
    state: S,
    routes: Vec<RouteRecipe<B, S>>,
    /// Each route's source and its own group, if it names one.
    route_names: Vec<(String, Option<String>)>,
    drain_deadline: Duration,
    budget: Option<SharedBudget>,
    health: HealthSettings,
    shutdown_timeout: Duration,
    #[cfg(feature = "metrics")]
    registry: prometheus::Registry,
    #[cfg(feature = "metrics")]
    lag_interval: Option<Duration>,
    #[cfg(feature = "health-server")]
    http: Option<String>,
    #[cfg(feature = "serde")]
    route_settings: std::collections::BTreeMap<String, RouteSettings>,
}

impl<B: Broker, S> std::fmt::Debug for Service<B, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("name", &self.name)
            .field("broker", &self.broker.kind())
            .field(
                "routes",
                &self
                    .route_names
                    .iter()
                    .map(|(source, _)| source)
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl<B: Broker> Service<B, ()> {
    /// A service named `name` on `broker`. The name is every route's
    /// consumer group unless the route names its own
    /// ([`Route::group`]).
    pub fn new(name: impl Into<String>, broker: B) -> Self {
        Self::with_state(name, broker, ())
    }
}

impl<B: Broker, S: Clone + Send + Sync + 'static> Service<B, S> {
    /// How long the routes' handlers get to finish once a stop begins, by
    /// default.
    pub const DEFAULT_DRAIN_DEADLINE: Duration = Duration::from_secs(30);

    /// How long the broker's background parts get to stop, by default.
    pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

    /// A service whose handlers share `state`: their
    /// [`State<T>`](crate::State) arguments are taken from it
    /// ([`FromRef`](crate::FromRef)). Make it cheap to clone (an `Arc`
    /// around what is not `Clone`).
    pub fn with_state(name: impl Into<String>, broker: B, state: S) -> Self {
        Self {
            name: name.into().into(),
            broker,
            state,
            routes: Vec::new(),
            route_names: Vec::new(),
            drain_deadline: Self::DEFAULT_DRAIN_DEADLINE,
            budget: None,
            health: HealthSettings::default(),
            shutdown_timeout: Self::DEFAULT_SHUTDOWN_TIMEOUT,
            #[cfg(feature = "metrics")]
            registry: prometheus::Registry::new(),
            #[cfg(feature = "metrics")]
            lag_interval: Some(Duration::from_secs(15)),
            #[cfg(feature = "health-server")]
            http: None,
            #[cfg(feature = "serde")]
            route_settings: std::collections::BTreeMap::new(),
        }
    }

    /// Consumes `source` (a Kafka topic, Redis stream, RabbitMQ queue or
    /// NATS stream) with `handler`, an async fn of extractors, under the
    /// route's defaults ([`Route::new`]). The route is named after its
    /// source.
    pub fn route<F, Args>(self, source: impl Into<String>, handler: F) -> Self
    where
        F: Handler<Args, S> + Send + Sync + 'static,
        Args: Send + Sync + 'static,
        HandlerFn<F, Args, S>: TowerService<Message, Error = HandlerError> + Clone + Send + 'static,
        <HandlerFn<F, Args, S> as TowerService<Message>>::Response: RouteResponse,
        <HandlerFn<F, Args, S> as TowerService<Message>>::Future: Send + 'static,
    {
        self.route_with(source, Route::new(), handler)
    }

    /// Consumes `source` with `handler` under `route`'s settings.
    pub fn route_with<F, Args>(
        mut self,
        source: impl Into<String>,
        route: Route,
        handler: F,
    ) -> Self
    where
        F: Handler<Args, S> + Send + Sync + 'static,
        Args: Send + Sync + 'static,
        HandlerFn<F, Args, S>: TowerService<Message, Error = HandlerError> + Clone + Send + 'static,
        <HandlerFn<F, Args, S> as TowerService<Message>>::Response: RouteResponse,
        <HandlerFn<F, Args, S> as TowerService<Message>>::Future: Send + 'static,
    {
        let source = source.into();
        self.route_names.push((source.clone(), route.group.clone()));
        self.routes
            .push(Box::new(move |app: App<S>, wiring: Wiring<B>| {
                Box::pin(wire_route(app, wiring, source, route, handler))
            }));
        self
    }

    /// `settings` (from a config file and the environment) over what the
    /// code set: the drain deadline, the HTTP address (with the
    /// `health-server` feature), and each route's settings by its source.
    /// The broker URL is the caller's to use (`AnyBroker::from_url` in the
    /// `intake` crate).
    #[cfg(feature = "serde")]
    pub fn settings(mut self, settings: &ServiceSettings) -> Self {
        if let Some(deadline) = settings.drain_deadline {
            self.drain_deadline = deadline;
        }
        #[cfg(feature = "health-server")]
        if let Some(address) = &settings.http {
            self.http = Some(address.clone());
        }
        self.route_settings.extend(
            settings
                .routes
                .iter()
                .map(|(source, route)| (source.clone(), route.clone())),
        );
        self
    }

    /// How long the handlers get to finish once a stop begins
    /// ([`DEFAULT_DRAIN_DEADLINE`](Self::DEFAULT_DRAIN_DEADLINE)).
    pub fn drain_deadline(mut self, deadline: Duration) -> Self {
        self.drain_deadline = deadline;
        self
    }

    /// One in-flight budget for all the routes together (see
    /// [`SharedBudget`]); each route still holds at most its own
    /// [`max_in_flight`](Route::max_in_flight).
    pub fn shared_budget(mut self, budget: SharedBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// How health judges the routes (see [`HealthSettings`]).
    pub fn health_settings(mut self, settings: HealthSettings) -> Self {
        self.health = settings;
        self
    }

    /// How long the broker's background parts (parking movers) get to stop
    /// once the routes have
    /// ([`DEFAULT_SHUTDOWN_TIMEOUT`](Self::DEFAULT_SHUTDOWN_TIMEOUT)).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// The registry the service's metrics are in: register your own beside
    /// them, and [`http`](Self::http) serves them all on `/metrics`.
    #[cfg(feature = "metrics")]
    pub fn registry(&self) -> &prometheus::Registry {
        &self.registry
    }

    /// How often each route's broker lag and parked backlog are read into
    /// the `intake_broker_lag_*` and `intake_parked_messages` gauges
    /// (default 15 s); `None` reads them never.
    #[cfg(feature = "metrics")]
    pub fn lag_interval(mut self, interval: Option<Duration>) -> Self {
        self.lag_interval = interval;
        self
    }

    /// Serves `/health/live`, `/health/ready` and `/metrics` on `address`
    /// (`127.0.0.1:9898`; port 0 picks one) while the service runs.
    #[cfg(feature = "health-server")]
    pub fn http(mut self, address: impl Into<String>) -> Self {
        self.http = Some(address.into());
        self
    }

    /// Runs until SIGTERM or Ctrl-C, then drains (a second signal stops at
    /// once), and shuts every part down in order (see
    /// [`App::run`]).
    pub async fn run(self) -> Result<AppReport, ServiceError> {
        let signals = crate::app::Signals::install()
            .map_err(|error| ServiceError::Run(crate::app::AppError::Signals(error)))?;
        self.run_app(|app| app.run_with(signals)).await
    }

    /// Runs until `shutdown` fires (a `CancellationToken` or any future),
    /// then drains and shuts every part down in order.
    pub async fn run_until(self, shutdown: impl Into<Shutdown>) -> Result<AppReport, ServiceError> {
        let shutdown = shutdown.into();
        self.run_app(|app| app.run_until(shutdown)).await
    }

    async fn run_app<F, Fut>(self, run: F) -> Result<AppReport, ServiceError>
    where
        F: FnOnce(App<S>) -> Fut,
        Fut: Future<Output = Result<AppReport, crate::app::AppError>>,
    {
        let health = Health::new(self.health);
        let wiring = Wiring {
            broker: self.broker.clone(),
            group: Arc::clone(&self.name),
            publisher: Arc::default(),
            #[cfg(feature = "metrics")]
            metrics: crate::metrics::Metrics::register(&self.registry)
                .map_err(|error| ServiceError::Metrics(Box::new(error)))?,
            #[cfg(feature = "serde")]
            routes: Arc::new(self.route_settings),
        };
        let mut app = App::with_state(self.state)
            .drain_deadline(self.drain_deadline)
            .health(health.clone());
        if let Some(budget) = self.budget {
            app = app.shared_budget(budget);
        }
        for recipe in self.routes {
            app = recipe(app, wiring.clone()).await?;
        }
        #[cfg(feature = "metrics")]
        if let Some(interval) = self.lag_interval {
            app = export_lag(app, &wiring, &self.registry, &self.route_names, interval).await?;
        }
        let broker = self.broker.clone();
        let timeout = self.shutdown_timeout;
        app = app.on_shutdown("broker parts", move || async move {
            broker
                .shutdown(timeout)
                .await
                .map_err(|error| Box::new(error) as BoxError)
        });

        #[cfg(feature = "health-server")]
        let serving = match self.http {
            Some(address) => {
                let listener = crate::app::HealthListener::bind(address.as_str())
                    .await
                    .map_err(|source| ServiceError::Http {
                        address: address.clone(),
                        source,
                    })?;
                if let Ok(local) = listener.local_addr() {
                    tracing::info!(address = %local, "health and metrics over HTTP");
                }
                let stop = tokio_util::sync::CancellationToken::new();
                let service = crate::app::HealthService::new(health.clone());
                #[cfg(feature = "metrics")]
                let service = service.with_metrics(self.registry.clone());
                let task = tokio::spawn(listener.serve(service, stop.clone()));
                Some((stop, task))
            }
            None => None,
        };
        let _ = &health;

        let result = run(app).await;

        #[cfg(feature = "health-server")]
        if let Some((stop, task)) = serving {
            stop.cancel();
            if let Err(error) = task.await {
                tracing::warn!(%error, "the health listener ended badly");
            }
        }
        result.map_err(ServiceError::Run)
    }
}

/// Derives the route's parts, wires its stack and adds it to `app`.
async fn wire_route<B, S, F, Args>(
    app: App<S>,
    wiring: Wiring<B>,
    source: String,
    route: Route,
    handler: F,
) -> Result<App<S>, ServiceError>
where
    B: Broker,
    S: Clone + Send + Sync + 'static,
    F: Handler<Args, S> + Send + Sync + 'static,
    Args: Send + Sync + 'static,
    HandlerFn<F, Args, S>: TowerService<Message, Error = HandlerError> + Clone + Send + 'static,
    <HandlerFn<F, Args, S> as TowerService<Message>>::Response: RouteResponse,
    <HandlerFn<F, Args, S> as TowerService<Message>>::Future: Send + 'static,
{
    type Answer<F, Args, S> = <HandlerFn<F, Args, S> as TowerService<Message>>::Response;
    #[cfg(feature = "serde")]
    let route = match wiring.routes.get(&source) {
        Some(settings) => settings.apply(route),
        None => route,
    };
    let name = route.name_for(&source);
    let group = route
        .group
        .clone()
        .unwrap_or_else(|| wiring.group.to_string());
    let address = RouteAddress::new(source.as_str(), group);
    let parts = wiring
        .broker
        .route(&address, &route.route_options())
        .await
        .map_err(|error| ServiceError::Derive {
            route: name.clone(),
            broker: wiring.broker.kind(),
            part: "parts",
            source: Box::new(error),
        })?;
    let publisher = if <Answer<F, Args, S> as RouteResponse>::PUBLISHES {
        Some(wiring.publisher(&name).await?)
    } else {
        None
    };
    let settled = <Answer<F, Args, S> as RouteResponse>::settle(app.handler(handler), publisher)
        .ok_or_else(|| ServiceError::Derive {
            route: name.clone(),
            broker: wiring.broker.kind(),
            part: "publisher",
            source: "no publisher for a route that publishes".into(),
        })?;
    let parking = parts.parking.map(ParkingLayer::new);
    let retry = RetryLayer::new(route.backoff_policy());
    #[cfg(feature = "metrics")]
    let (measured, retry) = {
        let measured = wiring.metrics.layer(name.as_str());
        (measured.clone(), retry.observe(measured))
    };
    let stack = ServiceBuilder::new();
    #[cfg(feature = "metrics")]
    let stack = stack.layer(measured);
    let service = stack
        .layer(TraceLayer::new(name.as_str()))
        .layer(DeadLetterLayer::new(parts.dead_letter_sink))
        .option_layer(parking)
        .layer(retry)
        .layer(CatchPanicLayer::new())
        .service(settled);
    let builder = route.consumer_builder();
    #[cfg(feature = "metrics")]
    let builder = builder.observer(Arc::new(wiring.metrics.clone()));
    let consumer = builder
        .build(parts.source, parts.acker, service)
        .map_err(|error| ServiceError::Config {
            route: name.clone(),
            source: error,
        })?;
    Ok(app.route(name, consumer))
}

/// Adds a background task per route that reads its broker lag and parked
/// backlog into gauges.
#[cfg(feature = "metrics")]
async fn export_lag<B: Broker, S>(
    mut app: App<S>,
    wiring: &Wiring<B>,
    registry: &prometheus::Registry,
    routes: &[(String, Option<String>)],
    interval: Duration,
) -> Result<App<S>, ServiceError> {
    let metrics = crate::metrics::LagMetrics::register(registry)
        .map_err(|error| ServiceError::Metrics(Box::new(error)))?;
    for (source, group) in routes {
        let group: Option<&String> = group.as_ref();
        #[cfg(feature = "serde")]
        let group = wiring
            .routes
            .get(source)
            .and_then(|route| route.group.as_ref())
            .or(group);
        let group = group.map_or(&*wiring.group, String::as_str);
        let address = RouteAddress::new(source.as_str(), group);
        let probe =
            wiring
                .broker
                .lag_probe(&address)
                .await
                .map_err(|error| ServiceError::Derive {
                    route: source.clone(),
                    broker: wiring.broker.kind(),
                    part: "lag probe",
                    source: Box::new(error),
                })?;
        let exporter = crate::metrics::LagExporter::new(probe, &metrics);
        app = app.background(format!("lag of {address}"), move |stop| {
            exporter.run(interval, stop)
        });
    }
    Ok(app)
}
