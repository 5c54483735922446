//! Health's transitions beyond a stall: a source that cannot reach its
//! broker while it reconnects on its own, a consumer backing off for longer
//! than the grace, a stop (not ready from its first moment, while the
//! drain still runs) and a long rebalance (a stuck partition stays live
//! within the rebalance grace).

#[path = "support/eventually.rs"]
mod eventually;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use eventually::eventually;
use intake_core::app::{App, Health, HealthSettings, Problem};
use intake_core::backend::{Limits, Reachability, Source, SourceError, SourceEvent};
use intake_core::consumer::Consumer;
use intake_core::memory::{MemoryAcker, MemoryBroker, MemorySource, Record};
use intake_core::{Constant, HandlerError, Message};
use tokio_util::sync::CancellationToken;

/// A memory broker with an `orders` topic of `partitions`, and a member
/// of group `billing` on it.
fn orders(partitions: u32) -> (MemoryBroker, MemorySource, MemoryAcker) {
    let broker = MemoryBroker::new();
    broker.create_topic("orders", partitions).expect("topic");
    let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
    (broker, source, acker)
}

fn settings() -> HealthSettings {
    HealthSettings {
        rebalance_grace: Duration::ZERO,
        backoff_grace: Duration::from_millis(200),
        ..HealthSettings::default()
    }
}

/// The memory source, with a reachability mark the test sets, as a source
/// whose client reconnects on its own would.
struct Reconnecting {
    inner: MemorySource,
    reachability: Reachability,
}

impl Source for Reconnecting {
    async fn next(
        &mut self,
        deliveries: &mut Vec<Message>,
        max: usize,
    ) -> Result<SourceEvent, SourceError> {
        self.inner.next(deliveries, max).await
    }

    fn set_limits(&mut self, limits: Limits) {
        self.inner.set_limits(limits);
    }

    fn reachability(&self) -> Option<Reachability> {
        Some(self.reachability.clone())
    }

    async fn close(&mut self) -> Result<(), SourceError> {
        self.inner.close().await
    }
}

#[tokio::test]
async fn a_source_that_cannot_reach_its_broker_makes_the_route_unready() {
    let (broker, source, acker) = orders(1);
    let reachability = Reachability::new();
    let source = Reconnecting {
        inner: source,
        reachability: reachability.clone(),
    };
    let handler = tower::service_fn(|_message: Message| async { Ok::<_, HandlerError>(()) });
    let health = Health::new(settings());
    let stop = CancellationToken::new();
    let app = App::new().health(health.clone()).route(
        "orders",
        Consumer::builder()
            .commit_interval(Duration::from_millis(10))
            .build(source, acker, handler)
            .expect("settings"),
    );
    let running = tokio::spawn(app.run_until(stop.clone()));
    broker.send("orders", Record::new("o-1")).expect("send");
    eventually("the app is ready", || health.is_ready()).await;

    reachability.unreachable();
    eventually("not ready while the broker is unreachable", || {
        !health.is_ready()
    })
    .await;
    let report = health.readiness();
    assert!(
        matches!(report.routes[0].1.as_slice(), [Problem::Unreachable { .. }]),
        "{report}"
    );
    assert!(health.is_live(), "an outage is a readiness matter");

    reachability.reachable();
    eventually("ready again once it reconnects", || health.is_ready()).await;
    stop.cancel();
    running.await.expect("join").expect("app");
}

#[tokio::test]
async fn a_consumer_backing_off_longer_than_the_grace_is_not_ready() {
    let (broker, source, acker) = orders(1);
    let failing = Arc::new(AtomicBool::new(true));
    let handler = tower::service_fn({
        let failing = failing.clone();
        move |_message: Message| {
            let failing = failing.load(Ordering::SeqCst);
            async move {
                if failing {
                    Err(HandlerError::retryable("the database is down"))
                } else {
                    Ok(())
                }
            }
        }
    });
    let health = Health::new(settings());
    let stop = CancellationToken::new();
    let app = App::new().health(health.clone()).route(
        "orders",
        Consumer::builder()
            .commit_interval(Duration::from_millis(10))
            .backoff(Constant::new(Duration::from_millis(50)))
            .build(source, acker, handler)
            .expect("settings"),
    );
    let running = tokio::spawn(app.run_until(stop.clone()));
    broker.send("orders", Record::new("o-1")).expect("send");
    eventually("not ready once backing off past the grace", || {
        health.readiness().routes.iter().any(|(_, problems)| {
            problems
                .iter()
                .any(|p| matches!(p, Problem::BackingOff { .. }))
        })
    })
    .await;
    assert!(health.is_live(), "backing off is a readiness matter");

    failing.store(false, Ordering::SeqCst);
    eventually("ready again once the handler succeeds", || {
        health.is_ready()
    })
    .await;
    stop.cancel();
    running.await.expect("join").expect("app");
}

