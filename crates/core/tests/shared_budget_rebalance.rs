//! Routes under a shared budget while their groups rebalance (review R27):
//! a route whose fetched deliveries wait for shared room still hears of
//! revocations, so it never runs deliveries of a partition that went to
//! another member meanwhile.

#[path = "support/eventually.rs"]
mod eventually;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eventually::eventually;
use intake_core::app::App;
use intake_core::backend::{Limits, Source, SourceError, SourceEvent};
use intake_core::consumer::{Consumer, DeliveryOrder, SharedBudget};
use intake_core::memory::{MemoryBroker, MemorySource, Record};
use intake_core::{HandlerError, Message};
use tokio_util::sync::CancellationToken;

/// A memory source that counts what it hands to the runtime.
struct Counted {
    inner: MemorySource,
    /// The `max` of the latest call of `next`.
    asked: Arc<AtomicUsize>,
    delivered: Arc<AtomicUsize>,
    revoked: Arc<AtomicUsize>,
}

impl Source for Counted {
    async fn next(
        &mut self,
        deliveries: &mut Vec<Message>,
        max: usize,
    ) -> Result<SourceEvent, SourceError> {
        self.asked.store(max, Ordering::SeqCst);
        let event = self.inner.next(deliveries, max).await;
        match &event {
            Ok(SourceEvent::Delivered) => {
                self.delivered.fetch_add(deliveries.len(), Ordering::SeqCst);
            }
            Ok(SourceEvent::Revoked(_)) => {
                self.revoked.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
        event
    }

    fn set_limits(&mut self, limits: Limits) {
        self.inner.set_limits(limits);
    }

    async fn close(&mut self) -> Result<(), SourceError> {
        self.inner.close().await
    }
}

/// Who handled what: (member, partition, offset).
type Handled = Arc<Mutex<Vec<(&'static str, u32, String)>>>;

fn recording(
    member: &'static str,
    handled: Handled,
) -> impl tower::Service<
    Message,
    Response = (),
    Error = HandlerError,
    Future = impl Future<Output = Result<(), HandlerError>> + Send,
> + Send
+ 'static {
    tower::service_fn(move |message: Message| {
        let handled = handled.clone();
        async move {
            let metadata = message.metadata();
            if let Ok(mut handled) = handled.lock() {
                handled.push((
                    member,
                    metadata.partition(),
                    metadata.position().to_string(),
                ));
            }
            Ok::<_, HandlerError>(())
        }
    })
}

fn blocked_until(
    release: CancellationToken,
) -> impl tower::Service<
    Message,
    Response = (),
    Error = HandlerError,
    Future = impl Future<Output = Result<(), HandlerError>> + Send,
> + Send
+ 'static {
    tower::service_fn(move |_message: Message| {
        let release = release.clone();
        async move {
            release.cancelled().await;
            Ok::<_, HandlerError>(())
        }
    })
}

fn handled_by(handled: &Handled, member: &str, partition: u32) -> usize {
    handled
        .lock()
        .map(|handled| {
            handled
                .iter()
                .filter(|(who, p, _)| *who == member && *p == partition)
                .count()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_waiting_for_shared_room_are_not_run_after_their_partition_moved() {
    const SHARED: usize = 4;
    // Short, so that without the fix the partition moves on while the route
    // still waits for room.
    let broker = MemoryBroker::builder()
        .rebalance_timeout(Duration::from_millis(300))
        .build();
    broker.create_topic("orders", 2).expect("topic");
    broker.create_topic("hog", 1).expect("topic");
    let budget = SharedBudget::new(SHARED, 1 << 20).expect("budget");
    let handled: Handled = Arc::default();
    let release = CancellationToken::new();
    let delivered = Arc::new(AtomicUsize::new(0));
    let revoked = Arc::new(AtomicUsize::new(0));
    let asked = Arc::new(AtomicUsize::new(0));

    let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
    let orders = Counted {
        inner: source,
        asked: asked.clone(),
        delivered: delivered.clone(),
        revoked: revoked.clone(),
    };
    let (hog_source, hog_acker) = broker.consumer("hog", "hog").expect("consumer");
    let app = App::new()
        .shared_budget(budget.clone())
        .route(
            "orders",
            Consumer::builder()
                .max_in_flight(SHARED)
                .ordering(DeliveryOrder::Unordered)
                .commit_interval(Duration::from_millis(10))
                .build(orders, acker, recording("first", handled.clone()))
                .expect("settings"),
        )
        .route(
            "hog",
            Consumer::builder()
                .max_in_flight(SHARED)
                .ordering(DeliveryOrder::Unordered)
                .commit_interval(Duration::from_millis(10))
                .build(hog_source, hog_acker, blocked_until(release.clone()))
                .expect("settings"),
        );
    let stop = CancellationToken::new();
    let running = tokio::spawn(app.run_until(stop.clone()));

    // The orders route asks its (empty) topic for deliveries while the
    // shared budget is free; then the hog takes all of it.
    eventually("the orders route asks for deliveries", || {
        asked.load(Ordering::SeqCst) > 0
    })
    .await;
    for id in 0..SHARED {
        broker
            .send("hog", Record::new(id.to_string()))
            .expect("send");
    }
    eventually("the hog holds the whole shared budget", || {
        budget.held().0 == SHARED as u64
    })
    .await;

    // A delivery of partition 1 reaches the orders route, which has no
    // shared room for it: it waits.
    broker
        .send("orders", Record::new("stale").to_partition(1))
        .expect("send");
    eventually("the orders route fetched it", || {
        delivered.load(Ordering::SeqCst) == 1
    })
    .await;

    // A second member joins: partition 1 moves to it.
    let (second_source, second_acker) = broker.consumer("orders", "billing").expect("consumer");
    let second_stop = CancellationToken::new();
    let second = tokio::spawn(
        Consumer::builder()
            .ordering(DeliveryOrder::Unordered)
            .commit_interval(Duration::from_millis(10))
            .build(
                second_source,
                second_acker,
                recording("second", handled.clone()),
            )
            .expect("settings")
            .run(second_stop.clone()),
    );
    eventually("the second member handled partition 1's message", || {
        handled_by(&handled, "second", 1) == 1
    })
    .await;

    // Room comes back. A marker on partition 0, still the first route's,
    // is handled after anything the route held back.
    release.cancel();
    broker
        .send("orders", Record::new("marker").to_partition(0))
        .expect("send");
    eventually("the first route handled the marker", || {
        handled_by(&handled, "first", 0) == 1
    })
    .await;

    assert_eq!(
        handled_by(&handled, "first", 1),
        0,
        "the first route ran a delivery of partition 1 after it went to the second member \
         (handled: {:?}; revocations the first route fetched: {})",
        handled.lock().map(|h| h.clone()).unwrap_or_default(),
        revoked.load(Ordering::SeqCst)
    );

    stop.cancel();
    let report = running.await.expect("join").expect("app");
    let run = report
        .route("orders")
        .and_then(|route| route.report())
        .expect("the orders route's report");
    assert_eq!(
        run.released_on_revoke, 1,
        "the waiting delivery was released to the next owner"
    );
    second_stop.cancel();
    second.await.expect("join").expect("second member");
}

/// Records what the runtime reports about its waits for shared room.
#[derive(Default)]
struct Waits {
    reports: Mutex<Vec<Option<Duration>>>,
}

impl intake_core::observer::ConsumerObserver for Waits {
    fn on_shared_budget_wait(&self, waited: Option<Duration>) {
        if let Ok(mut reports) = self.reports.lock() {
            reports.push(waited);
        }
    }
}

impl Waits {
    fn last(&self) -> Option<Option<Duration>> {
        self.reports
            .lock()
            .ok()
            .and_then(|reports| reports.last().copied())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_the_others_starve_of_shared_room_says_so_until_it_gets_some() {
    const SHARED: usize = 8;
    const CAP: usize = 6;
    let broker = MemoryBroker::new();
    for topic in ["first", "second", "starved"] {
        broker.create_topic(topic, 1).expect("topic");
    }
    let budget = SharedBudget::new(SHARED, 1 << 20).expect("budget");
    let release = CancellationToken::new();
    let handled: Handled = Arc::default();
    let waits = Arc::new(Waits::default());
    let asked = Arc::new(AtomicUsize::new(0));

    let hog = |topic: &str| {
        let (source, acker) = broker.consumer(topic, "app").expect("consumer");
        Consumer::builder()
            .max_in_flight(CAP)
            .ordering(DeliveryOrder::Unordered)
            .commit_interval(Duration::from_millis(10))
            .build(source, acker, blocked_until(release.clone()))
            .expect("settings")
    };
    let (source, acker) = broker.consumer("starved", "app").expect("consumer");
    let starved = Counted {
        inner: source,
        asked: asked.clone(),
        delivered: Arc::default(),
        revoked: Arc::default(),
    };
    let app = App::new()
        .shared_budget(budget.clone())
        .route(
            "starved",
            Consumer::builder()
                .max_in_flight(CAP)
                .ordering(DeliveryOrder::Unordered)
                .commit_interval(Duration::from_millis(10))
                .observer(waits.clone())
                .build(starved, acker, recording("starved", handled.clone()))
                .expect("settings"),
        )
        .route("first", hog("first"))
        .route("second", hog("second"));
    let stop = CancellationToken::new();
    let running = tokio::spawn(app.run_until(stop.clone()));

    eventually("the starved route asks for deliveries", || {
        asked.load(Ordering::SeqCst) > 0
    })
    .await;
    // The two others take the whole shared budget and keep it.
    for id in 0..CAP {
        for topic in ["first", "second"] {
            broker
                .send(topic, Record::new(id.to_string()))
                .expect("send");
        }
    }
    eventually("the others hold the whole shared budget", || {
        budget.held().0 == SHARED as u64
    })
    .await;
    broker.send("starved", Record::new("waits")).expect("send");
    eventually("the starved route says it waits for room", || {
        matches!(waits.last(), Some(Some(_)))
    })
    .await;
    eventually("and says so again while it waits, for longer", || {
        let reports = waits.reports.lock().map(|r| r.clone()).unwrap_or_default();
        reports.len() >= 3 && reports.windows(2).all(|pair| pair[0] < pair[1])
    })
    .await;
    assert!(handled.lock().map(|h| h.is_empty()).unwrap_or(false));

    release.cancel();
    eventually("the starved route says the wait is over", || {
        waits.last() == Some(None)
    })
    .await;
    eventually("and handles its message", || {
        handled.lock().map(|h| h.len() == 1).unwrap_or(false)
    })
    .await;
    stop.cancel();
    running.await.expect("join").expect("app");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starved_route_is_not_ready_until_it_gets_room() {
    const SHARED: usize = 4;
    let broker = MemoryBroker::new();
    for topic in ["hog", "starved"] {
        broker.create_topic(topic, 1).expect("topic");
    }
    let budget = SharedBudget::new(SHARED, 1 << 20).expect("budget");
    let release = CancellationToken::new();
    let asked = Arc::new(AtomicUsize::new(0));
    let health = intake_core::app::Health::new(intake_core::app::HealthSettings {
        stall_window: Duration::from_millis(200),
        rebalance_grace: Duration::ZERO,
        assignment_grace: Duration::ZERO,
        ..intake_core::app::HealthSettings::default()
    });
    let (hog_source, hog_acker) = broker.consumer("hog", "app").expect("consumer");
    let (source, acker) = broker.consumer("starved", "app").expect("consumer");
    let starved = Counted {
        inner: source,
        asked: asked.clone(),
        delivered: Arc::default(),
        revoked: Arc::default(),
    };
    let app = App::new()
        .shared_budget(budget.clone())
        .health(health.clone())
        .route(
            "starved",
            Consumer::builder()
                .max_in_flight(SHARED)
                .commit_interval(Duration::from_millis(10))
                .build(starved, acker, recording("starved", Handled::default()))
                .expect("settings"),
        )
        .route(
            "hog",
            Consumer::builder()
                .max_in_flight(SHARED)
                .ordering(DeliveryOrder::Unordered)
                .commit_interval(Duration::from_millis(10))
                .build(hog_source, hog_acker, blocked_until(release.clone()))
                .expect("settings"),
        );
    let stop = CancellationToken::new();
    let running = tokio::spawn(app.run_until(stop.clone()));
    eventually("the starved route asks for deliveries", || {
        asked.load(Ordering::SeqCst) > 0
    })
    .await;
    for id in 0..SHARED {
        broker
            .send("hog", Record::new(id.to_string()))
            .expect("send");
    }
    eventually("the hog holds the whole shared budget", || {
        budget.held().0 == SHARED as u64
    })
    .await;
    broker.send("starved", Record::new("waits")).expect("send");
    eventually("readiness names the starved route", || {
        let report = health.readiness();
        report.routes.iter().any(|(route, problems)| {
            route == "starved"
                && problems.iter().any(|problem| {
                    problem
                        .to_string()
                        .starts_with("no room in the shared budget")
                })
        })
    })
    .await;
    assert!(
        health
            .readiness()
            .routes
            .iter()
            .all(|(route, problems)| route == "starved" || problems.is_empty()),
        "only the starved route: {}",
        health.readiness()
    );
    release.cancel();
    eventually("ready again once it gets room", || health.is_ready()).await;
    stop.cancel();
    running.await.expect("join").expect("app");
}
