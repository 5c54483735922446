//! Consume a Kafka topic as a member of a consumer group.
//!
//! Needs a Kafka-protocol broker on 127.0.0.1:9092 (`.ci/services/kafka.sh`
//! starts one), or set `KAFKA_BROKERS`. The example creates the topic
//! `intake-example.orders` (4 partitions) if it is missing, produces a few
//! orders to it, one of them malformed and one that fails once, and
//! consumes until Ctrl-C. The malformed order goes to the dead-letter topic
//! `intake-example.orders.billing.dlq` with its origin in headers; every
//! other order is processed and committed. Produce more with any Kafka
//! client, for example
//!
//! ```text
//! echo '{"id":42,"customer":"c-9","quantity":2}' | kcat -P -b 127.0.0.1:9092 -t intake-example.orders
//! ```
//!
//! Run it with `cargo run --example kafka --features kafka`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::Duration;

use intake::dead_letter::DeadLetterLayer;
use intake::kafka::rdkafka::ClientConfig;
use intake::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use intake::kafka::rdkafka::client::DefaultClientContext;
use intake::kafka::rdkafka::error::RDKafkaErrorCode;
use intake::kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use intake::kafka::{KafkaDeadLetterSink, KafkaSettings, KafkaSource};
use intake::retry::RetryLayer;
use intake::{
    CatchPanicLayer, Consumer, DeliveryOrder, Exponential, HandlerError, Json, Meta, handler_fn,
};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;

const TOPIC: &str = "intake-example.orders";
const GROUP: &str = "billing";

#[derive(Deserialize)]
struct Order {
    id: u64,
    customer: String,
    quantity: u32,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let brokers = std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
    // Every librdkafka setting passes through: TLS and SASL go here too.
    let settings = KafkaSettings::new(&brokers);

    create_topic(&settings).await?;
    produce_example_orders(&settings).await?;

    let source = KafkaSource::builder(
        settings
            .clone()
            .set("partition.assignment.strategy", "cooperative-sticky"),
    )
    .group(GROUP)
    .topic(TOPIC)
    .build()
    .await?;
    let acker = source.acker();
    let dead_letters = KafkaDeadLetterSink::builder(settings, GROUP).build()?;

    let processed = Arc::new(AtomicU64::new(0));
    let retried = Arc::new(AtomicU64::new(0));
    let handler = {
        let (processed, retried) = (processed.clone(), retried.clone());
        handler_fn(move |Meta(meta): Meta, Json(order): Json<Order>| {
            let (processed, retried) = (processed.clone(), retried.clone());
            async move {
                if order.id == 3 && meta.attempt() == 1 {
                    retried.fetch_add(1, AtomicOrdering::Relaxed);
                    return Err(HandlerError::retryable("the stock service timed out"));
                }
                tracing::info!(
                    partition = meta.partition(),
                    offset = %meta.position(),
                    attempt = meta.attempt(),
                    order = order.id,
                    customer = %order.customer,
                    quantity = order.quantity,
                    "order reserved"
                );
                processed.fetch_add(1, AtomicOrdering::Relaxed);
                Ok::<(), HandlerError>(())
            }
        })
    };
    // Outermost first: a message that fails for good (undecodable, or out of
    // retries) is written to the dead-letter topic, then committed.
    let handler = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(dead_letters))
        .layer(RetryLayer::new(
            Exponential::new(Duration::from_millis(50), Duration::from_secs(2)).max_retries(3),
        ))
        .layer(CatchPanicLayer::new())
        .service(handler);

    let shutdown = CancellationToken::new();
    let on_ctrl_c = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("Ctrl-C: shutting down");
        on_ctrl_c.cancel();
    });
    tracing::info!(%brokers, topic = TOPIC, group = GROUP, "consuming; Ctrl-C stops");

    let report = Consumer::builder()
        .max_in_flight(256)
        // Orders of one customer (the key) in order, customers in parallel.
        .ordering(DeliveryOrder::Key)
        .build(source, acker, handler)?
        .run(shutdown)
        .await?;

    println!("intake kafka example: {TOPIC} as group {GROUP} on {brokers}");
    println!(
        "  processed:     {}",
        processed.load(AtomicOrdering::Relaxed)
    );
    println!("  dead-lettered: {}", report.ignored);
    println!("  retried:       {}", retried.load(AtomicOrdering::Relaxed));
    println!("  unfinished:    {}", report.unfinished.len());
    for (partition, position) in &report.committed {
        println!("  {partition}: committed through offset {position}");
    }
    println!("  ran for {:.1?}", report.elapsed);
    Ok(())
}

/// Creates the example topic unless it exists.
async fn create_topic(settings: &KafkaSettings) -> Result<(), Box<dyn std::error::Error>> {
    let admin: AdminClient<DefaultClientContext> = settings.client_config().create()?;
    let results = admin
        .create_topics(
            &[NewTopic::new(TOPIC, 4, TopicReplication::Fixed(-1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(format!("creating {topic}: {code}").into()),
        }
    }
    Ok(())
}

/// Five orders keyed by customer: order 3 fails once, order 4 is malformed.
async fn produce_example_orders(
    settings: &KafkaSettings,
) -> Result<(), Box<dyn std::error::Error>> {
    let producer: FutureProducer = ClientConfig::clone(settings.client_config()).create()?;
    for id in 1..=5u64 {
        let customer = format!("c-{}", id % 2);
        let payload = if id == 4 {
            format!(r#"{{"id":{id},"customer":"#)
        } else {
            format!(r#"{{"id":{id},"customer":"{customer}","quantity":{id}}}"#)
        };
        producer
            .send(
                FutureRecord::to(TOPIC).key(&customer).payload(&payload),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(error, _)| error)?;
    }
    Ok(())
}
