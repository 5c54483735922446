//! What the `intake` command's end-to-end tests share: the brokers'
//! addresses, running the built binary, and skipping when a broker does
//! not listen. Each test file uses part of it.
#![allow(dead_code)]

use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

pub const REDIS: &str = "redis://127.0.0.1:6379";
pub const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
pub const KAFKA: &str = "127.0.0.1:9092";
pub const NATS: &str = "nats://127.0.0.1:4222";

/// Longest a run of the command may take: its own waits are bounded by
/// `--timeout`, this bounds the test should one not be.
pub const RUN_LIMIT: Duration = Duration::from_secs(40);

/// What a run of `intake` left behind.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|error| {
            panic!(
                "stdout is not JSON ({error}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }

    pub fn assert_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code,
            Some(code),
            "exit code; stdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        self
    }
}

/// Runs the built `intake` with `args`, stdin closed, `INTAKE_BROKER` unset.
pub async fn intake(args: &[&str]) -> Run {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_intake"))
        .args(args)
        .env_remove("INTAKE_BROKER")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the intake binary starts");
    let output = tokio::time::timeout(RUN_LIMIT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("intake {args:?} did not end within {RUN_LIMIT:?}"))
        .expect("intake's output");
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Whether `address` listens; when it does not, the test skips (or fails
/// under `INTAKE_REQUIRE_BROKERS=1`).
pub fn broker_listens(test: &str, address: &str) -> bool {
    let listens = address
        .parse()
        .ok()
        .and_then(|address| TcpStream::connect_timeout(&address, Duration::from_secs(2)).ok())
        .is_some();
    if !listens {
        assert!(
            std::env::var("INTAKE_REQUIRE_BROKERS").as_deref() != Ok("1"),
            "{test}: nothing listens on {address} and INTAKE_REQUIRE_BROKERS=1"
        );
        eprintln!("{test}: skipped, nothing listens on {address}");
    }
    listens
}

/// A name no earlier run used.
pub fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    format!("cli-{prefix}-{}-{nanos}", std::process::id())
}
