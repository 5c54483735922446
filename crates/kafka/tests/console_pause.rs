//! Pausing and resuming a partition through the consumer's control
//! (`ConsumerControl`, issue 28 slice 3) on Apache Kafka on 127.0.0.1:9092:
//! a paused partition is no longer fetched (the source hands over none of
//! the records produced meanwhile), its committed offset stays, the other
//! partition flows, and a resume picks the records up in order, once each.
//! Skipped with a printed reason when no broker listens, unless
//! `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_core::backend::{Limits, Source, SourceError, SourceEvent};
use intake_core::observer::{ConsumerObserver, PartitionSnapshot};
use intake_core::{Consumer, DeliveryOrder, HandlerError, Message, PartitionKey, Position};
use intake_kafka::KafkaSource;
use tokio_util::sync::CancellationToken;

use support::{KafkaBackend, unique};

const PATIENCE: Duration = Duration::from_secs(60);

/// Offsets per partition, in the order seen.
type Offsets = Arc<Mutex<HashMap<u32, Vec<i64>>>>;

fn of(offsets: &Offsets, partition: u32) -> Vec<i64> {
    offsets
        .lock()
        .map(|offsets| offsets.get(&partition).cloned().unwrap_or_default())
        .unwrap_or_default()
}

fn record(offsets: &Offsets, message: &Message) {
    if let (Position::Offset(offset), Ok(mut offsets)) =
        (message.metadata().position(), offsets.lock())
    {
        offsets
            .entry(message.metadata().partition())
            .or_default()
            .push(offset);
    }
}

/// The Kafka source, recording every record it hands to the runtime.
struct Fetched {
    inner: KafkaSource,
    fetched: Offsets,
}

impl Source for Fetched {
    async fn next(
        &mut self,
        deliveries: &mut Vec<Message>,
        max: usize,
    ) -> Result<SourceEvent, SourceError> {
        let event = self.inner.next(deliveries, max).await;
        if let Ok(SourceEvent::Delivered) = &event {
            for message in deliveries.iter() {
                record(&self.fetched, message);
            }
        }
        event
    }

    fn pause(&mut self, partition: &PartitionKey) -> bool {
        self.inner.pause(partition)
    }

    fn resume(&mut self, partition: &PartitionKey) {
        self.inner.resume(partition);
    }

    fn set_limits(&mut self, limits: Limits) {
        self.inner.set_limits(limits);
    }

    async fn close(&mut self) -> Result<(), SourceError> {
        self.inner.close().await
    }
}

/// Whether the runtime's last tick showed each partition paused.
#[derive(Default)]
struct Paused(Mutex<HashMap<u32, bool>>);

impl ConsumerObserver for Paused {
    fn on_partitions(&self, partitions: &[PartitionSnapshot]) {
        if let Ok(mut paused) = self.0.lock() {
            for snapshot in partitions {
                paused.insert(snapshot.stats.partition.partition, snapshot.paused);
            }
        }
    }
}

impl Paused {
    fn is(&self, partition: u32) -> bool {
        self.0
            .lock()
            .map(|paused| paused.get(&partition).copied().unwrap_or(false))
            .unwrap_or(false)
    }
}

async fn committed(kafka: &KafkaBackend, topic: &str, group: &str) -> Vec<Option<i64>> {
    let mut offsets = kafka.offsets(topic, group).await.expect("offsets");
    offsets.sort_by_key(|(partition, _, _)| *partition);
    offsets
        .into_iter()
        .map(|(_, committed, _)| committed)
        .collect()
}

async fn produce(kafka: &KafkaBackend, topic: &str, partition: i32, range: std::ops::Range<i64>) {
    kafka
        .produce_to_partition(topic, partition, range.map(|n| n.to_string()))
        .await
        .expect("produced");
}

