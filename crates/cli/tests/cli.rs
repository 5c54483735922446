//! The `intake` binary end to end, against the real brokers on 127.0.0.1
//! (Redis 6379, RabbitMQ 5672, Kafka 9092, NATS 4222): each test sets the
//! broker up with its own client, runs the built command, and reads its
//! stdout, stderr and exit code as a script would.
//!
//! A test whose broker does not listen skips with a printed reason, unless
//! `INTAKE_REQUIRE_BROKERS=1` (as in CI).

mod support;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_amqp::lapin;
use intake_kafka::rdkafka;
use intake_nats::async_nats;
use intake_redis_streams::redis;
use serde_json::Value;
use support::{AMQP, KAFKA, NATS, REDIS, RUN_LIMIT, Run, broker_listens, intake, unique};

/// Asserts the lag `intake lag --json` reports, and that the table says
/// the same.
async fn assert_lag(broker: &str, source: &str, group: &str, expected: u64) {
    let base = [
        "lag",
        "--broker",
        broker,
        "--source",
        source,
        "--group",
        group,
        "--timeout",
        "10",
    ];
    let json = intake(&[&base[..], &["--json"]].concat()).await;
    json.assert_code(0);
    let value = json.json();
    assert_eq!(value["total"], expected, "{value}");
    assert_eq!(value["source"], source);
    assert_eq!(value["group"], group);
    assert_eq!(value["partitions"][0]["source"], source);
    let table = intake(&base).await;
    table.assert_code(0);
    let first = table.stdout.lines().next().unwrap_or_default();
    assert!(first.starts_with("SOURCE"), "{}", table.stdout);
    let row = table.stdout.lines().nth(1).unwrap_or_default();
    assert!(row.starts_with(source), "{}", table.stdout);
    assert!(
        row.split_whitespace()
            .any(|cell| cell == expected.to_string()),
        "{}",
        table.stdout
    );
}

/// Parked messages are acknowledged, so broker lag never counts them: the
/// command reports them beside it (issue 26: it said 0 while 5 waited).
#[tokio::test]
async fn redis_lag_counts_the_parked_backlog_beside_broker_lag() {
    use intake_core::backend::{Broker, Parking, RouteAddress, RouteOptions};
    use intake_core::{Message, Metadata, Position};

    if !broker_listens("redis parked lag", "127.0.0.1:6379") {
        return;
    }
    let (stream, group) = (unique("parked"), "billing");
    let broker = intake_redis_streams::RedisBroker::new(REDIS);
    let address = RouteAddress::new(&stream, group);
    let parts = broker
        .route(&address, &RouteOptions::new().parking())
        .await
        .expect("a route with parking");
    let parking = parts.parking.expect("asked for parking");
    for seq in 0..5 {
        let message = Message::new(
            format!("m{seq}"),
            Metadata::new(stream.as_str().into(), 0, Position::StreamId { ms: 1, seq }),
        );
        parking
            .park(&message, Duration::from_secs(600))
            .await
            .expect("parked");
    }
    let base = [
        "lag",
        "--broker",
        REDIS,
        "--source",
        &stream,
        "--group",
        group,
        "--timeout",
        "10",
    ];
    let json = intake(&[&base[..], &["--json"]].concat()).await;
    json.assert_code(0);
    let value = json.json();
    assert_eq!(value["parked"], 5, "{value}");
    let table = intake(&base).await;
    table.assert_code(0);
    assert!(
        table
            .stdout
            .lines()
            .any(|line| line.starts_with("parked")
                && line.split_whitespace().any(|cell| cell == "5")),
        "{}",
        table.stdout
    );
    broker
        .shutdown(Duration::from_secs(10))
        .await
        .expect("the parking stops");
}

#[tokio::test]
async fn redis_lag_counts_what_the_group_did_not_acknowledge() {
    if !broker_listens("redis lag", "127.0.0.1:6379") {
        return;
    }
    let (stream, group) = (unique("lag"), "billing");
    let client = redis::Client::open(REDIS).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    for n in 0..10 {
        let _: String = redis::cmd("XADD")
            .arg(&stream)
            .arg("*")
            .arg("n")
            .arg(n)
            .query_async(&mut redis)
            .await
            .unwrap();
    }
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&stream)
        .arg(group)
        .arg("0")
        .query_async(&mut redis)
        .await
        .unwrap();
    // Four delivered, three of them acknowledged: 6 never delivered plus 1
    // pending.
    let read: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(group)
        .arg("c")
        .arg("COUNT")
        .arg(4)
        .arg("STREAMS")
        .arg(&stream)
        .arg(">")
        .query_async(&mut redis)
        .await
        .unwrap();
    let ids: Vec<String> = read.keys[0]
        .ids
        .iter()
        .map(|entry| entry.id.clone())
        .collect();
    assert_eq!(ids.len(), 4);
    let acked: u64 = redis::cmd("XACK")
        .arg(&stream)
        .arg(group)
        .arg(&ids[..3])
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(acked, 3);

    assert_lag(REDIS, &stream, group, 7).await;

    let _: () = redis::cmd("DEL")
        .arg(&stream)
        .query_async(&mut redis)
        .await
        .unwrap();
}

