//! Readiness beyond acknowledgements: a source that cannot reach its broker
//! while it reconnects on its own, and a consumer backing off for longer
//! than the grace.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use intake_core::app::{App, Health, HealthSettings, Problem};
use intake_core::backend::{Limits, Reachability, Source, SourceError, SourceEvent};
use intake_core::consumer::Consumer;
use intake_core::memory::{MemoryBroker, MemorySource, Record};
use intake_core::{Constant, HandlerError, Message};
use tokio_util::sync::CancellationToken;

/// Waits (bounded) until `condition` holds.
async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    for _ in 0..2_000 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting until {what}");
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
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 1).expect("topic");
    let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
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
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 1).expect("topic");
    let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
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
