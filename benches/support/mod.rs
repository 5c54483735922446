//! The harness shared by the pipeline benchmarks: one scenario per binary, on
//! the memory broker, a current-thread runtime and a prefilled topic.
//!
//! Each binary measures three things about the consume region (the function
//! [`consume_region`], marked `#[inline(never)]` so callgrind can toggle on it):
//! - messages per second: the best of several timed runs;
//! - heap allocations per message: `(A(2N) - A(N)) / N` with a counting
//!   global allocator, so fixed start-up costs cancel out;
//! - instructions per message: `benches/callgrind.sh <bench>` runs the binary
//!   under `valgrind --tool=callgrind --collect-atstart=no
//!   --toggle-collect=*consume_region*` with `--once N` and `--once 2N` and
//!   prints `(Ir(2N) - Ir(N)) / N`.
//!
//! The body is the 28-byte `{"id":1000000,"quantity":37}` the peer benchmark
//! used.

#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use intake::Message;
use intake::consumer::{Consumer, DeliveryOrder, RunReport};
use intake::memory::{MemoryBroker, Record};
use tokio_util::sync::CancellationToken;
use tower::Service;

/// The peer benchmark's body.
pub const ORDER_JSON: &[u8] = br#"{"id":1000000,"quantity":37}"#;

/// The struct the body decodes into.
#[derive(serde::Deserialize)]
pub struct Order {
    /// Order id.
    pub id: u64,
    /// Quantity.
    pub quantity: u32,
}

/// Counts heap allocations while [`COUNTING`] is set.
pub struct CountingAllocator;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(AtomicOrdering::Relaxed) {
            ALLOCATIONS.fetch_add(1, AtomicOrdering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(AtomicOrdering::Relaxed) {
            ALLOCATIONS.fetch_add(1, AtomicOrdering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Wraps the scenario's handler so the run stops after the last message. The
/// runtime calls its one handler instance in turn, so a plain counter does:
/// an add and a compare per message, on every variant.
pub struct StopAfterTarget<S> {
    inner: S,
    handled: u64,
    target: u64,
    stop: CancellationToken,
}

impl<S: Service<Message>> Service<Message> for StopAfterTarget<S> {
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
        self.handled += 1;
        if self.handled == self.target {
            self.stop.cancel();
        }
        self.inner.call(message)
    }
}

/// The consumer's shape: the peer benchmark's by default (4 partitions, no
/// keys, partition order, 256 in flight); `benches/scaling.rs` varies one
/// dimension at a time.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Partitions of the topic; records go round-robin, so consecutive
    /// deliveries of a fetch interleave partitions.
    pub partitions: u32,
    /// Distinct keys, assigned round-robin; `None` sends records without a key.
    pub keys: Option<u64>,
    /// The consumer's `max_in_flight`.
    pub max_in_flight: usize,
    /// The consumer's ordering.
    pub ordering: DeliveryOrder,
}

impl Default for Shape {
    fn default() -> Self {
        Self {
            partitions: 4,
            keys: None,
            max_in_flight: 256,
            ordering: DeliveryOrder::Partition,
        }
    }
}

fn prefilled(messages: u64, body: &'static [u8], shape: Shape) -> MemoryBroker {
    let broker = MemoryBroker::new();
    broker
        .create_topic("orders", shape.partitions)
        .expect("create the topic");
    let partitions = u64::from(shape.partitions);
    broker
        .send_batch(
            "orders",
            (0..messages).map(|index| {
                let record = Record::new(bytes::Bytes::from_static(body))
                    .to_partition((index % partitions) as u32);
                match shape.keys {
                    Some(keys) => record.with_key((index % keys).to_string()),
                    None => record,
                }
            }),
        )
        .expect("prefill");
    broker
}

/// Runs one consumer over the prefilled broker until `messages` were handled.
#[inline(never)]
pub fn consume_region<H>(
    runtime: &tokio::runtime::Runtime,
    broker: &MemoryBroker,
    messages: u64,
    shape: Shape,
    handler: H,
) -> RunReport
where
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<intake::HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    let token = CancellationToken::new();
    let (source, acker) = broker.consumer("orders", "bench").expect("join the group");
    let consumer = Consumer::builder()
        .max_in_flight(shape.max_in_flight)
        .max_uncommitted(shape.max_in_flight.max(100_000))
        .ordering(shape.ordering)
        .build(
            source,
            acker,
            StopAfterTarget {
                inner: handler,
                handled: 0,
                target: messages,
                stop: token.clone(),
            },
        )
        .expect("valid settings");
    runtime
        .block_on(consumer.run(token))
        .expect("the run succeeds")
}

/// Runs `work` and returns its result with the heap allocations made while it
/// ran (on any thread), for benchmarks with a consume region of their own.
pub fn allocations_during<R>(work: impl FnOnce() -> R) -> (R, u64) {
    ALLOCATIONS.store(0, AtomicOrdering::Relaxed);
    COUNTING.store(true, AtomicOrdering::Relaxed);
    let result = work();
    COUNTING.store(false, AtomicOrdering::Relaxed);
    (result, ALLOCATIONS.load(AtomicOrdering::Relaxed))
}

/// The command line: `--once N` (callgrind mode) and `--messages N`.
pub struct Args {
    /// Consume `N` messages once and exit (`benches/callgrind.sh`).
    pub once: Option<u64>,
    /// Messages of the timed runs (1,000,000 by default).
    pub messages: u64,
}

/// Parses `--once N` (callgrind mode) and `--messages N`.
pub fn args() -> Args {
    let mut args = Args {
        once: None,
        messages: 1_000_000,
    };
    let mut iter = std::env::args().skip(1);
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "--once" => args.once = iter.next().and_then(|n| n.parse().ok()),
            "--messages" => {
                if let Some(n) = iter.next().and_then(|n| n.parse().ok()) {
                    args.messages = n;
                }
            }
            _ => {} // `cargo bench` passes `--bench`
        }
    }
    args
}

