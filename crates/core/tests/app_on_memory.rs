//! The app layer on the memory broker: routes under one shared budget,
//! startup hooks that abort the start, a drain on a token, a stop at once,
//! and a failing route named in the error.
//!
//! Waits for commits with `backend::testkit` (core's own tests always have
//! its `testkit` feature: see the dev-dependency in its manifest).

#[path = "support/eventually.rs"]
mod eventually;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use eventually::eventually;
use intake_core::app::{App, AppError, RouteOutcome};
use intake_core::backend::testkit::{assert_committed, wait_until_committed};
use intake_core::consumer::{Consumer, DeliveryOrder, SharedBudget};
use intake_core::memory::{MemoryBroker, Record};
use intake_core::{HandlerError, Message};
use tokio_util::sync::CancellationToken;

/// Handlers currently running, per route and in total, with the highest
/// total seen.
#[derive(Default)]
struct Gauge {
    total: AtomicUsize,
    peak_total: AtomicUsize,
    done: AtomicUsize,
}

impl Gauge {
    fn enter(&self) {
        let now = self.total.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak_total.fetch_max(now, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.total.fetch_sub(1, Ordering::SeqCst);
        self.done.fetch_add(1, Ordering::SeqCst);
    }
}

/// A handler that counts itself in `route` and `all`, then waits for `gate`.
fn gated_handler(
    route: Arc<Gauge>,
    all: Arc<Gauge>,
    gate: CancellationToken,
) -> impl tower::Service<
    Message,
    Response = (),
    Error = HandlerError,
    Future = impl Future<Output = Result<(), HandlerError>> + Send,
> + Send
+ 'static {
    tower::service_fn(move |_message: Message| {
        let (route, all, gate) = (route.clone(), all.clone(), gate.clone());
        async move {
            route.enter();
            all.enter();
            gate.cancelled().await;
            all.leave();
            route.leave();
            Ok::<_, HandlerError>(())
        }
    })
}

fn fill(broker: &MemoryBroker, topic: &str, count: usize) {
    broker.create_topic(topic, 4).expect("topic");
    for id in 0..count {
        broker
            .send(topic, Record::new(id.to_string()))
            .expect("send");
    }
}

/// How long a test waits for a route to commit what it was given.
const COMMITTED_WITHIN: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_together_stay_within_the_shared_budget_and_a_hot_route_leaves_room() {
    const SHARED: usize = 10;
    const ROUTE_CAP: usize = 7;
    let broker = MemoryBroker::new();
    fill(&broker, "hot", 200);
    fill(&broker, "cold", 20);
    let all = Arc::new(Gauge::default());
    let hot = Arc::new(Gauge::default());
    let cold = Arc::new(Gauge::default());
    let gate = CancellationToken::new();
    let budget = SharedBudget::new(SHARED, 64 << 20).expect("budget");

    let route = |topic: &str, gauge: &Arc<Gauge>| {
        let (source, acker) = broker.consumer(topic, "app").expect("consumer");
        Consumer::builder()
            .max_in_flight(ROUTE_CAP)
            .ordering(DeliveryOrder::Unordered)
            .commit_interval(Duration::from_millis(5))
            .build(
                source,
                acker,
                gated_handler(gauge.clone(), all.clone(), gate.clone()),
            )
            .expect("settings")
    };
    let app = App::new()
        .shared_budget(budget.clone())
        .route("hot", route("hot", &hot))
        .route("cold", route("cold", &cold));
    let stop = CancellationToken::new();
    let running = tokio::spawn(app.run_until(stop.clone()));

    // Every handler blocks: the budget fills, and stays full.
    eventually("the shared budget is full", || {
        all.total.load(Ordering::SeqCst) == SHARED
    })
    .await;
    // Each route holds at most its cap, so whichever started first left
    // the other at least the rest of the shared budget.
    for (name, gauge) in [("hot", &hot), ("cold", &cold)] {
        let held = gauge.total.load(Ordering::SeqCst);
        assert!(
            (SHARED - ROUTE_CAP..=ROUTE_CAP).contains(&held),
            "route {name} holds {held} of the shared {SHARED} (cap {ROUTE_CAP})"
        );
    }

    // Let them all through: the budget turns over many times, waking the
    // route that waits for room each time the other frees some.
    gate.cancel();
    for topic in ["hot", "cold"] {
        wait_until_committed(&broker, topic, "app", COMMITTED_WITHIN)
            .await
            .expect("both topics are consumed");
    }
    stop.cancel();
    let report = running.await.expect("join").expect("app");

    assert!(all.peak_total.load(Ordering::SeqCst) <= SHARED);
    assert_eq!(report.peak_shared_messages, Some(SHARED as u64));
    assert_eq!(budget.held(), (0, 0), "everything was given back");
    let succeeded = |name: &str| {
        report
            .route(name)
            .and_then(|route| route.report())
            .map(|run| run.succeeded)
    };
    assert_eq!(succeeded("hot"), Some(200));
    assert_eq!(succeeded("cold"), Some(20));
}

