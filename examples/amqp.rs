//! Consume a RabbitMQ queue.
//!
//! Needs RabbitMQ on 127.0.0.1:5672 (or set `INTAKE_AMQP_URL`). The example
//! declares a quorum queue `intake-example-orders` (with a dead-letter
//! exchange and a delivery limit), publishes the example orders to it with
//! publisher confirms (one fails once, one is malformed, one has no items),
//! reserves them with the handler every broker example shares
//! (`examples/support`), and keeps consuming until SIGTERM or Ctrl-C. The
//! malformed order and the one without items are published, with their
//! origin and error, to `intake-example-orders.dlq` (publisher-confirmed)
//! before they are acknowledged.
//!
//! ```text
//! cargo run --example amqp --features amqp
//! INTAKE_AMQP_URL=amqps://user:pass@broker:5671/%2f cargo run --example amqp --features amqp
//! ```

#[path = "support/mod.rs"]
mod support;

use intake::amqp::lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use intake::amqp::lapin::{BasicProperties, Connection, ConnectionProperties};
use intake::amqp::{AmqpSettings, AmqpSource, Exchange, Queue, Topology};
use intake::dead_letter::DeadLetterLayer;
use intake::retry::RetryLayer;
use intake::{CatchPanicLayer, Consumer, DeliveryOrder, Json, Meta, handler_fn};
use tower::ServiceBuilder;

const QUEUE: &str = "intake-example-orders";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    support::init_logging("info,lapin=warn");
    let url = std::env::var("INTAKE_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());

    // Invalid orders end in `intake-example-orders.dlq`: published there by
    // the dead-letter layer, or by the broker after 5 failed deliveries.
    let dead_letter_queue = format!("{QUEUE}.dlq");
    let topology = Topology::new()
        .exchange(Exchange::direct("intake-example.dlx"))
        .queue(Queue::classic(dead_letter_queue.as_str()))
        .bind(dead_letter_queue.as_str(), "intake-example.dlx", QUEUE)
        .queue(
            Queue::quorum(QUEUE)
                .dead_letter_exchange("intake-example.dlx")
                .delivery_limit(5),
        );
    let source =
        AmqpSource::builder(AmqpSettings::new(url.as_str()).connection_name("intake-example"))
            .queue(QUEUE)
            .declare(topology)
            .build()
            .await?;
    let acker = source.acker();
    // Publishes to the dead-letter exchange with the queue's name as routing
    // key, which the binding above routes to the dead-letter queue. The
    // source fills in the broker, TLS and the queue it consumes (a
    // destination that routed back into it would be refused).
    let dead_letters = source
        .dead_letter_sink()
        .exchange("intake-example.dlx")
        .build()
        .await?;

    publish_orders(&url).await?;

    let tally = support::Tally::shared();
    let handler = {
        let tally = tally.clone();
        handler_fn(move |Meta(meta): Meta, Json(order): Json<support::Order>| {
            let tally = tally.clone();
            async move { support::reserve(&meta, order, &tally).await }
        })
    };
    // Outermost first: a message that fails for good (undecodable, or out of
    // retries) is published to the dead-letter queue, then acknowledged.
    let handler = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(dead_letters))
        .layer(RetryLayer::new(support::retry_policy()))
        .layer(CatchPanicLayer::new())
        .service(handler);

    let shutdown = support::shutdown_on_signals();
    tracing::info!(
        endpoint = source.endpoint(),
        queue = QUEUE,
        "consuming; SIGTERM or Ctrl-C stops"
    );
    let report = Consumer::builder()
        // The consumer's budget is also the broker's prefetch.
        .max_in_flight(64)
        // A queue's messages carry its routing key, the same for all: no
        // per-customer key to order by, so in parallel.
        .ordering(DeliveryOrder::Unordered)
        .build(source, acker, handler)?
        .run(shutdown)
        .await?;
    tally.print("amqp", &report);
    Ok(())
}

/// Publishes the example orders with publisher confirms.
async fn publish_orders(url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let connection = Connection::connect(url, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    for (_customer, order) in support::example_orders() {
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
