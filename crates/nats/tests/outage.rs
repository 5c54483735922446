//! Outages on a nats-server of the test's own (never the shared one): the
//! server SIGKILLed and started again on its storage under a running
//! consumer, a shutdown while it is down, a server that is not there at
//! build time. Readiness follows the outage: false while the server is
//! down, true again once the client reconnected.

mod support;

use std::time::Duration;

use intake_core::app::{Health, HealthSettings, Problem};
use intake_core::{Consumer, DeliveryOrder, HandlerError, Message};
use intake_nats::{Error, NatsSettings, NatsSource};
use support::own_server::OwnServer;
use support::{Running, Seen, wait_until};

/// Ports of this file's own servers (one per test: they run in parallel).
const KILL_PORT: u16 = 14_231;
const SHUTDOWN_PORT: u16 = 14_232;
const GIVE_UP_PORT: u16 = 14_233;

fn own_server(port: u16, test: &str) -> Option<OwnServer> {
    support::init_tracing();
    match OwnServer::start(port) {
        Ok(server) => Some(server),
        Err(error) => {
            intake_core::backend::testkit::skip_or_fail(
                test,
                &format!("cannot start nats-server: {error}"),
            );
            None
        }
    }
}

fn recording(
    seen: Seen,
) -> impl tower::Service<
    Message,
    Response = (),
    Error = HandlerError,
    Future = impl Future<Output = Result<(), HandlerError>> + Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |message: Message| {
        let seen = seen.clone();
        async move {
            seen.record(&message);
            tokio::time::sleep(Duration::from_millis(1)).await;
            Ok::<_, HandlerError>(())
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_and_started_again_loses_nothing() {
    let Some(server) = own_server(KILL_PORT, "server killed") else {
        return;
    };
    let client = intake_nats::async_nats::connect(server.url())
        .await
        .expect("connect");
    let stream = support::unique("outage");
    support::create_stream(&client, &stream)
        .await
        .expect("stream");
    support::produce(&client, &stream, support::numbered("m", 2_000))
        .await
        .expect("produce");
    drop(client);
    let source = NatsSource::builder(server.url())
        .stream(&stream)
        .consumer("g")
        .ack_wait(Duration::from_secs(2))
        .fetch_wait(Duration::from_secs(1))
        .ack_timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("source");
    let acker = source.acker();
    let seen = Seen::default();
    let health = Health::new(HealthSettings::default());
    let running = Running::start(
        Consumer::builder()
            .ordering(DeliveryOrder::Unordered)
            .max_in_flight(64)
            .commit_interval(Duration::from_millis(50))
            .observer(health.register("outage", None)),
        source,
        acker,
        recording(seen.clone()),
    );
    health.started();
    wait_until("some progress", Duration::from_secs(30), || {
        seen.total() >= 300
    })
    .await;
    wait_until("ready", Duration::from_secs(30), || health.is_ready()).await;
    server.kill().expect("SIGKILL the server");
    // The client reconnects on its own: readiness still sees the outage.
    wait_until(
        "not ready while the server is down",
        Duration::from_secs(30),
        || {
            health.readiness().routes[0]
                .1
                .iter()
                .any(|problem| matches!(problem, Problem::Unreachable { .. }))
        },
    )
    .await;
    server.restart().expect("start it again");
    wait_until(
        "ready again after the restart",
        Duration::from_secs(30),
        || health.is_ready(),
    )
    .await;
    wait_until(
        "every message after the restart",
        Duration::from_secs(90),
        || (0..2_000).all(|n| seen.count(format!("m{n}").as_bytes()) >= 1),
    )
    .await;
    let report = running.stop().await;
    assert!(report.succeeded >= 2_000, "{report:?}");
    let client = intake_nats::async_nats::connect(server.url())
        .await
        .expect("connect");
    assert_eq!(
        support::unacknowledged(&client, &stream, "g")
            .await
            .expect("inspect"),
        0,
        "everything acknowledged once the server was back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_while_the_server_is_down_ends_within_its_deadline() {
    let Some(server) = own_server(SHUTDOWN_PORT, "shutdown in an outage") else {
        return;
    };
    let client = intake_nats::async_nats::connect(server.url())
        .await
        .expect("connect");
    let stream = support::unique("down");
    support::create_stream(&client, &stream)
        .await
        .expect("stream");
    support::produce(&client, &stream, support::numbered("m", 10))
        .await
        .expect("produce");
    drop(client);
    let source = NatsSource::builder(server.url())
        .stream(&stream)
        .consumer("g")
        .ack_timeout(Duration::from_secs(1))
        .build()
        .await
        .expect("source");
    let acker = source.acker();
    let seen = Seen::default();
    let running = Running::start(
        Consumer::builder()
            .ordering(DeliveryOrder::Unordered)
            .shutdown_deadline(Duration::from_secs(2)),
        source,
        acker,
        recording(seen.clone()),
    );
    wait_until("the ten messages", Duration::from_secs(30), || {
        seen.total() >= 10
    })
    .await;
    server.kill().expect("SIGKILL the server");
    // The report comes within the stop's own bound (`Running::stop` fails
    // after 60 s): the final commit and the close each wait at most their
    // timeout for a server that is not there.
    let report = running.stop().await;
    assert_eq!(report.succeeded, 10);
}

#[tokio::test]
async fn no_server_at_build_is_a_transient_error_naming_the_address_without_credentials() {
    support::init_tracing();
    // A port nothing listens on.
    let url = "nats://app:s3cret-pw@127.0.0.1:9";
    let error = NatsSource::builder(NatsSettings::new(url).connect_timeout(Duration::from_secs(2)))
        .stream("S")
        .consumer("g")
        .build()
        .await
        .expect_err("nothing listens");
    assert!(matches!(error, Error::Unreachable { .. }), "{error:?}");
    assert!(error.is_transient());
    let shown = format!("{error} {error:?}");
    assert!(!shown.contains("s3cret-pw"), "{shown}");
    assert_eq!(error.endpoint(), Some("nats://app:***@127.0.0.1:9"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_backoff_that_gives_up_ends_the_run_saying_so() {
    let Some(server) = own_server(GIVE_UP_PORT, "reconnect gives up") else {
        return;
    };
    let client = intake_nats::async_nats::connect(server.url())
        .await
        .expect("connect");
    let stream = support::unique("giveup");
    support::create_stream(&client, &stream)
        .await
        .expect("stream");
    drop(client);
    let settings = NatsSettings::new(server.url())
        .reconnect_backoff(intake_core::Constant::new(Duration::from_millis(50)).max_retries(3));
    let source = NatsSource::builder(settings)
        .stream(&stream)
        .consumer("g")
        .fetch_wait(Duration::from_millis(200))
        .build()
        .await
        .expect("source");
    let acker = source.acker();
    let consumer = Consumer::builder()
        .ordering(DeliveryOrder::Unordered)
        .build(source, acker, recording(Seen::default()))
        .expect("consumer");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(consumer.run(shutdown.clone()));
    server.kill().expect("SIGKILL the server");
    let ended = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the run ends by itself")
        .expect("the run's task");
    let error = ended.expect_err("the source gave up");
    let text = format!("{error:?}");
    assert!(text.contains("GaveUp"), "{text}");
}
