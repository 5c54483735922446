//! The quickstart: a consumer of 10,000 orders on the in-memory broker.
//!
//! A few orders are malformed (they go to the dead-letter topic with their
//! origin) and a few fail transiently (the retry layer retries them). The
//! consumer runs with `Key` ordering and 64 in flight, shuts down gracefully
//! once everything is committed, prints a summary, and exits with an error
//! unless every order is accounted for.
//!
//! ```sh
//! cargo run --example quickstart
//! ```

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use intake::consumer::{Consumer, DeliveryOrder};
use intake::dead_letter::DeadLetterLayer;
use intake::memory::{MemoryBroker, Record};
use intake::retry::RetryLayer;
use intake::{CatchPanicLayer, Exponential, HandlerError, Json, Meta, handler_fn};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;

const ORDERS: u64 = 10_000;
const PARTITIONS: u32 = 4;
const TOPIC: &str = "orders";
const GROUP: &str = "billing";

#[derive(Deserialize)]
struct Order {
    id: u64,
    customer: String,
    quantity: u32,
}

/// Every 997th order is malformed; every 1000th-plus-7 fails once.
fn payload(id: u64) -> String {
    if id.is_multiple_of(997) {
        format!("{{\"id\": {id}, \"customer\": ")
    } else {
        format!(
            r#"{{"id":{id},"customer":"customer-{}","quantity":{}}}"#,
            id % 500,
            id % 9 + 1
        )
    }
}

fn fails_transiently(id: u64) -> bool {
    id % 1000 == 7
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .init();

    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, PARTITIONS)?;
    broker.send_batch(
        TOPIC,
        (0..ORDERS).map(|id| Record::new(payload(id)).with_key(format!("customer-{}", id % 500))),
    )?;

    let processed: Arc<Mutex<HashSet<u64>>> = Arc::default();
    let retried = Arc::new(AtomicU64::new(0));
    let handler = {
        let (processed, retried) = (processed.clone(), retried.clone());
        handler_fn(move |Meta(meta): Meta, Json(order): Json<Order>| {
            let (processed, retried) = (processed.clone(), retried.clone());
            async move {
                if fails_transiently(order.id) && meta.attempt() == 1 {
                    retried.fetch_add(1, AtomicOrdering::Relaxed);
                    return Err(HandlerError::retryable("the stock service timed out"));
                }
                // The real work would reserve stock for the customer here.
                std::hint::black_box((&order.customer, order.quantity));
                processed
                    .lock()
                    .map_err(|_| HandlerError::permanent("ledger lock poisoned"))?
                    .insert(order.id);
                Ok(())
            }
        })
    };
    let handler = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(broker.dead_letter_sink(TOPIC, GROUP)?))
        .layer(RetryLayer::new(
            Exponential::new(Duration::from_millis(5), Duration::from_millis(50)).max_retries(3),
        ))
        .layer(CatchPanicLayer::new())
        .service(handler);

    let (source, acker) = broker.consumer(TOPIC, GROUP)?;
    let consumer = Consumer::builder()
        .max_in_flight(64)
        .ordering(DeliveryOrder::Key)
        .commit_interval(Duration::from_millis(20))
        .build(source, acker, handler)?;

    // Shut down once the group has committed everything produced.
    let shutdown = CancellationToken::new();
    let watcher = {
        let (broker, shutdown) = (broker.clone(), shutdown.clone());
        tokio::spawn(async move {
            while broker.lag(TOPIC, GROUP).map_or(true, |lag| lag > 0) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            shutdown.cancel();
        })
    };
    let started = Instant::now();
    let report = consumer.run(shutdown).await?;
    let elapsed = started.elapsed();
    watcher.await?;

    let processed = processed
        .lock()
        .map(|set| set.len() as u64)
        .unwrap_or_default();
    let dead_letters = broker.dead_letters(TOPIC, GROUP)?;
    let committed = broker.committed(TOPIC, GROUP)?;
    let high_watermarks = broker.high_watermarks(TOPIC)?;

    println!(
        "intake quickstart: {ORDERS} orders over {PARTITIONS} partitions, Key ordering, 64 in flight"
    );
    println!("  processed:      {processed}");
    println!(
        "  retried:        {}",
        retried.load(AtomicOrdering::Relaxed)
    );
    println!("  dead-lettered:  {}", dead_letters.len());
    for (partition, (committed, high)) in committed.iter().zip(&high_watermarks).enumerate() {
        println!(
            "  partition {partition}: committed offset {} of {high}",
            committed.map_or("none".to_owned(), |offset| offset.to_string())
        );
    }
    println!(
        "  throughput:     {:.0} orders/s ({elapsed:.2?})",
        ORDERS as f64 / elapsed.as_secs_f64()
    );
    if let Some(letter) = dead_letters.first() {
        println!(
            "  first dead letter: {}/{} @ {} after {} attempt(s): {}",
            letter.message.metadata().source(),
            letter.message.metadata().partition(),
            letter.message.metadata().position(),
            letter.attempts,
            letter.error
        );
    }

    let malformed = (0..ORDERS).filter(|id| id % 997 == 0).count() as u64;
    let all_committed = committed
        .iter()
        .zip(&high_watermarks)
        .all(|(committed, high)| committed.unwrap_or(0) == *high);
    let accounted = processed + dead_letters.len() as u64 == ORDERS
        && dead_letters.len() as u64 == malformed
        && report.unfinished.is_empty()
        && all_committed;
    if !accounted {
        eprintln!("not every order is accounted for: {report:?}");
        std::process::exit(1);
    }
    println!("every order is accounted for");
    Ok(())
}
