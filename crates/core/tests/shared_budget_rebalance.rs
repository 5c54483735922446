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
    running.await.expect("join").expect("app");
    second_stop.cancel();
    second.await.expect("join").expect("second member");
}
