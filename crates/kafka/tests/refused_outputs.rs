//! Outputs the broker refuses, on Apache Kafka at 127.0.0.1:9092 (review
//! 2026-12-04, R3): among a thousand inputs, one whose output is too large
//! for its destination's `max.message.bytes` goes to the dead-letter
//! destination, every other input's output reaches the destination once,
//! the group's offsets reach the end of the input, and the run's report
//! says so. Both with `KafkaTransactions` (exactly once) and with a plain
//! `PublishLayer`.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use intake_core::backend::testkit::TestMessage;
use intake_core::publish::{Output, PublishLayer};
use intake_core::{
    Consumer, DeadLetterLayer, DeliveryOrder, Payload, RunError, RunReport, handler_fn,
};
use intake_kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
use intake_kafka::rdkafka::error::KafkaError;
use intake_kafka::rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use intake_kafka::rdkafka::{ClientConfig, Message as _};
use intake_kafka::{KafkaPublisher, KafkaSettings, KafkaTransactions};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;

use support::{KafkaBackend, unique};

/// Inputs per test.
const COUNT: usize = 1_000;
/// The input whose output is too large.
const BIG: usize = 421;
/// The destination's `max.message.bytes`: small, so that a batch of
/// ordinary outputs is larger than it too.
const LIMIT: &str = "2000";

fn backend(test: &str) -> Option<KafkaBackend> {
    support::init_tracing();
    KafkaBackend::real(test)
}

/// The output of input `id`: its id, and for [`BIG`] ten thousand spaces
/// more.
fn output_payload(id: &str) -> String {
    if id == BIG.to_string() {
        format!("{id}{}", " ".repeat(10_000))
    } else {
        id.to_owned()
    }
}

/// Input topic (2 partitions) with `0..COUNT`, destination (2 partitions,
/// [`LIMIT`]).
async fn topics(backend: &KafkaBackend, name: &str) -> (String, String, String) {
    let input = unique(&format!("intake-refused-{name}-in"));
    let output = unique(&format!("intake-refused-{name}-out"));
    let group = unique(&format!("intake-refused-{name}-group"));
    backend.create_topic(&input, 2).await.expect("input topic");
    backend
        .create_topic_with(&output, 2, &[("max.message.bytes", LIMIT)])
        .await
        .expect("output topic");
    let inputs: Vec<TestMessage> = (0..COUNT)
        .map(|id| TestMessage::new(format!("k{id}"), id.to_string()))
        .collect();
    backend.produce_to(&input, &inputs).await.expect("produce");
    (input, output, group)
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
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The payloads of `topic` read with `read_committed`, counted per payload
/// (trimmed: the big one's spaces go).
async fn read_committed(backend: &KafkaBackend, topic: &str) -> BTreeMap<String, usize> {
    let brokers = backend.brokers().to_owned();
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || -> Result<_, KafkaError> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", unique("intake-refused-reader"))
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
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while at_end < partitions.len() && std::time::Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(message)) => {
                    let payload = String::from_utf8_lossy(message.payload().unwrap_or_default());
                    *counts.entry(payload.trim().to_owned()).or_insert(0) += 1;
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

/// Asserts what both modes must end with: [`BIG`] dead-lettered (and only
/// it), every other id once in the destination, the report honest.
async fn assert_only_the_big_one_refused(
    backend: &KafkaBackend,
    output: &str,
    dead_letter_topic: &str,
    report: &RunReport,
) {
    assert_eq!(report.dead_lettered, 1, "{report:?}");
    assert_eq!(report.succeeded, (COUNT - 1) as u64, "{report:?}");
    assert!(report.is_settled(), "{report:?}");

    let counts = read_committed(backend, output).await;
    let repeated: Vec<_> = counts.iter().filter(|(_, seen)| **seen != 1).collect();
    assert!(repeated.is_empty(), "ids not seen once: {repeated:?}");
    let missing: Vec<usize> = (0..COUNT)
        .filter(|id| *id != BIG && !counts.contains_key(&id.to_string()))
        .collect();
    assert!(missing.is_empty(), "ids missing: {missing:?}");
    assert!(
        !counts.contains_key(&BIG.to_string()),
        "the big one arrived"
    );

    let letters = backend
        .read_all(dead_letter_topic)
        .await
        .expect("dead letters");
    let ids: Vec<String> = letters
        .iter()
        .map(|record| {
            let letter = record.dead_letter().expect("a dead letter");
            String::from_utf8_lossy(letter.message.payload()).into_owned()
        })
        .collect();
    assert_eq!(ids, [BIG.to_string()], "dead letters");
}

/// Stops a run and returns its report.
async fn stop(
    shutdown: CancellationToken,
    run: JoinHandle<Result<RunReport, RunError>>,
) -> RunReport {
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the run ends within 60 s of the shutdown")
        .expect("task")
        .expect("run")
}

/// Exactly once: the big output never enters a transaction; its input is
/// dead-lettered and every other input commits with its output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_an_output_too_large_is_dead_lettered_and_the_rest_commits() {
    let Some(backend) = backend("a refused output, exactly once") else {
        return;
    };
    let (input, output, group) = topics(&backend, "eos").await;
    let transactions = KafkaTransactions::new(
        KafkaSettings::new(backend.brokers()),
        unique("intake-refused"),
    )
    .operation_timeout(Duration::from_secs(10))
    .transaction_timeout(Duration::from_secs(10));
    let source = backend
        .source(&input, &group)
        .exactly_once(&transactions)
        .min_commit_interval(Duration::from_millis(20))
        .build()
        .await
        .expect("source");
    let acker = source.acker();
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let dead_letter_topic = sink.topic_for(&input);
    let destination: Arc<str> = output.as_str().into();
    let handler = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(sink))
        .layer(transactions.layer())
        .service(handler_fn(move |Payload(payload): Payload| {
            let destination = Arc::clone(&destination);
            async move {
                let id = String::from_utf8_lossy(&payload).into_owned();
                Output::new(destination, output_payload(&id))
            }
        }));
    let consumer = Consumer::builder()
        .max_in_flight(256)
        .build(source, acker, handler)
        .expect("consumer");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(consumer.run(shutdown.clone()));

    until_all_committed(&backend, &input, &group, Duration::from_secs(60)).await;
    let report = stop(shutdown, run).await;
    assert_eq!(transactions.outputs_held(), 0, "every output committed");
    assert_only_the_big_one_refused(&backend, &output, &dead_letter_topic, &report).await;
}

