//! Consume orders from RabbitMQ with an async fn.
//!
//! Declares a quorum queue `intake-example-orders` (with a dead-letter
//! exchange and a delivery limit), publishes a few orders, one of them
//! invalid, handles them, and stops once all are done or on Ctrl-C. The
//! invalid order fails permanently and is published, with its origin and
//! error, to `intake-example-orders.dlq` (publisher-confirmed) before it is
//! acknowledged.
//!
//! ```text
//! cargo run --example amqp --features amqp
//! INTAKE_AMQP_URL=amqps://user:pass@broker:5671/%2f cargo run --example amqp --features amqp
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};

use intake::amqp::lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use intake::amqp::lapin::{BasicProperties, Connection, ConnectionProperties};
use intake::amqp::{AmqpDeadLetterSink, AmqpSource, Exchange, Queue, Topology};
use intake::{Consumer, DeadLetterLayer, DeliveryOrder, HandlerError, Json, Meta, handler_fn};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

const QUEUE: &str = "intake-example-orders";
const ORDERS: usize = 5;

#[derive(Deserialize)]
struct Order {
    id: u64,
    quantity: u32,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,lapin=warn".into()),
        )
        .init();
    let url = std::env::var("INTAKE_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());

    // Invalid orders end in `intake-example-orders.dlq`: published there by
    // the dead-letter layer, or by the broker after 5 failed deliveries.
    let dead_letters = format!("{QUEUE}.dlq");
    let topology = Topology::new()
        .exchange(Exchange::direct("intake-example.dlx"))
        .queue(Queue::classic(dead_letters.as_str()))
        .bind(dead_letters.as_str(), "intake-example.dlx", QUEUE)
        .queue(
            Queue::quorum(QUEUE)
                .dead_letter_exchange("intake-example.dlx")
                .delivery_limit(5),
        );

    let max_in_flight = 64;
    let source = AmqpSource::builder(url.as_str())
        .queue(QUEUE)
        .declare(topology)
        .max_in_flight(max_in_flight)
        .connection_name("intake-example")
        .connect()
        .await?;
    let acker = source.acker();
    tracing::info!(endpoint = source.endpoint(), queue = QUEUE, "consuming");

    // Publishes to the dead-letter exchange with the queue's name as routing
    // key, which the binding above routes to the dead-letter queue.
    let dead_letter_sink = AmqpDeadLetterSink::builder(url.as_str())
        .exchange("intake-example.dlx")
        .connect()
        .await?;

    publish_orders(&url).await?;

    let shutdown = CancellationToken::new();
    let handled = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (handled, shutdown) = (handled.clone(), shutdown.clone());
        handler_fn(move |Meta(meta): Meta, Json(order): Json<Order>| {
            let (handled, shutdown) = (handled.clone(), shutdown.clone());
            async move {
                if handled.fetch_add(1, AtomicOrdering::SeqCst) + 1 == ORDERS {
                    shutdown.cancel();
                }
                if order.quantity == 0 {
                    return Err(HandlerError::permanent(format!(
                        "order {} has no items",
                        order.id
                    )));
                }
                tracing::info!(
                    order = order.id,
                    quantity = order.quantity,
                    attempt = meta.attempt(),
                    tag = %meta.position(),
                    "order reserved"
                );
                Ok(())
            }
        })
    };
    let handler = tower::ServiceBuilder::new()
        .layer(DeadLetterLayer::new(dead_letter_sink))
        .service(handler);

    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                shutdown.cancel();
            }
        }
    });

    let report = Consumer::builder()
        .max_in_flight(max_in_flight)
        .ordering(DeliveryOrder::Unordered)
        .build(source, acker, handler)?
        .run(shutdown)
        .await?;
    tracing::info!(
        succeeded = report.succeeded,
        unfinished = report.unfinished.len(),
        "stopped"
    );
    Ok(())
}

/// Publishes `ORDERS` orders with publisher confirms.
async fn publish_orders(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let connection = Connection::connect(url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    for id in 1..=ORDERS as u64 {
        // Order 3 has no items: it goes to the dead-letter queue.
        let quantity = if id == 3 { 0 } else { id * 2 };
        let order = format!(r#"{{"id":{id},"quantity":{quantity}}}"#);
        channel
            .basic_publish(
                "".into(),
                QUEUE.into(),
                BasicPublishOptions::default(),
                order.as_bytes(),
                BasicProperties::default()
                    .with_content_type("application/json".into())
                    .with_delivery_mode(2),
            )
            .await?
            .await?;
    }
    connection.close(200, "published".into()).await?;
    Ok(())
}
