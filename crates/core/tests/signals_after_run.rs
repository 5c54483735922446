//! SIGTERM and SIGINT after `App::run` returned (review R31): tokio keeps
//! its signal handlers for the life of the process, so without care a
//! signal after the run is swallowed and a hang after it (a shutdown step
//! of the service's own) can only be ended with SIGKILL.
//!
//! The test runs this test binary again as a child process (switched by an
//! environment variable) that runs an app twice, each run stopped by
//! SIGTERM, and then hangs; the parent sends the signals and watches.
#![cfg(unix)]

#[path = "support/eventually.rs"]
mod eventually;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use eventually::eventually;
use intake_core::app::{App, Health, HealthSettings};
use intake_core::consumer::Consumer;
use intake_core::memory::MemoryBroker;
use intake_core::{HandlerError, Message};

/// Set in the child's environment: run the child's part.
const CHILD: &str = "INTAKE_SIGNALS_AFTER_RUN_CHILD";

/// The prefix of the child's lines that the parent reads.
const MARK: &str = "signals-child: ";

/// How long the parent waits for each step of the child.
const PATIENCE: Duration = Duration::from_secs(30);

fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{MARK}{line}");
    let _ = out.flush();
}

/// The child: two runs of an app, each until a SIGTERM, then a hang; or,
/// with [`CHILD`] set to `hook`, one run whose shutdown hook hangs.
#[test]
fn child_process() {
    let Some(mode) = std::env::var_os(CHILD) else {
        return;
    };
    if mode == "hook" {
        return child_with_a_hanging_hook();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        for round in 1..=2 {
            let broker = MemoryBroker::new();
            broker.create_topic("orders", 1).expect("topic");
            let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
            let health = Health::new(HealthSettings::default());
            let app = App::new().health(health.clone()).route(
                "orders",
                Consumer::builder()
                    .build(
                        source,
                        acker,
                        tower::service_fn(|_message: Message| async { Ok::<_, HandlerError>(()) }),
                    )
                    .expect("settings"),
            );
            let running = tokio::spawn(app.run());
            // Ready once the routes run: the signals were installed before.
            eventually("the app is ready", || health.is_ready()).await;
            say(&format!("ready {round}"));
            running.await.expect("join").expect("the run drains");
            say(&format!("returned {round}"));
        }
        say("hanging");
        // A shutdown step of the service that never ends (bounded here).
        tokio::time::sleep(PATIENCE * 2).await;
        say("not ended");
    });
}

/// One run whose shutdown hook never ends (bounded here); the runtime's
/// log goes to stdout, where the parent reads it.
fn child_with_a_hanging_hook() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stdout)
        .with_ansi(false)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let broker = MemoryBroker::new();
        broker.create_topic("orders", 1).expect("topic");
        let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
        let health = Health::new(HealthSettings::default());
        let app = App::new()
            .health(health.clone())
            .on_shutdown("flush", async || {
                say("hook hangs");
                tokio::time::sleep(PATIENCE * 2).await;
                Ok::<_, std::io::Error>(())
            })
            .route(
                "orders",
                Consumer::builder()
                    .build(
                        source,
                        acker,
                        tower::service_fn(|_message: Message| async { Ok::<_, HandlerError>(()) }),
                    )
                    .expect("settings"),
            );
        let running = tokio::spawn(app.run());
        eventually("the app is ready", || health.is_ready()).await;
        say("ready");
        let _ = running.await;
        say("not ended");
    });
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{name} failed");
}

/// Kills the child when the parent's test fails.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_signal_after_the_run_ends_the_process_and_a_later_run_still_drains() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let (mut child, lines) = spawn_child("runs");
    for round in 1..=2 {
        wait_for(&lines, &format!("{MARK}ready {round}"));
        signal(&child.0, "TERM");
        // A later run installs the signals again and drains on SIGTERM; it
        // is not ended by what the first run left behind.
        wait_for(&lines, &format!("{MARK}returned {round}"));
    }
    wait_for(&lines, &format!("{MARK}hanging"));
    signal(&child.0, "INT");
    assert_eq!(
        exit_code(&mut child),
        Some(128 + 2),
        "a SIGINT after the run ends the process as 128 + SIGINT"
    );
}

/// Spawns the child in `mode`; returns it and its stdout's lines.
fn spawn_child(mode: &str) -> (Reap, mpsc::Receiver<String>) {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "child_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the child");
    let stdout = child.stdout.take().expect("stdout");
    let (lines, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    (Reap(child), received)
}

/// Waits (bounded) for a line of the child that contains `wanted`.
fn wait_for(lines: &mpsc::Receiver<String>, wanted: &str) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(wanted) => return,
            Ok(_) => {}
            Err(_) => panic!("the child did not say `{wanted}` within {PATIENCE:?}"),
        }
    }
}

/// Waits (bounded) for the child to end; returns its exit code.
fn exit_code(child: &mut Reap) -> Option<i32> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.0.try_wait().expect("wait") {
            return status.code();
        }
        assert!(
            Instant::now() < deadline,
            "the child still runs {PATIENCE:?} after the signal that should end it"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_third_signal_ends_a_run_whose_shutdown_hook_hangs() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let (mut child, lines) = spawn_child("hook");
    wait_for(&lines, &format!("{MARK}ready"));
    signal(&child.0, "TERM");
    wait_for(&lines, &format!("{MARK}hook hangs"));
    signal(&child.0, "TERM");
    // Each signal is sent once the last was seen: tokio folds signals that
    // arrive before its listener looked into one.
    wait_for(&lines, "second stop signal received");
    signal(&child.0, "TERM");
    assert_eq!(
        exit_code(&mut child),
        Some(128 + 15),
        "a third SIGTERM ends the process as 128 + SIGTERM"
    );
}
