//! `intake pause`, `intake resume` and `intake group` end to end, against
//! the real brokers on 127.0.0.1 (Redis 6379, RabbitMQ 5672, Kafka 9092,
//! NATS 4222): each test runs the built command and reads its stdout,
//! stderr and exit code as a script would, and writes an instance's status
//! record straight through the backend's control channel, as a console
//! would.
//!
//! A test whose broker does not listen skips with a printed reason, unless
//! `INTAKE_REQUIRE_BROKERS=1` (as in CI).

mod support;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use intake_core::group_control::{ControlChannel, ControlLog};
use serde_json::Value;
use support::{AMQP, KAFKA, NATS, REDIS, broker_listens, intake, unique};

/// An instance name no console would choose: a window title, HTML, a bidi
/// override and a newline that would forge a line of the table.
const HOSTILE: &str = "\x1b]0;owned\x07<script>alert(1)</script>\u{202e}\ninstance: forged";

/// A status record as an instance's console writes it, of the instance
/// [`HOSTILE`], with partition 1 of `orders`.
fn hostile_status() -> Vec<u8> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64);
    serde_json::to_vec(&serde_json::json!({
        "v": 1,
        "instance": HOSTILE,
        "at_unix_ms": now,
        "routes": [{
            "name": "orders", "instance": HOSTILE, "state": "running", "ready": true,
            "live": true, "problems": [], "partitions": 1, "stalled_partitions": 0,
            "in_flight": 3, "backoff_level": 0, "acks_failing": false,
            "committed_messages": 41, "paused": false,
            "partition_list": [{
                "source": "orders", "partition": 1, "owner": HOSTILE,
                "assigned_at_unix_ms": now, "assigned_for_ms": 10, "handled": "41",
                "committed": "40", "newest": "44", "uncommitted": 3, "in_flight": 3,
                "since_progress_ms": 5, "liveness": "ok", "paused": false
            }]
        }]
    }))
    .expect("a status record")
}

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

/// The pauses `intake group --json` shows, as (route, scope, partition).
async fn pauses_shown(broker: &str, group: &str) -> (Vec<(String, String, Option<u64>)>, Value) {
    let run = intake(&["group", "--broker", broker, "--group", group, "--json"]).await;
    run.assert_code(0);
    let value = run.json();
    let pauses = value["pauses"]
        .as_array()
        .unwrap_or_else(|| panic!("no pauses in {value}"))
        .iter()
        .map(|pause| {
            (
                pause["route"].as_str().unwrap_or_default().to_owned(),
                pause["scope"].as_str().unwrap_or_default().to_owned(),
                pause["partition"].as_u64(),
            )
        })
        .collect();
    (pauses, value)
}

