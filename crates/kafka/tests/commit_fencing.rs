//! Review C13: a commit batch the acker took for one assignment of a
//! partition must never commit it for a later one. Apache Kafka on
//! 127.0.0.1:9092 (`.ci/services/kafka.sh`); skipped with a printed reason
//! when no broker listens, unless `INTAKE_REQUIRE_BROKERS=1`.
//!
//! Every wait is on a condition, bounded; no test sleeps a fixed time and
//! hopes.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_core::backend::testkit::Backend;
use intake_core::backend::testkit::harness::numbered;
use intake_core::backend::{AckBatch, AckError};
use intake_core::publish::Output;
use intake_core::{
    Consumer, ConsumerObserver, HandlerError, Message, PartitionKey, Position, RunError, RunReport,
    handler_fn,
};
use intake_kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
use intake_kafka::rdkafka::error::KafkaError;
use intake_kafka::rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use intake_kafka::rdkafka::{ClientConfig, Message as _};
use intake_kafka::{KafkaSettings, KafkaSource, KafkaTransactions};
use support::consumer::eventually;
use support::{KafkaBackend, unique};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceBuilder};

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
    /// A member that only counts.
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
        Self::launch(source, revoke_timeout, observer, handler, handled)
    }

    /// A member of an exactly-once relay: each input forwarded to `output`
    /// in `transactions`.
    fn relay(
        source: KafkaSource,
        revoke_timeout: Duration,
        observer: Option<Arc<dyn ConsumerObserver>>,
        transactions: &KafkaTransactions,
        output: &str,
    ) -> Self {
        let handled = Arc::new(AtomicUsize::new(0));
        let destination: Arc<str> = output.into();
        let handler = ServiceBuilder::new()
            .layer(transactions.layer())
            .service(handler_fn({
                let handled = handled.clone();
                move |message: Message| {
                    let handled = handled.clone();
                    let destination = destination.clone();
                    async move {
                        handled.fetch_add(1, Ordering::AcqRel);
                        Output::forward(&message, destination)
                    }
                }
            }));
        Self::launch(source, revoke_timeout, observer, handler, handled)
    }

    fn launch<H>(
        source: KafkaSource,
        revoke_timeout: Duration,
        observer: Option<Arc<dyn ConsumerObserver>>,
        handler: H,
        handled: Arc<AtomicUsize>,
    ) -> Self
    where
        H: Service<Message, Response = ()> + Send + 'static,
        H::Error: Into<HandlerError> + Send + 'static,
        H::Future: Send + 'static,
    {
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

/// The payloads of partition 0 of `topic`, read with `read_committed`,
/// counted per payload.
async fn read_committed(kafka: &KafkaBackend, topic: &str) -> BTreeMap<String, usize> {
    let brokers = kafka.brokers().to_owned();
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || -> Result<_, KafkaError> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", unique("intake-fence-reader"))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "true")
            .set("isolation.level", "read_committed")
            .create()?;
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(&topic, 0, Offset::Beginning)?;
        consumer.assign(&list)?;
        let mut counts = BTreeMap::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "{topic} not read to its end in 20 s"
            );
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(message)) => {
                    let payload = String::from_utf8_lossy(message.payload().unwrap_or_default());
                    *counts.entry(payload.into_owned()).or_insert(0) += 1;
                }
                Some(Err(KafkaError::PartitionEOF(_))) => return Ok(counts),
                Some(Err(error)) => return Err(error),
                None => {}
            }
        }
    })
    .await
    .expect("reader thread")
    .expect("read")
}

/// The same in an exactly-once relay, where the stale batch is a
/// transaction: A relays 0 (committed at once), keeps the outputs of 1..=9
/// for a transaction held back 30 s, loses the partition to B (which relays
/// 1..=29 and commits 30) and gets it back. A's held transaction must not
/// commit offset 10 (with none of its outputs, dropped with the partition):
/// a member starting later would relay 10..=29 a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_held_across_a_revoke_and_a_new_assignment_is_not_committed() {
    support::init_tracing();
    let test = "a_transaction_held_across_a_revoke_and_a_new_assignment_is_not_committed";
    let Some(kafka) = KafkaBackend::real(test) else {
        return;
    };
    let topic = kafka.create_source(1).await.expect("input topic");
    let output = unique("intake-fence-out");
    kafka.create_topic(&output, 1).await.expect("output topic");
    let group = unique("intake-fence");
    let partition = PartitionKey::new(topic.as_str(), 0);
    let transactions = |name: &str| {
        KafkaTransactions::new(KafkaSettings::new(kafka.brokers()), unique(name))
            .operation_timeout(Duration::from_secs(10))
            .transaction_timeout(Duration::from_secs(10))
    };
    let kafka_a = KafkaBackend::at(kafka.brokers()).with_settings(&[("client.id", "zz-held")]);
    let kafka_b = KafkaBackend::at(kafka.brokers()).with_settings(&[("client.id", "aa-next")]);

    let acks = Arc::new(Acks::new(partition.clone()));
    let transactions_a = transactions("intake-fence-a");
    let source_a = kafka_a
        .source(&topic, &group)
        .exactly_once(&transactions_a)
        .min_commit_interval(Duration::from_secs(30))
        .build()
        .await
        .expect("source A");
    let a = Member::relay(
        source_a,
        Duration::from_millis(100),
        Some(acks.clone() as Arc<dyn ConsumerObserver>),
        &transactions_a,
        &output,
    );
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

    let transactions_b = transactions("intake-fence-b");
    let source_b = kafka_b
        .source(&topic, &group)
        .exactly_once(&transactions_b)
        .build()
        .await
        .expect("B");
    let b = Member::relay(
        source_b,
        Duration::from_secs(10),
        None,
        &transactions_b,
        &output,
    );
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
    assert_eq!(acks.answered().len(), 1, "A's second transaction is held");
    b.stop().await;
    eventually("A's held transaction to be answered", PATIENCE, || async {
        acks.answered().len() >= 2
    })
    .await;
    a.stop().await;
    let after = committed(&kafka, &topic, &group).await;

    // Whoever the group's next member is starts from its committed offset.
    let transactions_c = transactions("intake-fence-c");
    let source_c = kafka
        .source(&topic, &group)
        .exactly_once(&transactions_c)
        .build()
        .await
        .expect("C");
    let c = Member::relay(
        source_c,
        Duration::from_secs(10),
        None,
        &transactions_c,
        &output,
    );
    kafka
        .produce(&topic, numbered(30, 1))
        .await
        .expect("produce");
    eventually("C to commit 31", PATIENCE, || async {
        committed(&kafka, &topic, &group).await == Some(31)
    })
    .await;
    c.stop().await;

    let counts = read_committed(&kafka, &output).await;
    let repeated: Vec<_> = counts.iter().filter(|(_, seen)| **seen != 1).collect();
    assert_eq!(
        after,
        Some(30),
        "A's held transaction committed its first assignment's offset over B's progress; \
         outputs relayed more than once: {repeated:?}"
    );
    assert!(
        repeated.is_empty(),
        "outputs relayed more than once: {repeated:?}"
    );
    assert_eq!(counts.len(), 31, "every input's output: {counts:?}");
}
