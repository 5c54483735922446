//! Review C13: a commit batch the acker took for one assignment of a
//! partition must never commit it for a later one. Apache Kafka on
//! 127.0.0.1:9092 (`.ci/services/kafka.sh`); skipped with a printed reason
//! when no broker listens, unless `INTAKE_REQUIRE_BROKERS=1`.
//!
//! Every wait is on a condition, bounded; no test sleeps a fixed time and
//! hopes.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_core::backend::testkit::Backend;
use intake_core::backend::testkit::harness::numbered;
use intake_core::backend::{AckBatch, AckError};
use intake_core::{
    Consumer, ConsumerObserver, HandlerError, Message, PartitionKey, Position, RunError, RunReport,
    handler_fn,
};
use intake_kafka::KafkaSource;
use support::consumer::eventually;
use support::{KafkaBackend, unique};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const PATIENCE: Duration = Duration::from_secs(90);

/// What the acker answered for each batch that moved the watermark of one
/// partition: the watermark and whether the acker said it committed.
struct Acks {
    partition: PartitionKey,
    answered: Mutex<Vec<(Position, Result<(), String>)>>,
}

impl Acks {
    fn new(partition: PartitionKey) -> Self {
        Self {
            partition,
            answered: Mutex::new(Vec::new()),
        }
    }

    fn answered(&self) -> Vec<(Position, Result<(), String>)> {
        self.answered
            .lock()
            .map(|answered| answered.clone())
            .unwrap_or_default()
    }
}

impl ConsumerObserver for Acks {
    fn on_ack(&self, batch: &AckBatch, result: Result<(), &AckError>, _elapsed: Duration) {
        let Some(watermark) = batch
            .partitions
            .iter()
            .find(|ack| ack.partition == self.partition)
            .and_then(|ack| ack.watermark)
        else {
            return;
        };
        if let Ok(mut answered) = self.answered.lock() {
            answered.push((watermark, result.map_err(|error| error.to_string())));
        }
    }
}

/// A runtime on `source` whose handler counts what it handled.
struct Member {
    shutdown: CancellationToken,
    task: JoinHandle<Result<RunReport, RunError>>,
    handled: Arc<AtomicUsize>,
}

impl Member {
    fn start(
        source: KafkaSource,
        revoke_timeout: Duration,
        observer: Option<Arc<dyn ConsumerObserver>>,
    ) -> Self {
        let handled = Arc::new(AtomicUsize::new(0));
        let handler = handler_fn({
            let handled = handled.clone();
            move |_message: Message| {
                let handled = handled.clone();
                async move {
                    handled.fetch_add(1, Ordering::AcqRel);
                    Ok::<(), HandlerError>(())
                }
            }
        });
        let acker = source.acker();
        let mut builder = Consumer::builder()
            .commit_interval(Duration::from_millis(50))
            .revoke_timeout(revoke_timeout);
        if let Some(observer) = observer {
            builder = builder.observer(observer);
        }
        let consumer = builder
            .build(source, acker, handler)
            .expect("valid consumer settings");
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(consumer.run(shutdown.clone()));
        Self {
            shutdown,
            task,
            handled,
        }
    }

    fn handled(&self) -> usize {
        self.handled.load(Ordering::Acquire)
    }

    async fn stop(self) -> RunReport {
        self.shutdown.cancel();
        match self.task.await {
            Ok(Ok(report)) => report,
            Ok(Err(error)) => panic!("the consumer failed: {error}"),
            Err(error) => panic!("the consumer task failed: {error}"),
        }
    }
}

/// The committed offset of `group` on partition 0 of `topic`.
async fn committed(kafka: &KafkaBackend, topic: &str, group: &str) -> Option<i64> {
    kafka
        .offsets(topic, group)
        .await
        .expect("offsets")
        .into_iter()
        .find(|(partition, _, _)| *partition == 0)
        .and_then(|(_, committed, _)| committed)
}

/// A commits offset 1, then its acker holds the batch of offsets 1..=9
/// back for the minimum commit interval (30 s). Meanwhile B joins: A's
/// revocation waits for the runtime, whose final batch is queued behind
/// the held one, until the revoke wait (revoke timeout + 5 s) ends, and A
/// gives the partition up. B (its member id sorts first, so the range
/// assignor gives it the only partition) handles 1..=29 and commits 30,
/// then leaves: the partition comes back to A, a new assignment starting
/// at 30. Then A's held batch, taken for the first assignment, reaches the
/// broker: it must not commit its offset over B's 30.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_held_across_a_revoke_and_a_new_assignment_is_not_committed() {
    support::init_tracing();
    let test = "a_batch_held_across_a_revoke_and_a_new_assignment_is_not_committed";
    let Some(kafka) = KafkaBackend::real(test) else {
        return;
    };
    let topic = kafka.create_source(1).await.expect("topic");
    let group = unique("intake-fence");
    let partition = PartitionKey::new(topic.as_str(), 0);

    // Kafka names a member `{client.id}-{uuid}`, and librdkafka's range
    // assignor gives the partitions to the members in that order.
    let kafka_a = KafkaBackend::at(kafka.brokers()).with_settings(&[("client.id", "zz-held")]);
    let kafka_b = KafkaBackend::at(kafka.brokers()).with_settings(&[("client.id", "aa-next")]);

    let acks = Arc::new(Acks::new(partition.clone()));
    let source_a = kafka_a
        .source(&topic, &group)
        .min_commit_interval(Duration::from_secs(30))
        .build()
        .await
        .expect("source A");
    let a = Member::start(
        source_a,
        Duration::from_millis(100),
        Some(acks.clone() as Arc<dyn ConsumerObserver>),
    );

    // The first commit goes at once; the next waits for the interval.
    kafka
        .produce(&topic, numbered(0, 1))
        .await
        .expect("produce");
    eventually("A to commit offset 1", PATIENCE, || async {
        committed(&kafka, &topic, &group).await == Some(1)
    })
    .await;
    kafka
        .produce(&topic, numbered(1, 9))
        .await
        .expect("produce");
    eventually("A to handle 10", PATIENCE, || async { a.handled() == 10 }).await;

    let source_b = kafka_b.source(&topic, &group).build().await.expect("B");
    let b = Member::start(source_b, Duration::from_secs(10), None);
    eventually("B to handle 1..=9 again", PATIENCE, || async {
        b.handled() >= 9
    })
    .await;
    kafka
        .produce(&topic, numbered(10, 20))
        .await
        .expect("produce");
    eventually("B to commit 30", PATIENCE, || async {
        committed(&kafka, &topic, &group).await == Some(30)
    })
    .await;
    let held = acks.answered();
    assert_eq!(
        held.len(),
        1,
        "A's batch after its first is still held back by the commit interval: {held:?}"
    );
    b.stop().await;

    // The partition comes back to A; its held batch is answered once the
    // interval has passed.
    eventually("A's held batch to be answered", PATIENCE, || async {
        acks.answered().len() >= 2
    })
    .await;
    let answered = acks.answered();
    let (watermark, outcome) = &answered[1];
    assert!(
        matches!(watermark, Position::Offset(offset) if (1..=9).contains(offset)),
        "the held batch is of A's first assignment: {answered:?}"
    );
    let after = committed(&kafka, &topic, &group).await;
    a.stop().await;
    assert_eq!(
        after,
        Some(30),
        "A's batch of its first assignment committed over B's progress \
         (the acker answered {outcome:?})"
    );
    assert!(outcome.is_err(), "the held batch is refused: {answered:?}");
    assert_eq!(
        committed(&kafka, &topic, &group).await,
        Some(30),
        "A's stop commits nothing of its first assignment"
    );
}