#[tokio::test]
async fn a_stop_is_not_ready_from_its_first_moment_until_the_drain_ends() {
    let (broker, source, acker) = orders(1);
    let started = CancellationToken::new();
    let release = CancellationToken::new();
    let handler = tower::service_fn({
        let (started, release) = (started.clone(), release.clone());
        move |_message: Message| {
            let (started, release) = (started.clone(), release.clone());
            async move {
                started.cancel();
                release.cancelled().await;
                Ok::<_, HandlerError>(())
            }
        }
    });
    let health = Health::new(settings());
    let stop = CancellationToken::new();
    let app = App::new()
        .health(health.clone())
        .drain_deadline(Duration::from_secs(30))
        .route(
            "orders",
            Consumer::builder()
                .commit_interval(Duration::from_millis(10))
                .build(source, acker, handler)
                .expect("settings"),
        );
    let running = tokio::spawn(app.run_until(stop.clone()));
    broker.send("orders", Record::new("o-1")).expect("send");
    started.cancelled().await;
    eventually("the app is ready", || health.is_ready()).await;

    stop.cancel();
    eventually("not ready once the stop began", || !health.is_ready()).await;
    let report = health.readiness();
    assert!(
        matches!(report.routes[0].1.as_slice(), [Problem::Stopping]),
        "{report}"
    );
    assert!(
        !running.is_finished(),
        "readiness fell while the handler still ran: a load balancer stops first"
    );
    release.cancel();
    let report = running.await.expect("join").expect("app");
    assert_eq!(
        report.routes[0].report().map(|run| run.succeeded),
        Some(1),
        "the drain finished the handler"
    );
    let ended = health.readiness();
    assert!(
        matches!(ended.routes[0].1.as_slice(), [Problem::NotRunning]),
        "{ended}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_rebalance_keeps_a_stuck_partition_live_within_the_grace() {
    let (broker, source, acker) = orders(2);
    let stuck = CancellationToken::new();
    let release = CancellationToken::new();
    let handler = tower::service_fn({
        let (stuck, release) = (stuck.clone(), release.clone());
        move |message: Message| {
            let (stuck, release) = (stuck.clone(), release.clone());
            async move {
                if message.metadata().partition() == 0 {
                    stuck.cancel();
                    release.cancelled().await;
                }
                Ok::<_, HandlerError>(())
            }
        }
    });
    let stall_window = Duration::from_millis(200);
    let health = Health::new(HealthSettings {
        stall_window,
        rebalance_grace: Duration::from_secs(30),
        assignment_grace: Duration::ZERO,
        ..HealthSettings::default()
    });
    let stop = CancellationToken::new();
    let app = App::new().health(health.clone()).route(
        "orders",
        Consumer::builder()
            .commit_interval(Duration::from_millis(10))
            .revoke_timeout(Duration::from_secs(30))
            .build(source, acker, handler)
            .expect("settings"),
    );
    let running = tokio::spawn(app.run_until(stop.clone()));
    for partition in 0..2u32 {
        broker
            .send("orders", Record::new("o").to_partition(partition))
            .expect("send");
    }
    stuck.cancelled().await;
    // A second member joins: the group rebalances while a handler of the
    // first is stuck, and the revocation waits for it (up to 30 s).
    let (other_source, other_acker) = broker.consumer("orders", "billing").expect("consumer");
    let other_stop = CancellationToken::new();
    let other = tokio::spawn(
        Consumer::builder()
            .build(
                other_source,
                other_acker,
                tower::service_fn(|_m: Message| async { Ok::<_, HandlerError>(()) }),
            )
            .expect("settings")
            .run(other_stop.clone()),
    );
    // Five stall windows: without the rebalance grace, the stuck partition
    // would fail liveness after one.
    for _ in 0..50 {
        let report = health.liveness();
        assert!(report.is_healthy(), "live during the rebalance: {report}");
        tokio::time::sleep(stall_window / 10).await;
    }
    release.cancel();
    other_stop.cancel();
    stop.cancel();
    other.await.expect("join").expect("run");
    running.await.expect("join").expect("app");
}
