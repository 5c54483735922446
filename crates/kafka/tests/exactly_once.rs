//! Exactly-once pipelines on Apache Kafka at 127.0.0.1:9092: inputs relayed
//! through `KafkaTransactions` appear exactly once in the output read with
//! `read_committed`, through a crash and past a zombie.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use intake_core::backend::testkit::TestMessage;
use intake_core::backend::{AckBatch, AckError, Acker, PartitionAck, Source, SourceEvent};
use intake_core::publish::Output;
use intake_core::{
    Consumer, Message, PartitionKey, Payload, Position, RunError, RunReport, handler_fn,
};
use intake_kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
use intake_kafka::rdkafka::error::KafkaError;
use intake_kafka::rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use intake_kafka::rdkafka::{ClientConfig, Message as _};
use intake_kafka::{
    GroupProtocol, KafkaSettings, KafkaSource, KafkaTransactions, TransactionError,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceBuilder, ServiceExt};

use support::{KafkaBackend, error_chain, unique};

fn backend(test: &str) -> Option<KafkaBackend> {
    support::init_tracing();
    KafkaBackend::real(test)
}

/// Produces inputs `0..count` (payload = id, keyed by id so they spread
/// over the partitions).
async fn produce_inputs(backend: &KafkaBackend, topic: &str, count: usize) {
    produce_range(backend, topic, 0..count).await;
}

/// Produces the inputs of ids `ids` to `topic`.
async fn produce_range(backend: &KafkaBackend, topic: &str, ids: std::ops::Range<usize>) {
    let inputs: Vec<TestMessage> = ids
        .map(|id| TestMessage::new(format!("k{id}"), id.to_string()))
        .collect();
    backend.produce_to(topic, &inputs).await.expect("produce");
}

/// Transactions for a relay instance: short transaction timeout, so a test
/// that leaves one open waits little.
fn transactions(backend: &KafkaBackend, id: &str) -> KafkaTransactions {
    KafkaTransactions::new(KafkaSettings::new(backend.brokers()), id)
        .operation_timeout(Duration::from_secs(10))
        .transaction_timeout(Duration::from_secs(10))
}

/// A relay of `input` to `output` in `group`, running the real runtime:
/// each payload forwarded unchanged in a transaction.
async fn relay(
    backend: &KafkaBackend,
    input: &str,
    output: &str,
    group: &str,
    transactions: &KafkaTransactions,
) -> (CancellationToken, JoinHandle<Result<RunReport, RunError>>) {
    paced_relay(backend, input, output, group, transactions, None).await
}

/// A relay whose handler takes `pace` per input, eight at a time at most,
/// when there is one: slow enough to be killed mid-stream.
async fn paced_relay(
    backend: &KafkaBackend,
    input: &str,
    output: &str,
    group: &str,
    transactions: &KafkaTransactions,
    pace: Option<Duration>,
) -> (CancellationToken, JoinHandle<Result<RunReport, RunError>>) {
    let source = backend
        .source(input, group)
        .exactly_once(transactions)
        .min_commit_interval(Duration::from_millis(20))
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
                if let Some(pace) = pace {
                    tokio::time::sleep(pace).await;
                }
                Output::new(output, payload)
            }
        }));
    let consumer = Consumer::builder()
        .max_in_flight(if pace.is_some() { 8 } else { 1024 })
        .build(source, acker, handler)
        .expect("consumer");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(consumer.run(shutdown.clone()));
    (shutdown, run)
}

/// Inputs of `topic` whose offsets `group` committed, and how many there
/// are. Asks again while the group's coordinator moves (a new group's first
/// answers may say "not coordinator").
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

