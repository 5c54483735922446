//! `examples/service.rs` as Kubernetes runs it, on the memory broker and on
//! each real one (`--broker`): ready over HTTP, messages handled on both
//! routes and poison dead-lettered (seen in `/metrics`), SIGTERM drains and
//! exits 0 with a summary line per route; a second SIGTERM during the drain
//! stops at once. The signals go to the example's process, never to the
//! test harness.
//!
//! A broker that does not answer on 127.0.0.1 skips its test, saying so,
//! unless `INTAKE_REQUIRE_BROKERS=1`.

#![cfg(unix)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use intake_core::backend::testkit::skip_or_fail;

/// The example's binary, built once per test process.
///
/// `cargo test --workspace --all-features` (CI) has built it already, so
/// this build is a no-op there; `--test service_example` alone builds no
/// example. The same `--workspace --all-features` selection as CI (and as
/// the chaos suite's ledger build): another feature set would resolve
/// dependency features differently and rebuild much of the tree.
fn example() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        // target/<profile>/deps/service_example-… -> target/<profile>
        let test = std::env::current_exe().expect("the test binary's path");
        let profile_dir = test
            .parent()
            .and_then(Path::parent)
            .expect("the profile directory");
        let target_dir = profile_dir.parent().expect("the target directory");
        let mut cargo = Command::new(env!("CARGO"));
        cargo
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("CARGO_TARGET_DIR", target_dir)
            .args([
                "build",
                "--workspace",
                "--all-features",
                "--example",
                "service",
            ])
            .stdin(Stdio::null());
        if profile_dir
            .file_name()
            .is_some_and(|name| name == "release")
        {
            cargo.arg("--release");
        }
        let status = cargo.status().expect("run cargo build");
        assert!(status.success(), "building the service example: {status}");
        let binary = profile_dir.join("examples").join("service");
        assert!(binary.exists(), "cargo built no {}", binary.display());
        binary
    })
}

/// A running example, killed if the test ends before it exited.
struct Service {
    child: Child,
    address: String,
    stdout: BufReader<ChildStdout>,
    stderr: PathBuf,
}

