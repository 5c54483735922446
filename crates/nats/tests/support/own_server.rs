//! A nats-server of the test's own, on its own port and in its own
//! temporary directory, started, stopped and killed through
//! `.ci/services/nats.sh`: a test that takes a server down never takes down
//! the one every other test shares.
//!
//! The chaos suite at the repository's root includes this file too
//! (`#[path]`), so it finds the script from either package.

use std::path::{Path, PathBuf};
use std::process::Command;

use intake_core::BoxError;

/// A running server of the test's own; stopped (and its storage removed)
/// when dropped.
pub struct OwnServer {
    port: u16,
    /// Configuration, JetStream storage, certificates, pid and log.
    state: PathBuf,
    tls: bool,
    include: Option<PathBuf>,
}

impl OwnServer {
    /// Starts a server on `port` with JetStream. Blocks until it serves, at
    /// most the script's 30 s.
    pub fn start(port: u16) -> Result<Self, BoxError> {
        Self::start_with(port, false, None)
    }

    /// Starts a server on `port`, requiring TLS (`tls`) and including the
    /// config file `include` (authorization blocks).
    pub fn start_with(port: u16, tls: bool, include: Option<&str>) -> Result<Self, BoxError> {
        let state = std::env::temp_dir().join(format!(
            "intake-nats-{port}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_nanos())
        ));
        std::fs::create_dir_all(&state)?;
        let include = match include {
            Some(text) => {
                let path = state.join("test-include.conf");
                std::fs::write(&path, text)?;
                Some(path)
            }
            None => None,
        };
        let server = Self {
            port,
            state,
            tls,
            include,
        };
        server.script("start")?;
        Ok(server)
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory holding the test CA (`tls/ca.pem`, `tls/other-ca.pem`).
    pub fn state(&self) -> &Path {
        &self.state
    }

    /// A clean shutdown (SIGTERM, bounded by the script).
    pub fn stop(&self) -> Result<(), BoxError> {
        self.script("stop")
    }

    /// A crash: SIGKILL.
    pub fn kill(&self) -> Result<(), BoxError> {
        self.script("kill")
    }

    /// Starts the server again on the same storage.
    pub fn restart(&self) -> Result<(), BoxError> {
        self.script("start")
    }

    fn script(&self, verb: &str) -> Result<(), BoxError> {
        let mut command = Command::new("bash");
        command
            .arg(script()?)
            .arg(verb)
            .env("INTAKE_NATS_PORT", self.port.to_string())
            .env("INTAKE_NATS_STATE_DIR", &self.state)
            .env("INTAKE_NATS_TLS", if self.tls { "1" } else { "0" });
        if let Some(include) = &self.include {
            command.env("INTAKE_NATS_INCLUDE", include);
        }
        let status = command.status()?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("nats.sh {verb} on port {} failed: {status}", self.port).into())
        }
    }
}

/// `.ci/services/nats.sh`, from the package directory up.
fn script() -> Result<PathBuf, BoxError> {
    let package = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    package
        .ancestors()
        .map(|directory| directory.join(".ci/services/nats.sh"))
        .find(|script| script.exists())
        .ok_or_else(|| format!("no .ci/services/nats.sh above {}", package.display()).into())
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = self.script("stop");
        let _ = std::fs::remove_dir_all(&self.state);
    }
}
