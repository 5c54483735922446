//! Consume a Kafka topic as a member of a consumer group.
//!
//! Needs a Kafka-protocol broker on 127.0.0.1:9092 (`.ci/services/kafka.sh`
//! starts one), or set `KAFKA_BROKERS`. The example creates the topic
//! `intake-example.orders` (4 partitions) if it is missing, produces the
//! example orders to it (one fails once, one is malformed, one has no
//! items), reserves them with the handler every broker example shares
//! (`examples/support`), and consumes until SIGTERM or Ctrl-C. The malformed
//! order and the one without items go to the dead-letter topic
//! `intake-example.orders.billing.dlq` with their origin in headers; every
//! other order is reserved and committed. Produce more with any Kafka
//! client, for example
//!
//! ```text
//! echo '{"id":42,"customer":"c-9","quantity":2}' | kcat -P -b 127.0.0.1:9092 -t intake-example.orders
//! ```
//!
//! Run it with `cargo run --example kafka --features kafka`.

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use intake::dead_letter::DeadLetterLayer;
use intake::kafka::rdkafka::ClientConfig;
use intake::kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use intake::kafka::rdkafka::client::DefaultClientContext;
use intake::kafka::rdkafka::error::RDKafkaErrorCode;
use intake::kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use intake::kafka::{KafkaSettings, KafkaSource};
use intake::retry::RetryLayer;
use intake::{CatchPanicLayer, Consumer, DeliveryOrder, Json, Meta, handler_fn};
use tower::ServiceBuilder;

const TOPIC: &str = "intake-example.orders";
const GROUP: &str = "billing";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    support::init_logging("info");
    let brokers = std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
    // Every librdkafka setting passes through: TLS and SASL go here too.
    let settings = KafkaSettings::new(&brokers);

    create_topic(&settings).await?;
    produce_example_orders(&settings).await?;

    // librdkafka's default assignment (`range`) gives partition p of every
    // topic the group reads to one member: what parking's order per key
    // needs once the source also reads a return topic (see
    // `intake::kafka::parking`). `cooperative-sticky` may give partition p
    // of a topic and of its return topic to different members.
    let source = KafkaSource::builder(settings.clone())
        .group(GROUP)
        .topic(TOPIC)
        .build()
        .await?;
    let acker = source.acker();
    // Dead letters go to `intake-example.orders.billing.dlq`, on the source's
    // brokers with its settings.
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
    // retries) is written to the dead-letter topic, then committed.
    let handler = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(dead_letters))
        .layer(RetryLayer::new(support::retry_policy()))
        .layer(CatchPanicLayer::new())
        .service(handler);

    let shutdown = support::shutdown_on_signals();
    tracing::info!(%brokers, topic = TOPIC, group = GROUP, "consuming; SIGTERM or Ctrl-C stops");
    let report = Consumer::builder()
        .max_in_flight(256)
        // Orders of one customer (the key) in order, customers in parallel.
        .ordering(DeliveryOrder::Key)
        .build(source, acker, handler)?
        .run(shutdown)
        .await?;
    tally.print("kafka", &report);
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

/// The example orders, keyed by customer.
async fn produce_example_orders(
    settings: &KafkaSettings,
) -> Result<(), Box<dyn std::error::Error>> {
    let producer: FutureProducer = ClientConfig::clone(settings.client_config()).create()?;
    for (customer, payload) in support::example_orders() {
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