/// Publishing without transactions: the same outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_an_output_too_large_is_dead_lettered_and_the_rest_arrives() {
    let Some(backend) = backend("a refused output, published") else {
        return;
    };
    let (input, output, group) = topics(&backend, "plain").await;
    let source = backend
        .source(&input, &group)
        .min_commit_interval(Duration::from_millis(20))
        .build()
        .await
        .expect("source");
    let acker = source.acker();
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let dead_letter_topic = sink.topic_for(&input);
    // Batches gather for 50 ms: the big output shares one with others, and
    // batches of small ones are larger than the limit.
    let publisher = KafkaPublisher::builder(KafkaSettings::new(backend.brokers()))
        .linger(Duration::from_millis(50))
        .build()
        .expect("publisher");
    let destination: Arc<str> = output.as_str().into();
    let handler = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(sink))
        .layer(PublishLayer::new(publisher))
        .service(handler_fn(move |Payload(payload): Payload| {
            let destination = Arc::clone(&destination);
            async move {
                let id = String::from_utf8_lossy(&payload).into_owned();
                Output::new(destination, output_payload(&id))
            }
        }));
    // Key order (each input its own key): many outputs in flight at once.
    let consumer = Consumer::builder()
        .ordering(DeliveryOrder::Key)
        .max_in_flight(256)
        .build(source, acker, handler)
        .expect("consumer");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(consumer.run(shutdown.clone()));

    until_all_committed(&backend, &input, &group, Duration::from_secs(60)).await;
    let report = stop(shutdown, run).await;
    assert_only_the_big_one_refused(&backend, &output, &dead_letter_topic, &report).await;
}