#[tokio::test]
async fn a_failed_startup_hook_consumes_nothing() {
    let broker = MemoryBroker::new();
    fill(&broker, "orders", 5);
    let handled = Arc::new(AtomicUsize::new(0));
    let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
    let counter = handled.clone();
    let consumer = Consumer::builder()
        .build(
            source,
            acker,
            tower::service_fn(move |_message: Message| {
                counter.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, HandlerError>(()) }
            }),
        )
        .expect("settings");
    let later_hook_ran = Arc::new(AtomicUsize::new(0));
    let later = later_hook_ran.clone();
    let error = App::new()
        .on_startup("migrate", async || {
            Err::<(), _>(std::io::Error::other("the database refused the migration"))
        })
        .on_startup("warm up", async move || {
            later.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(())
        })
        .route("orders", consumer)
        .run_until(CancellationToken::new())
        .await
        .expect_err("the start must fail");

    let AppError::Startup { hook, error } = &error else {
        panic!("expected a startup error, got {error:?}");
    };
    assert_eq!(hook, "migrate");
    assert_eq!(error.to_string(), "the database refused the migration");
    assert_eq!(later_hook_ran.load(Ordering::SeqCst), 0);
    assert_eq!(handled.load(Ordering::SeqCst), 0);
    assert_eq!(broker.lag("orders", "billing").expect("lag"), 5);

    // The next consumer of the group gets every message.
    let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
    let stop = CancellationToken::new();
    let app = App::new().route(
        "orders",
        Consumer::builder()
            .build(
                source,
                acker,
                tower::service_fn(|_message: Message| async { Ok::<_, HandlerError>(()) }),
            )
            .expect("settings"),
    );
    let running = tokio::spawn(app.run_until(stop.clone()));
    wait_until_committed(&broker, "orders", "billing", COMMITTED_WITHIN)
        .await
        .expect("the next consumer committed everything");
    stop.cancel();
    let report = running.await.expect("join").expect("app");
    assert_eq!(
        report
            .route("orders")
            .and_then(|r| r.report())
            .map(|r| r.succeeded),
        Some(5)
    );
}

#[tokio::test]
async fn a_token_drains_every_route_and_then_runs_the_shutdown_hooks() {
    let broker = MemoryBroker::new();
    fill(&broker, "orders", 3);
    let all = Arc::new(Gauge::default());
    let route = Arc::new(Gauge::default());
    let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
    let slow = tower::service_fn({
        let (all, route) = (all.clone(), route.clone());
        move |_message: Message| {
            let (all, route) = (all.clone(), route.clone());
            async move {
                all.enter();
                route.enter();
                // Still running when the stop comes: the drain waits for it.
                tokio::time::sleep(Duration::from_millis(50)).await;
                route.leave();
                all.leave();
                Ok::<_, HandlerError>(())
            }
        }
    });
    let hook_saw_done = Arc::new(AtomicUsize::new(usize::MAX));
    let (seen, done) = (hook_saw_done.clone(), all.clone());
    let stop = CancellationToken::new();
    let app = App::new()
        .drain_deadline(Duration::from_secs(60))
        .route(
            "orders",
            Consumer::builder()
                .ordering(DeliveryOrder::Unordered)
                .build(source, acker, slow)
                .expect("settings"),
        )
        .on_shutdown("flush", async move || {
            seen.store(done.done.load(Ordering::SeqCst), Ordering::SeqCst);
            Ok::<_, std::io::Error>(())
        });
    let running = tokio::spawn(app.run_until(stop.clone()));
    eventually("the handlers run", || all.total.load(Ordering::SeqCst) == 3).await;
    stop.cancel();
    let report = running.await.expect("join").expect("app");

    let RouteOutcome::Finished(run) = &report.routes[0].outcome else {
        panic!("expected a drained route: {report:?}");
    };
    assert_eq!(
        run.succeeded, 3,
        "the drain let the running handlers finish"
    );
    assert!(run.unfinished.is_empty());
    assert_eq!(
        hook_saw_done.load(Ordering::SeqCst),
        3,
        "the hook ran after the drain"
    );
    assert_committed(&broker, "orders", "billing");
}

#[tokio::test]
async fn a_second_stop_abandons_what_is_held_and_gives_the_budget_back() {
    let broker = MemoryBroker::new();
    fill(&broker, "orders", 4);
    let all = Arc::new(Gauge::default());
    let never = CancellationToken::new();
    let budget = SharedBudget::new(8, 1 << 20).expect("budget");
    let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
    let drain = CancellationToken::new();
    let stop_now = CancellationToken::new();
    let app = App::new()
        .shared_budget(budget.clone())
        .drain_deadline(Duration::from_secs(3_600))
        .route(
            "orders",
            Consumer::builder()
                .ordering(DeliveryOrder::Unordered)
                .build(
                    source,
                    acker,
                    gated_handler(Arc::new(Gauge::default()), all.clone(), never),
                )
                .expect("settings"),
        );
    let running = tokio::spawn(app.run_until_or_abort(drain.clone(), stop_now.clone()));
    eventually("the handlers run", || all.total.load(Ordering::SeqCst) == 4).await;
    drain.cancel();
    stop_now.cancel();
    let error = running.await.expect("join").expect_err("stopped at once");
    let AppError::StoppedAtOnce { report } = &error else {
        panic!("expected a stop at once, got {error:?}");
    };
    assert_eq!(report.routes[0].outcome, RouteOutcome::Abandoned);
    assert_eq!(
        budget.held(),
        (0, 0),
        "the abandoned route gave its room back"
    );
    assert_eq!(
        broker.lag("orders", "billing").expect("lag"),
        4,
        "nothing acknowledged"
    );
}

