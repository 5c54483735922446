//! Waits (bounded) until a condition over shared test state holds, for tests
//! that watch gauges or health while an app runs. Include it with
//! `#[path = "support/eventually.rs"] mod eventually;`. For the memory
//! broker's commits, use `backend::testkit::wait_until_committed`, which
//! says what is left when it gives up.

use std::time::Duration;

/// How long [`eventually`] waits before it fails the test.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Waits until `condition` holds, checking every 5 ms; panics naming `what`
/// after [`PATIENCE`] (on Tokio's clock).
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {PATIENCE:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
