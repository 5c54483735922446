//! Shutdown while Redis is unreachable: closing the source, the acker's
//! last acknowledgement and `Consumer::run` all return within bounds set by
//! the connect and command timeouts, under the default retry-forever
//! reconnect policy. The server is a `redis-server` of the test's own, on a
//! port of its own, which the test kills (refused connections) or freezes
//! with SIGSTOP (connections accepted, never answered); the shared server is
//! never touched. Readiness follows such an outage: false while the server
//! is down, true again once it is back.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use intake_core::app::{App, Health, HealthSettings, Problem};
use intake_core::{
    Consumer, HandlerError, Message,
    backend::{AckBatch, Acker, PartitionAck, Source},
};
use intake_redis_streams::{RedisSettings, RedisStreamsSource, RedisStreamsSourceBuilder};
use tokio_util::sync::CancellationToken;

use support::*;

/// Far above the timeouts configured below (a few hundred milliseconds):
/// reaching it means the step retried without end.
const HANG: Duration = Duration::from_secs(30);

/// How the test's server becomes unreachable.
#[derive(Clone, Copy, Debug)]
enum Outage {
    /// SIGKILL: connections are refused.
    Killed,
    /// SIGSTOP: the kernel still accepts connections, nothing answers.
    Frozen,
    /// SIGKILL, and a listener that never answers takes the port: the
    /// existing connections are gone, every new one hangs until its
    /// connect timeout (a host that went away behind a load balancer).
    Blackholed,
}

/// A `redis-server` child on a free port; killed when dropped.
struct OwnServer {
    child: Child,
    port: u16,
    /// Holds the port after [`Outage::Blackholed`].
    blackhole: Option<std::net::TcpListener>,
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl OwnServer {
    fn start() -> Result<Self, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(|error| error.to_string())?
            .port();
        Ok(Self {
            child: Self::spawn(port)?,
            port,
            blackhole: None,
        })
    }

    /// A new server on the port of the one that was killed, empty (nothing
    /// is saved): a restart that lost the data.
    fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.blackhole = None;
        self.child = Self::spawn(self.port).expect("the server starts again");
    }

    /// A `redis-server` on `port`, once it listens.
    fn spawn(port: u16) -> Result<Child, String> {
        let mut child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|error| format!("cannot start redis-server: {error}"))?;
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(child);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        Err("redis-server did not start listening".into())
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn break_down(&mut self, outage: Outage) {
        match outage {
            Outage::Killed => {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
            Outage::Blackholed => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                // Never accepted: the kernel completes the handshakes into
                // the backlog, and nothing is ever read or written.
                self.blackhole = Some(
                    std::net::TcpListener::bind(("127.0.0.1", self.port))
                        .expect("the port is free again"),
                );
            }
            Outage::Frozen => {
                let stopped = Command::new("kill")
                    .args(["-STOP", &self.child.id().to_string()])
                    .status()
                    .expect("kill -STOP");
                assert!(stopped.success(), "the server was frozen");
            }
        }
    }

    async fn admin(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .expect("a URL")
            .get_multiplexed_async_connection()
            .await
            .expect("the test's own server answers")
    }
}

fn own_server_or_skip(test: &str) -> Option<OwnServer> {
    match OwnServer::start() {
        Ok(server) => Some(server),
        Err(error) => {
            intake_core::backend::testkit::skip_or_fail(
                test,
                &format!("no redis-server of its own: {error}"),
            );
            None
        }
    }
}

/// A group consumer with short timeouts and the default reconnect policy
/// (retry forever).
fn config(server: &OwnServer, stream: &str) -> RedisStreamsSourceBuilder {
    RedisStreamsSource::builder(
        RedisSettings::new(server.url())
            .connect_timeout(Duration::from_millis(300))
            .command_timeout(Duration::from_millis(300)),
    )
    .stream(stream)
    .group("g")
    .consumer("c1")
    .block(Duration::from_millis(200))
}

