//! Per-message cost of the built-in layers, for callgrind.
//!
//! `layer_cost <stack> <messages>` sends `messages` messages through one
//! stack over a handler that succeeds at once, polling each future once.
//! Each message goes through [`handle`], which is never inlined: callgrind,
//! told to count only inside it (`--toggle-collect`), measures exactly
//! `poll_ready` + `call` + `poll` + dropping the message, and nothing of the
//! setup. Subtract the `bare` stack's figure to get what the layers add.
//! `layer_cost_callgrind.sh` does that for every stack.
//!
//! Without arguments (as `cargo bench` runs it) it checks that every stack
//! handles a message, so the benchmark cannot rot.

use std::future::Future;
use std::hint::black_box;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use intake_core::catch_panic::CatchPanicLayer;
use intake_core::dead_letter::{DeadLetter, DeadLetterError, DeadLetterLayer, DeadLetterSink};
use intake_core::metrics::Metrics;
use intake_core::retry::RetryLayer;
use intake_core::trace::TraceLayer;
use intake_core::{
    Exponential, Headers, Json, Message, Metadata, Position, SourceName, handler_fn,
};
use pin_project_lite::pin_project;
use tower::{Layer, Service, ServiceBuilder};

#[path = "../tests/support/succeed.rs"]
mod succeed;

use succeed::Succeed;

/// The cheapest layer a user can write: forwards the call and the future.
/// Its cost is the floor for any layer.
#[derive(Clone, Copy)]
struct PassThroughLayer;

#[derive(Clone, Copy)]
struct PassThrough<S>(S);

impl<S> Layer<S> for PassThroughLayer {
    type Service = PassThrough<S>;

    fn layer(&self, inner: S) -> PassThrough<S> {
        PassThrough(inner)
    }
}

pin_project! {
    struct PassThroughFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F: Future> Future for PassThroughFuture<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.project().inner.poll(cx)
    }
}

impl<S: Service<Message>> Service<Message> for PassThrough<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = PassThroughFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, message: Message) -> Self::Future {
        PassThroughFuture {
            inner: self.0.call(message),
        }
    }
}

/// What the `json` stack decodes: no field that allocates.
#[derive(serde::Deserialize)]
struct Order {
    id: u64,
    quantity: u32,
}

struct UnusedSink;

#[async_trait::async_trait]
impl DeadLetterSink for UnusedSink {
    async fn write(&self, _letter: &DeadLetter) -> Result<(), DeadLetterError> {
        Ok(())
    }
}

fn messages(count: usize) -> Vec<Message> {
    let source: SourceName = "orders".into();
    let headers: Headers = [("content-type", Bytes::from_static(b"application/json"))]
        .into_iter()
        .collect();
    (0..count)
        .map(|offset| {
            Message::new(
                Bytes::from_static(br#"{"id":1,"quantity":2}"#),
                Metadata::new(source.clone(), 0, Position::Offset(offset as i64)),
            )
            .with_key(Bytes::from_static(b"customer-1"))
            .with_headers(headers.clone())
        })
        .collect()
}

/// One message through the stack: what callgrind measures.
#[inline(never)]
fn handle<S>(service: &mut S, message: Message, cx: &mut Context<'_>) -> bool
where
    S: Service<Message, Response = ()>,
{
    if !matches!(service.poll_ready(cx), Poll::Ready(Ok(()))) {
        return false;
    }
    let outcome = pin!(service.call(message)).poll(cx);
    matches!(outcome, Poll::Ready(Ok(())))
}

/// Sends `count` messages through `service`, after one that warms caches
/// (the metrics layer resolves its series on the first message).
fn run<S>(mut service: S, count: usize)
where
    S: Service<Message, Response = ()>,
{
    let mut cx = Context::from_waker(Waker::noop());
    let mut messages = messages(count + 1);
    let mut handled = 0;
    for message in messages.drain(..) {
        if handle(&mut service, black_box(message), &mut cx) {
            handled += 1;
        }
    }
    let count = count + 1;
    if handled != count {
        eprintln!("{} of {count} messages failed", count - handled);
        std::process::exit(2);
    }
}

const STACKS: &[&str] = &[
    "bare",
    "passthrough1",
    "passthrough4",
    "retry",
    "catch_panic",
    "trace",
    "metrics",
    "dead_letter",
    "full",
    "json",
];

fn run_stack(stack: &str, count: usize) -> bool {
    match stack {
        "bare" => run(Succeed, count),
        "passthrough1" => run(PassThroughLayer.layer(Succeed), count),
        "passthrough4" => run(
            ServiceBuilder::new()
                .layer(PassThroughLayer)
                .layer(PassThroughLayer)
                .layer(PassThroughLayer)
                .layer(PassThroughLayer)
                .service(Succeed),
            count,
        ),
        "retry" => run(
            RetryLayer::new(Exponential::default()).layer(Succeed),
            count,
        ),
        "catch_panic" => run(CatchPanicLayer::new().layer(Succeed), count),
        "trace" => run(TraceLayer::new("orders").layer(Succeed), count),
        "metrics" => {
            let registry = prometheus::Registry::new();
            let Ok(metrics) = Metrics::register(&registry) else {
                return false;
            };
            run(metrics.layer("orders").layer(Succeed), count);
        }
        "dead_letter" => run(DeadLetterLayer::new(UnusedSink).layer(Succeed), count),
        "full" => {
            let registry = prometheus::Registry::new();
            let Ok(metrics) = Metrics::register(&registry) else {
                return false;
            };
            let measured = metrics.layer("orders");
            run(
                ServiceBuilder::new()
                    .layer(measured.clone())
                    .layer(TraceLayer::new("orders"))
                    .layer(DeadLetterLayer::new(UnusedSink))
                    .layer(RetryLayer::new(Exponential::default()).observe(measured))
                    .layer(CatchPanicLayer::new())
                    .service(Succeed),
                count,
            );
        }
        // A handler fn with a `Json<T>` extractor, compared with `bare`.
        "json" => run(
            handler_fn(|Json(order): Json<Order>| async move {
                black_box((order.id, order.quantity));
            }),
            count,
        ),
        _ => return false,
    }
    true
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [stack, count] => {
            let Ok(count) = count.parse::<usize>() else {
                eprintln!("usage: layer_cost <stack> <messages>");
                std::process::exit(2);
            };
            if !run_stack(stack, count) {
                eprintln!("unknown stack {stack}; one of {STACKS:?}");
                std::process::exit(2);
            }
        }
        // `cargo bench` passes `--bench`: check every stack once.
        _ => {
            for stack in STACKS {
                if !run_stack(stack, 10) {
                    eprintln!("stack {stack} failed");
                    std::process::exit(2);
                }
            }
            println!("layer_cost: {} stacks ran", STACKS.len());
        }
    }
}