/// The whole benchmark for one scenario, in the default shape.
pub fn main<H, F>(name: &str, body: &'static [u8], make_handler: F)
where
    F: Fn() -> H,
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<intake::HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    main_shaped(name, body, Shape::default(), make_handler);
}

/// The whole benchmark for one scenario in `shape`.
pub fn main_shaped<H, F>(name: &str, body: &'static [u8], shape: Shape, make_handler: F)
where
    F: Fn() -> H,
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<intake::HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let args = args();
    if let Some(messages) = args.once {
        let broker = prefilled(messages, body, shape);
        let report = consume_region(&runtime, &broker, messages, shape, make_handler());
        black_box(report);
        return;
    }
    let messages = args.messages;

    let allocations_for = |count: u64| {
        let broker = prefilled(count, body, shape);
        ALLOCATIONS.store(0, AtomicOrdering::Relaxed);
        COUNTING.store(true, AtomicOrdering::Relaxed);
        let report = consume_region(&runtime, &broker, count, shape, make_handler());
        COUNTING.store(false, AtomicOrdering::Relaxed);
        assert!(report.succeeded >= count, "every message was handled");
        ALLOCATIONS.load(AtomicOrdering::Relaxed)
    };
    let small = allocations_for(messages / 2);
    let large = allocations_for(messages);
    let per_message = (large as f64 - small as f64) / (messages / 2) as f64;

    let mut best = Duration::MAX;
    for _ in 0..5 {
        let broker = prefilled(messages, body, shape);
        let started = Instant::now();
        let report = consume_region(&runtime, &broker, messages, shape, make_handler());
        let elapsed = started.elapsed();
        assert!(report.succeeded >= messages);
        best = best.min(elapsed);
    }
    let rate = messages as f64 / best.as_secs_f64();
    println!(
        "{name}: {messages} messages, best of 5: {:.2} M msg/s; heap allocations per message: {per_message:.4} (A(N/2)={small}, A(N)={large})",
        rate / 1e6
    );
}
