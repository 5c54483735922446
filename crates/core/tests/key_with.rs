//! `DeliveryOrder::Key` with the key found by `ConsumerBuilder::key_with`
//! (a header here), and messages without a key counted, on the memory
//! broker.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_core::backend::testkit::wait_until_committed;
use intake_core::consumer::{Consumer, DeliveryOrder};
use intake_core::memory::{MemoryBroker, Record};
use intake_core::{HandlerError, Message};
use tokio_util::sync::CancellationToken;

const CUSTOMERS: usize = 4;
const PER_CUSTOMER: usize = 25;

/// Runs a `Key`-ordered consumer over orders whose customer is in a header,
/// with `key_with` set or not; returns the (customer, sequence) pairs in
/// the order the handlers started, the most that ran at once, and the
/// report.
async fn run(with_key_fn: bool) -> (Vec<(String, usize)>, usize, intake_core::RunReport) {
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 1).expect("topic");
    for sequence in 0..PER_CUSTOMER {
        for customer in 0..CUSTOMERS {
            broker
                .send(
                    "orders",
                    Record::new(sequence.to_string())
                        .with_header("customer", format!("c{customer}")),
                )
                .expect("send");
        }
    }
    let started = Arc::new(Mutex::new(Vec::new()));
    let running = Arc::new(Mutex::new((0usize, 0usize)));
    let handler = tower::service_fn({
        let (started, running) = (started.clone(), running.clone());
        move |message: Message| {
            let (started, running) = (started.clone(), running.clone());
            async move {
                let customer = message
                    .headers()
                    .get_str("customer")
                    .unwrap_or("")
                    .to_owned();
                let sequence: usize = std::str::from_utf8(message.payload())
                    .ok()
                    .and_then(|text| text.parse().ok())
                    .unwrap_or(usize::MAX);
                started.lock().unwrap().push((customer, sequence));
                {
                    let mut running = running.lock().unwrap();
                    running.0 += 1;
                    running.1 = running.1.max(running.0);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                running.lock().unwrap().0 -= 1;
                Ok::<_, HandlerError>(())
            }
        }
    });
    let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
    let mut builder = Consumer::builder()
        .ordering(DeliveryOrder::Key)
        .max_in_flight(32);
    if with_key_fn {
        builder =
            builder.key_with(|message| message.headers().get("customer").map(|value| &value[..]));
    }
    let stop = CancellationToken::new();
    let consumer = tokio::spawn(
        builder
            .build(source, acker, handler)
            .expect("settings")
            .run(stop.clone()),
    );
    wait_until_committed(&broker, "orders", "billing", Duration::from_secs(10))
        .await
        .expect("every order committed");
    stop.cancel();
    let report = consumer.await.expect("join").expect("run");
    let started = std::mem::take(&mut *started.lock().unwrap());
    let most = running.lock().unwrap().1;
    (started, most, report)
}

#[tokio::test]
async fn a_key_found_in_a_header_orders_each_customer_and_runs_customers_in_parallel() {
    let (started, most, report) = run(true).await;
    assert_eq!(started.len(), CUSTOMERS * PER_CUSTOMER);
    for customer in 0..CUSTOMERS {
        let name = format!("c{customer}");
        let sequence: Vec<usize> = started
            .iter()
            .filter(|(who, _)| *who == name)
            .map(|(_, sequence)| *sequence)
            .collect();
        assert_eq!(
            sequence,
            (0..PER_CUSTOMER).collect::<Vec<_>>(),
            "{name} in order"
        );
    }
    assert!(most > 1, "different customers ran at the same time");
    assert!(
        most <= CUSTOMERS,
        "never two of one customer at once: {most}"
    );
    assert_eq!(report.without_key, 0);
}

#[tokio::test]
async fn messages_without_a_key_in_key_mode_are_counted() {
    // The key is only in a header, and no key function says so: every
    // message runs unordered, and the report says how many.
    let (started, _most, report) = run(false).await;
    assert_eq!(started.len(), CUSTOMERS * PER_CUSTOMER);
    assert_eq!(report.without_key, (CUSTOMERS * PER_CUSTOMER) as u64);
}
