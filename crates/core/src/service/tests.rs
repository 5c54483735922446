use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::*;
use crate::handler::{Key, Payload, State};
use crate::memory::{MemoryBroker, Record};
use crate::publish::Output;

async fn until_drained(broker: &MemoryBroker, topic: &str, group: &str) {
    tokio::time::timeout(Duration::from_secs(20), async {
        while broker.lag(topic, group).unwrap_or(u64::MAX) > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the group catches up within 20 s");
}

#[tokio::test]
async fn the_safe_stack_dead_letters_parks_retries_and_publishes_by_default() {
    let broker = MemoryBroker::new();
    broker.create_topic("payments", 2).unwrap();
    broker.create_topic("orders", 2).unwrap();
    broker.create_topic("receipts", 1).unwrap();
    for (id, account) in [
        (1, "a"),
        (2, "b"),
        (3, "later"),
        (4, "poison"),
        (5, "flaky"),
    ] {
        broker
            .send("payments", Record::new(id.to_string()).with_key(account))
            .unwrap();
        broker
            .send("orders", Record::new(id.to_string()).with_key(account))
            .unwrap();
    }
    let flaky_attempts = Arc::new(AtomicU64::new(0));

    async fn receipt(Key(account): Key, Payload(id): Payload) -> Result<Output, HandlerError> {
        Ok(Output::new("receipts", id).with_key(account.unwrap_or_default()))
    }
    async fn bill(
        State(flaky): State<Arc<AtomicU64>>,
        Key(account): Key,
        meta: crate::handler::Meta,
    ) -> Result<(), HandlerError> {
        match account.as_deref() {
            Some(b"poison") => Err(HandlerError::permanent("refused for good")),
            Some(b"later") if meta.0.parked_from().is_none() => Err(HandlerError::retry_later(
                "not yet",
                Duration::from_millis(50),
            )),
            Some(b"flaky") if flaky.fetch_add(1, Ordering::Relaxed) < 2 => {
                Err(HandlerError::retryable("flaky downstream"))
            }
            Some(b"panics") => panic!("a handler bug"),
            _ => Ok(()),
        }
    }

    let stop = CancellationToken::new();
    let service = Service::with_state("billing", broker.clone(), Arc::clone(&flaky_attempts))
        .route_with(
            "payments",
            Route::new().backoff(Duration::from_millis(1), Duration::from_millis(5)),
            bill,
        )
        .route("orders", receipt);
    let running = tokio::spawn(service.run_until(stop.clone()));
    until_drained(&broker, "payments", "billing").await;
    until_drained(&broker, "orders", "billing").await;
    stop.cancel();
    let report = running.await.unwrap().unwrap();

    let billing = report.route("payments").and_then(|r| r.report()).unwrap();
    assert_eq!(billing.dead_lettered, 1, "the poison is dead-lettered");
    assert_eq!(broker.dead_letters("payments", "billing").unwrap().len(), 1);
    assert_eq!(
        flaky_attempts.load(Ordering::Relaxed),
        3,
        "retried twice, then passed"
    );
    assert_eq!(
        broker.high_watermarks("receipts").unwrap(),
        [5],
        "a receipt per order, each confirmed before its order was acknowledged"
    );
    assert_eq!(billing.succeeded, 4, "the parked one came back and passed");
}

#[tokio::test]
async fn a_panicking_handler_is_a_failed_message_not_a_dead_route() {
    let broker = MemoryBroker::new();
    broker.create_topic("events", 1).unwrap();
    for id in 0..10 {
        broker.send("events", Record::new(id.to_string())).unwrap();
    }
    async fn handle(Payload(id): Payload) {
        assert!(id.as_ref() != b"3", "a handler bug on message 3");
    }
    let stop = CancellationToken::new();
    let service = Service::new("readers", broker.clone()).route_with(
        "events",
        Route::new().retries(0),
        handle,
    );
    let running = tokio::spawn(service.run_until(stop.clone()));
    until_drained(&broker, "events", "readers").await;
    stop.cancel();
    let report = running.await.unwrap().unwrap();
    let run = report.route("events").and_then(|r| r.report()).unwrap();
    assert_eq!((run.succeeded, run.dead_lettered), (9, 1));
}

#[tokio::test]
async fn a_route_on_a_source_the_broker_lacks_fails_before_anything_runs() {
    let broker = MemoryBroker::new();
    async fn handle() {}
    let error = Service::new("readers", broker)
        .route("missing", handle)
        .run_until(CancellationToken::new())
        .await
        .expect_err("the route has no source");
    assert!(
        matches!(&error, ServiceError::Derive { route, part: "parts", .. } if route == "missing"),
        "{error:?}"
    );
}

#[cfg(feature = "serde")]
#[tokio::test]
async fn settings_from_a_file_apply_over_the_code() {
    let broker = MemoryBroker::new();
    broker.create_topic("events", 1).unwrap();
    broker.send("events", Record::new("1")).unwrap();
    async fn flaky() -> Result<(), HandlerError> {
        Err(HandlerError::retryable("always down"))
    }
    let settings: ServiceSettings = serde_json::from_str(
        r#"{ "drain_deadline": "1s", "routes": { "events": { "group": "from-file", "retries": 0 } } }"#,
    )
    .unwrap();
    let stop = CancellationToken::new();
    let service = Service::new("readers", broker.clone())
        .route_with("events", Route::new().retries(1_000), flaky)
        .settings(&settings);
    let running = tokio::spawn(service.run_until(stop.clone()));
    until_drained(&broker, "events", "from-file").await;
    stop.cancel();
    let report = running.await.unwrap().unwrap();
    let run = report
        .route("events as from-file")
        .and_then(|r| r.report())
        .unwrap();
    assert_eq!(run.dead_lettered, 1, "no retries: the file said 0");
}
