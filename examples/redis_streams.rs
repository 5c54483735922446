//! Consume a Redis stream as a member of a consumer group.
//!
//! Needs Redis on 127.0.0.1:6379 (or set `REDIS_URL`). The example adds the
//! example orders to the stream `intake-example:orders` (one fails once, one
//! is malformed, one has no items), reserves them with the handler every
//! broker example shares (`examples/support`), and keeps consuming until
//! SIGTERM or Ctrl-C. The malformed order and the one without items go to
//! the dead-letter stream `intake-example:orders:dlq` with their origin;
//! every other order is acknowledged. Add more with
//!
//! ```text
//! redis-cli XADD intake-example:orders '*' payload '{"id":42,"customer":"c-9","quantity":2}' customer c-9
//! ```
//!
//! Run it with `cargo run --example redis_streams --features redis`.

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use intake::dead_letter::DeadLetterLayer;
use intake::redis_streams::{RedisStreamsSource, redis};
use intake::retry::RetryLayer;
use intake::{CatchPanicLayer, Consumer, DeliveryOrder, Json, Meta, handler_fn};
use tower::ServiceBuilder;

const STREAM: &str = "intake-example:orders";
const GROUP: &str = "billing";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    support::init_logging("info");
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());

    add_example_orders(&url).await?;

    let source = RedisStreamsSource::builder(url.as_str())
        .stream(STREAM)
        .group(GROUP)
        .consumer("billing-1")
        .key_field("customer")
        // Longer than any order takes to handle: entries pending longer
        // than this are taken over from consumers that died.
        .claim_min_idle(Duration::from_secs(30))
        .max_deliveries(5)
        .build()
        .await?;
    let acker = source.acker();
    let dead_letters = source.dead_letter_sink().build().await?;

    let tally = support::Tally::shared();
    let handler = {
        let tally = tally.clone();
        handler_fn(move |Meta(meta): Meta, Json(order): Json<support::Order>| {
            let tally = tally.clone();
            async move { support::reserve(&meta, order, &tally).await }
        })
    };
    // Outermost first: a message that fails for good (undecodable, or out of
    // retries) is written to the dead-letter stream, then acknowledged.
    let handler = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(dead_letters))
        .layer(RetryLayer::new(support::retry_policy()))
        .layer(CatchPanicLayer::new())
        .service(handler);

    let shutdown = support::shutdown_on_signals();
    tracing::info!(%url, stream = STREAM, group = GROUP, "consuming; SIGTERM or Ctrl-C stops");
    let report = Consumer::builder()
        .max_in_flight(256)
        // Orders of one customer in order, customers in parallel.
        .ordering(DeliveryOrder::Key)
        .build(source, acker, handler)?
        .run(shutdown)
        .await?;
    tally.print("redis_streams", &report);
    Ok(())
}

/// Adds the example orders, the customer as the key field.
async fn add_example_orders(url: &str) -> Result<(), redis::RedisError> {
    let client = redis::Client::open(url)?;
    let mut connection = client.get_multiplexed_async_connection().await?;
    let mut pipe = redis::pipe();
    for (customer, payload) in support::example_orders() {
        pipe.cmd("XADD")
            .arg(STREAM)
            .arg("*")
            .arg("payload")
            .arg(payload)
            .arg("customer")
            .arg(customer)
            .ignore();
    }
    pipe.query_async::<()>(&mut connection).await
}