/// Waits (up to `patience`) until `group` committed every input of `topic`.
async fn until_all_committed(backend: &KafkaBackend, topic: &str, group: &str, patience: Duration) {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let (done, total) = committed(backend, topic, group).await;
        if done == total {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{done} of {total} inputs committed within {patience:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The payloads of `topic` read with `isolation.level` (read_committed
/// stops at the last stable offset), counted per payload.
async fn read(backend: &KafkaBackend, topic: &str, isolation: &str) -> BTreeMap<String, usize> {
    let brokers = backend.brokers().to_owned();
    let topic = topic.to_owned();
    let isolation = isolation.to_owned();
    tokio::task::spawn_blocking(move || -> Result<_, KafkaError> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", unique("intake-eos-reader"))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "true")
            .set("isolation.level", &isolation)
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
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
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
        assert_eq!(
            at_end,
            partitions.len(),
            "{topic} not read to its end in 20 s"
        );
        Ok(counts)
    })
    .await
    .expect("reader thread")
    .expect("read")
}

/// Asserts that `counts` holds each id of `0..count` exactly once.
fn exactly_once(counts: &BTreeMap<String, usize>, count: usize) {
    let repeated: Vec<_> = counts.iter().filter(|(_, seen)| **seen != 1).collect();
    assert!(repeated.is_empty(), "ids not seen once: {repeated:?}");
    let missing: Vec<usize> = (0..count)
        .filter(|id| !counts.contains_key(&id.to_string()))
        .collect();
    assert!(missing.is_empty(), "ids missing: {missing:?}");
    assert_eq!(counts.len(), count, "ids that were never input: {counts:?}");
}

/// Every input relayed once: the output read with `read_committed` holds
/// each id once, nothing was aborted (read_uncommitted shows the same), and
/// every input offset is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_relay_outputs_each_input_exactly_once() {
    const COUNT: usize = 300;
    let Some(backend) = backend("a transactional relay") else {
        return;
    };
    let input = unique("intake-eos-in");
    let output = unique("intake-eos-out");
    let group = unique("intake-eos-group");
    backend.create_topic(&input, 3).await.expect("input topic");
    backend
        .create_topic(&output, 3)
        .await
        .expect("output topic");
    produce_inputs(&backend, &input, COUNT).await;

    let transactions = transactions(&backend, &unique("intake-eos-relay"));
    let (shutdown, run) = relay(&backend, &input, &output, &group, &transactions).await;
    until_all_committed(&backend, &input, &group, Duration::from_secs(30)).await;
    shutdown.cancel();
    let report = run.await.expect("task").expect("run");
    assert_eq!(report.succeeded, COUNT as u64);
    assert_eq!(transactions.outputs_held(), 0, "every output committed");

    exactly_once(&read(&backend, &output, "read_committed").await, COUNT);
    exactly_once(&read(&backend, &output, "read_uncommitted").await, COUNT);
}

support::per_group_protocol!(
    /// A relay killed mid-stream (its task aborted: no final commit, its
    /// open transaction left open) and started again with the same
    /// transactional.id: the new one aborts what the old left open and
    /// carries on from the committed offsets, and the output holds each id
    /// once.
    a_relay_killed_mid_stream_and_restarted_outputs_each_input_exactly_once => killed_and_restarted
);

async fn killed_and_restarted(test: &str, protocol: GroupProtocol) {
    const COUNT: usize = 2_000;
    let Some(backend) = backend(test) else {
        return;
    };
    let backend = backend.with_protocol(protocol);
    let input = unique("intake-eos-kill-in");
    let output = unique("intake-eos-kill-out");
    let group = backend.new_group("intake-eos-kill-group").await;
    let id = unique("intake-eos-kill-relay");
    backend.create_topic(&input, 2).await.expect("input topic");
    backend
        .create_topic(&output, 2)
        .await
        .expect("output topic");
    produce_inputs(&backend, &input, COUNT).await;

    let first = transactions(&backend, &id);
    let pace = Some(Duration::from_millis(5));
    let (_shutdown, run) = paced_relay(&backend, &input, &output, &group, &first, pace).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (done, _) = committed(&backend, &input, &group).await;
        if done > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing committed in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    run.abort();
    let _ = run.await;
    let (done, total) = committed(&backend, &input, &group).await;
    tracing::info!(done, total, "relay killed");
    assert!(
        done < total,
        "killed after the last commit: {done} of {total}"
    );

    let second = transactions(&backend, &id);
    let (shutdown, run) = relay(&backend, &input, &output, &group, &second).await;
    until_all_committed(&backend, &input, &group, Duration::from_secs(30)).await;
    shutdown.cancel();
    run.await.expect("task").expect("run");

    exactly_once(&read(&backend, &output, "read_committed").await, COUNT);
    let uncommitted: usize = read(&backend, &output, "read_uncommitted")
        .await
        .values()
        .sum();
    tracing::info!(
        uncommitted,
        committed = COUNT,
        "outputs of aborted transactions are only seen read_uncommitted"
    );
}

support::per_group_protocol!(
    /// A second relay joining the group while the first relays: the first's
    /// revoked partitions are drained and committed in a transaction before
    /// the second takes them, and the output holds each id once.
    relays_that_rebalance_output_each_input_exactly_once => relays_that_rebalance
);

async fn relays_that_rebalance(test: &str, protocol: GroupProtocol) {
    const COUNT: usize = 1_000;
    let Some(backend) = backend(test) else {
        return;
    };
    let backend = backend.with_protocol(protocol);
    let input = unique("intake-eos-rebalance-in");
    let output = unique("intake-eos-rebalance-out");
    let group = backend.new_group("intake-eos-rebalance-group").await;
    backend.create_topic(&input, 4).await.expect("input topic");
    backend
        .create_topic(&output, 2)
        .await
        .expect("output topic");
    // A fifth of the inputs before the relays start, the rest in steps over
    // about 8 s once the second relay has joined: a group that takes a
    // while to hand it partitions (KIP-848 assigns on heartbeats, slower on
    // a loaded machine) still has inputs left to give it.
    const UP_FRONT: usize = COUNT / 5;
    const STEPS: usize = 8;
    produce_inputs(&backend, &input, UP_FRONT).await;

    let pace = Some(Duration::from_millis(5));
    let first = transactions(&backend, &unique("intake-eos-rebalance-a"));
    let (stop_first, first_run) =
        paced_relay(&backend, &input, &output, &group, &first, pace).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while committed(&backend, &input, &group).await.0 == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing committed in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = transactions(&backend, &unique("intake-eos-rebalance-b"));
    let (stop_second, second_run) =
        paced_relay(&backend, &input, &output, &group, &second, pace).await;
    let step = (COUNT - UP_FRONT) / STEPS;
    for start in (UP_FRONT..COUNT).step_by(step) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        produce_range(&backend, &input, start..(start + step).min(COUNT)).await;
    }
    until_all_committed(&backend, &input, &group, Duration::from_secs(40)).await;
    stop_first.cancel();
    stop_second.cancel();
    let first_report = first_run.await.expect("task").expect("run A");
    let second_report = second_run.await.expect("task").expect("run B");
    assert!(
        second_report.succeeded > 0,
        "the second relay took partitions"
    );
    tracing::info!(
        first = first_report.succeeded,
        second = second_report.succeeded,
        "inputs handled by each relay"
    );

    exactly_once(&read(&backend, &output, "read_committed").await, COUNT);
}

/// Takes messages from `source` until it delivered `count`.
async fn deliveries(source: &mut KafkaSource, count: usize) -> Vec<Message> {
    let mut delivered = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while delivered.len() < count {
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(
            !remaining.is_zero(),
            "{} of {count} delivered in 30 s",
            delivered.len()
        );
        match tokio::time::timeout(remaining, source.next(&mut delivered, count)).await {
            Ok(Ok(SourceEvent::Delivered | SourceEvent::Assigned(_))) | Err(_) => {}
            Ok(Ok(other)) => panic!("unexpected source event {other:?}"),
            Ok(Err(error)) => panic!("source failed: {}", error_chain(&error)),
        }
    }
    delivered
}

/// A zombie: instance A handled every input and holds their outputs, not
/// yet committed, when B starts with A's group.instance.id (a replacement
/// of A, say, while A still runs), takes its partition, relays everything
/// and commits. A's commit comes later: the group refuses its offsets (A's
/// membership is no longer current, KIP-447: `UNKNOWN_MEMBER_ID`), A's
/// transaction aborts, every later one is refused the same way, and A's
/// outputs never reach read_committed readers. (A refused generation or
/// membership aborts the transaction rather than fencing the producer for
/// good, as in Java's client: a cooperative rebalance moves the generation
/// of members that keep their partitions too.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_that_lost_its_partitions_is_refused_and_its_outputs_never_count() {
    const COUNT: usize = 20;
    let Some(backend) = backend("a zombie transactional relay") else {
        return;
    };
    let input = unique("intake-eos-zombie-in");
    let output = unique("intake-eos-zombie-out");
    let group = unique("intake-eos-zombie-group");
    let instance = unique("intake-eos-zombie-member");
    backend.create_topic(&input, 1).await.expect("input topic");
    backend
        .create_topic(&output, 1)
        .await
        .expect("output topic");
    produce_inputs(&backend, &input, COUNT).await;
    // A hears of its replacement at its next heartbeat, 20 s away: long
    // after its commit below.
    let members = backend.with_settings(&[
        ("group.instance.id", instance.as_str()),
        ("session.timeout.ms", "60000"),
        ("heartbeat.interval.ms", "20000"),
    ]);

    let zombie = transactions(&members, &unique("intake-eos-zombie-a"));
    let mut source = members
        .source(&input, &group)
        .exactly_once(&zombie)
        .build()
        .await
        .expect("source A");
    let acker_a = source.acker();
    let handler = handler_fn({
        let output = output.clone();
        move |Payload(payload): Payload| {
            let output = output.clone();
            async move { Output::new(output, payload) }
        }
    });
    let mut service = ServiceBuilder::new().layer(zombie.layer()).service(handler);
    let delivered = deliveries(&mut source, COUNT).await;
    let mut last = 0;
    for message in delivered {
        if let Position::Offset(offset) = message.metadata().position() {
            last = last.max(offset);
        }
        service
            .ready()
            .await
            .expect("ready")
            .call(message)
            .await
            .expect("handled");
    }
    assert_eq!(zombie.outputs_held(), COUNT);

    let successor = transactions(&members, &unique("intake-eos-zombie-b"));
    let (shutdown, run) = relay(&members, &input, &output, &group, &successor).await;
    until_all_committed(&members, &input, &group, Duration::from_secs(30)).await;
    shutdown.cancel();
    run.await.expect("task").expect("run B");

    let mut ack = PartitionAck::new(PartitionKey::new(input.as_str(), 0));
    ack.watermark = Some(Position::Offset(last));
    let batch = AckBatch {
        partitions: vec![ack],
        sync: true,
    };
    let mut acker_a = acker_a;
    for attempt in 0..3 {
        match acker_a.ack(&batch).await {
            Err(AckError::Broker(source)) => match source.downcast_ref::<TransactionError>() {
                Some(TransactionError::Aborted { .. } | TransactionError::Fenced { .. }) => {}
                other => panic!("attempt {attempt}: expected a refused transaction, got {other:?}"),
            },
            other => panic!("attempt {attempt}: expected a refused transaction, got {other:?}"),
        }
    }
    drop(source);

    exactly_once(&read(&members, &output, "read_committed").await, COUNT);
    let uncommitted: usize = read(&members, &output, "read_uncommitted")
        .await
        .values()
        .sum();
    // A's outputs reach the log only if they left its producer before the
    // refusal (the abort purges the rest): there, aborted, if at all.
    assert!(
        uncommitted >= COUNT,
        "{uncommitted} outputs read_uncommitted"
    );
    tracing::info!(
        aborted = uncommitted - COUNT,
        "the zombie's outputs on the log, aborted"
    );
}