/// A final commit the broker refuses is reported as not committed: the
/// destination is deleted (and this producer may not create it), inputs
/// keep coming, and the run is stopped while their transaction cannot
/// commit. The run ends within its shutdown deadline, and its report lists
/// the input's partition as not committed, at the last input handled,
/// rather than as committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_commit_that_fails_is_reported_as_not_committed() {
    let Some(backend) = backend("a final commit refused") else {
        return;
    };
    let input = unique("intake-refused-final-in");
    let output = unique("intake-refused-final-out");
    let group = unique("intake-refused-final-group");
    backend.create_topic(&input, 1).await.expect("input topic");
    backend
        .create_topic(&output, 1)
        .await
        .expect("output topic");
    let first: Vec<TestMessage> = (0..50)
        .map(|id| TestMessage::new(format!("k{id}"), id.to_string()))
        .collect();
    backend.produce_to(&input, &first).await.expect("produce");
    let settings = KafkaSettings::new(backend.brokers())
        .set("allow.auto.create.topics", "false")
        .set("topic.metadata.propagation.max.ms", "100")
        .set("topic.metadata.refresh.interval.ms", "500");
    let transactions = KafkaTransactions::new(settings, unique("intake-refused-final"))
        .operation_timeout(Duration::from_secs(5))
        .transaction_timeout(Duration::from_secs(10));
    let source = backend
        .source(&input, &group)
        .exactly_once(&transactions)
        .min_commit_interval(Duration::from_millis(20))
        .build()
        .await
        .expect("source");
    let acker = source.acker();
    let destination: Arc<str> = output.as_str().into();
    let handler = ServiceBuilder::new()
        .layer(transactions.layer())
        .service(handler_fn(move |Payload(payload): Payload| {
            let destination = Arc::clone(&destination);
            async move { Output::new(destination, payload) }
        }));
    let consumer = Consumer::builder()
        .shutdown_deadline(Duration::from_secs(20))
        .build(source, acker, handler)
        .expect("consumer");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(consumer.run(shutdown.clone()));
    until_all_committed(&backend, &input, &group, Duration::from_secs(30)).await;

    backend.delete_topic(&output).await.expect("delete");
    let more: Vec<TestMessage> = (50..60)
        .map(|id| TestMessage::new(format!("k{id}"), id.to_string()))
        .collect();
    backend
        .produce_to(&input, &more)
        .await
        .expect("produce more");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while transactions.outputs_held() < more.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the later inputs were not handled: {} outputs held",
            transactions.outputs_held()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Some transactions with them fail meanwhile.
    tokio::time::sleep(Duration::from_secs(2)).await;
    shutdown.cancel();
    let report = match tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the run ends within 60 s of the shutdown")
        .expect("task")
    {
        Ok(report) => report,
        Err(error) => {
            tracing::info!(error = %support::error_chain(&error), "the run failed");
            error.report().clone()
        }
    };
    tracing::info!(?report, "final report");
    let partition = intake_core::PartitionKey::new(input.as_str(), 0);
    assert!(
        report
            .not_committed
            .contains(&(partition.clone(), intake_core::Position::Offset(59))),
        "{report:?}"
    );
    assert!(
        report
            .committed
            .iter()
            .all(|(committed, _)| *committed != partition),
        "{report:?}"
    );
    assert!(!report.is_settled(), "{report:?}");
    assert_eq!(committed(&backend, &input, &group).await, (50, 60));
}

/// The size the transactional layer checks an output against is the
/// broker's: a record of `n` payload bytes (no key, no headers, 64 <= n
/// < 8,185) is a batch of `n + 70` bytes alone (61 of batch header, 9 of
/// record framing), so a topic with `max.message.bytes` 2,000 takes 1,930
/// bytes and refuses 1,931.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_alone_is_refused_exactly_over_the_topics_limit() {
    use intake_core::publish::{PublishErrorKind, Publisher};

    let Some(backend) = backend("the broker's size rule") else {
        return;
    };
    let topic = unique("intake-refused-rule");
    backend
        .create_topic_with(&topic, 1, &[("max.message.bytes", "2000")])
        .await
        .expect("topic");
    let publisher = KafkaPublisher::builder(KafkaSettings::new(backend.brokers()))
        .linger(Duration::ZERO)
        .build()
        .expect("publisher");
    publisher
        .publish(Output::new(topic.as_str(), vec![b'x'; 1_930]))
        .await
        .expect("1,930 bytes fit");
    let refused = publisher
        .publish(Output::new(topic.as_str(), vec![b'x'; 1_931]))
        .await
        .expect_err("1,931 bytes do not");
    assert_eq!(refused.kind(), PublishErrorKind::Rejected, "{refused}");
}