#[tokio::test]
async fn closing_the_source_during_an_outage_returns_instead_of_reconnecting_forever() {
    for outage in [Outage::Killed, Outage::Frozen, Outage::Blackholed] {
        let Some(mut server) = own_server_or_skip("closing the source during an outage") else {
            return;
        };
        let mut source = config(&server, "orders").build().await.expect("connect");
        // The runtime drops the source's pending read when it stops; that
        // read's connection is given up, so closing needs a new one.
        let mut buffer = Vec::new();
        let dropped =
            tokio::time::timeout(Duration::from_millis(50), source.next(&mut buffer, 10)).await;
        assert!(dropped.is_err(), "the read was still blocked");
        server.break_down(outage);
        let closed = tokio::time::timeout(HANG, source.close()).await;
        let Ok(closed) = closed else {
            panic!("close() kept reconnecting to a {outage:?} server");
        };
        let error = closed.expect_err("the consumer could not leave its group");
        assert!(error.is_transient(), "{outage:?}: {error}");
    }
}

#[tokio::test]
async fn the_last_acknowledgement_during_an_outage_fails_within_its_timeouts() {
    for outage in [Outage::Killed, Outage::Frozen, Outage::Blackholed] {
        let Some(mut server) = own_server_or_skip("the last acknowledgement during an outage")
        else {
            return;
        };
        let mut admin = server.admin().await;
        produce(&mut admin, "orders", "m", 3).await;
        let mut source = config(&server, "orders").build().await.expect("connect");
        let mut acker = source.acker();
        let received = receive(&mut source, 3, 10, Duration::from_secs(5)).await;
        assert_eq!(received.len(), 3);
        server.break_down(outage);
        let mut batch = AckBatch {
            partitions: Vec::new(),
            sync: true,
        };
        let mut partition = PartitionAck::new(partition("orders"));
        partition.completed = received
            .iter()
            .map(|message| message.metadata().position())
            .collect();
        batch.partitions.push(partition);
        let acknowledged = tokio::time::timeout(HANG, acker.ack(&batch)).await;
        let Ok(acknowledged) = acknowledged else {
            panic!("the acknowledgement kept waiting for a {outage:?} server");
        };
        assert!(acknowledged.is_err(), "{outage:?}: nothing confirmed it");
    }
}

#[tokio::test]
async fn a_consumer_stopped_during_an_outage_returns_from_run() {
    for outage in [Outage::Killed, Outage::Frozen, Outage::Blackholed] {
        let Some(mut server) = own_server_or_skip("a consumer stopped during an outage") else {
            return;
        };
        let mut admin = server.admin().await;
        produce(&mut admin, "orders", "m", 5).await;
        let source = config(&server, "orders").build().await.expect("connect");
        let acker = source.acker();
        let shutdown = CancellationToken::new();
        let (handled, mut handled_rx) = tokio::sync::mpsc::unbounded_channel();
        let handler = tower::service_fn(move |message: Message| {
            let _ = handled.send(message.metadata().position());
            std::future::ready(Ok::<_, HandlerError>(()))
        });
        let run = tokio::spawn(
            Consumer::builder()
                .shutdown_deadline(Duration::from_millis(500))
                .build(source, acker, handler)
                .expect("consumer")
                .run(shutdown.clone()),
        );
        for _ in 0..5 {
            tokio::time::timeout(HANG, handled_rx.recv())
                .await
                .expect("every entry was handled")
                .expect("the run is alive");
        }
        // The outage begins, and then the process is told to stop (SIGTERM).
        server.break_down(outage);
        shutdown.cancel();
        let ended = tokio::time::timeout(HANG, run).await;
        let Ok(ended) = ended else {
            panic!("Consumer::run hung after a stop during a {outage:?} outage");
        };
        let report = ended
            .expect("the run task")
            .expect("a stop is not a failure");
        assert_eq!(report.succeeded, 5);
    }
}