/// The scenario every backend runs: an instance's status written through
/// `status`, a partition paused and a route paused by the command, shown by
/// `intake group`, then resumed and gone.
async fn pause_show_resume(broker: &str, group: &str, status: impl ControlChannel) {
    status
        .append(hostile_status().into())
        .await
        .expect("the status record appended");
    let steer = |action: &'static str, partition: bool| {
        let mut args = vec![
            action, "--broker", broker, "--group", group, "--route", "orders", "--json",
        ];
        if partition {
            args.extend(["--source", "orders", "--partition", "1"]);
        }
        args
    };
    let sent = intake(&steer("pause", true)).await;
    sent.assert_code(0);
    let value = sent.json();
    assert_eq!(value["action"], "pause", "{value}");
    assert_eq!(value["route"], "orders");
    assert_eq!(value["scope"], "partition");
    assert_eq!(value["partition"], 1);
    assert!(
        value["by"]
            .as_str()
            .is_some_and(|by| by.starts_with("intake@")),
        "{value}"
    );
    let mut audit = steer("pause", false);
    audit[6] = "audit";
    intake(&audit).await.assert_code(0);

    let (pauses, value) = pauses_shown(broker, group).await;
    assert_eq!(
        pauses,
        [
            ("audit".to_owned(), "route".to_owned(), None),
            ("orders".to_owned(), "partition".to_owned(), Some(1)),
        ],
        "{value}"
    );
    let instances = value["instances"].as_array().expect("instances");
    assert_eq!(instances.len(), 1, "{value}");
    assert_eq!(
        instances[0]["instance"], HOSTILE,
        "JSON carries the exact name"
    );
    let partition = &instances[0]["routes"][0]["partitions"][0];
    assert_eq!(partition["handled"], "41", "{value}");
    assert_eq!(partition["in_flight"], 3, "{value}");
    assert_eq!(partition["liveness"], "ok", "{value}");

    let table = intake(&["group", "--broker", broker, "--group", group]).await;
    table.assert_code(0);
    assert_inert(&table.stdout);
    assert!(
        table
            .stdout
            .contains("\\x1b]0;owned\\x07<script>alert(1)</script>\\u{202e}\\ninstance: forged"),
        "{}",
        table.stdout
    );
    assert!(
        !table
            .stdout
            .lines()
            .any(|line| line.starts_with("instance: forged")),
        "{}",
        table.stdout
    );
    assert!(
        table
            .stdout
            .lines()
            .any(|line| line.starts_with("orders") && line.contains("partition 1 of orders")),
        "{}",
        table.stdout
    );

    intake(&steer("resume", true)).await.assert_code(0);
    let mut audit = steer("resume", false);
    audit[6] = "audit";
    intake(&audit).await.assert_code(0);
    let (pauses, value) = pauses_shown(broker, group).await;
    assert!(pauses.is_empty(), "{value}");
}

#[tokio::test]
async fn redis_pause_shows_in_group_and_resume_clears_it() {
    if !broker_listens("redis group", "127.0.0.1:6379") {
        return;
    }
    let group = unique("group-redis");
    let status = intake_redis_streams::RedisBroker::from_url(REDIS)
        .expect("settings")
        .control_channel(&group, ControlLog::Status)
        .await
        .expect("the status log");
    pause_show_resume(REDIS, &group, status).await;
    let client = intake_redis_streams::redis::Client::open(REDIS).expect("a client");
    if let Ok(mut connection) = client.get_multiplexed_async_connection().await {
        let _: Result<i64, _> = intake_redis_streams::redis::cmd("DEL")
            .arg(format!("{group}:intake-control"))
            .arg(format!("{group}:intake-status"))
            .query_async(&mut connection)
            .await;
    }
}

#[tokio::test]
async fn amqp_pause_shows_in_group_and_resume_clears_it() {
    if !broker_listens("amqp group", "127.0.0.1:5672") {
        return;
    }
    let group = unique("group-amqp");
    let status = intake_amqp::AmqpBroker::from_url(AMQP)
        .expect("settings")
        .control_channel(&group, ControlLog::Status)
        .await
        .expect("the status log");
    pause_show_resume(AMQP, &group, status).await;
    use intake_amqp::lapin;
    let connection = lapin::Connection::connect(AMQP, lapin::ConnectionProperties::default())
        .await
        .expect("a connection");
    let channel = connection.create_channel().await.expect("a channel");
    for log in ["control", "status"] {
        let _ = channel
            .queue_delete(
                format!("{group}.intake-{log}").as_str().into(),
                lapin::options::QueueDeleteOptions::default(),
            )
            .await;
    }
    let _ = connection.close(200, "done".into()).await;
}

#[tokio::test]
async fn nats_pause_shows_in_group_and_resume_clears_it() {
    if !broker_listens("nats group", "127.0.0.1:4222") {
        return;
    }
    let group = unique("group-nats");
    let status = intake_nats::NatsBroker::from_url(NATS)
        .expect("settings")
        .control_channel(&group, ControlLog::Status)
        .await
        .expect("the status log");
    pause_show_resume(NATS, &group, status).await;
    use intake_nats::async_nats;
    if let Ok(client) = async_nats::connect(NATS).await {
        let context = async_nats::jetstream::new(client);
        let mut names = context.stream_names();
        let mut ours = Vec::new();
        while let Some(Ok(name)) = futures_util::StreamExt::next(&mut names).await {
            if name.contains(&group.replace('-', "_")) || name.contains(&group) {
                ours.push(name);
            }
        }
        for name in ours {
            let _ = context.delete_stream(&name).await;
        }
    }
}

