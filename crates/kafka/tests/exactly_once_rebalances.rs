//! Exactly-once relays through incremental rebalances on Apache Kafka at
//! 127.0.0.1:9092 (review 2026-12-04, R10): under `cooperative-sticky`
//! and under KIP-848's `group.protocol=consumer`, a member keeps its
//! partitions and keeps committing while the group's generation moves on.
//! A transaction whose offsets carry the generation of a moment ago is
//! refused (`ILLEGAL_GENERATION`, `UNKNOWN_MEMBER_ID`, or the KIP-848
//! epoch's equivalent): that is an aborted transaction, tried again with
//! the new generation, not a fenced producer that ends the consumer.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use intake_core::backend::testkit::TestMessage;
use intake_core::publish::Output;
use intake_core::{Consumer, Payload, RunError, RunReport, handler_fn};
use intake_kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
use intake_kafka::rdkafka::error::KafkaError;
use intake_kafka::rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use intake_kafka::rdkafka::{ClientConfig, Message as _};
use intake_kafka::{GroupProtocol, KafkaSettings, KafkaTransactions};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;

use support::{KafkaBackend, error_chain, unique};

const COUNT: usize = 3_000;

/// A relay in a task of its own.
struct Relay {
    shutdown: CancellationToken,
    run: JoinHandle<Result<RunReport, RunError>>,
}

impl Relay {
    /// A relay of `input` to `output` in `group` whose handler takes `pace`
    /// per input, eight at a time: slow enough that commits go on through
    /// every rebalance.
    async fn start(
        backend: &KafkaBackend,
        input: &str,
        output: &str,
        group: &str,
        pace: Duration,
    ) -> Self {
        let transactions = KafkaTransactions::new(
            KafkaSettings::new(backend.brokers()),
            unique("intake-eos-r10"),
        )
        .operation_timeout(Duration::from_secs(10))
        .transaction_timeout(Duration::from_secs(10));
        let source = backend
            .source(input, group)
            .exactly_once(&transactions)
            .min_commit_interval(Duration::from_millis(10))
            .build()
            .await
            .expect("source");
        let acker = source.acker();
        let output: std::sync::Arc<str> = output.into();
        let handler = ServiceBuilder::new()
            .layer(transactions.layer())
            .service(handler_fn(move |Payload(payload): Payload| {
                let output = output.clone();
                async move {
                    tokio::time::sleep(pace).await;
                    Output::new(output, payload)
                }
            }));
        let consumer = Consumer::builder()
            .max_in_flight(8)
            .commit_interval(Duration::from_millis(10))
            .build(source, acker, handler)
            .expect("consumer");
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(consumer.run(shutdown.clone()));
        Self { shutdown, run }
    }

    /// Whether the run ended (a fenced producer ends it).
    fn ended(&self) -> bool {
        self.run.is_finished()
    }

    async fn stop(self, name: &str) -> RunReport {
        self.shutdown.cancel();
        match tokio::time::timeout(Duration::from_secs(60), self.run)
            .await
            .expect("the run ends within 60 s of the shutdown")
            .expect("task")
        {
            Ok(report) => report,
            Err(error) => panic!("relay {name} failed: {}", error_chain(&error)),
        }
    }
}

/// Inputs of `topic` that `group` committed, and how many there are.
async fn committed(backend: &KafkaBackend, topic: &str, group: &str) -> (i64, i64) {
    let mut attempts = 0;
    let offsets = loop {
        match backend.offsets(topic, group).await {
            Ok(offsets) => break offsets,
            Err(error) if attempts < 50 => {
                attempts += 1;
                tracing::debug!(%error, "offsets not read; again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("offsets: {error}"),
        }
    };
    let done = offsets
        .iter()
        .map(|(_, committed, _)| committed.unwrap_or(0))
        .sum();
    let total = offsets.iter().map(|(_, _, high)| high).sum();
    (done, total)
}

/// The payloads of `topic` read with `read_committed`, counted.
async fn read_committed(backend: &KafkaBackend, topic: &str) -> BTreeMap<String, usize> {
    let brokers = backend.brokers().to_owned();
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || -> Result<_, KafkaError> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", unique("intake-eos-r10-reader"))
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
        let mut counts = BTreeMap::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while at_end < partitions.len() && std::time::Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(message)) => {
                    let payload = String::from_utf8_lossy(message.payload().unwrap_or_default());
                    *counts.entry(payload.into_owned()).or_insert(0) += 1;
                }
                Some(Err(KafkaError::PartitionEOF(_))) => at_end += 1,
                Some(Err(error)) => return Err(error),
                None => {}
            }
        }
        assert_eq!(at_end, partitions.len(), "{topic} not read to its end");
        Ok(counts)
    })
    .await
    .expect("reader thread")
    .expect("read")
}

