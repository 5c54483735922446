//! The `opentelemetry` feature, with an in-memory exporter: a message's span
//! is parented on the producer's context, carries the messaging attributes,
//! and the outputs published within it carry its own context; a batch span
//! links every message's context.
#![cfg(feature = "opentelemetry")]

use std::time::Duration;

use intake_core::backend::testkit::wait_until_committed;
use intake_core::batch::{BatchLayer, BatchSettings};
use intake_core::memory::{MemoryBroker, Record};
use intake_core::publish::{Output, PublishLayer};
use intake_core::trace::{TraceLayer, TraceParent};
use intake_core::{Consumer, HandlerError, Message, handler_fn};
use opentelemetry::trace::{SpanKind, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;
use tracing_subscriber::layer::SubscriberExt;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";
const PATIENCE: Duration = Duration::from_secs(10);

/// Exports every span to memory through a `tracing-opentelemetry` layer,
/// with the W3C propagator, for the current thread.
fn exporting() -> (
    InMemorySpanExporter,
    SdkTracerProvider,
    tracing::subscriber::DefaultGuard,
) {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("intake-test")));
    let guard = tracing::subscriber::set_default(subscriber);
    (exporter, provider, guard)
}

fn finished(exporter: &InMemorySpanExporter, provider: &SdkTracerProvider) -> Vec<SpanData> {
    provider.force_flush().expect("flush the spans");
    exporter.get_finished_spans().expect("read the spans")
}

fn traceparent(parent: &str) -> String {
    format!("00-{TRACE_ID}-{parent}-01")
}

#[tokio::test(flavor = "current_thread")]
async fn a_message_span_continues_the_producers_trace_into_its_outputs() {
    let (exporter, provider, _guard) = exporting();
    let broker = MemoryBroker::new();
    broker.create_topic("in", 1).unwrap();
    broker.create_topic("out", 1).unwrap();
    broker
        .send(
            "in",
            Record::new("m0").with_header("traceparent", traceparent(PRODUCER_SPAN)),
        )
        .unwrap();
    let handler = ServiceBuilder::new()
        .layer(TraceLayer::new("relay"))
        .layer(PublishLayer::new(broker.memory_publisher()))
        .service(handler_fn(|message: Message| async move {
            Output::forward(&message, "out")
        }));
    let (source, acker) = broker.consumer("in", "relay").unwrap();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Consumer::builder()
            .build(source, acker, handler)
            .unwrap()
            .run(shutdown.clone()),
    );
    wait_until_committed(&broker, "in", "relay", PATIENCE)
        .await
        .unwrap();
    shutdown.cancel();
    run.await.unwrap().unwrap();

    let spans = finished(&exporter, &provider);
    let span = spans
        .iter()
        .find(|span| span.name == "message")
        .expect("the message span was exported");
    assert_eq!(span.span_context.trace_id().to_string(), TRACE_ID);
    assert_eq!(span.parent_span_id.to_string(), PRODUCER_SPAN);
    assert!(span.parent_span_is_remote);
    assert_eq!(span.span_kind, SpanKind::Consumer);
    let attribute = |name: &str| {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == name)
            .map(|kv| kv.value.to_string())
    };
    assert_eq!(
        attribute("messaging.destination.name").as_deref(),
        Some("in")
    );
    assert_eq!(
        attribute("messaging.operation.type").as_deref(),
        Some("process")
    );

    let output = &broker.messages("out", 0, 0).unwrap()[0];
    let header = output.headers().get("traceparent").expect("a traceparent");
    let carried = TraceParent::parse(header).expect("a valid traceparent");
    assert_eq!(carried.trace_id, TRACE_ID, "the output stays in the trace");
    assert_eq!(
        carried.parent_id,
        span.span_context.span_id().to_string(),
        "the output's parent is the consumer span, not the producer's"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_batch_span_links_every_messages_context() {
    let (exporter, provider, _guard) = exporting();
    let broker = MemoryBroker::new();
    broker.create_topic("in", 1).unwrap();
    let parents = ["00f067aa0ba902b1", "00f067aa0ba902b2", "00f067aa0ba902b3"];
    for parent in parents {
        broker
            .send(
                "in",
                Record::new("m").with_header("traceparent", traceparent(parent)),
            )
            .unwrap();
    }
    let rows = tower::service_fn(|batch: Vec<Message>| async move {
        Ok::<_, HandlerError>(batch.iter().map(|_| Ok(())).collect::<Vec<_>>())
    });
    let handler = ServiceBuilder::new()
        .layer(
            BatchLayer::new(BatchSettings {
                max_size: 3,
                max_wait: Duration::from_secs(5),
                parallelism: 1,
            })
            .unwrap(),
        )
        .service(rows);
    let (source, acker) = broker.consumer("in", "rows").unwrap();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        Consumer::builder()
            .ordering(intake_core::DeliveryOrder::Unordered)
            .build(source, acker, handler)
            .unwrap()
            .run(shutdown.clone()),
    );
    wait_until_committed(&broker, "in", "rows", PATIENCE)
        .await
        .unwrap();
    shutdown.cancel();
    run.await.unwrap().unwrap();

    let spans = finished(&exporter, &provider);
    let batch = spans
        .iter()
        .find(|span| span.name == "batch")
        .expect("the batch span was exported");
    let mut linked: Vec<String> = batch
        .links
        .iter()
        .map(|link| link.span_context.span_id().to_string())
        .collect();
    linked.sort();
    assert_eq!(linked, parents);
    assert!(
        batch
            .links
            .iter()
            .all(|link| link.span_context.trace_id().to_string() == TRACE_ID)
    );
}
