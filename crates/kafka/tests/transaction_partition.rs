//! An exactly-once pipeline's output that names its partition
//! ([`Output::with_partition`]) lands in that partition, as
//! [`KafkaPublisher`](intake_kafka::KafkaPublisher) puts it, whatever
//! partition its key would pick. Apache Kafka on 127.0.0.1:9092
//! (`.ci/services/kafka.sh`); skipped with a printed reason when no broker
//! listens, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use intake_core::backend::testkit::TestMessage;
use intake_core::publish::Output;
use intake_core::{Consumer, Message, RunReport, handler_fn};
use intake_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewPartitions};
use intake_kafka::rdkafka::client::DefaultClientContext;
use intake_kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
use intake_kafka::rdkafka::error::KafkaError;
use intake_kafka::rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use intake_kafka::rdkafka::{ClientConfig, Message as _};
use intake_kafka::{KafkaSettings, KafkaTransactions};
use support::consumer::eventually;
use support::{KafkaBackend, unique};
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;

const COUNT: usize = 24;

/// The partition of each payload of `topic`, read with `read_committed`
/// to the end of every partition.
async fn read_committed(kafka: &KafkaBackend, topic: &str) -> BTreeMap<String, Vec<i32>> {
    let brokers = kafka.brokers().to_owned();
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || -> Result<_, KafkaError> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", unique("intake-eos-partition-reader"))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "true")
            .set("isolation.level", "read_committed")
            .create()?;
        let metadata = consumer.fetch_metadata(Some(&topic), Duration::from_secs(10))?;
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .filter(|found| found.name() == topic)
            .flat_map(|found| found.partitions().iter().map(|p| p.id()))
            .collect();
        let mut list = TopicPartitionList::new();
        for partition in &partitions {
            list.add_partition_offset(&topic, *partition, Offset::Beginning)?;
        }
        consumer.assign(&list)?;
        let mut at_end = 0;
        let mut placed: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while at_end < partitions.len() && std::time::Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(message)) => {
                    let payload = String::from_utf8_lossy(message.payload().unwrap_or_default());
                    placed
                        .entry(payload.into_owned())
                        .or_default()
                        .push(message.partition());
                }
                Some(Err(KafkaError::PartitionEOF(_))) => at_end += 1,
                Some(Err(error)) => return Err(error),
                None => {}
            }
        }
        assert_eq!(
            at_end,
            partitions.len(),
            "{topic} not read to its end in 20 s"
        );
        Ok(placed)
    })
    .await
    .expect("reader thread")
    .expect("read")
}

/// A relay of `input` to `output` in transactions, each output forwarded
/// with its input's key into the partition `place` names for its payload.
struct Relay {
    input: String,
    output: String,
    group: String,
    shutdown: CancellationToken,
    run: tokio::task::JoinHandle<Result<RunReport, intake_core::RunError>>,
}

impl Relay {
    /// Creates the input topic (one partition) and the output topic
    /// (`partitions`), and starts relaying.
    async fn start(kafka: &KafkaBackend, partitions: u32, place: fn(&str) -> u32) -> Self {
        let input = unique("intake-eos-placed-in");
        let output = unique("intake-eos-placed-out");
        let group = unique("intake-eos-placed-group");
        kafka.create_topic(&input, 1).await.expect("input topic");
        kafka
            .create_topic(&output, partitions)
            .await
            .expect("output topic");
        let transactions = KafkaTransactions::new(
            KafkaSettings::new(kafka.brokers()),
            unique("intake-eos-placed"),
        )
        .operation_timeout(Duration::from_secs(10))
        .transaction_timeout(Duration::from_secs(10));
        let source = kafka
            .source(&input, &group)
            .exactly_once(&transactions)
            .min_commit_interval(Duration::from_millis(20))
            .build()
            .await
            .expect("source");
        let acker = source.acker();
        let destination: std::sync::Arc<str> = output.as_str().into();
        let handler = ServiceBuilder::new()
            .layer(transactions.layer())
            .service(handler_fn(move |message: Message| {
                let destination = destination.clone();
                async move {
                    let partition = place(&String::from_utf8_lossy(message.payload()));
                    Output::forward(&message, destination).with_partition(partition)
                }
            }));
        let consumer = Consumer::builder()
            .build(source, acker, handler)
            .expect("consumer");
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(consumer.run(shutdown.clone()));
        Self {
            input,
            output,
            group,
            shutdown,
            run,
        }
    }