/// Two relays share four partitions; a third joins and leaves, again and
/// again, while both relay and commit. Every relay runs to its shutdown
/// (none is ended as fenced) and the output holds each id once.
async fn relays_through_incremental_rebalances(
    test: &str,
    protocol: GroupProtocol,
    settings: &[(&str, &str)],
) {
    support::init_tracing();
    let Some(backend) = KafkaBackend::real(test) else {
        return;
    };
    let backend = backend.with_protocol(protocol).with_settings(settings);
    let input = unique("intake-eos-r10-in");
    let output = unique("intake-eos-r10-out");
    let group = backend.new_group("intake-eos-r10-group").await;
    backend.create_topic(&input, 4).await.expect("input topic");
    backend
        .create_topic(&output, 2)
        .await
        .expect("output topic");
    let inputs: Vec<TestMessage> = (0..COUNT)
        .map(|id| TestMessage::new(format!("k{id}"), id.to_string()))
        .collect();
    backend.produce_to(&input, &inputs).await.expect("produce");

    let pace = Duration::from_millis(10);
    let first = Relay::start(&backend, &input, &output, &group, pace).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while committed(&backend, &input, &group).await.0 == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing committed in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let second = Relay::start(&backend, &input, &output, &group, pace).await;
    let mut rebalances = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (done, total) = committed(&backend, &input, &group).await;
        tracing::info!(done, total, rebalances, "relaying");
        assert!(
            !first.ended(),
            "the first relay ended during the rebalances"
        );
        assert!(
            !second.ended(),
            "the second relay ended during the rebalances"
        );
        if done == total {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{done} of {total} inputs committed within 120 s"
        );
        if rebalances < 6 {
            // A third member joins, takes a partition, and leaves: two
            // rebalances in which the other two keep most of theirs.
            let third = Relay::start(&backend, &input, &output, &group, pace).await;
            tokio::time::sleep(Duration::from_millis(2_500)).await;
            third.stop("third").await;
            rebalances += 2;
        } else {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert!(rebalances >= 2, "the group rebalanced while relaying");
    let first_report = first.stop("first").await;
    let second_report = second.stop("second").await;
    tracing::info!(
        first = first_report.succeeded,
        second = second_report.succeeded,
        ack_failures = first_report.ack_failures + second_report.ack_failures,
        "handled by each relay"
    );

    let counts = read_committed(&backend, &output).await;
    let repeated: Vec<_> = counts.iter().filter(|(_, seen)| **seen != 1).collect();
    assert!(repeated.is_empty(), "ids not seen once: {repeated:?}");
    let missing: Vec<usize> = (0..COUNT)
        .filter(|id| !counts.contains_key(&id.to_string()))
        .collect();
    assert!(missing.is_empty(), "ids missing: {missing:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_relays_survive_cooperative_rebalances() {
    relays_through_incremental_rebalances(
        "exactly_once_relays_survive_cooperative_rebalances",
        GroupProtocol::Classic,
        &[("partition.assignment.strategy", "cooperative-sticky")],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_relays_survive_kip_848_rebalances() {
    relays_through_incremental_rebalances(
        "exactly_once_relays_survive_kip_848_rebalances",
        GroupProtocol::Consumer,
        &[],
    )
    .await;
}
