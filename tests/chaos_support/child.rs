//! Child processes with bounded waits: a `ledger consume` run that can be
//! SIGKILLed, waited for or watched, and short commands (produce, broker
//! tools) that must finish within a deadline.
//!
//! Output goes to files, never to pipes: a pipe nobody reads fills up and
//! blocks the child, and files stay behind for a post-mortem.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::ledger_file::Progress;

/// How often waits look at the child and the ledger files: at ten thousand
/// messages a second, a kill lands within a hundred ids of its target.
const POLL: Duration = Duration::from_millis(10);

/// A running child process (mostly `ledger consume`). Dropping it SIGKILLs
/// the process, so a failing test leaves no consumer behind.
pub struct ChildProcess {
    label: String,
    child: Option<Child>,
    stdout: PathBuf,
    stderr: PathBuf,
}

/// How a consumer run ended on its own.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    /// The counters of the last stdout line, if it was the final line.
    pub counts: Option<RunCounts>,
}

/// The final stdout line, `processed=… retried=… dead_lettered=…` (a
/// relay's says `relayed=…` for `processed=…`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunCounts {
    pub processed: u64,
    pub retried: u64,
    pub dead_lettered: u64,
}

impl RunCounts {
    /// Reads `processed=1 retried=2 dead_lettered=3` (in any order, other
    /// fields ignored); `None` unless all three are there.
    pub fn parse(line: &str) -> Option<Self> {
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
        };
        Some(Self {
            processed: field("processed").or_else(|| field("relayed"))?,
            retried: field("retried")?,
            dead_lettered: field("dead_lettered")?,
        })
    }
}

impl ChildProcess {
    /// Starts `command`, its stdout and stderr going to `LABEL.stdout` and
    /// `LABEL.stderr` in `logs`. Labels are unique within a scenario.
    pub fn spawn(mut command: Command, label: &str, logs: &Path) -> Result<Self, String> {
        let stdout = logs.join(format!("{label}.stdout"));
        let stderr = logs.join(format!("{label}.stderr"));
        let open = |path: &Path| {
            File::create(path).map_err(|error| format!("cannot create {}: {error}", path.display()))
        };
        command
            .stdin(Stdio::null())
            .stdout(open(&stdout)?)
            .stderr(open(&stderr)?);
        let child = command
            .spawn()
            .map_err(|error| format!("cannot start {label} ({command:?}): {error}"))?;
        Ok(Self {
            label: label.to_owned(),
            child: Some(child),
            stdout,
            stderr,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// `Err` (with the end of its stderr) if the process has already exited:
    /// a consumer that should still be running died or gave up on its own.
    pub fn check_running(&mut self) -> Result<(), String> {
        let child = self.child.as_mut().expect("the process was not reaped yet");
        match child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "{} exited on its own ({status}) while it should have been running\n{}",
                self.label,
                self.output_tail()
            )),
            Err(error) => Err(format!("cannot poll {}: {error}", self.label)),
        }
    }

