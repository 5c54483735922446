//! The CI service scripts' own logic, where a mistake would stop every run
//! before a single test: run with bash, on files this test writes.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

/// A log file of this test's own, removed when dropped.
struct Log(PathBuf);

impl Log {
    fn new(name: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("intake-ci-{}-{name}.log", std::process::id()));
        Self(path)
    }

    fn write(&self, text: &str) {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.0)
            .expect("open the log");
        file.write_all(text.as_bytes()).expect("write the log");
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs `log_says_since FILE 1 PATTERN` from `.ci/lib/log.sh` under the
/// service scripts' shell options; `true` when it found the line.
fn log_says_since(log: &std::path::Path, pattern: &str) -> bool {
    let script = format!(
        "set -euo pipefail; source .ci/lib/log.sh; log_says_since '{}' 1 '{}'",
        log.display(),
        pattern
    );
    let status = Command::new("bash")
        .arg("-c")
        .arg(script)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("bash runs");
    status.success()
}

#[test]
fn a_ready_line_followed_by_more_than_a_pipe_buffer_of_log_is_seen() {
    // Kafka's start-up log had 79 KB when it was ready and grows on: the
    // line is early, a pipe buffer (64 KiB) and more follow it.
    let log = Log::new("ready-then-more");
    let mut text = String::from("[KafkaRaftServer nodeId=1] Kafka Server started\n");
    for line in 0..4_000 {
        text.push_str(&format!(
            "INFO line {line} of what the broker logs after it started\n"
        ));
    }
    assert!(text.len() > 200_000);
    log.write(&text);

    for _ in 0..5 {
        assert!(log_says_since(&log.0, "Kafka Server started"));
    }
}

#[test]
fn a_line_that_is_not_there_is_not_seen() {
    let log = Log::new("not-ready");
    log.write("starting\n");
    assert!(!log_says_since(&log.0, "Kafka Server started"));
}
