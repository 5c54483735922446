//! The real runtime on a [`KafkaSource`], in a task of its own, with a
//! handler that records what it saw and an observer that records what the
//! runtime owns.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_core::backend::testkit::harness::{Ledger, id_of};
use intake_core::{
    Consumer, ConsumerBuilder, ConsumerObserver, DeliveryOrder, HandlerError, Message,
    PartitionKey, PartitionSnapshot, RunError, RunReport, handler_fn,
};
use intake_kafka::KafkaSource;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower::Service;

/// What the runtime reported about its partitions.
#[derive(Default)]
pub struct Ownership {
    assigned: Mutex<BTreeSet<PartitionKey>>,
    revoked: AtomicUsize,
}

impl ConsumerObserver for Ownership {
    fn on_partitions(&self, partitions: &[PartitionSnapshot]) {
        if let Ok(mut assigned) = self.assigned.lock() {
            *assigned = partitions
                .iter()
                .map(|snapshot| snapshot.stats.partition.clone())
                .collect();
        }
    }

    fn on_revoked(&self, partition: &PartitionKey) {
        self.revoked.fetch_add(1, AtomicOrdering::Relaxed);
        if let Ok(mut assigned) = self.assigned.lock() {
            assigned.remove(partition);
        }
    }
}

/// A consumer running the intake runtime.
pub struct TestConsumer {
    shutdown: CancellationToken,
    task: JoinHandle<Result<RunReport, RunError>>,
    ownership: Arc<Ownership>,
}

impl TestConsumer {
    /// Runs `source` with a handler that records each message's id in
    /// `ledger`, after sleeping `work` (zero: no sleep).
    pub fn start(
        source: KafkaSource,
        ledger: &Ledger,
        work: Duration,
        builder: ConsumerBuilder,
    ) -> Self {
        let ledger = ledger.clone();
        let handler = handler_fn(move |message: Message| {
            let ledger = ledger.clone();
            async move {
                if !work.is_zero() {
                    tokio::time::sleep(work).await;
                }
                ledger.record(id_of(&message)?);
                Ok::<(), HandlerError>(())
            }
        });
        Self::run(source, builder, handler)
    }

    fn run<H>(source: KafkaSource, builder: ConsumerBuilder, handler: H) -> Self
    where
        H: Service<Message, Response = ()> + Send + 'static,
        H::Error: Into<HandlerError> + Send + 'static,
        H::Future: Send + 'static,
    {
        let acker = source.acker();
        let ownership = Arc::new(Ownership::default());
        let consumer = builder
            .observer(ownership.clone())
            .commit_interval(Duration::from_millis(50))
            .build(source, acker, handler)
            .expect("valid consumer settings");
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(consumer.run(shutdown.clone()));
        Self {
            shutdown,
            task,
            ownership,
        }
    }

    /// Runs `source` with `work` per message, in `ordering`, with at most
    /// `max_in_flight` deliveries.
    pub fn working(
        source: KafkaSource,
        ledger: &Ledger,
        work: Duration,
        ordering: DeliveryOrder,
        max_in_flight: usize,
    ) -> Self {
        let builder = Consumer::builder()
            .ordering(ordering)
            .max_in_flight(max_in_flight);
        Self::start(source, ledger, work, builder)
    }

    /// Runs `source` with the default runtime settings and no handler delay.
    pub fn recording(source: KafkaSource, ledger: &Ledger) -> Self {
        Self::start(source, ledger, Duration::ZERO, Consumer::builder())
    }

    /// Runs `source` unordered (so that every message of a partition is
    /// handled at once) with a handler that records each message's id in
    /// `ledger`, then finishes only once `gate` is open: until then nothing
    /// is done, so nothing is committed.
    pub fn gated(source: KafkaSource, ledger: &Ledger, gate: watch::Receiver<bool>) -> Self {
        let ledger = ledger.clone();
        let handler = handler_fn(move |message: Message| {
            let ledger = ledger.clone();
            let mut gate = gate.clone();
            async move {
                ledger.record(id_of(&message)?);
                // A closed gate's sender is gone: finish rather than hang.
                let _ = gate.wait_for(|open| *open).await;
                Ok::<(), HandlerError>(())
            }
        });
        Self::run(
            source,
            Consumer::builder().ordering(DeliveryOrder::Unordered),
            handler,
        )
    }

    /// Partitions the runtime owned at its last commit tick.
    pub fn assigned(&self) -> usize {
        self.ownership
            .assigned
            .lock()
            .map(|assigned| assigned.len())
            .unwrap_or_default()
    }

    /// Partitions revoked so far.
    pub fn revocations(&self) -> usize {
        self.ownership.revoked.load(AtomicOrdering::Relaxed)
    }

    /// Shuts down gracefully and returns the report.
    pub async fn stop(self) -> RunReport {
        self.shutdown.cancel();
        match self.task.await {
            Ok(Ok(report)) => report,
            Ok(Err(error)) => panic!("the consumer failed: {error}"),
            Err(error) => panic!("the consumer task failed: {error}"),
        }
    }

    /// Kills the consumer without shutdown: its source is dropped unclosed.
    pub async fn crash(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// Waits until `condition` holds, checking every 50 ms, or panics after
/// `patience` naming `what` was awaited.
pub async fn eventually<F, Fut>(what: &str, patience: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + patience;
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {patience:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `consumers` own the `partitions` between them, each of them
/// at least one, or panics after `patience`.
pub async fn settled(consumers: &[&TestConsumer], partitions: usize, patience: Duration) {
    eventually(
        &format!(
            "{} consumers to share {partitions} partitions",
            consumers.len()
        ),
        patience,
        || async {
            consumers.iter().all(|consumer| consumer.assigned() > 0)
                && consumers
                    .iter()
                    .map(|consumer| consumer.assigned())
                    .sum::<usize>()
                    == partitions
        },
    )
    .await;
}
