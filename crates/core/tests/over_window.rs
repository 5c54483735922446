//! One hung handler holds its partition's watermark; once that partition has
//! `max_uncommitted` deliveries between its watermark and its newest one,
//! only that partition stops being fetched: the others keep flowing and
//! committing (review C7). On the memory broker, whose source pauses a
//! partition when the runtime asks, under `DeliveryOrder::Key` and
//! `Unordered` (under `Partition` the hung message's lane holds its
//! partition's later deliveries in the budget long before the window fills).
//!
//! A source that cannot pause a partition, or that says it does and keeps
//! delivering it, stalls the whole consumer instead, as every source did
//! before, with the engine's ring still bounded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_core::backend::{Source, SourceError, SourceEvent};
use intake_core::consumer::{Consumer, DeliveryOrder};
use intake_core::memory::{MemoryBroker, MemorySource, Record};
use intake_core::{HandlerError, Message, PartitionKey, Position};
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

/// Pauses (`true`) and resumes the runtime asked for, by partition.
type Pauses = Arc<Mutex<Vec<(u32, bool)>>>;

/// What the source does when asked to pause a partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OnPause {
    /// Pauses it (the memory source's own answer).
    Pause,
    /// Answers that it cannot (the trait's default).
    Refuse,
    /// Answers that it does, and goes on delivering it.
    Ignore,
}

/// The memory source, with its answer to pauses chosen, and every pause
/// and resume recorded.
struct Recorded {
    inner: MemorySource,
    on_pause: OnPause,
    pauses: Pauses,
}

impl Recorded {
    fn record(&self, partition: &PartitionKey, pause: bool) {
        if let Ok(mut pauses) = self.pauses.lock() {
            pauses.push((partition.partition, pause));
        }
    }
}

impl Source for Recorded {
    async fn next(
        &mut self,
        deliveries: &mut Vec<Message>,
        max: usize,
    ) -> Result<SourceEvent, SourceError> {
        self.inner.next(deliveries, max).await
    }

    fn pause(&mut self, partition: &PartitionKey) -> bool {
        self.record(partition, true);
        match self.on_pause {
            OnPause::Pause => self.inner.pause(partition),
            OnPause::Refuse => false,
            OnPause::Ignore => true,
        }
    }

    fn resume(&mut self, partition: &PartitionKey) {
        self.record(partition, false);
        self.inner.resume(partition);
    }

    async fn close(&mut self) -> Result<(), SourceError> {
        self.inner.close().await
    }
}

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

/// Partition 0 starts with the hung message, then 199 others; the other
/// partitions have 200 each, all with keys of their own.
fn broker() -> MemoryBroker {
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
    broker
}

/// Runs a consumer over `broker` until offset 0 of partition 0, hung, is
/// released and everything is committed. `while_hung` checks what happened
/// before the release, once `settled` holds (or a bounded wait ran out,
/// when `settled` is not expected to hold).
async fn run_with_a_hung_message(
    ordering: DeliveryOrder,
    on_pause: OnPause,
    settled: impl Fn(&MemoryBroker, &Handled) -> bool,
    while_hung: impl FnOnce(&MemoryBroker, &Handled, &Pauses),
) -> Vec<(u32, bool)> {
    let broker = broker();
    let (source, acker) = broker.consumer("orders", "g").expect("join the group");
    let pauses: Pauses = Arc::default();
    let source = Recorded {
        inner: source,
        on_pause,
        pauses: pauses.clone(),
    };
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
            "handled per partition {counts:?}, committed {:?}, pauses {:?}",
            broker.committed("orders", "g").unwrap_or_default(),
            pauses
                .lock()
                .map(|pauses| pauses.clone())
                .unwrap_or_default()
        )
    };

    // Bounded on the paused clock: a stalled run gets there quickly too.
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while !settled(&broker, &handled) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    while_hung(&broker, &handled, &pauses);

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
    pauses
        .lock()
        .map(|pauses| pauses.clone())
        .unwrap_or_default()
}

