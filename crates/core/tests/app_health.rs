//! Readiness and liveness of an app's routes on the memory broker, and the
//! built-in listener that serves them.

#[path = "support/eventually.rs"]
mod eventually;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use eventually::eventually;
use intake_core::app::{App, Health, HealthListener, HealthService, HealthSettings, Problem};
use intake_core::consumer::{Consumer, DeliveryOrder};
use intake_core::memory::{MemoryBroker, Record};
use intake_core::{HandlerError, Message};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

fn settings(stall_window: Duration) -> HealthSettings {
    HealthSettings {
        stall_window,
        rebalance_grace: Duration::ZERO,
        assignment_grace: Duration::from_secs(3_600),
        ..HealthSettings::default()
    }
}

fn ok_handler() -> impl tower::Service<
    Message,
    Response = (),
    Error = HandlerError,
    Future = impl Future<Output = Result<(), HandlerError>> + Send,
> + Send
+ 'static {
    tower::service_fn(|_message: Message| async { Ok::<_, HandlerError>(()) })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_partition_fails_liveness_while_the_others_flow() {
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 2).expect("topic");
    let flowed = Arc::new(AtomicUsize::new(0));
    let release = CancellationToken::new();
    let handler = tower::service_fn({
        let (flowed, release) = (flowed.clone(), release.clone());
        move |message: Message| {
            let (flowed, release) = (flowed.clone(), release.clone());
            async move {
                if message.metadata().partition() == 0 {
                    // Stuck until the test lets it go.
                    release.cancelled().await;
                } else {
                    flowed.fetch_add(1, Ordering::SeqCst);
                }
                Ok::<_, HandlerError>(())
            }
        }
    });
    let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
    let health = Health::new(settings(Duration::from_millis(300)));
    let stop = CancellationToken::new();
    let app = App::new().health(health.clone()).route(
        "orders",
        Consumer::builder()
            .ordering(DeliveryOrder::Unordered)
            .commit_interval(Duration::from_millis(10))
            .build(source, acker, handler)
            .expect("settings"),
    );
    let running = tokio::spawn(app.run_until(stop.clone()));
    for id in 0..4u32 {
        broker
            .send("orders", Record::new(id.to_string()).to_partition(id % 2))
            .expect("send");
    }
    eventually("the app is ready", || health.is_ready()).await;
    assert!(health.is_live(), "live before the window has passed");

    // Partition 1 keeps flowing while partition 0 is stuck.
    let mut stalled = None;
    for id in 4..2_004u32 {
        broker
            .send("orders", Record::new(id.to_string()).to_partition(1))
            .expect("send");
        let report = health.liveness();
        if !report.is_healthy() {
            stalled = Some(report);
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let report = stalled.expect("liveness fails once partition 0 stalls for the window");
    let (route, problems) = &report.routes[0];
    assert_eq!(route, "orders");
    assert_eq!(problems.len(), 1, "{report}");
    assert!(
        matches!(&problems[0], Problem::Stalled { partition, .. } if partition.partition == 0),
        "{report}"
    );
    assert!(flowed.load(Ordering::SeqCst) > 0);
    assert!(
        health.is_ready(),
        "a stall is a liveness matter, not readiness"
    );

    release.cancel();
    eventually("live again once the partition moves", || health.is_live()).await;
    stop.cancel();
    running.await.expect("join").expect("app");
    assert!(!health.is_ready(), "an app that ended is not ready");
}

#[tokio::test]
async fn a_route_is_not_ready_until_it_has_an_assignment() {
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 1).expect("topic");
    let health = Health::new(settings(Duration::from_secs(3_600)));
    assert!(!health.is_ready(), "nothing runs yet");

    // Another member holds the only partition.
    let (holder_source, holder_acker) = broker.consumer("orders", "billing").expect("consumer");
    let holder_stop = CancellationToken::new();
    let holder = tokio::spawn(
        Consumer::builder()
            .build(holder_source, holder_acker, ok_handler())
            .expect("settings")
            .run(holder_stop.clone()),
    );
    eventually("the holder has the partition", || {
        broker
            .group("orders", "billing")
            .map(|group| group.members.len() == 1)
            .unwrap_or(false)
    })
    .await;

    let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
    let stop = CancellationToken::new();
    let app = App::new().health(health.clone()).route(
        "orders",
        Consumer::builder()
            .commit_interval(Duration::from_millis(10))
            .build(source, acker, ok_handler())
            .expect("settings"),
    );
    let running = tokio::spawn(app.run_until(stop.clone()));
    eventually("the route runs", || {
        health
            .readiness()
            .routes
            .first()
            .is_some_and(|(_, problems)| problems == &[Problem::NoAssignment])
    })
    .await;
    assert!(!health.is_ready());

    // The holder leaves: the partition moves to the route.
    holder_stop.cancel();
    holder.await.expect("join").expect("holder");
    eventually("ready once assigned", || health.is_ready()).await;

    stop.cancel();
    running.await.expect("join").expect("app");
}

async fn get(address: std::net::SocketAddr, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("write");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("read");
    answer
}

#[tokio::test]
async fn the_listener_answers_the_probes() {
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 1).expect("topic");
    let health = Health::new(settings(Duration::from_secs(3_600)));
    let listener = HealthListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let serving = CancellationToken::new();
    let server = tokio::spawn(listener.serve(HealthService::new(health.clone()), serving.clone()));

    let answer = get(address, "/health/ready").await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");

    let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
    let stop = CancellationToken::new();
    let app = App::new().health(health.clone()).route(
        "orders",
        Consumer::builder()
            .commit_interval(Duration::from_millis(10))
            .build(source, acker, ok_handler())
            .expect("settings"),
    );
    let running = tokio::spawn(app.run_until(stop.clone()));
    eventually("ready", || health.is_ready()).await;

    let answer = get(address, "/health/ready").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("orders: ok\n"), "{answer}");
    let answer = get(address, "/health/live").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let answer = get(address, "/nothing").await;
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");

    stop.cancel();
    running.await.expect("join").expect("app");
    serving.cancel();
    server.await.expect("server");
}

/// A part beside the routes (a parking's mover, an outbox relay) counts:
/// broken, the instance is neither live nor ready; only unready, it is
/// live and not ready; healthy again, both.
#[test]
fn a_parts_check_counts_with_the_routes() {
    use intake_core::app::PartHealth;
    use std::sync::Mutex;
    let health = Health::new(settings(Duration::from_secs(60)));
    let _route = health.register("orders", None);
    health.started();
    let said = Arc::new(Mutex::new(PartHealth::NotLive(
        "the mover has not turned for 90 s".to_owned(),
    )));
    health.add_check("mover", {
        let said = Arc::clone(&said);
        move || said.lock().expect("said").clone()
    });
    let part = |report: intake_core::app::HealthReport| {
        report
            .routes
            .into_iter()
            .find(|(name, _)| name == "mover")
            .map(|(_, problems)| problems)
            .expect("the part is reported by its name")
    };
    assert_eq!(
        part(health.liveness()),
        vec![Problem::Part {
            reason: "the mover has not turned for 90 s".to_owned()
        }]
    );
    assert!(!health.is_live() && !health.is_ready());
    *said.lock().expect("said") = PartHealth::NotReady("rows refused".to_owned());
    assert!(health.is_live(), "{}", health.liveness());
    assert_eq!(part(health.readiness()).len(), 1);
    *said.lock().expect("said") = PartHealth::Healthy;
    assert!(part(health.readiness()).is_empty());
    assert!(part(health.liveness()).is_empty());
}
