//! Pausing and resuming partitions of a running consumer through its
//! `ConsumerControl`, on the memory broker (issue 28, slice 3).

#[path = "support/eventually.rs"]
mod eventually;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eventually::eventually;
use intake_core::app::{App, Health, HealthSettings};
use intake_core::consumer::{Consumer, DeliveryOrder};
use intake_core::memory::{MemoryBroker, Record};
use intake_core::observer::{ConsumerObserver, PartitionSnapshot};
use intake_core::{HandlerError, Message};
use tokio_util::sync::CancellationToken;

/// Payloads handled, by partition, in the order handled.
type Handled = Arc<Mutex<HashMap<u32, Vec<String>>>>;

fn handled(handled: &Handled, partition: u32) -> Vec<String> {
    handled
        .lock()
        .expect("lock")
        .get(&partition)
        .cloned()
        .unwrap_or_default()
}

/// Keeps the last snapshot of each partition.
#[derive(Default)]
struct Snapshots(Mutex<HashMap<u32, PartitionSnapshot>>);

impl ConsumerObserver for Snapshots {
    fn on_partitions(&self, partitions: &[PartitionSnapshot]) {
        let mut last = self.0.lock().expect("lock");
        for snapshot in partitions {
            last.insert(snapshot.stats.partition.partition, snapshot.clone());
        }
    }
}

impl Snapshots {
    fn of(&self, partition: u32) -> Option<PartitionSnapshot> {
        self.0.lock().expect("lock").get(&partition).cloned()
    }
}

fn send(broker: &MemoryBroker, partition: u32, ids: std::ops::Range<u32>) {
    for id in ids {
        broker
            .send(
                "orders",
                Record::new(format!("{partition}-{id}")).to_partition(partition),
            )
            .expect("send");
    }
}

fn expected(partition: u32, ids: std::ops::Range<u32>) -> Vec<String> {
    ids.map(|id| format!("{partition}-{id}")).collect()
}

fn committed(broker: &MemoryBroker) -> Vec<Option<i64>> {
    broker.committed("orders", "billing").expect("committed")
}

/// Records what it handles; the first message of partition 0 waits for
/// `gate`.
fn recording(
    handled: Handled,
    gate: CancellationToken,
) -> impl tower::Service<
    Message,
    Response = (),
    Error = HandlerError,
    Future = impl Future<Output = Result<(), HandlerError>> + Send,