/// Waits (bounded by [`PATIENCE`]) until `done` holds, asking every 100 ms.
async fn wait_until<F, Fut>(what: &str, mut done: F, state: impl Fn() -> String)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {PATIENCE:?} waiting for {what}: {}",
            state()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_partition_is_not_fetched_and_resumes_in_order() {
    support::init_tracing();
    let test = "a_paused_partition_is_not_fetched_and_resumes_in_order";
    let Some(kafka) = KafkaBackend::real(test) else {
        return;
    };
    let topic = unique("intake-console-pause");
    kafka.create_topic(&topic, 2).await.expect("topic");
    let group = unique("g");
    produce(&kafka, &topic, 0, 0..10).await;
    produce(&kafka, &topic, 1, 0..10).await;

    let source = kafka.source(&topic, &group).build().await.expect("source");
    let acker = source.acker();
    let fetched: Offsets = Arc::default();
    let handled: Offsets = Arc::default();
    let paused = Arc::new(Paused::default());
    let handler = {
        let handled = handled.clone();
        tower::service_fn(move |message: Message| {
            let handled = handled.clone();
            async move {
                record(&handled, &message);
                Ok::<_, HandlerError>(())
            }
        })
    };
    let consumer = Consumer::builder()
        .ordering(DeliveryOrder::Partition)
        .commit_interval(Duration::from_millis(50))
        .observer(paused.clone())
        .build(
            Fetched {
                inner: source,
                fetched: fetched.clone(),
            },
            acker,
            handler,
        )
        .expect("valid settings");
    let control = consumer.control();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(consumer.run(shutdown.clone()));
    let state = || {
        format!(
            "fetched p0 {:?} p1 {:?}; handled p0 {:?} p1 {:?}",
            of(&fetched, 0),
            of(&fetched, 1),
            of(&handled, 0),
            of(&handled, 1)
        )
    };

    wait_until(
        "both partitions to be handled and committed",
        || {
            let (kafka, topic, group) = (&kafka, &topic, &group);
            async move { committed(kafka, topic, group).await == [Some(10), Some(10)] }
        },
        state,
    )
    .await;

    control.pause_partition(&topic, 0);
    wait_until(
        "the run to apply the pause",
        || {
            let paused = &paused;
            async move { paused.is(0) }
        },
        state,
    )
    .await;
    let fetched_before = of(&fetched, 0);
    produce(&kafka, &topic, 0, 10..20).await;
    produce(&kafka, &topic, 1, 10..20).await;
    wait_until(
        "partition 1 to flow and commit while partition 0 is paused",
        || {
            let (kafka, topic, group) = (&kafka, &topic, &group);
            async move { committed(kafka, topic, group).await.get(1) == Some(&Some(20)) }
        },
        state,
    )
    .await;
    // A few more fetch rounds of partition 1's: partition 0 still not
    // fetched.
    produce(&kafka, &topic, 1, 20..30).await;
    wait_until(
        "partition 1's next records",
        || {
            let (kafka, topic, group) = (&kafka, &topic, &group);
            async move { committed(kafka, topic, group).await.get(1) == Some(&Some(30)) }
        },
        state,
    )
    .await;
    assert_eq!(
        of(&fetched, 0),
        fetched_before,
        "the source fetched records of the paused partition: {}",
        state()
    );
    assert_eq!(
        of(&handled, 0),
        (0..10).collect::<Vec<i64>>(),
        "{}",
        state()
    );
    assert_eq!(
        committed(&kafka, &topic, &group).await.first(),
        Some(&Some(10)),
        "the paused partition's committed offset holds"
    );

    control.resume_partition(&topic, 0);
    wait_until(
        "partition 0 to pick up what was produced while paused",
        || {
            let (kafka, topic, group) = (&kafka, &topic, &group);
            async move { committed(kafka, topic, group).await.first() == Some(&Some(20)) }
        },
        state,
    )
    .await;
    assert_eq!(
        of(&handled, 0),
        (0..20).collect::<Vec<i64>>(),
        "in order, once each: {}",
        state()
    );
    assert!(!paused.is(0) || !control.is_paused(&topic, 0));

    shutdown.cancel();
    let report = tokio::time::timeout(PATIENCE, run)
        .await
        .expect("the run ends in time")
        .expect("join")
        .expect("run");
    assert!(report.unfinished.is_empty(), "{:?}", report.unfinished);
}
