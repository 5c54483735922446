//! What an [`App`] costs per message over the consumers it runs: two routes
//! against the same two consumers spawned by hand, on the memory broker.
//!
//! Two topics (`orders`, `payments`) of 4 partitions each, half of the
//! messages in each, the pipeline benchmarks' shape per consumer (256 in
//! flight, partition order, a no-op raw-bytes handler) and their harness
//! (`support/mod.rs`: a current-thread runtime, allocations as
//! `(A(N) - A(N/2)) / (N/2)`, instructions per message from
//! `benches/callgrind.sh app_routes N`). The variant comes from
//! `INTAKE_BENCH_ROUTES`:
//! - `consumers` (the default): two `Consumer::run` futures spawned on the
//!   runtime and awaited, as a service without the app layer writes it;
//! - `app`: the same two consumers as routes of one `App::run_until`;
//! - `consumers-shared` and `app-shared`: both under one `SharedBudget` of
//!   their caps together (512), so it never binds: the cost of its
//!   accounting, not of routes waiting on each other. The consumers get it
//!   from `ConsumerBuilder::shared_budget`, the app from
//!   `App::shared_budget`.
//!
//! Each run stops when both routes together handled every message.

mod support;

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use intake::Message;
use intake::app::App;
use intake::consumer::{Consumer, DeliveryOrder, RunReport, SharedBudget};
use intake::handler::{Payload, handler_fn};
use intake::memory::{MemoryBroker, Record};
use support::{CountingAllocator, ORDER_JSON, allocations_during};
use tokio_util::sync::CancellationToken;
use tower::Service;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const TOPICS: [&str; 2] = ["orders", "payments"];
const PARTITIONS: u32 = 4;
const MAX_IN_FLIGHT: usize = 256;

/// How the two consumers run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Consumers,
    ConsumersShared,
    App,
    AppShared,
}

impl Variant {
    fn shared(self) -> bool {
        matches!(self, Self::ConsumersShared | Self::AppShared)
    }
}

fn variant() -> Variant {
    match std::env::var("INTAKE_BENCH_ROUTES").as_deref() {
        Ok("app") => Variant::App,
        Ok("app-shared") => Variant::AppShared,
        Ok("consumers-shared") => Variant::ConsumersShared,
        _ => Variant::Consumers,
    }
}

/// Counts down the messages of both routes and stops the run at the last:
/// one atomic decrement per message, the same in every variant.
struct StopAfterAll<S> {
    inner: S,
    left: Arc<AtomicU64>,
    stop: CancellationToken,
}

impl<S: Service<Message>> Service<Message> for StopAfterAll<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, message: Message) -> S::Future {
        if self.left.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.stop.cancel();
        }
        self.inner.call(message)
    }
}

fn prefilled(per_topic: u64) -> MemoryBroker {
    let broker = MemoryBroker::new();
    for topic in TOPICS {
        broker
            .create_topic(topic, PARTITIONS)
            .expect("create the topic");
        broker
            .send_batch(
                topic,
                (0..per_topic).map(|index| {
                    Record::new(bytes::Bytes::from_static(ORDER_JSON))
                        .to_partition((index % u64::from(PARTITIONS)) as u32)
                }),
            )
            .expect("prefill");
    }
    broker
}

/// Runs both consumers over the prefilled broker until `messages` (both
/// topics together) were handled; returns each one's report.
#[inline(never)]
fn consume_region(
    runtime: &tokio::runtime::Runtime,
    broker: &MemoryBroker,
    messages: u64,
    variant: Variant,
) -> Vec<RunReport> {
    let stop = CancellationToken::new();
    let left = Arc::new(AtomicU64::new(messages));
    let budget = SharedBudget::new(2 * MAX_IN_FLIGHT, 1 << 30).expect("budget");
    let consumer = |topic: &str| {
        let (source, acker) = broker.consumer(topic, "bench").expect("join the group");
        let builder = match variant {
            Variant::ConsumersShared => Consumer::builder().shared_budget(budget.clone()),
            _ => Consumer::builder(),
        };
        builder
            .max_in_flight(MAX_IN_FLIGHT)
            .max_uncommitted(100_000)
            .ordering(DeliveryOrder::Partition)
            .build(
                source,
                acker,
                StopAfterAll {
                    inner: handler_fn(|Payload(payload): Payload| async move {
                        black_box(payload.len());
                    }),
                    left: left.clone(),
                    stop: stop.clone(),
                },
            )
            .expect("valid settings")
    };
    let [orders, payments] = TOPICS.map(consumer);
    runtime.block_on(async {
        match variant {
            Variant::Consumers | Variant::ConsumersShared => {
                let orders = tokio::spawn(orders.run(stop.clone()));
                let payments = tokio::spawn(payments.run(stop.clone()));
                vec![
                    orders.await.expect("join").expect("the run succeeds"),
                    payments.await.expect("join").expect("the run succeeds"),
                ]
            }
            Variant::App | Variant::AppShared => {
                let mut app = App::new();
                if variant.shared() {
                    app = app.shared_budget(budget.clone());
                }
                let report = app
                    .route("orders", orders)
                    .route("payments", payments)
                    .run_until(stop.clone())
                    .await
                    .expect("the app succeeds");
                report
                    .routes
                    .iter()
                    .map(|route| route.report().expect("a finished route").clone())
                    .collect()
            }
        }
    })
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let variant = variant();
    let args = support::args();
    if let Some(messages) = args.once {
        let broker = prefilled(messages / 2);
        black_box(consume_region(&runtime, &broker, messages, variant));
        return;
    }
    let messages = args.messages;
    let run = |count: u64| {
        let broker = prefilled(count / 2);
        let started = Instant::now();
        let (reports, allocations) =
            allocations_during(|| consume_region(&runtime, &broker, count, variant));
        let elapsed = started.elapsed();
        let handled: u64 = reports.iter().map(|report| report.succeeded).sum();
        assert!(handled >= count, "every message was handled");
        (elapsed, allocations)
    };
    let (_, small) = run(messages / 2);
    let (_, large) = run(messages);
    let per_message = (large as f64 - small as f64) / (messages / 2) as f64;
    let best = (0..5)
        .map(|_| run(messages).0)
        .min()
        .unwrap_or(Duration::MAX);
    println!(
        "app_routes {variant:?}: {messages} messages over 2 topics, best of 5: {:.2} M msg/s; heap allocations per message: {per_message:.4} (A(N/2)={small}, A(N)={large})",
        messages as f64 / best.as_secs_f64() / 1e6
    );
}