    /// Produces inputs `ids` keyed `k{id}` (the keys spread over the
    /// partitions of the output topic) and waits until every input is
    /// committed.
    async fn relay(&self, kafka: &KafkaBackend, ids: std::ops::Range<usize>) {
        let inputs: Vec<TestMessage> = ids
            .map(|id| TestMessage::new(format!("k{id}"), id.to_string()))
            .collect();
        kafka
            .produce_to(&self.input, &inputs)
            .await
            .expect("produce");
        eventually("every input committed", Duration::from_secs(60), || async {
            kafka
                .offsets(&self.input, &self.group)
                .await
                .is_ok_and(|offsets| {
                    offsets
                        .iter()
                        .all(|(_, committed, high)| *committed == Some(*high))
                })
        })
        .await;
    }

    /// Stops; the run's report and where each output is, read with
    /// `read_committed`.
    async fn stop(self, kafka: &KafkaBackend) -> (RunReport, BTreeMap<String, Vec<i32>>) {
        self.shutdown.cancel();
        let report = self.run.await.expect("task").expect("run");
        (report, read_committed(kafka, &self.output).await)
    }
}

/// Grows `topic` to `total` partitions.
async fn add_partitions(kafka: &KafkaBackend, topic: &str, total: usize) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", kafka.brokers())
        .create()
        .expect("admin client");
    let results = admin
        .create_partitions(
            &[NewPartitions::new(topic, total)],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("partitions request");
    for result in results {
        result.expect("partitions added");
    }
}

/// Relays inputs `0..COUNT` to a topic of four partitions, each output into
/// the partition `place` names for it.
async fn relay_placed(
    kafka: &KafkaBackend,
    place: fn(&str) -> u32,
) -> (RunReport, BTreeMap<String, Vec<i32>>) {
    let relay = Relay::start(kafka, 4, place).await;
    relay.relay(kafka, 0..COUNT).await;
    relay.stop(kafka).await
}

/// Every output placed in partition 2 is there, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_output_lands_in_the_partition_it_names() {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real("a_transactional_output_lands_in_the_partition_it_names")
    else {
        return;
    };
    let (_, placed) = relay_placed(&kafka, |_| 2).await;
    let misplaced: Vec<_> = placed
        .iter()
        .filter(|(_, partitions)| partitions.as_slice() != [2])
        .collect();
    assert!(
        misplaced.is_empty(),
        "outputs not once in partition 2: {misplaced:?}"
    );
    assert_eq!(placed.len(), COUNT, "every input's output: {placed:?}");
}

/// An output naming partition 7 of the four fails its input permanently
/// in the layer (a dead-letter layer would take it), and the transactions
/// carry every other input's output. Librdkafka would fail every
/// transaction that carried it ("unknown partition"): nothing would
/// commit, for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_naming_a_partition_its_topic_lacks_fails_its_input_not_the_transactions() {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real(
        "an_output_naming_a_partition_its_topic_lacks_fails_its_input_not_the_transactions",
    ) else {
        return;
    };
    let (report, placed) = relay_placed(&kafka, |payload| if payload == "5" { 7 } else { 1 }).await;
    assert_eq!(report.discarded, 1, "{report:?}");
    assert_eq!(report.ack_failures, 0, "no transaction failed: {report:?}");
    assert!(!placed.contains_key("5"), "{placed:?}");
    let misplaced: Vec<_> = placed
        .iter()
        .filter(|(_, partitions)| partitions.as_slice() != [1])
        .collect();
    assert!(
        misplaced.is_empty(),
        "outputs not once in partition 1: {misplaced:?}"
    );
    assert_eq!(placed.len(), COUNT - 1, "every other input's: {placed:?}");
}

/// The partition count the layer read is read again before an output past
/// it is refused: partitions added to the topic after the layer's first
/// read take outputs at once (the count is otherwise read every 5 min).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_naming_a_partition_added_since_the_count_was_read_is_kept() {
    support::init_tracing();
    let Some(kafka) =
        KafkaBackend::real("an_output_naming_a_partition_added_since_the_count_was_read_is_kept")
    else {
        return;
    };
    let relay = Relay::start(&kafka, 2, |payload| {
        if payload.parse::<usize>().is_ok_and(|id| id >= 10) {
            3
        } else {
            1
        }
    })
    .await;
    relay.relay(&kafka, 0..10).await;
    add_partitions(&kafka, &relay.output, 4).await;
    relay.relay(&kafka, 10..20).await;
    let (report, placed) = relay.stop(&kafka).await;
    assert_eq!(report.discarded, 0, "{report:?}");
    let expected = |id: &str| {
        if id.parse::<usize>().is_ok_and(|id| id >= 10) {
            3
        } else {
            1
        }
    };
    let misplaced: Vec<_> = placed
        .iter()
        .filter(|(id, partitions)| partitions.as_slice() != [expected(id)])
        .collect();
    assert!(misplaced.is_empty(), "outputs misplaced: {misplaced:?}");
    assert_eq!(placed.len(), 20, "every input's output: {placed:?}");
}