#[tokio::test]
async fn readiness_fails_while_the_server_is_down_and_returns_after_its_restart() {
    let Some(mut server) = own_server_or_skip("readiness during an outage") else {
        return;
    };
    let mut admin = server.admin().await;
    produce(&mut admin, "orders", "before", 1).await;
    let source = config(&server, "orders")
        .reconnect_backoff(intake_core::Constant::new(Duration::from_millis(50)))
        .build()
        .await
        .expect("connect");
    let acker = source.acker();
    let (handled, mut handled_rx) = tokio::sync::mpsc::unbounded_channel();
    let handler = tower::service_fn(move |message: Message| {
        let _ = handled.send(message.payload().clone());
        std::future::ready(Ok::<_, HandlerError>(()))
    });
    let health = Health::new(HealthSettings {
        rebalance_grace: Duration::ZERO,
        ..HealthSettings::default()
    });
    let stop = CancellationToken::new();
    let app = App::new().health(health.clone()).route(
        "orders",
        Consumer::builder()
            .commit_interval(Duration::from_millis(20))
            .build(source, acker, handler)
            .expect("consumer"),
    );
    let running = tokio::spawn(app.run_until(stop.clone()));
    let first = tokio::time::timeout(HANG, handled_rx.recv()).await;
    assert_eq!(first.expect("handled").expect("alive"), "before0");
    eventually(&health, "ready", |health| health.is_ready()).await;

    server.break_down(Outage::Killed);
    eventually(&health, "not ready while the server is down", |health| {
        matches!(
            health.readiness().routes[0].1.as_slice(),
            [Problem::Unreachable { .. }, ..]
        )
    })
    .await;
    assert!(health.is_live(), "an outage is a readiness matter");

    server.restart();
    let mut admin = server.admin().await;
    produce(&mut admin, "orders", "after", 1).await;
    let next = tokio::time::timeout(HANG, handled_rx.recv()).await;
    assert_eq!(
        next.expect("handled after the restart").expect("alive"),
        "after0"
    );
    eventually(&health, "ready again", |health| health.is_ready()).await;
    stop.cancel();
    tokio::time::timeout(HANG, running)
        .await
        .expect("the app stops")
        .expect("join")
        .expect("a stop is not a failure");
}

/// Waits (within [`HANG`]) until `condition` holds, naming the readiness
/// report when it never does.
async fn eventually(health: &Health, what: &str, condition: impl Fn(&Health) -> bool) {
    let deadline = tokio::time::Instant::now() + HANG;
    while !condition(health) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never {what}: {}",
            health.readiness()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A reconnect policy that records each retry it is asked about and gives
/// up after three; `validate` fails when `invalid`.
#[derive(Clone, Default)]
struct RecordingBackoff {
    asked: std::sync::Arc<std::sync::Mutex<Vec<u32>>>,
    invalid: bool,
}

impl intake_core::BackoffPolicy for RecordingBackoff {
    fn delay(&self, retry: u32) -> Option<Duration> {
        self.asked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(retry);
        (retry <= 3).then_some(Duration::from_millis(10))
    }

    fn validate(&self) -> Result<(), intake_core::ConfigError> {
        if self.invalid {
            Err(intake_core::ConfigError::new("min", "is above max"))
        } else {
            Ok(())
        }
    }
}

#[tokio::test]
async fn any_backoff_policy_paces_the_reconnects_and_its_giving_up_ends_the_read() {
    let Some(mut server) = own_server_or_skip("any backoff policy paces the reconnects") else {
        return;
    };
    let policy = RecordingBackoff::default();
    let mut source = config(&server, "orders")
        .reconnect_backoff(policy.clone())
        .build()
        .await
        .expect("connect");
    server.break_down(Outage::Killed);
    let mut buffer = Vec::new();
    let read = tokio::time::timeout(HANG, source.next(&mut buffer, 10)).await;
    assert!(
        matches!(
            read,
            Ok(Err(intake_core::backend::SourceError::Unreachable { .. }))
        ),
        "{read:?}"
    );
    let asked = policy.asked.lock().map(|asked| asked.clone()).ok();
    assert_eq!(
        asked,
        Some(vec![1, 2, 3, 4]),
        "one question per failed attempt, the fourth answered with giving up"
    );
}

#[tokio::test]
async fn an_invalid_reconnect_policy_is_refused_when_built() {
    let built = RedisStreamsSource::builder("redis://127.0.0.1:1")
        .stream("orders")
        .group("g")
        .reconnect_backoff(RecordingBackoff {
            invalid: true,
            ..RecordingBackoff::default()
        })
        .build()
        .await;
    match built {
        Err(intake_redis_streams::Error::Config(error)) => {
            assert_eq!(error.setting, "reconnect_backoff");
            assert!(error.problem.contains("`min` is above max"), "{error}");
        }
        other => panic!("expected a configuration error, got {other:?}"),
    }
}
