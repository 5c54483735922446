//! An Apache Kafka broker of the test's own, on its own ports and in its own
//! temporary directory, started, stopped and killed through
//! `.ci/services/kafka.sh`: a test that takes a broker down never takes down
//! the one every other test shares.
//!
//! The chaos suite at the repository's root includes this file too
//! (`#[path]`), so it finds the script from either package.

use std::path::PathBuf;
use std::process::Command;

use intake_core::BoxError;

/// A running broker of the test's own; stopped (and its storage removed)
/// when dropped.
pub struct OwnBroker {
    port: u16,
    /// Configuration, storage, certificates, pid and log.
    state: PathBuf,
}

impl OwnBroker {
    /// Starts a broker whose plaintext listener is `port` (it also takes the
    /// three ports after it: TLS, SASL_SSL and its controller). Blocks until
    /// it serves, at most the script's 120 s.
    pub fn start(port: u16) -> Result<Self, BoxError> {
        let state = std::env::temp_dir().join(format!(
            "intake-kafka-{port}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_nanos())
        ));
        std::fs::create_dir_all(&state)?;
        let broker = Self { port, state };
        broker.script("start")?;
        Ok(broker)
    }

    /// `127.0.0.1:PORT`.
    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A controlled shutdown (SIGTERM, bounded by the script).
    pub fn stop(&self) -> Result<(), BoxError> {
        self.script("stop")
    }

    /// A crash: SIGKILL, no controlled shutdown.
    pub fn kill(&self) -> Result<(), BoxError> {
        self.script("kill")
    }

    /// Starts the broker again on the same storage.
    pub fn restart(&self) -> Result<(), BoxError> {
        self.script("start")
    }

    fn script(&self, verb: &str) -> Result<(), BoxError> {
        let status = Command::new("bash")
            .arg(script()?)
            .arg(verb)
            .env("INTAKE_KAFKA_PORT", self.port.to_string())
            .env("INTAKE_KAFKA_STATE_DIR", &self.state)
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("kafka.sh {verb} on port {} failed: {status}", self.port).into())
        }
    }
}

/// `.ci/services/kafka.sh`, from the package directory up.
fn script() -> Result<PathBuf, BoxError> {
    let package = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    package
        .ancestors()
        .map(|directory| directory.join(".ci/services/kafka.sh"))
        .find(|script| script.exists())
        .ok_or_else(|| format!("no .ci/services/kafka.sh above {}", package.display()).into())
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        let _ = self.script("stop");
        let _ = std::fs::remove_dir_all(&self.state);
    }
}
