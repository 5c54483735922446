//! One hung handler holds its partition's watermark; once that partition has
//! `max_uncommitted` deliveries between its watermark and its newest one,
//! only that partition stops being fetched: the others keep flowing and
//! committing (review C7). On the memory broker, whose source pauses a
//! partition when the runtime asks, under `DeliveryOrder::Key` and
//! `Unordered` (under `Partition` the hung message's lane holds its
//! partition's later deliveries in the budget long before the window fills).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_core::consumer::{Consumer, DeliveryOrder};
use intake_core::memory::{MemoryBroker, Record};
use intake_core::{HandlerError, Message, Position};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

const PARTITIONS: u32 = 4;
const PER_PARTITION: i64 = 200;
const MAX_IN_FLIGHT: usize = 8;
const MAX_UNCOMMITTED: usize = 16;
/// The key of the one message that hangs (offset 0 of partition 0).
const HUNG: &str = "hung";

/// Offsets handled, per partition.
type Handled = Arc<Mutex<HashMap<u32, Vec<i64>>>>;

fn handled_of(handled: &Handled, partition: u32) -> Vec<i64> {
    handled
        .lock()
        .map(|handled| handled.get(&partition).cloned().unwrap_or_default())
        .unwrap_or_default()
}

/// Waits (bounded, on the test's clock) until `done` holds; `state` says
/// where things stand if it never does.
async fn wait_until(what: &str, done: impl Fn() -> bool, state: impl Fn() -> String) {
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting for {what}: {}", state());
}

async fn one_hung_handler_pauses_only_its_partition(ordering: DeliveryOrder) {
    let broker = MemoryBroker::new();
    broker.create_topic("orders", PARTITIONS).expect("topic");
    for partition in 0..PARTITIONS {
        for offset in 0..PER_PARTITION {
            let key = if partition == 0 && offset == 0 {
                HUNG.to_owned()
            } else {
                format!("p{partition}-k{}", offset % 50)
            };
            broker
                .send(
                    "orders",
                    Record::new(offset.to_string())
                        .with_key(key)
                        .to_partition(partition),
                )
                .expect("send");
        }
    }
    let (source, acker) = broker.consumer("orders", "g").expect("join the group");
    let handled: Handled = Arc::default();
    let release = Arc::new(Notify::new());
    let handler = {
        let (handled, release) = (handled.clone(), release.clone());
        tower::service_fn(move |message: Message| {
            let (handled, release) = (handled.clone(), release.clone());
            async move {
                if message.key().is_some_and(|key| &key[..] == HUNG.as_bytes()) {
                    release.notified().await;
                }
                let Position::Offset(offset) = message.metadata().position() else {
                    return Err(HandlerError::permanent("memory positions are offsets"));
                };
                if let Ok(mut handled) = handled.lock() {
                    handled
                        .entry(message.metadata().partition())
                        .or_default()
                        .push(offset);
                }
                Ok::<_, HandlerError>(())
            }
        })
    };
    let consumer = Consumer::builder()
        .max_in_flight(MAX_IN_FLIGHT)
        .max_uncommitted(MAX_UNCOMMITTED)
        .ordering(ordering)
        .commit_interval(Duration::from_millis(5))
        .build(source, acker, handler)
        .expect("valid settings");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(consumer.run(shutdown.clone()));
    let state = || {
        let counts: Vec<usize> = (0..PARTITIONS)
            .map(|partition| handled_of(&handled, partition).len())
            .collect();
        format!(
            "handled per partition {counts:?}, committed {:?}",
            broker.committed("orders", "g").unwrap_or_default()
        )
    };

    // While offset 0 of partition 0 hangs, the other partitions are handled
    // to the end and committed.
    wait_until(
        "the other partitions to be handled and committed",
        || {
            let committed = broker.committed("orders", "g").unwrap_or_default();
            (1..PARTITIONS).all(|partition| {
                handled_of(&handled, partition).len() == PER_PARTITION as usize
                    && committed.get(partition as usize) == Some(&Some(PER_PARTITION))
            })
        },
        state,
    )
    .await;
    let committed = broker.committed("orders", "g").expect("committed offsets");
    assert_eq!(
        committed.first(),
        Some(&None),
        "nothing of partition 0 is committed past its hung message"
    );
    // Partition 0 stopped near its window: what it had fetched when it
    // reached it, at most one fetch (the budget) more.
    let early = handled_of(&handled, 0).len();
    assert!(
        early < MAX_UNCOMMITTED + MAX_IN_FLIGHT,
        "partition 0 took {early} deliveries past its hung message, window {MAX_UNCOMMITTED}"
    );

    // Released, the hung message lets its partition go on to the end.
    release.notify_one();
    wait_until(
        "everything to be committed",
        || broker.lag("orders", "g").is_ok_and(|lag| lag == 0),
        state,
    )
    .await;
    shutdown.cancel();
    let report = run.await.expect("join").expect("a clean run");
    assert_eq!(
        report.succeeded,
        u64::from(PARTITIONS) * PER_PARTITION as u64
    );
    for partition in 0..PARTITIONS {
        let mut offsets = handled_of(&handled, partition);
        offsets.sort_unstable();
        offsets.dedup();
        assert_eq!(
            offsets,
            (0..PER_PARTITION).collect::<Vec<_>>(),
            "partition {partition}: every offset handled"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn under_key_order_a_hung_handler_pauses_only_its_partition() {
    one_hung_handler_pauses_only_its_partition(DeliveryOrder::Key).await;
}

#[tokio::test(start_paused = true)]
async fn unordered_a_hung_handler_pauses_only_its_partition() {
    one_hung_handler_pauses_only_its_partition(DeliveryOrder::Unordered).await;
}
