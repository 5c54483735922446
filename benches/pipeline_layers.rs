//! Consume raw bytes through the built-in layers, one stack at a time, on
//! the memory broker. See `support/mod.rs` for what is measured.
//!
//! `INTAKE_BENCH_LAYERS` picks the stack (callgrind runs one:
//! `INTAKE_BENCH_LAYERS=retry benches/callgrind.sh pipeline_layers`); without
//! it every stack runs in turn. `bare` is `pipeline_bytes`' handler alone;
//! `passthrough1` and `passthrough4` wrap it in the cheapest layer a user can
//! write, once and four times; the others wrap it in one built-in layer
//! (tracing with no subscriber installed), and `full` in the usual stack.

mod support;

use std::future::Future;
use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll};

use intake::catch_panic::CatchPanicLayer;
use intake::dead_letter::{DeadLetter, DeadLetterError, DeadLetterLayer, DeadLetterSink};
use intake::handler::{Payload, handler_fn};
use intake::metrics::Metrics;
use intake::retry::RetryLayer;
use intake::trace::TraceLayer;
use intake::{Exponential, Message};
use pin_project_lite::pin_project;
use support::{CountingAllocator, ORDER_JSON};
use tower::{Layer, Service, ServiceBuilder};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// A layer that only forwards the call and the future.
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

/// The dead-letter layer's sink; never written, every message succeeds.
struct UnusedSink;

#[async_trait::async_trait]
impl DeadLetterSink for UnusedSink {
    async fn write(&self, _letter: &DeadLetter) -> Result<(), DeadLetterError> {
        Ok(())
    }
}

/// `pipeline_bytes`' handler.
fn bytes_handler() -> impl Service<
    Message,
    Response = (),
    Error = intake::HandlerError,
    Future = impl Future<Output = Result<(), intake::HandlerError>> + Send,
> + Clone
+ Send
+ 'static {
    handler_fn(|Payload(payload): Payload| async move {
        black_box(payload.len());
    })
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
];

fn run(stack: &str) {
    let name = format!("pipeline_layers[{stack}]");
    match stack {
        "bare" => support::main(&name, ORDER_JSON, bytes_handler),
        "passthrough1" => support::main(&name, ORDER_JSON, || {
            PassThroughLayer.layer(bytes_handler())
        }),
        "passthrough4" => support::main(&name, ORDER_JSON, || {
            ServiceBuilder::new()
                .layer(PassThroughLayer)
                .layer(PassThroughLayer)
                .layer(PassThroughLayer)
                .layer(PassThroughLayer)
                .service(bytes_handler())
        }),
        "retry" => support::main(&name, ORDER_JSON, || {
            RetryLayer::new(Exponential::default()).layer(bytes_handler())
        }),
        "catch_panic" => support::main(&name, ORDER_JSON, || {
            CatchPanicLayer::new().layer(bytes_handler())
        }),
        "trace" => support::main(&name, ORDER_JSON, || {
            TraceLayer::new("orders").layer(bytes_handler())
        }),
        "metrics" => {
            let registry = intake::metrics::prometheus::Registry::new();
            let metrics = Metrics::register(&registry).expect("a fresh registry");
            support::main(&name, ORDER_JSON, || {
                metrics.layer("orders").layer(bytes_handler())
            });
        }
        "dead_letter" => support::main(&name, ORDER_JSON, || {
            DeadLetterLayer::new(UnusedSink).layer(bytes_handler())
        }),
        "full" => {
            let registry = intake::metrics::prometheus::Registry::new();
            let metrics = Metrics::register(&registry).expect("a fresh registry");
            support::main(&name, ORDER_JSON, || {
                let measured = metrics.layer("orders");
                ServiceBuilder::new()
                    .layer(measured.clone())
                    .layer(TraceLayer::new("orders"))
                    .layer(DeadLetterLayer::new(UnusedSink))
                    .layer(RetryLayer::new(Exponential::default()).observe(measured))
                    .layer(CatchPanicLayer::new())
                    .service(bytes_handler())
            });
        }
        unknown => {
            eprintln!("unknown stack {unknown}; the stacks are {STACKS:?}");
            std::process::exit(2);
        }
    }
}

fn main() {
    match std::env::var("INTAKE_BENCH_LAYERS") {
        Ok(stack) => run(&stack),
        Err(_) => STACKS.iter().for_each(|stack| run(stack)),
    }
}
