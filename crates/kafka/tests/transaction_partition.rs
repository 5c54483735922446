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
use intake_core::{Consumer, Message, handler_fn};
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

/// Inputs keyed `k0`..`k23` (their keys spread over the four partitions
/// of the output topic) are relayed in transactions, each output keyed as
/// its input and placed in partition 2: read with `read_committed`, every
/// output is there, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_output_lands_in_the_partition_it_names() {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real("a_transactional_output_lands_in_the_partition_it_names")
    else {
        return;
    };
    let input = unique("intake-eos-placed-in");
    let output = unique("intake-eos-placed-out");
    let group = unique("intake-eos-placed-group");
    kafka.create_topic(&input, 1).await.expect("input topic");
    kafka.create_topic(&output, 4).await.expect("output topic");
    let inputs: Vec<TestMessage> = (0..COUNT)
        .map(|id| TestMessage::new(format!("k{id}"), id.to_string()))
        .collect();
    kafka.produce_to(&input, &inputs).await.expect("produce");

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
            async move { Output::forward(&message, destination).with_partition(2) }
        }));
    let consumer = Consumer::builder()
        .build(source, acker, handler)
        .expect("consumer");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(consumer.run(shutdown.clone()));
    eventually("every input committed", Duration::from_secs(60), || async {
        kafka.offsets(&input, &group).await.is_ok_and(|offsets| {
            offsets
                .iter()
                .all(|(_, committed, high)| *committed == Some(*high))
        })
    })
    .await;
    shutdown.cancel();
    run.await.expect("task").expect("run");

    let placed = read_committed(&kafka, &output).await;
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