> + Send
+ 'static {
    tower::service_fn(move |message: Message| {
        let (handled, gate) = (handled.clone(), gate.clone());
        async move {
            let payload = String::from_utf8_lossy(message.payload()).into_owned();
            if payload == "0-0" {
                gate.cancelled().await;
            }
            handled
                .lock()
                .expect("lock")
                .entry(message.metadata().partition())
                .or_default()
                .push(payload);
            Ok::<_, HandlerError>(())
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_partition_holds_its_position_stays_live_and_resumes_in_order() {
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 2).expect("topic");
    let stall_window = Duration::from_millis(200);
    let health = Health::new(HealthSettings {
        stall_window,
        rebalance_grace: Duration::ZERO,
        assignment_grace: Duration::from_secs(3_600),
        ..HealthSettings::default()
    });
    let snapshots = Arc::new(Snapshots::default());
    let seen: Handled = Arc::default();
    let gate = CancellationToken::new();
    let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
    let consumer = Consumer::builder()
        .ordering(DeliveryOrder::Partition)
        .commit_interval(Duration::from_millis(10))
        .observer(snapshots.clone())
        .build(source, acker, recording(seen.clone(), gate.clone()))
        .expect("settings");
    let control = consumer.control();
    let stop = CancellationToken::new();
    let app = App::new().health(health.clone()).route("orders", consumer);
    let running = tokio::spawn(app.run_until(stop.clone()));

    // Partition 0's first message runs (and waits); the four after it are
    // admitted behind it in its lane.
    send(&broker, 0, 0..5);
    eventually("partition 0's deliveries are admitted", || {
        snapshots.of(0).is_some_and(|s| s.stats.uncommitted == 5)
    })
    .await;
    control.pause_partition("orders", 0);
    assert!(control.is_paused("orders", 0));
    eventually("the run applied the pause", || {
        snapshots.of(0).is_some_and(|s| s.paused)
    })
    .await;
    // The running one finishes and is committed; none after it starts.
    gate.cancel();
    send(&broker, 0, 5..10);
    send(&broker, 1, 0..5);
    eventually("partition 1 flows and commits", || {
        handled(&seen, 1).len() == 5 && committed(&broker)[1] == Some(5)
    })
    .await;
    eventually("partition 0's running message is committed", || {
        committed(&broker)[0] == Some(1)
    })
    .await;
    assert_eq!(handled(&seen, 0), expected(0, 0..1));

    // Past the stall window, with work held: paused, not stalled.
    tokio::time::sleep(stall_window * 3).await;
    let snapshot = snapshots.of(0).expect("partition 0's snapshot");
    assert!(snapshot.paused, "{snapshot:?}");
    assert!(snapshot.stats.uncommitted > 0, "held work: {snapshot:?}");
    assert!(health.is_live(), "{}", health.liveness());
    assert!(health.is_ready(), "{}", health.readiness());
    assert_eq!(handled(&seen, 0), expected(0, 0..1), "nothing started");
    assert_eq!(committed(&broker)[0], Some(1), "the position holds");

    control.resume_partition("orders", 0);
    eventually("partition 0 delivers what it held, and the rest", || {
        handled(&seen, 0).len() >= 10 && committed(&broker)[0] == Some(10)
    })
    .await;
    assert_eq!(handled(&seen, 0), expected(0, 0..10), "in order, once each");
    assert!(snapshots.of(0).is_some_and(|s| !s.paused));

    stop.cancel();
    let report = running.await.expect("join").expect("app");
    let run = report
        .route("orders")
        .and_then(|route| route.report())
        .expect("the route's report");
    assert!(run.unfinished.is_empty(), "{:?}", run.unfinished);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_holds_across_a_revoke_and_a_new_assignment() {
    let broker = MemoryBroker::builder()
        .rebalance_timeout(Duration::from_millis(300))
        .build();
    broker.create_topic("orders", 2).expect("topic");
    let seen: Handled = Arc::default();
    let open = CancellationToken::new();
    open.cancel();
    let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
    let first_member = acker.member_id();
    let consumer = Consumer::builder()
        .ordering(DeliveryOrder::Unordered)
        .commit_interval(Duration::from_millis(10))
        .build(source, acker, recording(seen.clone(), open.clone()))
        .expect("settings");
    let control = consumer.control();
    // Paused before the run: held from its first assignment.
    control.pause_partition("orders", 1);
    let stop = CancellationToken::new();
    let running = tokio::spawn(consumer.run(stop.clone()));

    send(&broker, 0, 0..3);
    send(&broker, 1, 0..3);
    eventually("partition 0 flows", || committed(&broker)[0] == Some(3)).await;

    // A second member joins, every partition of it paused: it takes one of
    // the two partitions, and hands it back when it leaves.
    let (second_source, second_acker) = broker.consumer("orders", "billing").expect("consumer");
    let second_member = second_acker.member_id();
    let second = Consumer::builder()
        .commit_interval(Duration::from_millis(10))
        .build(
            second_source,
            second_acker,
            recording(seen.clone(), open.clone()),
        )
        .expect("settings");
    second.control().pause_all();
    let second_stop = CancellationToken::new();
    let second_running = tokio::spawn(second.run(second_stop.clone()));
    eventually("the group rebalanced over two members", || {
        let group = broker.group("orders", "billing").expect("group");
        group.partitions_of(second_member).len() == 1
            && group.partitions_of(first_member).len() == 1
    })
    .await;
    second_stop.cancel();
    second_running.await.expect("join").expect("second run");
    eventually("both partitions are the first member's again", || {
        broker
            .group("orders", "billing")
            .expect("group")
            .partitions_of(first_member)
            .len()
            == 2
    })
    .await;

    send(&broker, 0, 3..6);
    send(&broker, 1, 3..6);
    eventually("partition 0 flows again", || {
        committed(&broker)[0] == Some(6)
    })
    .await;
    assert!(handled(&seen, 1).is_empty(), "{:?}", handled(&seen, 1));
    assert_eq!(
        committed(&broker)[1],
        None,
        "partition 1 holds its position"
    );

    control.resume_partition("orders", 1);
    eventually("partition 1 delivers everything", || {
        committed(&broker)[1] == Some(6)
    })
    .await;
    let mut partition_one = handled(&seen, 1);
    partition_one.sort();
    assert_eq!(partition_one, expected(1, 0..6), "once each");

    stop.cancel();
    running.await.expect("join").expect("run");
}

/// The console's `POST .../routes/{route}/pause` and `.../resume` over real
/// HTTP: refused without the token (and audited), done with it (audited),
/// and the partition shown paused.
#[cfg(all(feature = "console", feature = "health-server"))]
mod console {
    use std::net::SocketAddr;
    use std::time::Duration;

    use intake_core::app::{
        App, Console, ConsoleSettings, ConsoleToken, Health, HealthListener, HealthService,
        HealthSettings,
    };
    use intake_core::consumer::{Consumer, DeliveryOrder};
    use intake_core::memory::MemoryBroker;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_util::sync::CancellationToken;

    use super::{Handled, committed, eventually, expected, handled, recording, send};

    const TOKEN: &str = "pause-t0ken-0123456789abcdef";

    async fn request(address: SocketAddr, method: &str, path: &str, token: bool) -> (u16, String) {
        let exchange = async {
            let mut stream = tokio::net::TcpStream::connect(address)
                .await
                .expect("connect");
            let mut head =
                format!("{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n");
            if token {
                head.push_str(&format!("Authorization: Bearer {TOKEN}\r\n"));
            }
            head.push_str("Content-Length: 0\r\n\r\n");
            stream.write_all(head.as_bytes()).await.expect("write");
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await.expect("read");
            answer
        };
        let answer = tokio::time::timeout(Duration::from_secs(10), exchange)
            .await
            .expect("the console answers in time");
        let status = answer
            .get(9..12)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("no status line: {answer}"));
        let body = answer
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_owned())
            .unwrap_or_default();
        (status, body)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_console_pauses_and_resumes_a_partition_behind_the_guard() {
        let broker = MemoryBroker::new();
        broker.create_topic("orders", 2).expect("topic");
        let health = Health::new(HealthSettings {
            rebalance_grace: Duration::ZERO,
            assignment_grace: Duration::from_secs(3_600),
            ..HealthSettings::default()
        });
        let console = Console::new(
            health,
            ConsoleSettings::default()
                .sample_interval(Duration::from_millis(50))
                .token(ConsoleToken::new(TOKEN).expect("token")),
        );
        let listener = HealthListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let serving = CancellationToken::new();
        let service = HealthService::new(console.health().clone()).with_console(console.clone());
        let server = tokio::spawn(listener.serve(service, serving.clone()));

        let seen: Handled = Default::default();
        let open = CancellationToken::new();
        open.cancel();
        let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
        let stop = CancellationToken::new();
        let app = App::new().console(console.clone()).route(
            "orders",
            Consumer::builder()
                .ordering(DeliveryOrder::Partition)
                .commit_interval(Duration::from_millis(10))
                .build(source, acker, recording(seen.clone(), open))
                .expect("settings"),
        );
        let running = tokio::spawn(app.run_until(stop.clone()));
        send(&broker, 0, 0..2);
        send(&broker, 1, 0..2);
        eventually("both partitions flow", || {
            committed(&broker) == [Some(2), Some(2)]
        })
        .await;

        let pause = "/console/api/v1/routes/orders/pause?partition=0";
        let (status, body) = request(address, "POST", pause, false).await;
        assert_eq!(status, 401, "{body}");
        let (status, body) = request(address, "GET", pause, true).await;
        assert_eq!(status, 405, "{body}");
        let (status, body) = request(address, "POST", pause, true).await;
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("\"partition\":0"), "{body}");
        let (status, body) = request(
            address,
            "POST",
            "/console/api/v1/routes/nowhere/pause",
            true,
        )
        .await;
        assert_eq!(status, 404, "{body}");

        let partitions = "/console/api/v1/routes/orders/partitions";
        let mut shown = String::new();
        for _ in 0..400 {
            shown = request(address, "GET", partitions, false).await.1;
            if shown.contains("\"liveness\":\"paused\"") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(shown.contains("\"liveness\":\"paused\""), "{shown}");
        assert!(shown.contains("\"paused\":true"), "{shown}");

        send(&broker, 0, 2..4);
        send(&broker, 1, 2..4);
        eventually("partition 1 flows", || committed(&broker)[1] == Some(4)).await;
        assert_eq!(committed(&broker)[0], Some(2), "partition 0 holds");
        assert_eq!(handled(&seen, 0), expected(0, 0..2));

        let (status, body) = request(
            address,
            "POST",
            "/console/api/v1/routes/orders/resume?partition=0",
            true,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        eventually("partition 0 flows again", || {
            committed(&broker)[0] == Some(4)
        })
        .await;
        assert_eq!(handled(&seen, 0), expected(0, 0..4));

        let audit = console.audit_log();
        let found = |action: &str, outcome: &str| {
            audit
                .iter()
                .any(|entry| entry.action == action && entry.outcome.starts_with(outcome))
        };
        assert!(found("pause", "refused"), "{audit:?}");
        assert!(found("pause", "done"), "{audit:?}");
        assert!(found("resume", "done"), "{audit:?}");

        stop.cancel();
        running.await.expect("join").expect("app");
        serving.cancel();
        server.await.expect("join");
    }
}