/// Parked copies wait in the queue's wait queues, their originals
/// acknowledged: the command counts them beside the queue's lag.
#[tokio::test]
async fn amqp_lag_counts_the_parked_backlog_in_the_wait_queues() {
    use intake_core::backend::{Broker, Parking, RouteAddress, RouteOptions};
    use intake_core::{Message, Metadata, Position};
    use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};

    if !broker_listens("amqp parked lag", "127.0.0.1:5672") {
        return;
    }
    let queue = unique("parked");
    let connection = lapin::Connection::connect(AMQP, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    let broker = intake_amqp::AmqpBroker::from_url(AMQP).unwrap();
    let address = RouteAddress::new(&queue, "billing");
    let parts = broker
        .route(&address, &RouteOptions::new().parking())
        .await
        .expect("a route with parking");
    let parking = parts.parking.clone().expect("asked for parking");
    for tag in 1..=3 {
        let message = Message::new(
            format!("m{tag}"),
            Metadata::new(queue.as_str().into(), 0, Position::Tag(tag)),
        );
        parking
            .park(&message, Duration::from_secs(600))
            .await
            .expect("parked");
    }
    let json = intake(&[
        "lag",
        "--broker",
        AMQP,
        "--source",
        &queue,
        "--group",
        "billing",
        "--timeout",
        "10",
        "--json",
    ])
    .await;
    json.assert_code(0);
    let value = json.json();
    assert_eq!(value["parked"], 3, "{value}");
    drop(parts);
    broker
        .shutdown(Duration::from_secs(10))
        .await
        .expect("the parking stops");
    for name in [queue.clone(), format!("{queue}.dlq")] {
        let _ = channel
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
}

#[tokio::test]
async fn amqp_lag_counts_the_messages_ready_in_the_queue() {
    if !broker_listens("amqp lag", "127.0.0.1:5672") {
        return;
    }
    use lapin::options::{
        BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions,
        QueueDeclareOptions, QueueDeleteOptions,
    };
    let queue = unique("lag");
    let connection = lapin::Connection::connect(AMQP, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    for n in 0..10 {
        channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                format!("{n}").as_bytes(),
                lapin::BasicProperties::default(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
    for _ in 0..3 {
        let got = channel
            .basic_get(queue.as_str().into(), BasicGetOptions::default())
            .await
            .unwrap()
            .expect("a message in the queue");
        got.ack(BasicAckOptions::default()).await.unwrap();
    }

    // The group names nothing on RabbitMQ: the queue is what is counted.
    assert_lag(AMQP, &queue, "any", 7).await;

    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let _ = connection.close(200, "done".into()).await;
}

/// The issue's measurement: `intake lag --source payments --group billing`
/// said 0 while 5 messages waited in the group's retry topics.
#[tokio::test]
async fn kafka_lag_counts_the_parked_backlog_in_the_retry_topics() {
    use intake_core::backend::{Broker, Parking, RouteAddress, RouteOptions};
    use intake_core::{Message, Metadata, Position};
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;

    if !broker_listens("kafka parked lag", KAFKA) {
        return;
    }
    let (topic, group) = (unique("parked"), unique("g"));
    let mut config = rdkafka::ClientConfig::new();
    config.set("bootstrap.servers", KAFKA);
    let admin: AdminClient<DefaultClientContext> = config.create().unwrap();
    let created = admin
        .create_topics(
            &[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    let broker = intake_kafka::KafkaBroker::from_url(&format!("kafka://{KAFKA}")).unwrap();
    let address = RouteAddress::new(&topic, &group);
    let tiers = RouteOptions::new().parking_tiers([Duration::from_secs(600)]);
    let parts = broker
        .route(&address, &tiers)
        .await
        .expect("a route with parking");
    let parking = parts.parking.expect("asked for parking");
    for offset in 0..5 {
        let message = Message::new(
            format!("m{offset}"),
            Metadata::new(topic.as_str().into(), 0, Position::Offset(offset)),
        );
        parking
            .park(&message, Duration::from_secs(600))
            .await
            .expect("parked");
    }
    let base = [
        "lag",
        "--broker",
        &format!("kafka://{KAFKA}"),
        "--source",
        &topic,
        "--group",
        &group,
        "--timeout",
        "20",
        "--json",
    ]
    .map(|arg| arg.to_owned());
    let base: Vec<&str> = base.iter().map(String::as_str).collect();
    let json = intake(&base).await;
    json.assert_code(0);
    let value = json.json();
    assert_eq!(value["parked"], 5, "{value}");
    assert_eq!(
        value["total"], 0,
        "the originals are not broker lag: {value}"
    );
    drop(parts.source);
    broker
        .shutdown(Duration::from_secs(20))
        .await
        .expect("the mover stops");
    let _ = admin.delete_topics(&[&topic], &AdminOptions::new()).await;
}

#[tokio::test]
async fn kafka_lag_is_the_log_end_minus_the_committed_offset() {
    if !broker_listens("kafka lag", KAFKA) {
        return;
    }
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};

    let (topic, group) = (unique("lag"), unique("g"));
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", KAFKA);
    let admin: AdminClient<DefaultClientContext> = config.create().unwrap();
    let created = admin
        .create_topics(
            &[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    let producer: FutureProducer = config.clone().set("acks", "all").create().unwrap();
    for n in 0..10 {
        let payload = n.to_string();
        producer
            .send(
                FutureRecord::<str, str>::to(&topic)
                    .partition(0)
                    .payload(payload.as_str()),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
    // The group committed offset 3: three of ten are done.
    let committer: BaseConsumer = config
        .clone()
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut offsets = TopicPartitionList::new();
    offsets
        .add_partition_offset(&topic, 0, Offset::Offset(3))
        .unwrap();
    committer.commit(&offsets, CommitMode::Sync).unwrap();

    assert_lag(&format!("kafka://{KAFKA}"), &topic, &group, 7).await;

    let _ = admin.delete_topics(&[&topic], &AdminOptions::new()).await;
}

#[tokio::test]
async fn nats_lag_counts_what_the_durable_consumer_did_not_acknowledge() {
    if !broker_listens("nats lag", "127.0.0.1:4222") {
        return;
    }
    use async_nats::jetstream::{self, consumer};
    use futures_util::StreamExt as _;

    let stream = unique("lag");
    let client = async_nats::connect(NATS).await.unwrap();
    let context = jetstream::new(client);
    context
        .create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{stream}.>")],
            ..Default::default()
        })
        .await
        .unwrap();
    for n in 0..10 {
        context
            .publish(format!("{stream}.{n}"), n.to_string().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let durable = context
        .get_stream(&stream)
        .await
        .unwrap()
        .create_consumer(consumer::pull::Config {
            durable_name: Some("billing".to_owned()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .unwrap();
    // Four delivered, three of them acknowledged: 6 pending plus 1 waiting
    // for its ack.
    let mut batch = durable
        .fetch()
        .max_messages(4)
        .expires(Duration::from_secs(5))
        .messages()
        .await
        .unwrap();
    let mut delivered = Vec::new();
    while let Some(message) = batch.next().await {
        delivered.push(message.unwrap());
    }
    assert_eq!(delivered.len(), 4);
    for message in &delivered[..3] {
        message.double_ack().await.unwrap();
    }

    assert_lag(NATS, &stream, "billing", 7).await;

    let _ = context.delete_stream(&stream).await;
}

#[tokio::test]
async fn an_unreachable_broker_exits_1_without_showing_the_password() {
    // Nothing listens on port 1; the password must not reach stderr.
    let run = intake(&[
        "lag",
        "--broker",
        "amqp://app:s3cr3t-pw@127.0.0.1:1/%2f",
        "--source",
        "q",
        "--group",
        "g",
        "--timeout",
        "2",
    ])
    .await;
    run.assert_code(1);
    assert!(run.stderr.starts_with("error: "), "{}", run.stderr);
    assert!(!run.stderr.contains("s3cr3t-pw"), "{}", run.stderr);
    assert!(!run.stdout.contains("s3cr3t-pw"), "{}", run.stdout);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
}

#[tokio::test]
async fn usage_errors_exit_2() {
    let run = intake(&[
        "lag", "--broker", "http://h", "--source", "s", "--group", "g",
    ])
    .await;
    run.assert_code(2);
    assert!(
        run.stderr.contains("--broker must start with"),
        "{}",
        run.stderr
    );
    intake(&["lag", "--source", "s", "--group", "g"])
        .await
        .assert_code(2);
    intake(&["frobnicate"]).await.assert_code(2);
    intake(&["--help"]).await.assert_code(0);
}

#[tokio::test]
async fn an_unknown_source_exits_3() {
    if !broker_listens("redis unknown", "127.0.0.1:6379") {
        return;
    }
    let run = intake(&[
        "lag",
        "--broker",
        REDIS,
        "--source",
        &unique("missing"),
        "--group",
        "g",
    ])
    .await;
    run.assert_code(3);
}

#[tokio::test]
async fn dlq_on_an_unreachable_kafka_exits_1_within_the_timeout() {
    // Nothing listens on port 1. Kafka's clients connect on first use, so
    // it is the store's first call that fails, bounded by --timeout.
    let started = std::time::Instant::now();
    let run = intake(&[
        "dlq",
        "count",
        "--broker",
        "kafka://127.0.0.1:1",
        "--source",
        "s",
        "--group",
        "g",
        "--timeout",
        "2",
    ])
    .await;
    run.assert_code(1);
    assert!(run.stderr.starts_with("error: "), "{}", run.stderr);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn purge_without_yes_and_without_a_terminal_is_refused() {
    // stdin is /dev/null: nobody can answer the question.
    let run = intake(&[
        "dlq", "purge", "--broker", REDIS, "--source", "s", "--group", "g",
    ])
    .await;
    run.assert_code(2);
    assert!(run.stderr.contains("pass --yes"), "{}", run.stderr);
}

/// Ids `0..10` of which these fail for good on their first delivery: the
/// poison of a run, dead-lettered, then replayed by the command.
const POISON: [u64; 3] = [2, 5, 7];

/// Ids handled by a run, with the replay count each carried.
type Handled = Arc<Mutex<Vec<(u64, u32)>>>;

/// Runs a consumer of `source` until `handled` holds `until` ids (at most
/// 20 s), then stops it. Its handler records each id it handles and fails
/// for good on a poison id that was not replayed yet (a replay carries
/// `intake.replays`: the bug that made it poison is fixed by then), which
/// the dead-letter layer writes to `sink`.
async fn run_with_poison<S, A, D>(
    source: S,
    acker: A,
    sink: D,
    handled: &Handled,
    until: usize,
) -> intake_core::RunReport
where
    S: intake_core::backend::Source,
    A: intake_core::backend::Acker,
    D: intake_core::backend::DeadLetterSink,
{
    use intake_core::{DeadLetterLayer, HandlerError, Message, handler_fn};

    let recorded = handled.clone();
    let handler = handler_fn(move |message: Message| {
        let recorded = recorded.clone();
        async move {
            let id: u64 = std::str::from_utf8(message.payload())
                .ok()
                .and_then(|text| text.parse().ok())
                .ok_or_else(|| HandlerError::permanent("not an id"))?;
            let replays: u32 = message
                .headers()
                .get_str("intake.replays")
                .and_then(|text| text.parse().ok())
                .unwrap_or(0);
            if POISON.contains(&id) && replays == 0 {
                return Err(HandlerError::permanent(format!("poison {id}")));
            }
            recorded
                .lock()
                .map_err(|_| HandlerError::permanent("a test thread panicked"))?
                .push((id, replays));
            Ok::<(), HandlerError>(())
        }
    });
    let handler = tower::ServiceBuilder::new()
        .layer(DeadLetterLayer::new(sink))
        .service(handler);
    let consumer = intake_core::Consumer::builder()
        .build(source, acker, handler)
        .expect("the consumer's settings");
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(consumer.run(stop.clone()));
    let count = || handled.lock().map_or(0, |handled| handled.len());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while count() < until && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    let report = tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the consumer stops within 20 s")
        .expect("the consumer's task")
        .expect("the consumer's run");
    assert_eq!(count(), until, "ids handled within 20 s; {report:?}");
    report
}

/// `intake dlq` on a group's dead letters after a run with poison: counted
/// by class, listed, one shown and then purged by id, a dry run moves
/// nothing, a replay (`dlq replay` with `replay_to`) moves the others back,
/// the count is zero, and the next run (`after_replay`, told how many ids
/// to wait for) handles exactly the replayed ids.
async fn dlq_count_replay_count_zero<F>(
    broker: &str,
    source: &str,
    group: &str,
    replay_to: &[&str],
    after_replay: impl FnOnce(usize) -> F,
) where
    F: std::future::Future<Output = Vec<(u64, u32)>>,
{
    let target = ["--broker", broker, "--source", source, "--group", group];
    let command = |words: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = words.iter().map(|w| (*w).to_owned()).collect();
        args.extend(target.iter().map(|w| (*w).to_owned()));
        args
    };
    let run = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        intake(&args).await
    };
    let counted = run(command(&["dlq", "count", "--json"])).await;
    counted.assert_code(0);
    let value = counted.json();
    assert_eq!(value["total"], POISON.len(), "{value}");
    assert_eq!(value["by_class"]["permanent"], POISON.len(), "{value}");

    let listed = run(command(&["dlq", "list", "--json"])).await;
    listed.assert_code(0);
    let letters = listed.json()["letters"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    // Each letter's id in the store, with the message id its error names.
    let mut ids: Vec<(u64, String)> = letters
        .iter()
        .filter_map(|letter| {
            let (_, id) = letter["letter"]["error"].as_str()?.rsplit_once("poison ")?;
            Some((id.parse().ok()?, letter["id"].as_str()?.to_owned()))
        })
        .collect();
    ids.sort_unstable();
    let message_ids: Vec<u64> = ids.iter().map(|(id, _)| *id).collect();
    assert_eq!(message_ids, POISON, "{}", listed.stdout);

    let (purged_id, letter_id) = ids[0].clone();
    let shown = run([command(&["dlq", "show", "--json"]), vec![letter_id.clone()]].concat()).await;
    shown.assert_code(0);
    let payload = shown.json()["letter"]["payload"]
        .as_str()
        .map(str::to_owned);
    assert_eq!(payload, Some(purged_id.to_string()), "{}", shown.stdout);

    let purged = run(command(&[
        "dlq", "purge", "--yes", "--json", "--id", &letter_id,
    ]))
    .await;
    purged.assert_code(0);
    assert_eq!(purged.json()["purged"], 1, "{}", purged.stdout);
    let left = POISON.len() - 1;

    let replay = [&["dlq", "replay", "--json"][..], replay_to].concat();
    let dry = run(command(&[&replay[..], &["--dry-run"]].concat())).await;
    dry.assert_code(0);
    assert_eq!(dry.json()["replayed"], left, "{}", dry.stdout);
    assert_eq!(dry.json()["by_class"]["permanent"], left, "{}", dry.stdout);
    let replayed = run(command(&replay)).await;
    replayed.assert_code(0);
    assert_eq!(replayed.json()["replayed"], left, "{}", replayed.stdout);
    assert_eq!(replayed.json()["dry_run"], false);

    let counted = run(command(&["dlq", "count", "--json"])).await;
    counted.assert_code(0);
    assert_eq!(counted.json()["total"], 0, "{}", counted.stdout);

    let mut handled = after_replay(left).await;
    handled.sort_unstable();
    let expected: Vec<(u64, u32)> = POISON
        .iter()
        .filter(|&&id| id != purged_id)
        .map(|&id| (id, 1))
        .collect();
    assert_eq!(handled, expected, "the replayed ids, each replayed once");
}

#[tokio::test]
async fn redis_dlq_count_after_poison_then_replay_then_zero() {
    if !broker_listens("redis dlq", "127.0.0.1:6379") {
        return;
    }
    use intake_redis_streams::RedisStreamsSource;

    let (stream, group) = (unique("dlq"), "billing");
    let client = redis::Client::open(REDIS).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    for id in 0..10u64 {
        let _: String = redis::cmd("XADD")
            .arg(&stream)
            .arg("*")
            .arg("payload")
            .arg(id.to_string())
            .query_async(&mut redis)
            .await
            .unwrap();
    }
    let consume = |handled: Handled, until: usize| {
        let stream = stream.clone();
        async move {
            let source = RedisStreamsSource::builder(REDIS)
                .stream(stream.as_str())
                .group(group)
                .consumer("c1")
                .block(Duration::from_millis(100))
                .build()
                .await
                .expect("the source");
            let acker = source.acker();
            let sink = source.dead_letter_sink().build().await.expect("the sink");
            run_with_poison(source, acker, sink, &handled, until).await
        }
    };
    let first: Handled = Arc::default();
    let report = consume(first.clone(), 10 - POISON.len()).await;
    assert_eq!(report.dead_lettered, POISON.len() as u64, "{report:?}");

    let after_replay = |until| async move {
        let second: Handled = Arc::default();
        consume(second.clone(), until).await;
        second.lock().unwrap().clone()
    };
    // The test's consumer reads no return stream: the replay goes to the
    // origin, which this group alone reads.
    dlq_count_replay_count_zero(REDIS, &stream, group, &["--to-origin"], after_replay).await;

    let _: () = redis::cmd("DEL")
        .arg(&stream)
        .arg(format!("{stream}:dlq"))
        .query_async(&mut redis)
        .await
        .unwrap();
}

#[tokio::test]
async fn amqp_dlq_count_after_poison_then_replay_then_zero() {
    if !broker_listens("amqp dlq", "127.0.0.1:5672") {
        return;
    }
    use intake_amqp::{AmqpSource, Queue, Topology};
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeleteOptions};

    let queue = unique("dlq");
    // `intake dlq` looks in `QUEUE.dlq` unless told otherwise.
    let dead_letters = format!("{queue}.dlq");
    let topology = || {
        Topology::new()
            .queue(Queue::classic(queue.as_str()))
            .queue(Queue::classic(dead_letters.as_str()))
    };
    topology().declare(AMQP).await.expect("the queues");
    let connection = lapin::Connection::connect(AMQP, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    for id in 0..10u64 {
        channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                id.to_string().as_bytes(),
                lapin::BasicProperties::default(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let consume = |handled: Handled, until: usize| {
        let (queue, dead_letters, topology) = (queue.clone(), dead_letters.clone(), topology());
        async move {
            let source = AmqpSource::builder(AMQP)
                .queue(queue.as_str())
                .declare(topology)
                .build()
                .await
                .expect("the source");
            let acker = source.acker();
            let sink = source
                .dead_letter_sink()
                .exchange("")
                .routing_key(dead_letters.as_str())
                .build()
                .await
                .expect("the sink");
            run_with_poison(source, acker, sink, &handled, until).await
        }
    };
    let first: Handled = Arc::default();
    let report = consume(first.clone(), 10 - POISON.len()).await;
    assert_eq!(report.dead_lettered, POISON.len() as u64, "{report:?}");

    let after_replay = |until| async move {
        let second: Handled = Arc::default();
        consume(second.clone(), until).await;
        second.lock().unwrap().clone()
    };
    // A queue is its consumers' own: a replay to the group goes back to it.
    dlq_count_replay_count_zero(AMQP, &queue, "any", &[], after_replay).await;

    for name in [&queue, &dead_letters] {
        let _ = channel
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    let _ = connection.close(200, "done".into()).await;
}

#[tokio::test]
async fn nats_dlq_count_after_poison_then_replay_then_zero() {
    if !broker_listens("nats dlq", "127.0.0.1:4222") {
        return;
    }
    use async_nats::jetstream;
    use intake_nats::NatsSource;

    // Not `STREAM.>`: that would store the dead-letter subject
    // `STREAM.billing.dlq` too, which the sink refuses.
    let (stream, group) = (unique("dlq"), "billing");
    let client = async_nats::connect(NATS).await.unwrap();
    let context = jetstream::new(client);
    context
        .create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("in.{stream}.>")],
            ..Default::default()
        })
        .await
        .unwrap();
    for id in 0..10u64 {
        context
            .publish(format!("in.{stream}.{id}"), id.to_string().into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let consume = |handled: Handled, until: usize| {
        let stream = stream.clone();
        async move {
            let source = NatsSource::builder(NATS)
                .stream(stream.as_str())
                .consumer(group)
                .fetch_wait(Duration::from_millis(200))
                .build()
                .await
                .expect("the source");
            let acker = source.acker();
            let sink = source.dead_letter_sink().build().await.expect("the sink");
            run_with_poison(source, acker, sink, &handled, until).await
        }
    };
    let first: Handled = Arc::default();
    let report = consume(first.clone(), 10 - POISON.len()).await;
    assert_eq!(report.dead_lettered, POISON.len() as u64, "{report:?}");

    // The replays go back to their own subjects `in.STREAM.ID`, which the
    // same durable consumer reads.
    let after_replay = |until| async move {
        let second: Handled = Arc::default();
        consume(second.clone(), until).await;
        second.lock().unwrap().clone()
    };
    dlq_count_replay_count_zero(NATS, &stream, group, &["--to-origin"], after_replay).await;

    for name in [
        stream.clone(),
        intake_nats::default_dead_letter_stream(&stream),
    ] {
        let _ = context.delete_stream(name).await;
    }
}

#[tokio::test]
async fn kafka_dlq_count_after_poison_then_replay_then_zero() {
    if !broker_listens("kafka dlq", KAFKA) {
        return;
    }
    use intake_kafka::{KafkaSettings, KafkaSource};
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::producer::{FutureProducer, FutureRecord};

    let (topic, group) = (unique("dlq"), unique("g"));
    let mut config = rdkafka::ClientConfig::new();
    config.set("bootstrap.servers", KAFKA);
    let admin: AdminClient<DefaultClientContext> = config.create().unwrap();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let created = admin
        .create_topics(
            &[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))],
            &options,
        )
        .await
        .unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    let producer: FutureProducer = config.clone().set("acks", "all").create().unwrap();
    for id in 0..10u64 {
        let payload = id.to_string();
        producer
            .send(
                FutureRecord::<str, str>::to(&topic).payload(payload.as_str()),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
    let consume = |handled: Handled, until: usize| {
        let (topic, group) = (topic.clone(), group.clone());
        async move {
            let settings = KafkaSettings::new(KAFKA)
                .set("session.timeout.ms", "6000")
                .set("heartbeat.interval.ms", "500");
            let source = KafkaSource::builder(settings)
                .group(group.as_str())
                .topic(topic.as_str())
                .build()
                .await
                .expect("the source");
            let acker = source.acker();
            let sink = source.dead_letter_sink().build().await.expect("the sink");
            run_with_poison(source, acker, sink, &handled, until).await
        }
    };
    let first: Handled = Arc::default();
    let report = consume(first.clone(), 10 - POISON.len()).await;
    assert_eq!(report.dead_lettered, POISON.len() as u64, "{report:?}");

    // The replays are produced to the topic again, after the offsets the
    // group committed: the same group reads exactly them.
    let after_replay = |until| async move {
        let second: Handled = Arc::default();
        consume(second.clone(), until).await;
        second.lock().unwrap().clone()
    };
    dlq_count_replay_count_zero(
        &format!("kafka://{KAFKA}"),
        &topic,
        &group,
        &["--to-origin"],
        after_replay,
    )
    .await;

    let dead_letters = format!("{topic}.{group}.dlq");
    let removed = format!("{dead_letters}{}", intake_kafka::REMOVED_SUFFIX);
    let _ = admin
        .delete_topics(&[&topic, &dead_letters, &removed], &options)
        .await;
}

/// What a producer can put in a header name (Kafka keeps ESC in a lossy
/// UTF-8 name), a key, or a handler's error quoting its input: OSC 0 (the
/// window title), OSC 52 (the clipboard), CSI, a C1 CSI, DEL, CR, a bidi
/// override, and a newline forging a line.
const HOSTILE: &str = "\x1b]0;owned\x07\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\u{9b}31m\x7f\r\u{202e}\nclass:     retryable";

/// Panics when `text` holds a character that could drive a terminal or
/// reorder a line (every control character but the newline, the bidi
/// controls).
fn assert_inert(text: &str) {
    let unsafe_char = |c: char| {
        (c.is_control() && c != '\n')
            || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if let Some(c) = text.chars().find(|&c| unsafe_char(c)) {
        panic!("{c:?} reaches the terminal in {text:?}");
    }
}

#[tokio::test]
async fn kafka_dlq_show_and_list_escape_what_a_producer_wrote() {
    if !broker_listens("kafka escapes", KAFKA) {
        return;
    }
    use intake_core::backend::DeadLetterSink as _;
    use intake_core::{DeadLetter, Headers, Message, Metadata, Position};
    use intake_kafka::{KafkaSettings, KafkaSource};
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;

    let (topic, group) = (unique("esc"), unique("g"));
    let mut config = rdkafka::ClientConfig::new();
    config.set("bootstrap.servers", KAFKA);
    let admin: AdminClient<DefaultClientContext> = config.create().unwrap();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let created = admin
        .create_topics(
            &[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))],
            &options,
        )
        .await
        .unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    let source = KafkaSource::builder(KafkaSettings::new(KAFKA))
        .group(group.as_str())
        .topic(topic.as_str())
        .build()
        .await
        .expect("the source");
    let sink = source.dead_letter_sink().build().await.expect("the sink");
    let mut headers = Headers::default();
    headers.insert(HOSTILE, HOSTILE.as_bytes().to_vec());
    let message = Message::new(
        HOSTILE,
        Metadata::new(topic.as_str().into(), 0, Position::Offset(0)),
    )
    .with_key(HOSTILE)
    .with_headers(headers);
    sink.write(&DeadLetter::new(message, HOSTILE, 1))
        .await
        .expect("the letter written");
    drop(source);

    let target = [
        "--broker",
        &format!("kafka://{KAFKA}"),
        "--source",
        &topic,
        "--group",
        &group,
    ]
    .map(str::to_owned);
    let target: Vec<&str> = target.iter().map(String::as_str).collect();
    for command in [
        &["dlq", "show", "0:0"][..],
        &["dlq", "list"],
        &["dlq", "show", "--json", "0:0"],
    ] {
        let run = intake(&[command, &target[..]].concat()).await;
        run.assert_code(0);
        assert_inert(&run.stdout);
        assert_inert(&run.stderr);
    }
    let shown = intake(&[&["dlq", "show", "0:0"][..], &target[..]].concat()).await;
    assert!(
        !shown
            .stdout
            .lines()
            .any(|line| line.starts_with("class:     retryable")),
        "a producer forged a line:\n{}",
        shown.stdout
    );
    let json = intake(&[&["dlq", "show", "--json", "0:0"][..], &target[..]].concat()).await;
    assert_eq!(json.json()["letter"]["error"], HOSTILE, "{}", json.stdout);

    let dead_letters = format!("{topic}.{group}.dlq");
    let _ = admin
        .delete_topics(&[&topic, &dead_letters], &options)
        .await;
}

/// Runs `intake` with `args` on a terminal of its own (util-linux
/// `script`), as a person would: the returned child's stdin is the
/// keyboard, its stdout what the terminal shows (stdout and stderr both).
fn intake_on_a_terminal(args: &[&str]) -> tokio::process::Child {
    let quoted: Vec<String> = std::iter::once(env!("CARGO_BIN_EXE_intake"))
        .chain(args.iter().copied())
        .map(|arg| format!("'{}'", arg.replace('\'', r"'\''")))
        .collect();
    tokio::process::Command::new("script")
        .args(["-qec", &quoted.join(" "), "/dev/null"])
        .env_remove("INTAKE_BROKER")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("script(1) starts")
}

/// Reads `from` until what was read contains `wanted` (at most 20 s).
async fn read_until(from: &mut (impl tokio::io::AsyncRead + Unpin), wanted: &str) -> String {
    use tokio::io::AsyncReadExt as _;
    let mut seen = Vec::new();
    let mut buffer = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !String::from_utf8_lossy(&seen).contains(wanted) {
        let read = tokio::time::timeout_at(deadline, from.read(&mut buffer))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no {wanted:?} within 20 s; read {:?}",
                    String::from_utf8_lossy(&seen)
                )
            })
            .expect("reading the terminal");
        assert!(
            read > 0,
            "the terminal closed before {wanted:?}: {:?}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buffer[..read]);
    }
    String::from_utf8_lossy(&seen).into_owned()
}

#[tokio::test]
async fn redis_purge_deletes_only_the_letters_it_asked_about() {
    if !broker_listens("redis purge", "127.0.0.1:6379") {
        return;
    }
    use intake_core::backend::DeadLetterSink as _;
    use intake_core::{DeadLetter, Message, Metadata, Position};
    use intake_redis_streams::RedisStreamsSource;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let (stream, group) = (unique("purge"), "billing");
    let client = redis::Client::open(REDIS).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    let _: String = redis::cmd("XADD")
        .arg(&stream)
        .arg("*")
        .arg("payload")
        .arg("0")
        .query_async(&mut redis)
        .await
        .unwrap();
    let source = RedisStreamsSource::builder(REDIS)
        .stream(stream.as_str())
        .group(group)
        .consumer("c1")
        .build()
        .await
        .expect("the source");
    let sink = source.dead_letter_sink().build().await.expect("the sink");
    let write = |n: i64| {
        let message = Message::new(
            n.to_string(),
            Metadata::new(stream.as_str().into(), 0, Position::Offset(n)),
        );
        let letter = DeadLetter::new(message, format!("poison {n}"), 1);
        let sink = &sink;
        async move { sink.write(&letter).await.expect("a letter written") }
    };
    for n in 0..3 {
        write(n).await;
    }

    let mut purge = intake_on_a_terminal(&[
        "dlq",
        "purge",
        "--broker",
        REDIS,
        "--source",
        &stream,
        "--group",
        group,
        "--class",
        "permanent",
        "--json",
    ]);
    let mut terminal = purge.stdout.take().expect("the terminal's output");
    let asked = read_until(&mut terminal, "[y/N]").await;
    assert!(asked.contains("Delete 3 dead letters"), "{asked}");
    // Two more given up while the person reads the question.
    for n in 3..5 {
        write(n).await;
    }
    let mut keyboard = purge.stdin.take().expect("the terminal's input");
    keyboard.write_all(b"y\n").await.unwrap();
    let mut rest = String::new();
    tokio::time::timeout(RUN_LIMIT, terminal.read_to_string(&mut rest))
        .await
        .expect("the purge ends")
        .unwrap();
    let status = tokio::time::timeout(RUN_LIMIT, purge.wait())
        .await
        .expect("the purge ends")
        .unwrap();
    assert!(status.success(), "{status:?}: {asked}{rest}");
    let document = &rest[rest.find('{').unwrap_or_else(|| panic!("JSON in {rest:?}"))..];
    let value: Value = serde_json::from_str(document).unwrap();
    assert_eq!(value["purged"], 3, "{rest}");

    let counted = intake(&[
        "dlq", "count", "--broker", REDIS, "--source", &stream, "--group", group, "--json",
    ])
    .await;
    counted.assert_code(0);
    assert_eq!(
        counted.json()["total"],
        2,
        "the letters written meanwhile are left: {}",
        counted.stdout
    );

    let _: () = redis::cmd("DEL")
        .arg(&stream)
        .arg(format!("{stream}:dlq"))
        .query_async(&mut redis)
        .await
        .unwrap();
}

/// What `.ci/services/kafka.sh env` prints: the TLS and SASL_SSL listeners,
/// the test CA, the SCRAM user and password.
fn kafka_test_env() -> std::collections::HashMap<String, String> {
    let script =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.ci/services/kafka.sh");
    let output = std::process::Command::new("bash")
        .arg(script)
        .arg("env")
        .output()
        .expect("kafka.sh env runs");
    assert!(output.status.success(), "kafka.sh env failed");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect()
}

/// A Kafka topic `{topic}.{group}.dlq` holding `letters` letters, written
/// over plaintext by the real sink; returns the topic and group.
async fn kafka_dead_letters(prefix: &str, letters: i64) -> (String, String) {
    use intake_core::backend::DeadLetterSink as _;
    use intake_core::{DeadLetter, Message, Metadata, Position};
    use intake_kafka::{KafkaSettings, KafkaSource};
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;

    let (topic, group) = (unique(prefix), unique("g"));
    let mut config = rdkafka::ClientConfig::new();
    config.set("bootstrap.servers", KAFKA);
    let admin: AdminClient<DefaultClientContext> = config.create().unwrap();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let created = admin
        .create_topics(
            &[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))],
            &options,
        )
        .await
        .unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    let source = KafkaSource::builder(KafkaSettings::new(KAFKA))
        .group(group.as_str())
        .topic(topic.as_str())
        .build()
        .await
        .expect("the source");
    let sink = source.dead_letter_sink().build().await.expect("the sink");
    for n in 0..letters {
        let message = Message::new(
            n.to_string(),
            Metadata::new(topic.as_str().into(), 0, Position::Offset(n)),
        );
        sink.write(&DeadLetter::new(message, format!("poison {n}"), 1))
            .await
            .expect("a letter written");
    }
    (topic, group)
}

#[tokio::test]
async fn kafka_over_tls_and_sasl_scram_with_settings_that_never_show_the_password() {
    if !broker_listens("kafka tls", KAFKA) {
        return;
    }
    let env = kafka_test_env();
    let get = |key: &str| {
        env.get(key)
            .unwrap_or_else(|| panic!("kafka.sh env prints {key}"))
    };
    let (topic, group) = kafka_dead_letters("tls", 3).await;
    let on = |brokers: &str| {
        vec![
            "--broker".to_owned(),
            format!("kafka://{brokers}"),
            "--source".to_owned(),
            topic.clone(),
            "--group".to_owned(),
            group.clone(),
        ]
    };
    let run = |args: Vec<String>, env: Vec<(&'static str, String)>| async move {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_intake"));
        command
            .args(&args)
            .env_remove("INTAKE_BROKER")
            .env_remove("INTAKE_KAFKA_CONFIG")
            .envs(env)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let output = tokio::time::timeout(RUN_LIMIT, command.output())
            .await
            .unwrap_or_else(|_| panic!("intake {args:?} did not end within {RUN_LIMIT:?}"))
            .expect("intake's output");
        Run {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    };

    // TLS, the test CA trusted, with settings on the command line.
    let mut tls = vec!["dlq".to_owned(), "count".to_owned(), "--json".to_owned()];
    tls.extend(on(get("INTAKE_KAFKA_TLS_BROKERS")));
    tls.extend([
        "--kafka-setting".to_owned(),
        "security.protocol=SSL".to_owned(),
        "--kafka-setting".to_owned(),
        format!("ssl.ca.location={}", get("INTAKE_KAFKA_CA")),
    ]);
    let counted = run(tls, Vec::new()).await;
    counted.assert_code(0);
    assert_eq!(counted.json()["total"], 3, "{}", counted.stdout);

    // SASL_SSL with SCRAM-SHA-512, the password in a settings file named by
    // the environment; debug logs on, and the password nowhere.
    let password = get("INTAKE_KAFKA_SCRAM_PASSWORD");
    let dir = std::env::temp_dir().join(unique("kafka-config"));
    std::fs::create_dir_all(&dir).unwrap();
    let write_config = |name: &str, password: &str| {
        let path = dir.join(name);
        std::fs::write(
            &path,
            format!(
                "# the test broker's SASL_SSL listener\n\
                 security.protocol=SASL_SSL\n\
                 ssl.ca.location = {}\n\
                 sasl.mechanisms=SCRAM-SHA-512\n\n\
                 sasl.username={}\n\
                 sasl.password={password}\n",
                get("INTAKE_KAFKA_CA"),
                get("INTAKE_KAFKA_SCRAM_USER"),
            ),
        )
        .unwrap();
        path.display().to_string()
    };
    let good = write_config("good.properties", password);
    let debug = ("RUST_LOG", "debug".to_owned());
    for command in [&["dlq", "count", "--json"][..], &["dlq", "list", "--json"]] {
        let mut sasl: Vec<String> = command.iter().map(|w| (*w).to_owned()).collect();
        sasl.extend(on(get("INTAKE_KAFKA_SASL_BROKERS")));
        let listed = run(
            sasl,
            vec![("INTAKE_KAFKA_CONFIG", good.clone()), debug.clone()],
        )
        .await;
        listed.assert_code(0);
        assert!(
            !listed.stdout.contains(password.as_str()),
            "{}",
            listed.stdout
        );
        assert!(
            !listed.stderr.contains(password.as_str()),
            "password in the logs"
        );
    }
    let mut lag = vec!["lag".to_owned(), "--json".to_owned()];
    lag.extend(on(get("INTAKE_KAFKA_SASL_BROKERS")));
    lag.extend(["--kafka-config".to_owned(), good.clone()]);
    let lag = run(lag, vec![debug.clone()]).await;
    lag.assert_code(0);
    assert!(
        !lag.stderr.contains(password.as_str()),
        "password in the logs"
    );

    // A wrong password fails, and neither it nor the right one shows.
    let wrong_password = "not-the-Secret-7f3a";
    let wrong = write_config("wrong.properties", wrong_password);
    let mut refused = vec!["dlq".to_owned(), "count".to_owned()];
    refused.extend(on(get("INTAKE_KAFKA_SASL_BROKERS")));
    refused.extend([
        "--timeout".to_owned(),
        "5".to_owned(),
        "--kafka-config".to_owned(),
        wrong,
    ]);
    let started = std::time::Instant::now();
    let refused = run(refused, vec![debug.clone()]).await;
    eprintln!(
        "wrong password: exit {:?} after {:?}",
        refused.code,
        started.elapsed()
    );
    assert!(
        matches!(refused.code, Some(1 | 3)),
        "{:?}: {}",
        refused.code,
        refused.stderr
    );
    assert!(refused.stderr.starts_with("error: ") || refused.stderr.contains("\nerror: "));
    for secret in [wrong_password, password.as_str()] {
        assert!(!refused.stderr.contains(secret), "{secret} shown");
    }

    // A setting mistyped on the command line, a secret in it: a usage
    // error that does not repeat it; settings for another broker: refused.
    let mut typo = vec!["dlq".to_owned(), "count".to_owned()];
    typo.extend(on(get("INTAKE_KAFKA_SASL_BROKERS")));
    typo.extend([
        "--kafka-setting".to_owned(),
        "sasl.password:hunter2-7f3a".to_owned(),
    ]);
    let typo = run(typo, Vec::new()).await;
    typo.assert_code(2);
    assert!(!typo.stderr.contains("hunter2-7f3a"), "{}", typo.stderr);
    let other = run(
        [
            "dlq",
            "count",
            "--broker",
            REDIS,
            "--source",
            "s",
            "--group",
            "g",
            "--kafka-setting",
            "security.protocol=SSL",
        ]
        .map(str::to_owned)
        .to_vec(),
        Vec::new(),
    )
    .await;
    other.assert_code(2);
    assert!(other.stderr.contains("kafka://"), "{}", other.stderr);

    let _ = std::fs::remove_dir_all(&dir);
}

/// Queues `queue` and `queue.dlq`, and `letters` letters of `queue` in the
/// latter written by the real AMQP sink (ids `0..letters` as payloads).
async fn amqp_dead_letters(queue: &str, letters: u64) {
    use intake_amqp::{AmqpSource, Queue, Topology};
    use intake_core::backend::DeadLetterSink as _;
    use intake_core::{DeadLetter, Message, Metadata, Position};

    let dead_letters = format!("{queue}.dlq");
    let topology = Topology::new()
        .queue(Queue::classic(queue))
        .queue(Queue::classic(dead_letters.as_str()));
    topology.clone().declare(AMQP).await.expect("the queues");
    let source = AmqpSource::builder(AMQP)
        .queue(queue)
        .declare(topology)
        .build()
        .await
        .expect("the source");
    let sink = source
        .dead_letter_sink()
        .exchange("")
        .routing_key(dead_letters.as_str())
        .build()
        .await
        .expect("the sink");
    for n in 0..letters {
        let message = Message::new(
            n.to_string(),
            Metadata::new(queue.into(), 0, Position::Tag(n + 1)),
        );
        sink.write(&DeadLetter::new(message, format!("poison {n}"), 1))
            .await
            .expect("a letter written");
    }
}

async fn amqp_delete(queues: &[&str]) {
    use lapin::options::QueueDeleteOptions;
    let connection = lapin::Connection::connect(AMQP, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    for queue in queues {
        let _ = channel
            .queue_delete((*queue).into(), QueueDeleteOptions::default())
            .await;
    }
    let _ = connection.close(200, "done".into()).await;
}

#[tokio::test]
async fn a_replay_the_broker_refuses_exits_3_and_leaves_the_letters() {
    if !broker_listens("amqp refused replay", "127.0.0.1:5672") {
        return;
    }
    let queue = unique("refused");
    amqp_dead_letters(&queue, 2).await;
    // The origin queue is gone: RabbitMQ returns each replay unroutable,
    // which the publisher reports as rejected.
    amqp_delete(&[&queue]).await;
    let target = ["--broker", AMQP, "--source", &queue, "--group", "any"];
    for how in [&[][..], &["--to-origin"]] {
        let run = intake(&[&["dlq", "replay"][..], how, &target[..]].concat()).await;
        run.assert_code(3);
        assert!(
            run.stderr.starts_with("error: dlq replay"),
            "{}",
            run.stderr
        );
    }
    let counted = intake(&[&["dlq", "count", "--json"][..], &target[..]].concat()).await;
    counted.assert_code(0);
    assert_eq!(counted.json()["total"], 2, "{}", counted.stdout);
    amqp_delete(&[&format!("{queue}.dlq")]).await;
}

#[tokio::test]
async fn amqp_says_when_letters_are_beyond_one_pass() {
    if !broker_listens("amqp cap", "127.0.0.1:5672") {
        return;
    }
    let queue = unique("cap");
    amqp_dead_letters(&queue, 8).await;
    let target = [
        "--broker",
        AMQP,
        "--source",
        &queue,
        "--group",
        "any",
        "--amqp-max-letters",
        "5",
    ];
    let run = |words: &'static [&'static str]| {
        let args: Vec<&str> = [words, &target[..]].concat();
        let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            intake(&args).await
        }
    };
    // Each needs every letter, and a pass reads 5 of the 8: no partial
    // answer, but what happened and what to do.
    for words in [
        &["dlq", "count", "--class", "permanent", "--json"][..],
        &["dlq", "list", "--json"],
        &["dlq", "replay", "--key", "none", "--json"],
    ] {
        let refused = run(words).await;
        refused.assert_code(3);
        assert!(refused.stdout.is_empty(), "{}", refused.stdout);
        assert!(
            refused.stderr.contains("--amqp-max-letters"),
            "{words:?}: {}",
            refused.stderr
        );
        assert!(
            !refused.stderr.contains("could not be reached"),
            "{}",
            refused.stderr
        );
    }
    // A purge nobody is asked about removes as it goes: every letter.
    let purged = run(&["dlq", "purge", "--yes", "--json"]).await;
    purged.assert_code(0);
    assert_eq!(purged.json()["purged"], 8, "{}", purged.stdout);
    let left = run(&["dlq", "count", "--json"]).await;
    left.assert_code(0);
    assert_eq!(left.json()["total"], 0, "{}", left.stdout);
    // The bound is RabbitMQ's.
    let other = intake(&[
        "dlq",
        "count",
        "--broker",
        REDIS,
        "--source",
        "s",
        "--group",
        "g",
        "--amqp-max-letters",
        "5",
    ])
    .await;
    other.assert_code(2);
    amqp_delete(&[&queue, &format!("{queue}.dlq")]).await;
}

/// The high watermark of partition 0 of `topic`: how many records were
/// ever produced to it.
fn kafka_end(topic: &str) -> i64 {
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", KAFKA)
        .create()
        .unwrap();
    consumer
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .unwrap()
        .1
}

#[tokio::test]
async fn kafka_default_replay_never_reaches_another_group() {
    if !broker_listens("kafka group replay", KAFKA) {
        return;
    }
    let (topic, group) = kafka_dead_letters("group", 3).await;
    let broker = format!("kafka://{KAFKA}");
    let target = ["--broker", &broker, "--source", &topic, "--group", &group];
    let before = kafka_end(&topic);
    // Every other group of the topic would handle a record produced to
    // it: by default a replay goes to this group alone, or nowhere. This
    // group reads no return topic yet.
    let run = intake(&[&["dlq", "replay"][..], &target[..]].concat()).await;
    assert_eq!(
        kafka_end(&topic),
        before,
        "a default replay reached every group of {topic}: {:?}\n{}{}",
        run.code,
        run.stdout,
        run.stderr
    );
    run.assert_code(3);
    assert!(run.stderr.contains("--to-origin"), "{}", run.stderr);
    assert!(
        run.stderr.contains("every consumer group"),
        "{}",
        run.stderr
    );
    let counted = intake(&[&["dlq", "count", "--json"][..], &target[..]].concat()).await;
    assert_eq!(counted.json()["total"], 3, "{}", counted.stdout);

    // Asked for, to the origin: every group's.
    let to_origin = intake(
        &[
            &["dlq", "replay", "--json", "--to-origin", "--id", "0:0"][..],
            &target[..],
        ]
        .concat(),
    )
    .await;
    to_origin.assert_code(0);
    assert_eq!(kafka_end(&topic), before + 1, "{}", to_origin.stdout);

    // Once the group reads its return topic (its parking's), the replay
    // goes there alone.
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", KAFKA)
        .create()
        .unwrap();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let returned = format!("{topic}.{group}.returned");
    let created = admin
        .create_topics(
            &[NewTopic::new(&returned, 1, TopicReplication::Fixed(1))],
            &options,
        )
        .await
        .unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    let to_group = intake(&[&["dlq", "replay", "--json"][..], &target[..]].concat()).await;
    to_group.assert_code(0);
    assert_eq!(to_group.json()["replayed"], 2, "{}", to_group.stdout);
    assert_eq!(kafka_end(&returned), 2);
    assert_eq!(kafka_end(&topic), before + 1);

    let dead_letters = format!("{topic}.{group}.dlq");
    let removed = format!("{dead_letters}{}", intake_kafka::REMOVED_SUFFIX);
    let _ = admin
        .delete_topics(&[&topic, &returned, &dead_letters, &removed], &options)
        .await;
}

#[tokio::test]
async fn replay_help_says_who_handles_a_replay() {
    let help = intake(&["dlq", "replay", "--help"]).await;
    help.assert_code(0);
    for words in ["--to-origin", "every consumer group", "alone"] {
        assert!(help.stdout.contains(words), "{words}: {}", help.stdout);
    }
    let help = intake(&["dlq", "purge", "--help"]).await;
    help.assert_code(0);
    assert!(help.stdout.contains("Redis"), "{}", help.stdout);
}

#[tokio::test]
async fn redis_group_scopes_count_list_purge_and_replay() {
    if !broker_listens("redis group scope", "127.0.0.1:6379") {
        return;
    }
    use intake_core::backend::DeadLetterSink as _;
    use intake_core::{DeadLetter, Message, Metadata, Position};
    use intake_redis_streams::RedisStreamsSource;

    // Two groups of one stream: their letters share `STREAM:dlq`.
    let stream = unique("scope");
    let client = redis::Client::open(REDIS).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    let _: String = redis::cmd("XADD")
        .arg(&stream)
        .arg("*")
        .arg("payload")
        .arg("0")
        .query_async(&mut redis)
        .await
        .unwrap();
    for (group, letters) in [("billing", 2), ("shipping", 3)] {
        let source = RedisStreamsSource::builder(REDIS)
            .stream(stream.as_str())
            .group(group)
            .consumer("c1")
            .build()
            .await
            .expect("the source");
        let sink = source.dead_letter_sink().build().await.expect("the sink");
        for n in 0..letters {
            let message = Message::new(
                format!("{group} {n}"),
                Metadata::new(stream.as_str().into(), 0, Position::Offset(n)),
            );
            sink.write(&DeadLetter::new(message, format!("poison {n}"), 1))
                .await
                .expect("a letter written");
        }
    }
    let of = |group: &'static str, words: &'static [&'static str]| {
        let stream = stream.clone();
        async move {
            let args = [
                words,
                &["--broker", REDIS, "--source", &stream, "--group", group],
            ]
            .concat();
            intake(&args).await
        }
    };
    let total = |run: Run| {
        run.assert_code(0);
        run.json()["total"].clone()
    };
    assert_eq!(total(of("billing", &["dlq", "count", "--json"]).await), 2);
    assert_eq!(total(of("shipping", &["dlq", "count", "--json"]).await), 3);
    let listed = of("shipping", &["dlq", "list", "--json"]).await;
    listed.assert_code(0);
    let groups: Vec<Value> = listed.json()["letters"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|letter| letter["letter"]["group"].clone())
        .collect();
    assert_eq!(
        groups,
        vec![Value::from("shipping"); 3],
        "{}",
        listed.stdout
    );

    let purged = of("billing", &["dlq", "purge", "--yes", "--json"]).await;
    purged.assert_code(0);
    assert_eq!(purged.json()["purged"], 2, "{}", purged.stdout);
    assert_eq!(total(of("shipping", &["dlq", "count", "--json"]).await), 3);

    let replayed = of("shipping", &["dlq", "replay", "--to-origin", "--json"]).await;
    replayed.assert_code(0);
    assert_eq!(replayed.json()["replayed"], 3, "{}", replayed.stdout);
    assert_eq!(total(of("billing", &["dlq", "count", "--json"]).await), 0);
    assert_eq!(total(of("shipping", &["dlq", "count", "--json"]).await), 0);

    let _: () = redis::cmd("DEL")
        .arg(&stream)
        .arg(format!("{stream}:dlq"))
        .query_async(&mut redis)
        .await
        .unwrap();
}

#[tokio::test]
async fn redis_default_replay_goes_to_the_groups_return_stream_or_nowhere() {
    if !broker_listens("redis group replay", "127.0.0.1:6379") {
        return;
    }
    use intake_core::backend::DeadLetterSink as _;
    use intake_core::{DeadLetter, Message, Metadata, Position};
    use intake_redis_streams::{RedisParking, RedisStreamsSource};

    let (stream, group) = (unique("way-back"), "billing");
    let client = redis::Client::open(REDIS).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    let _: String = redis::cmd("XADD")
        .arg(&stream)
        .arg("*")
        .arg("payload")
        .arg("0")
        .query_async(&mut redis)
        .await
        .unwrap();
    let source = RedisStreamsSource::builder(REDIS)
        .stream(stream.as_str())
        .group(group)
        .consumer("c1")
        .build()
        .await
        .expect("the source");
    let sink = source.dead_letter_sink().build().await.expect("the sink");
    for n in 0..2 {
        let message = Message::new(
            n.to_string(),
            Metadata::new(stream.as_str().into(), 0, Position::Offset(n)),
        );
        sink.write(&DeadLetter::new(message, "poison", 1))
            .await
            .expect("a letter written");
    }
    let xlen = |key: String| {
        let client = client.clone();
        async move {
            let mut redis = client.get_multiplexed_async_connection().await.unwrap();
            redis::cmd("XLEN")
                .arg(key)
                .query_async::<u64>(&mut redis)
                .await
                .unwrap()
        }
    };
    let target = ["--broker", REDIS, "--source", &stream, "--group", group];
    let origin_before = xlen(stream.clone()).await;

    // The group reads no return stream: nowhere to go but everyone's.
    let refused = intake(&[&["dlq", "replay"][..], &target[..]].concat()).await;
    refused.assert_code(3);
    assert!(refused.stderr.contains("--to-origin"), "{}", refused.stderr);
    assert_eq!(xlen(stream.clone()).await, origin_before);

    // Once it reads one (its parking's), the letters go there alone.
    let returned = RedisParking::return_stream(&stream, group);
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&returned)
        .arg(group)
        .arg("$")
        .arg("MKSTREAM")
        .query_async(&mut redis)
        .await
        .unwrap();
    let replayed = intake(&[&["dlq", "replay", "--json"][..], &target[..]].concat()).await;
    replayed.assert_code(0);
    assert_eq!(replayed.json()["replayed"], 2, "{}", replayed.stdout);
    assert_eq!(xlen(returned.clone()).await, 2);
    assert_eq!(xlen(stream.clone()).await, origin_before);

    let _: () = redis::cmd("DEL")
        .arg(&stream)
        .arg(&returned)
        .arg(format!("{stream}:dlq"))
        .query_async(&mut redis)
        .await
        .unwrap();
}
