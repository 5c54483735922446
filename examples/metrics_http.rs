//! A consumer on the memory broker with the full layer stack, its metrics
//! served at `/metrics` for Prometheus to scrape.
//!
//! ```text
//! cargo run --example metrics_http
//! curl http://127.0.0.1:9898/metrics
//! ```
//!
//! `METRICS_ADDR` changes the listen address; `RUN_FOR_SECS` stops the
//! example after that many seconds (otherwise SIGTERM or Ctrl-C stops it).

#[path = "support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use intake::consumer::Consumer;
use intake::memory::{MemoryBroker, Record};
use intake::metrics::prometheus::{Encoder, Registry, TextEncoder};
use intake::{
    CatchPanicLayer, DeadLetterLayer, Exponential, HandlerError, Json, Meta, Metrics, RetryLayer,
    TraceLayer, handler_fn,
};
use serde::Deserialize;
use tower::ServiceBuilder;

#[derive(Deserialize)]
struct Order {
    id: u64,
    cents: u64,
}

/// Bills an order. Every fifth order's first attempt hits a (simulated)
/// gateway timeout, so the retry counter moves.
async fn bill(Meta(meta): Meta, Json(order): Json<Order>) -> Result<(), HandlerError> {
    if order.id % 5 == 0 && meta.attempt() == 1 {
        return Err(HandlerError::retryable("payment gateway timed out"));
    }
    if order.cents == 0 {
        return Err(HandlerError::permanent(format!(
            "order {} is free",
            order.id
        )));
    }
    tokio::time::sleep(Duration::from_millis(2)).await;
    Ok(())
}

/// Serves the registry in Prometheus' text format.
async fn scrape(State(registry): State<Registry>) -> Response {
    let encoder = TextEncoder::new();
    let mut body = Vec::new();
    match encoder.encode(&registry.gather(), &mut body) {
        Ok(()) => (
            [(header::CONTENT_TYPE, encoder.format_type().to_owned())],
            body,
        )
            .into_response(),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response(),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    support::init_logging("warn");

    let registry = Registry::new();
    let metrics = Metrics::register(&registry)?;

    let broker = MemoryBroker::new();
    broker.create_topic("orders", 4)?;
    // SIGTERM (a container stop) or Ctrl-C drains the consumer.
    let shutdown = support::shutdown_on_signals();

    // A producer: one order every 5 ms; every 97th is malformed and every
    // 89th is free (both permanent failures, dead-lettered).
    let producer = {
        let broker = broker.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(Duration::from_millis(5));
            for id in 1_u64.. {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = ticks.tick() => {}
                }
                let payload = match id {
                    id if id % 97 == 0 => "{not json".to_owned(),
                    id if id % 89 == 0 => format!(r#"{{"id":{id},"cents":0}}"#),
                    id => format!(r#"{{"id":{id},"cents":{}}}"#, id * 100),
                };
                let record = Record::new(payload).with_key(format!("customer-{}", id % 10));
                if let Err(error) = broker.send("orders", record) {
                    eprintln!("producer stopped: {error}");
                    break;
                }
            }
        })
    };

    let measured = metrics.layer("billing");
    let handler = ServiceBuilder::new()
        .layer(measured.clone())
        .layer(TraceLayer::new("billing"))
        .layer(DeadLetterLayer::new(
            broker.dead_letter_sink("orders", "billing")?,
        ))
        .layer(
            RetryLayer::new(
                Exponential::new(Duration::from_millis(10), Duration::from_secs(1)).max_retries(3),
            )
            .observe(measured),
        )
        .layer(CatchPanicLayer::new())
        .service(handler_fn(bill));
    let (source, acker) = broker.consumer("orders", "billing")?;
    let consumer = Consumer::builder()
        .observer(Arc::new(metrics.clone()))
        .build(source, acker, handler)?;
    let consumer = tokio::spawn(consumer.run(shutdown.clone()));

    let address = std::env::var("METRICS_ADDR").unwrap_or_else(|_| "127.0.0.1:9898".to_owned());
    let listener = tokio::net::TcpListener::bind(&address).await?;
    println!("metrics at http://{}/metrics", listener.local_addr()?);
    let app = Router::new()
        .route("/metrics", get(scrape))
        .with_state(registry);

    let stop = shutdown.clone();
    let run_for = std::env::var("RUN_FOR_SECS")
        .ok()
        .and_then(|secs| secs.parse().ok())
        .map(Duration::from_secs);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            if let Some(duration) = run_for {
                tokio::select! {
                    () = tokio::time::sleep(duration) => stop.cancel(),
                    () = stop.cancelled() => {}
                }
            }
            stop.cancelled().await;
        })
        .await?;

    producer.await?;
    let report = consumer.await??;
    println!(
        "consumed {} messages ({} succeeded, {} dead-lettered, {} ignored) in {:?}",
        report.completed(),
        report.succeeded,
        report.dead_lettered,
        report.ignored,
        report.elapsed,
    );
    Ok(())
}
