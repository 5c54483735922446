//! Apps: routes under one shared budget, and a failed startup.

use super::handlers::{recording, recording_after};
use crate::app::App;
use crate::backend::testkit::harness::{Ledger, numbered, unique_group};
use crate::backend::testkit::{Backend, ConnectSettings};
use crate::consumer::{Consumer, DeliveryOrder, SharedBudget};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Two routes of one app, each on a source of its own, under one shared
/// in-flight budget: every message reaches its own route's handler, the
/// budget is never exceeded, and after the app stops everything handled is
/// acknowledged.
pub async fn an_app_runs_two_routes_under_one_budget<B: Backend>(backend: &B) {
    const BUDGET: usize = 8;
    let orders = backend.create_source(1).await.expect("create a source");
    let payments = backend.create_source(1).await.expect("create a source");
    let group = unique_group("app");
    // Orders are ids 0..100, payments 100..200: a message on the wrong
    // route would show in the other's ledger.
    backend
        .produce(&orders, numbered(0, 100))
        .await
        .expect("produce");
    backend
        .produce(&payments, numbered(100, 100))
        .await
        .expect("produce");
    let (orders_seen, payments_seen) = (Ledger::default(), Ledger::default());
    let budget = SharedBudget::new(BUDGET, 1 << 30).expect("a budget");
    let mut app = App::new().shared_budget(budget.clone());
    for (name, source, ledger) in [
        ("orders", &orders, &orders_seen),
        ("payments", &payments, &payments_seen),
    ] {
        let (source, acker) = backend
            .connect(source, &group, ConnectSettings { max_in_flight: 64 })
            .await
            .expect("connect");
        let consumer = Consumer::builder()
            .ordering(DeliveryOrder::Unordered)
            .max_in_flight(64)
            .commit_interval(Duration::from_millis(20))
            .build(
                source,
                acker,
                recording_after(ledger, Some(Duration::from_millis(1))),
            )
            .expect("settings");
        app = app.route(name, consumer);
    }
    let stop = CancellationToken::new();
    let running = tokio::spawn(app.run_until(stop.clone()));
    orders_seen.wait_for_all(100, "every order").await;
    payments_seen
        .wait_until("every payment", || payments_seen.distinct() == 100)
        .await;
    assert_eq!(
        payments_seen.missing(200),
        (0..100).collect::<Vec<_>>(),
        "{}: payments reached only the payments route",
        backend.name()
    );
    assert_eq!(
        orders_seen.distinct(),
        100,
        "and orders only the orders route"
    );
    stop.cancel();
    let report = running
        .await
        .expect("the app task")
        .expect("a stop is not a failure");
    assert_eq!(report.routes.len(), 2);
    let peak = budget.peak_messages();
    assert!(
        (1..=BUDGET as u64).contains(&peak),
        "{}: the shared budget held {peak} at most, against {BUDGET}",
        backend.name()
    );
    for source in [&orders, &payments] {
        assert_eq!(
            backend
                .unacknowledged(source, &group)
                .await
                .expect("inspect"),
            0,
            "{}: everything handled is acknowledged after the app stopped",
            backend.name()
        );
    }
}

/// A startup hook that fails stops the app before any route consumes: the
/// handler never runs, and every message is still there for the next start.
pub async fn a_failed_startup_consumes_nothing<B: Backend>(backend: &B) {
    let source = backend.create_source(1).await.expect("create the source");
    let group = unique_group("startup");
    backend
        .produce(&source, numbered(0, 10))
        .await
        .expect("produce");
    let seen = Ledger::default();
    let (connected, acker) = backend
        .connect(&source, &group, ConnectSettings { max_in_flight: 16 })
        .await
        .expect("connect");
    let consumer = Consumer::builder()
        .build(connected, acker, recording(&seen))
        .expect("settings");
    let app = App::new()
        .on_startup("migrate", || async {
            Err::<(), _>(std::io::Error::other("the database refused the migration"))
        })
        .route("orders", consumer);
    let ended = tokio::time::timeout(
        Duration::from_secs(30),
        app.run_until(CancellationToken::new()),
    )
    .await
    .expect("a failed start returns at once");
    let error = ended.expect_err("the start failed");
    assert!(
        error.to_string().contains("migrate"),
        "the error names the hook: {error}"
    );
    assert_eq!(seen.distinct(), 0, "no handler ran");
    assert_eq!(
        backend
            .unacknowledged(&source, &group)
            .await
            .expect("inspect"),
        10,
        "{}: every message is still there",
        backend.name()
    );
}