/// Whether partitions 1.. are handled to the end and committed.
fn others_done(broker: &MemoryBroker, handled: &Handled) -> bool {
    let committed = broker.committed("orders", "g").unwrap_or_default();
    (1..PARTITIONS).all(|partition| {
        handled_of(handled, partition).len() == PER_PARTITION as usize
            && committed.get(partition as usize) == Some(&Some(PER_PARTITION))
    })
}

async fn one_hung_handler_pauses_only_its_partition(ordering: DeliveryOrder) {
    let pauses = run_with_a_hung_message(
        ordering,
        OnPause::Pause,
        others_done,
        |broker, handled, pauses| {
            let counts: Vec<usize> = (0..PARTITIONS)
                .map(|partition| handled_of(handled, partition).len())
                .collect();
            let committed = broker.committed("orders", "g").expect("committed offsets");
            assert!(
                others_done(broker, handled),
                "while offset 0 of partition 0 hangs, the other partitions are handled to the \
                 end and committed: handled {counts:?}, committed {committed:?}, pauses {:?}",
                pauses
                    .lock()
                    .map(|pauses| pauses.clone())
                    .unwrap_or_default()
            );
            assert_eq!(
                committed.first(),
                Some(&None),
                "nothing of partition 0 is committed past its hung message"
            );
            // Partition 0 stopped at its window: what it had fetched when
            // it reached it, at most one fetch (the budget) more.
            assert!(
                counts[0] < MAX_UNCOMMITTED + MAX_IN_FLIGHT,
                "partition 0 took {} deliveries past its hung message, window {MAX_UNCOMMITTED}",
                counts[0]
            );
        },
    )
    .await;
    assert_eq!(
        pauses,
        vec![(0, true), (0, false)],
        "partition 0 paused once at its window, and resumed once its hung message finished"
    );
}

#[tokio::test(start_paused = true)]
async fn under_key_order_a_hung_handler_pauses_only_its_partition() {
    one_hung_handler_pauses_only_its_partition(DeliveryOrder::Key).await;
}

#[tokio::test(start_paused = true)]
async fn unordered_a_hung_handler_pauses_only_its_partition() {
    one_hung_handler_pauses_only_its_partition(DeliveryOrder::Unordered).await;
}

#[tokio::test(start_paused = true)]
async fn a_source_that_cannot_pause_a_partition_stalls_every_partition_until_it_has_room() {
    let pauses = run_with_a_hung_message(
        DeliveryOrder::Key,
        OnPause::Refuse,
        |_, _| false,
        |broker, handled, _| {
            let counts: Vec<usize> = (0..PARTITIONS)
                .map(|partition| handled_of(handled, partition).len())
                .collect();
            assert!(
                !others_done(broker, handled),
                "fetching stops for every partition: handled {counts:?}"
            );
            assert!(
                counts[0] < MAX_UNCOMMITTED,
                "partition 0 stops at its window: {counts:?}"
            );
        },
    )
    .await;
    // Refused, the pause needs no resume.
    assert_eq!(pauses, vec![(0, true)]);
}

#[tokio::test(start_paused = true)]
async fn a_source_still_delivering_a_paused_partition_stalls_every_partition_past_one_budget() {
    let pauses = run_with_a_hung_message(
        DeliveryOrder::Unordered,
        OnPause::Ignore,
        |_, _| false,
        |broker, handled, _| {
            let counts: Vec<usize> = (0..PARTITIONS)
                .map(|partition| handled_of(handled, partition).len())
                .collect();
            assert!(
                !others_done(broker, handled),
                "fetching stops for every partition: handled {counts:?}"
            );
            // The ring holds the hung message and those behind it: at most
            // the window and one budget, and one fetch more.
            assert!(
                counts[0] >= MAX_UNCOMMITTED && counts[0] < MAX_UNCOMMITTED + 2 * MAX_IN_FLIGHT,
                "partition 0 is admitted past its window up to one budget: {counts:?}"
            );
        },
    )
    .await;
    assert_eq!(pauses, vec![(0, true), (0, false)]);
}
