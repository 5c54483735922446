//! Every built-in layer costs no allocation per message on the success path:
//! named futures, label sets resolved once, spans that cost nothing when no
//! subscriber listens, and message copies that are reference-count bumps.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use intake_core::catch_panic::CatchPanicLayer;
use intake_core::dead_letter::{
    DeadLetter, DeadLetterError, DeadLetterLayer, DeadLetterSink, FailurePolicy,
};
#[cfg(feature = "metrics")]
use intake_core::metrics::Metrics;
use intake_core::retry::RetryLayer;
use intake_core::trace::TraceLayer;
use intake_core::{Exponential, HandlerError, Headers, Message, Metadata, Position};
use tower::{Layer, Service};

#[path = "support/counting_allocator.rs"]
mod counting_allocator;

use counting_allocator::allocations_during;

/// A handler that succeeds at once, with a named future.
#[derive(Clone, Copy)]
struct Succeed;

impl Service<Message> for Succeed {
    type Response = ();
    type Error = HandlerError;
    type Future = std::future::Ready<Result<(), HandlerError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), HandlerError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _message: Message) -> Self::Future {
        std::future::ready(Ok(()))
    }
}

/// A sink that is never written on the success path.
struct UnusedSink;

#[async_trait::async_trait]
impl DeadLetterSink for UnusedSink {
    async fn write(&self, _letter: &DeadLetter) -> Result<(), DeadLetterError> {
        Ok(())
    }
}

const MESSAGES: usize = 1_000;

fn messages() -> Vec<Message> {
    let source: intake_core::SourceName = "orders".into();
    let headers: Headers = [("content-type", Bytes::from_static(b"application/json"))]
        .into_iter()
        .collect();
    (0..MESSAGES)
        .map(|offset| {
            Message::new(
                Bytes::from_static(br#"{"id":1}"#),
                Metadata::new(source.clone(), 0, Position::Offset(offset as i64)),
            )
            .with_key(Bytes::from_static(b"customer-1"))
            .with_headers(headers.clone())
        })
        .collect()
}

/// Allocations made on this thread while `service` handles `MESSAGES`
/// messages, after one warm-up message (which may resolve caches).
fn allocations_per_run<S>(mut service: S) -> usize
where
    S: Service<Message, Response = ()>,
    S::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    let mut handle = |service: &mut S, message: Message| {
        assert!(service.poll_ready(&mut cx).is_ready());
        let outcome = pin!(service.call(message)).poll(&mut cx);
        assert!(
            matches!(outcome, Poll::Ready(Ok(()))),
            "the handler succeeds"
        );
    };
    let mut messages = messages();
    let warm_up = messages.pop().expect("messages");
    handle(&mut service, warm_up);

    let ((), allocations) = allocations_during(|| {
        for message in messages.drain(..) {
            handle(&mut service, message);
        }
    });
    allocations
}

/// A handler that boxes its future: the control that shows the counter
/// sees allocations.
#[derive(Clone, Copy)]
struct Boxed;

impl Service<Message> for Boxed {
    type Response = ();
    type Error = HandlerError;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), HandlerError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _message: Message) -> Self::Future {
        Box::pin(async { Ok(()) })
    }
}

#[test]
fn the_counter_sees_one_allocation_per_boxed_future() {
    assert_eq!(allocations_per_run(Boxed), MESSAGES - 1);
}

#[test]
fn retry_allocates_nothing_when_the_handler_succeeds() {
    let retry = RetryLayer::new(Exponential::default()).layer(Succeed);
    assert_eq!(allocations_per_run(retry), 0);
}

#[test]
fn catch_panic_allocates_nothing_when_the_handler_succeeds() {
    assert_eq!(
        allocations_per_run(CatchPanicLayer::new().layer(Succeed)),
        0
    );
}

#[test]
fn tracing_allocates_nothing_without_a_subscriber() {
    assert_eq!(
        allocations_per_run(TraceLayer::new("orders").layer(Succeed)),
        0
    );
}

#[cfg(feature = "metrics")]
#[test]
fn metrics_allocate_nothing_once_the_source_is_known() {
    let registry = prometheus::Registry::new();
    let metrics = Metrics::register(&registry).expect("fresh registry");
    assert_eq!(
        allocations_per_run(metrics.layer("orders").layer(Succeed)),
        0
    );
}

#[test]
fn dead_lettering_allocates_nothing_when_the_handler_succeeds() {
    assert_eq!(
        allocations_per_run(DeadLetterLayer::new(UnusedSink).layer(Succeed)),
        0
    );
    let block = FailurePolicy::block(Exponential::default()).expect("valid");
    assert_eq!(
        allocations_per_run(DeadLetterLayer::with_policy(block).layer(Succeed)),
        0
    );
}

#[cfg(feature = "metrics")]
#[test]
fn the_full_stack_allocates_nothing_when_the_handler_succeeds() {
    use std::time::Duration;
    use tower::ServiceBuilder;

    let registry = prometheus::Registry::new();
    let metrics = Metrics::register(&registry).expect("fresh registry");
    let measured = metrics.layer("orders");
    let stack = ServiceBuilder::new()
        .layer(measured.clone())
        .layer(TraceLayer::new("orders"))
        .layer(DeadLetterLayer::new(UnusedSink))
        .layer(RetryLayer::new(Exponential::default()).observe(measured))
        .layer(CatchPanicLayer::new())
        .timeout(Duration::from_secs(5))
        .service(Succeed);
    // The timeout's timer needs a runtime; the rest runs on this thread.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _entered = runtime.enter();
    assert_eq!(allocations_per_run(stack), 0);
}