/// A handler service that stops accepting messages.
#[derive(Clone)]
struct Unavailable;

impl tower::Service<Message> for Unavailable {
    type Response = ();
    type Error = HandlerError;
    type Future = std::future::Ready<Result<(), HandlerError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), HandlerError>> {
        Poll::Ready(Err(HandlerError::permanent("the pool is closed")))
    }

    fn call(&mut self, _message: Message) -> Self::Future {
        std::future::ready(Ok(()))
    }
}

#[tokio::test]
async fn a_failing_route_stops_the_others_and_is_named() {
    let broker = MemoryBroker::new();
    fill(&broker, "orders", 2);
    fill(&broker, "payments", 2);
    let (orders, orders_acker) = broker.consumer("orders", "billing").expect("consumer");
    let (payments, payments_acker) = broker.consumer("payments", "audit").expect("consumer");
    let app = App::new()
        .route(
            "orders",
            Consumer::builder()
                .build(
                    orders,
                    orders_acker,
                    tower::service_fn(|_message: Message| async { Ok::<_, HandlerError>(()) }),
                )
                .expect("settings"),
        )
        .route(
            "payments",
            Consumer::builder()
                .build(payments, payments_acker, Unavailable)
                .expect("settings"),
        );
    // Never stopped from outside: the failure stops the app.
    let error = app
        .run_until(CancellationToken::new())
        .await
        .expect_err("a route fails");
    let AppError::Route { route, report, .. } = &error else {
        panic!("expected a route error, got {error:?}");
    };
    assert_eq!(route, "payments");
    assert_eq!(error.to_string(), "route `payments` failed");
    assert!(matches!(
        report.route("orders").map(|r| &r.outcome),
        Some(RouteOutcome::Finished(_))
    ));
}

#[tokio::test]
async fn routes_need_distinct_names() {
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 1).expect("topic");
    let consumer = || {
        let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
        Consumer::builder()
            .build(
                source,
                acker,
                tower::service_fn(|_message: Message| async { Ok::<_, HandlerError>(()) }),
            )
            .expect("settings")
    };
    let error = App::new()
        .route("orders", consumer())
        .route("orders", consumer())
        .run_until(CancellationToken::new())
        .await
        .expect_err("two routes named alike");
    let AppError::Config(config) = error else {
        panic!("expected a configuration error");
    };
    assert_eq!(config.setting, "routes");
}

#[cfg(feature = "metrics")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_lag_exporter_runs_beside_the_routes_and_stops_after_them() {
    use intake_core::handler::{Payload, handler_fn};
    use intake_core::metrics::{LagExporter, LagMetrics};

    let broker = MemoryBroker::new();
    fill(&broker, "orders", 40);
    let registry = intake_core::metrics::prometheus::Registry::new();
    let lag_metrics = LagMetrics::register(&registry).expect("register");
    let exporter = LagExporter::new(broker.topic_lag_probe("orders", "billing"), &lag_metrics);
    let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
    let consumer = Consumer::builder()
        .commit_interval(Duration::from_millis(5))
        .build(
            source,
            acker,
            handler_fn(|Payload(_): Payload| async { Ok::<_, HandlerError>(()) }),
        )
        .expect("settings");
    let stopped_after_routes = Arc::new(AtomicUsize::new(0));
    let witness = stopped_after_routes.clone();
    let drain = CancellationToken::new();
    let app = App::new()
        .route("billing", consumer)
        .background("broker lag", move |stop| {
            exporter.run(Duration::from_millis(10), stop)
        })
        .background("witness", move |stop| async move {
            stop.cancelled().await;
            witness.fetch_add(1, Ordering::SeqCst);
        });
    let running = tokio::spawn(app.run_until(drain.clone()));

    // The exporter runs while the route does: the broker's lag for the
    // group reaches 0 once the route has committed all 40.
    eventually("the exported lag is 0", || {
        lag_metrics.messages("orders", 0, "billing") == Some(0)
            && (1..4)
                .all(|partition| lag_metrics.messages("orders", partition, "billing") == Some(0))
    })
    .await;
    assert_eq!(
        stopped_after_routes.load(Ordering::SeqCst),
        0,
        "not stopped while the routes run"
    );

    drain.cancel();
    let report = running.await.expect("join").expect("the app drains");
    assert!(matches!(
        report.routes[0].outcome,
        RouteOutcome::Finished(_)
    ));
    assert_eq!(
        stopped_after_routes.load(Ordering::SeqCst),
        1,
        "the background task was told to stop, and awaited, before run returned"
    );
}