/// The backstop: an output kept under one limit and refused under a lower
/// one set before its transaction. Input 51's output (5,000 bytes) is kept
/// while input 50 still runs (the watermark waits for it); then the
/// destination's max.message.bytes drops to 2,000 and 50 is let go. Every
/// transaction with 51's output is refused: they are tried after a backoff
/// (a few in 10 s, not one per 100 ms tick), nothing commits past 50,
/// liveness reports the failing commits, and the run's report is not
/// settled. A relay started again handles 51 again, checks it against the
/// limit now, dead-letters it, and commits everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_refused_after_it_was_kept_backs_off_until_a_restart_dead_letters_it() {
    use intake_core::app::{Health, HealthSettings, Problem};
    use intake_kafka::rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
    use intake_kafka::rdkafka::client::DefaultClientContext;
    use std::sync::atomic::{AtomicBool, Ordering};

    const INPUTS: usize = 100;
    const HELD: &str = "50";
    const LATE: &str = "51";
    let Some(backend) = backend("an output refused after it was kept") else {
        return;
    };
    let input = unique("intake-refused-late-in");
    let output = unique("intake-refused-late-out");
    let group = unique("intake-refused-late-group");
    backend.create_topic(&input, 1).await.expect("input topic");
    backend
        .create_topic(&output, 1)
        .await
        .expect("output topic");
    let inputs: Vec<TestMessage> = (0..INPUTS)
        .map(|id| TestMessage::new(format!("k{id}"), id.to_string()))
        .collect();
    backend.produce_to(&input, &inputs).await.expect("produce");

    let released = Arc::new(AtomicBool::new(false));
    let relay = |transactions: KafkaTransactions, health: Option<&Health>| {
        let backend = &backend;
        let (input, output, group) = (&input, &output, &group);
        let released = Arc::clone(&released);
        let observer = health.map(|health| health.register("relay", None));
        async move {
            let source = backend
                .source(input, group)
                .exactly_once(&transactions)
                .min_commit_interval(Duration::from_millis(20))
                .build()
                .await
                .expect("source");
            let acker = source.acker();
            let sink = source.dead_letter_sink().build().await.expect("sink");
            let destination: Arc<str> = output.as_str().into();
            let handler = ServiceBuilder::new()
                .layer(DeadLetterLayer::new(sink))
                .layer(transactions.layer())
                .service(handler_fn(move |Payload(payload): Payload| {
                    let destination = Arc::clone(&destination);
                    let released = Arc::clone(&released);
                    async move {
                        let id = String::from_utf8_lossy(&payload).into_owned();
                        while id == HELD && !released.load(Ordering::SeqCst) {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        let body = if id == LATE {
                            format!("{id}{}", " ".repeat(5_000))
                        } else {
                            id
                        };
                        Output::new(destination, body)
                    }
                }));
            let mut builder = Consumer::builder().ordering(DeliveryOrder::Key);
            if let Some(observer) = observer {
                builder = builder.observer(observer);
            }
            let consumer = builder.build(source, acker, handler).expect("consumer");
            let shutdown = CancellationToken::new();
            let run = tokio::spawn(consumer.run(shutdown.clone()));
            (shutdown, run)
        }
    };
    let transactions = || {
        KafkaTransactions::new(
            KafkaSettings::new(backend.brokers()),
            unique("intake-refused-late"),
        )
        .operation_timeout(Duration::from_secs(10))
        .transaction_timeout(Duration::from_secs(10))
    };

    let health = Health::new(HealthSettings {
        stall_window: Duration::from_secs(3),
        rebalance_grace: Duration::ZERO,
        ..HealthSettings::default()
    });
    health.started();
    let first = transactions();
    let (shutdown, run) = relay(first.clone(), Some(&health)).await;
    // Everything before 50 committed; 51 onwards kept, waiting for 50.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while first.outputs_held() != INPUTS - 51 || committed(&backend, &input, &group).await.0 != 50 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} outputs held",
            first.outputs_held()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", backend.brokers())
        .create()
        .expect("admin");
    let lowered =
        AlterConfig::new(ResourceSpecifier::Topic(&output)).set("max.message.bytes", "2000");
    for result in admin
        .alter_configs(
            std::iter::once(&lowered),
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("alter configs")
    {
        result.expect("the limit lowered");
    }
    released.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        committed(&backend, &input, &group).await,
        (50, INPUTS as i64),
        "nothing commits past 50"
    );
    let liveness = health.liveness();
    assert!(
        liveness.routes.iter().any(|(_, problems)| problems
            .iter()
            .any(|problem| matches!(problem, Problem::CommitsFailing { .. }))),
        "{liveness}"
    );
    shutdown.cancel();
    let report = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the run ends within 60 s of the shutdown")
        .expect("task")
        .expect("run");
    tracing::info!(?report, "the stuck run");
    assert!(!report.is_settled(), "{report:?}");
    assert!(
        (2..=15).contains(&report.ack_failures),
        "transactions refused in 10 s, backing off: {}",
        report.ack_failures
    );

    let (shutdown, run) = relay(transactions(), None).await;
    until_all_committed(&backend, &input, &group, Duration::from_secs(30)).await;
    let report = stop(shutdown, run).await;
    assert_eq!(report.dead_lettered, 1, "{report:?}");
    let counts = read_committed(&backend, &output).await;
    let missing: Vec<usize> = (0..INPUTS)
        .filter(|id| id.to_string() != LATE && counts.get(&id.to_string()) != Some(&1))
        .collect();
    assert!(missing.is_empty(), "ids not once: {missing:?}");
    assert!(!counts.contains_key(LATE), "the refused output arrived");
}

