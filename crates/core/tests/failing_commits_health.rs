//! Liveness sees commits that keep failing (review 2026-12-04, R22): a
//! route whose every acknowledgement the broker refuses, while its handlers
//! succeed and its watermarks move, is not live once the failures have
//! lasted the stall window, and is live again once a commit succeeds.

#[path = "support/eventually.rs"]
mod eventually;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use eventually::eventually;
use intake_core::app::{App, Health, HealthSettings, Problem};
use intake_core::backend::{AckBatch, AckError, AckMode, Acker};
use intake_core::consumer::Consumer;
use intake_core::memory::{MemoryBroker, Record};
use intake_core::{HandlerError, Message};
use tokio_util::sync::CancellationToken;

/// The memory broker's acker, refusing every batch while `refuse` is set.
struct Refusing<A> {
    inner: A,
    refuse: Arc<AtomicBool>,
}

impl<A: Acker> Acker for Refusing<A> {
    fn mode(&self) -> AckMode {
        self.inner.mode()
    }

    fn supports_requeue(&self) -> bool {
        self.inner.supports_requeue()
    }

    async fn ack(&mut self, batch: &AckBatch) -> Result<(), AckError> {
        if self.refuse.load(Ordering::SeqCst) {
            return Err(AckError::Broker("the broker refuses every commit".into()));
        }
        self.inner.ack(batch).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_that_keep_failing_fail_liveness_until_one_succeeds() {
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 1).expect("topic");
    let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
    let refuse = Arc::new(AtomicBool::new(true));
    let acker = Refusing {
        inner: acker,
        refuse: Arc::clone(&refuse),
    };
    let handler = tower::service_fn(|_message: Message| async { Ok::<_, HandlerError>(()) });
    let health = Health::new(HealthSettings {
        stall_window: Duration::from_millis(300),
        rebalance_grace: Duration::ZERO,
        assignment_grace: Duration::from_secs(3_600),
        ..HealthSettings::default()
    });
    let stop = CancellationToken::new();
    let app = App::new().health(health.clone()).route(
        "orders",
        Consumer::builder()
            .commit_interval(Duration::from_millis(10))
            .build(source, acker, handler)
            .expect("settings"),
    );
    let running = tokio::spawn(app.run_until(stop.clone()));

    // Messages keep coming and every handler succeeds: the watermark moves,
    // only the commits fail.
    let mut failing = None;
    for id in 0..2_000u32 {
        broker
            .send("orders", Record::new(id.to_string()))
            .expect("send");
        let report = health.liveness();
        if !report.is_healthy() {
            failing = Some(report);
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let report = failing.expect("liveness fails once commits have failed for the stall window");
    let (_, problems) = &report.routes[0];
    assert!(
        matches!(problems.as_slice(), [Problem::CommitsFailing { .. }]),
        "{report}"
    );
    assert!(!health.is_ready(), "nor is it ready");

    refuse.store(false, Ordering::SeqCst);
    broker.send("orders", Record::new("after")).expect("send");
    eventually("live again once a commit succeeds", || health.is_live()).await;
    stop.cancel();
    running.await.expect("join").expect("app");
}
