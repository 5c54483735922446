//! Consume a Redis stream as a member of a consumer group.
//!
//! Needs Redis on 127.0.0.1:6379 (or set `REDIS_URL`). The example adds a
//! few orders to the stream `intake-example:orders`, consumes them with
//! the handler below, and keeps consuming until Ctrl-C; add more with
//!
//! ```text
//! redis-cli XADD intake-example:orders '*' payload '{"id":42}' customer c-9
//! ```
//!
//! Run it with `cargo run --example redis_streams --features redis`.

use std::time::Duration;

use intake::redis_streams::{RedisStreamsSource, redis};
use intake::{Consumer, DeliveryOrder, HandlerError, Message};
use tokio_util::sync::CancellationToken;

const STREAM: &str = "intake-example:orders";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());

    add_example_orders(&url).await?;

    let source = RedisStreamsSource::builder(url)
        .stream(STREAM)
        .group("billing")
        .consumer("billing-1")
        .key_field("customer")
        // Longer than any order takes to handle: entries pending longer
        // than this are taken over from consumers that died.
        .claim_min_idle(Duration::from_secs(30))
        .max_deliveries(5)
        .build()
        .await?;
    let acker = source.acker();

    let handler = tower::service_fn(|message: Message| async move {
        let customer = message
            .key()
            .map(|key| String::from_utf8_lossy(key).into_owned())
            .unwrap_or_default();
        tracing::info!(
            id = %message.metadata().position(),
            attempt = message.metadata().attempt(),
            customer,
            payload = %String::from_utf8_lossy(message.payload()),
            "order"
        );
        Ok::<_, HandlerError>(())
    });

    let shutdown = CancellationToken::new();
    let on_ctrl_c = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_ctrl_c.cancel();
    });

    let report = Consumer::builder()
        .max_in_flight(256)
        // Orders of one customer in order, customers in parallel.
        .ordering(DeliveryOrder::Key)
        .build(source, acker, handler)?
        .run(shutdown)
        .await?;
    tracing::info!(?report, "stopped");
    Ok(())
}

async fn add_example_orders(url: &str) -> Result<(), redis::RedisError> {
    let client = redis::Client::open(url)?;
    let mut connection = client.get_multiplexed_async_connection().await?;
    let mut pipe = redis::pipe();
    for id in 1..=5 {
        pipe.cmd("XADD")
            .arg(STREAM)
            .arg("*")
            .arg("payload")
            .arg(format!(r#"{{"id":{id}}}"#))
            .arg("customer")
            .arg(format!("c-{}", id % 2))
            .ignore();
    }
    pipe.query_async::<()>(&mut connection).await
}