/// A destination that does not exist (and that this producer may not
/// create), with librdkafka's default wait for a topic to appear (30 s,
/// longer than the transaction's 3 s operation timeout): a transaction
/// whose outputs cannot be delivered in time is aborted and tried again
/// after a backoff, rather than left committing with an outcome nobody
/// knows, which ended the consumer as fatal. Once the topic exists,
/// everything commits, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_destination_aborts_transactions_and_the_relay_goes_on() {
    let Some(backend) = backend("a missing destination under a transaction") else {
        return;
    };
    let input = unique("intake-refused-gone-in");
    let output = unique("intake-refused-gone-out");
    let group = unique("intake-refused-gone-group");
    backend.create_topic(&input, 1).await.expect("input topic");
    let inputs: Vec<TestMessage> = (0..20)
        .map(|id| TestMessage::new(format!("k{id}"), id.to_string()))
        .collect();
    backend.produce_to(&input, &inputs).await.expect("produce");
    let settings = KafkaSettings::new(backend.brokers()).set("allow.auto.create.topics", "false");
    let transactions = KafkaTransactions::new(settings, unique("intake-refused-gone"))
        .operation_timeout(Duration::from_secs(3))
        .transaction_timeout(Duration::from_secs(60));
    let source = backend
        .source(&input, &group)
        .exactly_once(&transactions)
        .min_commit_interval(Duration::from_millis(20))
        .build()
        .await
        .expect("source");
    let acker = source.acker();
    let destination: Arc<str> = output.as_str().into();
    let handler = ServiceBuilder::new()
        .layer(transactions.layer())
        .service(handler_fn(move |Payload(payload): Payload| {
            let destination = Arc::clone(&destination);
            async move { Output::new(destination, payload) }
        }));
    let consumer = Consumer::builder()
        .build(source, acker, handler)
        .expect("consumer");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(consumer.run(shutdown.clone()));

    // Two operation timeouts and more: transactions time out and abort.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!run.is_finished(), "the relay ended");
    assert_eq!(committed(&backend, &input, &group).await, (0, 20));

    backend
        .create_topic(&output, 1)
        .await
        .expect("the destination");
    until_all_committed(&backend, &input, &group, Duration::from_secs(90)).await;
    let report = stop(shutdown, run).await;
    assert!(report.is_settled(), "{report:?}");
    let counts = read_committed(&backend, &output).await;
    let wrong: Vec<(usize, usize)> = (0..20)
        .map(|id| (id, counts.get(&id.to_string()).copied().unwrap_or(0)))
        .filter(|(_, seen)| *seen != 1)
        .collect();
    assert!(wrong.is_empty(), "ids not once: {wrong:?}");
}