#[tokio::test]
async fn kafka_pause_shows_in_group_and_resume_clears_it() {
    if !broker_listens("kafka group", KAFKA) {
        return;
    }
    let group = unique("group-kafka");
    let status = intake_kafka::KafkaBroker::new(intake_kafka::KafkaSettings::new(KAFKA))
        .control_channel(&group, ControlLog::Status)
        .await
        .expect("the status log");
    let broker = format!("kafka://{KAFKA}");
    pause_show_resume(&broker, &group, status).await;
    use intake_kafka::rdkafka;
    use rdkafka::admin::{AdminClient, AdminOptions};
    let admin: Result<AdminClient<rdkafka::client::DefaultClientContext>, _> =
        rdkafka::ClientConfig::new()
            .set("bootstrap.servers", KAFKA)
            .create();
    if let Ok(admin) = admin {
        let topics = [
            format!("{group}.intake-control"),
            format!("{group}.intake-status"),
        ];
        let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
        let _ = admin.delete_topics(&topics, &AdminOptions::new()).await;
    }
}

/// A broker that does not answer: each command exits 1 within its
/// `--timeout` (and a margin for the process), and no password reaches
/// either stream.
#[tokio::test]
async fn an_unreachable_broker_exits_1_within_the_timeout_without_the_password() {
    let secret = "s3cr3t-pw";
    let cases: [(String, Vec<&str>); 4] = [
        (format!("redis://:{secret}@127.0.0.1:1"), vec![]),
        (format!("amqp://app:{secret}@127.0.0.1:1/%2f"), vec![]),
        (format!("nats://app:{secret}@127.0.0.1:1"), vec![]),
        (
            "kafka://127.0.0.1:1".to_owned(),
            vec![
                "--kafka-setting",
                "sasl.password=s3cr3t-pw",
                "--kafka-setting",
                "sasl.username=app",
                "--kafka-setting",
                "security.protocol=SASL_PLAINTEXT",
                "--kafka-setting",
                "sasl.mechanisms=PLAIN",
            ],
        ),
    ];
    for (broker, extra) in &cases {
        for command in [
            &[
                "pause",
                "--route",
                "orders",
                "--source",
                "orders",
                "--partition",
                "0",
            ][..],
            &["group"],
        ] {
            let started = Instant::now();
            let base = [
                "--broker",
                broker.as_str(),
                "--group",
                "billing",
                "--timeout",
                "2",
            ];
            let args = [command, &base[..], extra.as_slice()].concat();
            let run = intake(&args).await;
            let took = started.elapsed();
            run.assert_code(1);
            assert!(
                run.stderr.starts_with("error: "),
                "{args:?}: {}",
                run.stderr
            );
            assert!(!run.stderr.contains(secret), "{args:?}: {}", run.stderr);
            assert!(run.stdout.is_empty(), "{args:?}: {}", run.stdout);
            assert!(took < Duration::from_secs(6), "{args:?} took {took:?}");
        }
    }
}

#[tokio::test]
async fn usage_errors_exit_2() {
    for args in [
        &["pause", "--broker", REDIS, "--group", "g"][..],
        &[
            "pause",
            "--broker",
            REDIS,
            "--group",
            "g",
            "--route",
            "r",
            "--partition",
            "1",
        ],
        &[
            "resume", "--broker", REDIS, "--group", "g", "--route", "r", "--source", "s",
        ],
        &["group", "--broker", "http://h", "--group", "g"],
        &[
            "group",
            "--broker",
            REDIS,
            "--group",
            "g",
            "--kafka-setting",
            "a=b",
        ],
    ] {
        intake(args).await.assert_code(2);
    }
}
