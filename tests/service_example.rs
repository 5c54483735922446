//! `examples/app.rs` as Kubernetes runs it: ready over HTTP, SIGTERM drains
//! and exits 0, a second SIGTERM during the drain stops at once. The signals
//! go to the example's process, never to the test harness.

#![cfg(unix)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

fn example() -> std::path::PathBuf {
    let test = std::env::current_exe().expect("test path");
    // target/<profile>/deps/app_example-… -> target/<profile>/examples/app
    test.parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("examples").join("app"))
        .expect("the examples directory")
}

/// Starts the example; returns it and the address its health listener took.
fn start(audit_ms: u64) -> (Child, String, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(example())
        .env("INTAKE_HTTP_ADDR", "127.0.0.1:0")
        .env("INTAKE_APP_AUDIT_MS", audit_ms.to_string())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .expect("run target/…/examples/app: `cargo test --features health-server` builds it, `--test app_example` alone does not (`cargo build --example app --features health-server` first)");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("the first line");
    let address = line
        .trim()
        .strip_prefix("health on http://")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    (child, address, stdout)
}

fn get(address: &str, path: &str) -> String {
    let Ok(mut stream) = TcpStream::connect(address) else {
        return String::new();
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return String::new();
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

fn wait_ready(address: &str) {
    for _ in 0..1_000 {
        if get(address, "/health/ready").starts_with("HTTP/1.1 200") {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the example never became ready");
}

fn term(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

/// Waits (bounded) for the example to exit.
fn wait_exit(child: &mut Child) -> ExitStatus {
    for _ in 0..3_000 {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    panic!("the example did not exit");
}

#[test]
fn sigterm_drains_and_exits_zero() {
    let (mut child, address, mut stdout) = start(0);
    wait_ready(&address);
    assert!(get(&address, "/health/live").starts_with("HTTP/1.1 200"));
    term(&child);
    let status = wait_exit(&mut child);
    let mut summary = String::new();
    stdout.read_to_string(&mut summary).expect("summary");
    assert!(status.success(), "{status:?}\n{summary}");
    assert!(summary.contains("orders: succeeded"), "{summary}");
    assert!(summary.contains("payments: succeeded"), "{summary}");
}

#[test]
fn a_second_sigterm_stops_at_once() {
    // Audits take an hour: the drain would wait for its whole deadline.
    let (mut child, address, mut stdout) = start(3_600_000);
    wait_ready(&address);
    term(&child);
    // Stopping: readiness goes false first, while the drain waits.
    for _ in 0..1_000 {
        if get(&address, "/health/ready").starts_with("HTTP/1.1 503") {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    term(&child);
    let status = wait_exit(&mut child);
    let mut summary = String::new();
    stdout.read_to_string(&mut summary).expect("summary");
    assert_eq!(status.code(), Some(2), "{summary}");
    assert!(summary.contains("stopped at once"), "{summary}");
}
