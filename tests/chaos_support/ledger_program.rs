//! The program under test, `examples/ledger.rs`: built once per test
//! process, then run as `ledger produce` and `ledger consume` children.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use super::backends::Backend;
use super::child::{ChildProcess, run_to_completion};

/// The ledger binary, built on first use.
///
/// `cargo test --workspace --all-features` has already built it (examples
/// are built with the tests), so in CI the build is a no-op. The same
/// `--workspace --all-features` selection is used here: another feature set
/// would resolve dependency features differently and rebuild half the
/// dependency tree.
pub fn binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let (target_dir, profile) = target_dir_and_profile();
        let mut cargo = Command::new(env!("CARGO"));
        cargo
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("CARGO_TARGET_DIR", &target_dir)
            .args([
                "build",
                "--workspace",
                "--all-features",
                "--example",
                "ledger",
            ]);
        if profile == "release" {
            cargo.arg("--release");
        }
        // Bounded like every other step: a build stuck behind another
        // cargo's lock fails the suite instead of hanging it.
        let logs = std::env::temp_dir().join(format!("intake-chaos-build-{}", std::process::id()));
        std::fs::create_dir_all(&logs)
            .unwrap_or_else(|error| panic!("cannot create {}: {error}", logs.display()));
        if let Err(error) = run_to_completion(cargo, "cargo-build-ledger", &logs, BUILD_TIMEOUT) {
            panic!("building the ledger example failed: {error}");
        }
        let _ = std::fs::remove_dir_all(&logs);
        let binary = target_dir.join(profile).join("examples").join("ledger");
        assert!(binary.exists(), "cargo built no {}", binary.display());
        binary
    })
}

/// A no-op in CI; a build from scratch on two cores takes minutes.
const BUILD_TIMEOUT: Duration = Duration::from_secs(1800);

/// This test binary lives in `<target>/<profile>/deps/chaos-…`; the
/// example goes to `<target>/<profile>/examples/ledger`.
fn target_dir_and_profile() -> (PathBuf, String) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the test binary is in deps/");
    let profile_dir = deps.parent().expect("deps/ is in the profile directory");
    let profile = profile_dir
        .file_name()
        .expect("the profile directory has a name")
        .to_string_lossy()
        .into_owned();
    let target_dir = profile_dir
        .parent()
        .expect("the profile directory is in the target directory")
        .to_path_buf();
    (target_dir, profile)
}

/// How long `ledger produce` may take for one scenario's messages.
const PRODUCE_TIMEOUT: Duration = Duration::from_secs(180);

/// `ledger produce`: ids `0..count` into `source` on the broker at `url`,
/// which it creates (`partitions` applies to Kafka). Returns once all are
/// confirmed.
pub fn produce(
    url: &str,
    source: &str,
    count: u64,
    partitions: Option<u32>,
    logs: &Path,
) -> Result<(), String> {
    let mut command = Command::new(binary());
    command
        .arg("produce")
        .args(["--broker", url])
        .args(["--source", source])
        .args(["--count", &count.to_string()]);
    if let Some(partitions) = partitions {
        command.args(["--partitions", &partitions.to_string()]);
    }
    run_to_completion(command, "produce", logs, PRODUCE_TIMEOUT).map(drop)
}

/// One `ledger consume` invocation.
#[derive(Clone, Debug)]
pub struct Consume {
    pub backend: Backend,
    /// The `--broker` URL: the backend's shared broker, or a scenario's own.
    pub url: String,
    pub source: String,
    pub group: String,
    pub ledger: PathBuf,
    /// Exits 0 after this long without messages, everything committed.
    pub idle_exit: Duration,
    /// Every K-th first attempt fails retryably.
    pub fail_every: Option<u32>,
    /// Runs the handler in an exactly-once PostgreSQL transaction.
    pub effects_db: Option<String>,
    /// Every K-th first attempt asks to be retried after the duration, and
    /// is parked.
    pub later: Option<(u32, Duration)>,
    /// `--ordering key`: each key's messages in order, a parked key's later
    /// messages behind it.
    pub key_order: bool,
}

impl Consume {
    /// Starts the consumer; `label` names its log files in `logs`.
    pub fn spawn(&self, label: &str, logs: &Path) -> Result<ChildProcess, String> {
        let mut command = Command::new(binary());
        command
            .arg("consume")
            .args(["--broker", &self.url])
            .args(["--source", &self.source])
            .args(["--group", &self.group])
            .arg("--ledger")
            .arg(&self.ledger)
            .args(["--idle-exit-secs", &self.idle_exit.as_secs().to_string()]);
        if let Some(every) = self.fail_every {
            command.args(["--fail-every", &every.to_string()]);
        }
        if let Some(url) = &self.effects_db {
            command.args(["--effects-db", url]);
        }
        if let Some((every, delay)) = self.later {
            command
                .args(["--later-every", &every.to_string()])
                .args(["--later-secs", &delay.as_secs().to_string()]);
        }
        if self.key_order {
            command.args(["--ordering", "key"]);
        }
        command.envs(self.backend.consumer_env().iter().copied());
        ChildProcess::spawn(command, label, logs)
    }
}

/// One `ledger relay` invocation: consumes `source` and publishes each
/// payload to `to`, acknowledging an input after its output is confirmed.
#[derive(Clone, Debug)]
pub struct Relay {
    pub backend: Backend,
    pub url: String,
    pub source: String,
    pub group: String,
    pub to: String,
    /// Exits 0 after this long without messages, everything committed.
    pub idle_exit: Duration,
    /// `--exactly-once`: Kafka transactions.
    pub exactly_once: bool,
}

impl Relay {
    /// Starts the relay; `label` names its log files in `logs`.
    pub fn spawn(&self, label: &str, logs: &Path) -> Result<ChildProcess, String> {
        let mut command = Command::new(binary());
        command
            .arg("relay")
            .args(["--broker", &self.url])
            .args(["--source", &self.source])
            .args(["--group", &self.group])
            .args(["--to", &self.to])
            .args(["--idle-exit-secs", &self.idle_exit.as_secs().to_string()]);
        if self.exactly_once {
            command.arg("--exactly-once");
        }
        command.envs(self.backend.consumer_env().iter().copied());
        ChildProcess::spawn(command, label, logs)
    }
}