impl Service {
    /// Starts the example with `args`, `env` on top of a quiet default;
    /// returns once it printed its health address.
    fn start(args: &[&str], env: &[(&str, &str)]) -> Self {
        let stderr = std::env::temp_dir().join(format!(
            "intake-service-example-{}-{:?}.log",
            std::process::id(),
            std::thread::current().id()
        ));
        let log = std::fs::File::create(&stderr).expect("the stderr log");
        let mut child = Command::new(example())
            .args(args)
            .env("INTAKE_HTTP_ADDR", "127.0.0.1:0")
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("run the service example");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("the first line");
        let address = match line.trim().strip_prefix("health on http://") {
            Some(address) => address.to_owned(),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                let log = std::fs::read_to_string(&stderr).unwrap_or_default();
                panic!("unexpected first line {line:?}; stderr:\n{log}");
            }
        };
        Self {
            child,
            address,
            stdout,
            stderr,
        }
    }

    fn get(&self, path: &str) -> String {
        let Ok(address) = self.address.parse::<SocketAddr>() else {
            return String::new();
        };
        let Ok(mut stream) = TcpStream::connect_timeout(&address, Duration::from_secs(2)) else {
            return String::new();
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        if stream.write_all(request.as_bytes()).is_err() {
            return String::new();
        }
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer
    }

    /// Waits (bounded) until `condition` holds.
    fn wait_for(&mut self, what: &str, limit: Duration, mut condition: impl FnMut(&Self) -> bool) {
        let started = Instant::now();
        while started.elapsed() < limit {
            if condition(self) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "the example exited ({status}) before {what}\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "{what}: not within {limit:?}\nmetrics:\n{}\n{}",
            self.get("/metrics"),
            self.log()
        );
    }

    fn wait_ready(&mut self, limit: Duration) {
        self.wait_for("ready", limit, |service| {
            service.get("/health/ready").starts_with("HTTP/1.1 200")
        });
    }

    fn term(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits (bounded) for the example to exit; returns how, and the rest of
    /// its stdout (the summary).
    fn wait_exit(&mut self) -> (ExitStatus, String) {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            if let Some(status) = self.child.try_wait().expect("wait") {
                let mut summary = String::new();
                self.stdout.read_to_string(&mut summary).expect("summary");
                return (status, summary);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("the example did not exit\n{}", self.log());
    }

    fn log(&self) -> String {
        let log = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        format!("stderr:\n{log}")
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.stderr);
    }
}

/// The sum of a counter's samples whose labels contain `label`.
fn counter(metrics: &str, name: &str, label: &str) -> f64 {
    metrics
        .lines()
        .filter(|line| line.starts_with(&format!("{name}{{")) && line.contains(label))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The number after `field ` in the summary line of `route`.
fn summary_count(summary: &str, route: &str, field: &str) -> Option<u64> {
    let line = summary
        .lines()
        .find(|line| line.starts_with(&format!("{route}: ")))?;
    let (_, after) = line.split_once(&format!("{field} "))?;
    after
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Runs the example with `args`: ready, live, messages handled on both
/// routes and dead letters in `/metrics`; then SIGTERM drains it, it exits
/// 0, and the summary says what each route handled.
fn serves_handles_dead_letters_and_drains(args: &[&str], ready_within: Duration) {
    let mut service = Service::start(args, &[("INTAKE_SERVICE_INTERVAL_MS", "5")]);
    service.wait_ready(ready_within);
    assert!(
        service.get("/health/live").starts_with("HTTP/1.1 200"),
        "{}",
        service.get("/health/live")
    );
    service.wait_for(
        "both routes handled messages and poison was dead-lettered",
        Duration::from_secs(30),
        |service| {
            let metrics = service.get("/metrics");
            let succeeded = |handler: &str| {
                counter(
                    &metrics,
                    "intake_messages_succeeded_total",
                    &format!("handler=\"{handler}\""),
                )
            };
            succeeded("billing") > 0.0
                && succeeded("audit") > 0.0
                && counter(&metrics, "intake_messages_dead_lettered_total", "") > 0.0
        },
    );
    service.term();
    let (status, summary) = service.wait_exit();
    assert!(status.success(), "{status:?}\n{summary}\n{}", service.log());
    for route in ["orders", "payments"] {
        let succeeded = summary_count(&summary, route, "succeeded");
        assert!(
            succeeded.is_some_and(|count| count > 0),
            "{route}: {succeeded:?}\n{summary}"
        );
    }
    let dead_lettered = summary_count(&summary, "orders", "dead-lettered").unwrap_or(0)
        + summary_count(&summary, "payments", "dead-lettered").unwrap_or(0);
    assert!(dead_lettered > 0, "{summary}");
}

/// Whether something listens on 127.0.0.1:`port`; otherwise skips `test`
/// (or fails it under `INTAKE_REQUIRE_BROKERS=1`).
fn broker_answers(test: &str, port: u16) -> bool {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    match TcpStream::connect_timeout(&address, Duration::from_secs(2)) {
        Ok(_) => true,
        Err(error) => {
            skip_or_fail(test, &format!("nothing answers on {address}: {error}"));
            false
        }
    }
}

#[test]
fn on_memory_sigterm_drains_and_exits_zero() {
    serves_handles_dead_letters_and_drains(&[], Duration::from_secs(10));
}

#[test]
fn a_second_sigterm_stops_at_once() {
    // Audits take an hour: the drain would wait for its whole deadline.
    let mut service = Service::start(&[], &[("INTAKE_SERVICE_AUDIT_MS", "3600000")]);
    service.wait_ready(Duration::from_secs(10));
    service.term();
    // Stopping: readiness goes false first, while the drain waits.
    service.wait_for(
        "not ready while draining",
        Duration::from_secs(10),
        |service| service.get("/health/ready").starts_with("HTTP/1.1 503"),
    );
    service.term();
    let (status, summary) = service.wait_exit();
    assert_eq!(status.code(), Some(2), "{summary}");
    assert!(summary.contains("stopped at once"), "{summary}");
}

#[test]
fn on_kafka_sigterm_drains_and_exits_zero() {
    if broker_answers("on_kafka_sigterm_drains_and_exits_zero", 9092) {
        // A new group waits for the broker's initial rebalance delay.
        serves_handles_dead_letters_and_drains(
            &["--broker", "kafka://127.0.0.1:9092"],
            Duration::from_secs(60),
        );
    }
}

#[test]
fn on_redis_sigterm_drains_and_exits_zero() {
    if broker_answers("on_redis_sigterm_drains_and_exits_zero", 6379) {
        serves_handles_dead_letters_and_drains(
            &["--broker", "redis://127.0.0.1:6379"],
            Duration::from_secs(20),
        );
    }
}

#[test]
fn on_amqp_sigterm_drains_and_exits_zero() {
    if broker_answers("on_amqp_sigterm_drains_and_exits_zero", 5672) {
        serves_handles_dead_letters_and_drains(
            &["--broker", "amqp://guest:guest@127.0.0.1:5672"],
            Duration::from_secs(20),
        );
    }
}

#[test]
fn on_nats_sigterm_drains_and_exits_zero() {
    if broker_answers("on_nats_sigterm_drains_and_exits_zero", 4222) {
        serves_handles_dead_letters_and_drains(
            &["--broker", "nats://127.0.0.1:4222"],
            Duration::from_secs(20),
        );
    }
}