    /// Waits until the ledger files followed by `progress` hold `target`
    /// distinct ids: the work got that far. Fails if the process exits or
    /// the ids do not come within `timeout`.
    pub fn wait_for_progress(
        &mut self,
        progress: &mut Progress,
        target: u64,
        timeout: Duration,
    ) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_running()?;
            let distinct = progress.distinct();
            if distinct >= target {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} did not get the ledgers to {target} distinct ids within {timeout:?} \
                     (they hold {distinct})\n{}",
                    self.label,
                    self.output_tail()
                ));
            }
            thread::sleep(POLL);
        }
    }

    /// SIGKILL, then reap. `Err` if it had already exited on its own (the
    /// kill would prove nothing).
    pub fn sigkill(&mut self) -> Result<(), String> {
        self.check_running()?;
        let mut child = self.child.take().expect("checked above");
        // `Child::kill` is SIGKILL on Unix: no handler, no flush, no commit.
        let killed = child.kill();
        let reaped = child.wait();
        killed.map_err(|error| format!("cannot SIGKILL {}: {error}", self.label))?;
        reaped.map_err(|error| format!("cannot reap {}: {error}", self.label))?;
        Ok(())
    }

    /// SIGTERM: a graceful stop, as Kubernetes starts one. `Err` if it had
    /// already exited on its own. Wait for it with
    /// [`expect_clean_exit`](Self::expect_clean_exit).
    pub fn sigterm(&mut self) -> Result<(), String> {
        self.check_running()?;
        super::backends::send_signal(self.pid(), "-TERM")
            .map_err(|error| format!("cannot SIGTERM {}: {error}", self.label))
    }

    /// Waits for the process to exit on its own, SIGKILLing it (and failing)
    /// after `timeout`: a consumer that never goes idle must not hang the
    /// suite.
    pub fn wait_for_exit(&mut self, timeout: Duration) -> Result<Finished, String> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut().expect("the process was not reaped yet");
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    self.child = None;
                    let stdout = fs::read_to_string(&self.stdout).unwrap_or_default();
                    let counts = stdout
                        .lines()
                        .rev()
                        .find(|line| !line.trim().is_empty())
                        .and_then(RunCounts::parse);
                    return Ok(Finished { status, counts });
                }
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    self.child = None;
                    return Err(format!(
                        "{} did not exit within {timeout:?}; killed it\n{}",
                        self.label,
                        self.output_tail()
                    ));
                }
                Ok(None) => thread::sleep(POLL),
                Err(error) => return Err(format!("cannot poll {}: {error}", self.label)),
            }
        }
    }

    /// Like [`wait_for_exit`](Self::wait_for_exit), and the run must have
    /// succeeded: exit status 0 and the final counters line.
    pub fn expect_clean_exit(&mut self, timeout: Duration) -> Result<RunCounts, String> {
        let finished = self.wait_for_exit(timeout)?;
        match finished {
            Finished {
                status,
                counts: Some(counts),
            } if status.success() => Ok(counts),
            Finished { status, counts } => Err(format!(
                "{} ended with {status} and final counters {counts:?}; expected exit 0 and a \
                 last line `processed=… retried=… dead_lettered=…`\n{}",
                self.label,
                self.output_tail()
            )),
        }
    }

    /// The last lines of stdout and stderr, for failure messages.
    pub fn output_tail(&self) -> String {
        format!(
            "--- {} (last lines) ---\n{}--- {} (last lines) ---\n{}",
            self.stdout.display(),
            tail(&self.stdout, 5),
            self.stderr.display(),
            tail(&self.stderr, 30)
        )
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs a short command to its end within `timeout`, its output captured in
/// `logs/LABEL.*`; returns its stdout, or `Err` (with the output's end)
/// unless it exits 0.
pub fn run_to_completion(
    command: Command,
    label: &str,
    logs: &Path,
    timeout: Duration,
) -> Result<String, String> {
    let mut process = ChildProcess::spawn(command, label, logs)?;
    let finished = process.wait_for_exit(timeout)?;
    if finished.status.success() {
        Ok(fs::read_to_string(&process.stdout).unwrap_or_default())
    } else {
        Err(format!(
            "{label} failed ({})\n{}",
            finished.status,
            process.output_tail()
        ))
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    for line in &all[all.len().saturating_sub(lines)..] {
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_line_parses_in_any_order_and_needs_all_three() {
        assert_eq!(
            RunCounts::parse("processed=5 retried=1 dead_lettered=0"),
            Some(RunCounts {
                processed: 5,
                retried: 1,
                dead_lettered: 0
            })
        );
        assert_eq!(
            RunCounts::parse("dead_lettered=2 processed=7 retried=3 elapsed=1s"),
            Some(RunCounts {
                processed: 7,
                retried: 3,
                dead_lettered: 2
            })
        );
        assert_eq!(RunCounts::parse("processed=5 retried=1"), None);
    }
}
