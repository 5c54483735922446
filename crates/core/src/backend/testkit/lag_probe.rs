//! The check every backend's lag probe passes against an address where no
//! broker answers.

use std::fmt::Debug;
use std::time::Duration;

use crate::error::ErrorChain;
use crate::lag::LagProbe;

/// Far above any probe timeout a test sets: reaching it means the probe
/// waited without a bound.
const HANG: Duration = Duration::from_secs(30);

/// Asks `probe`, pointed at an address where nothing answers, for the lag:
/// the answer must be a transient error within a bound, and neither the
/// error (its `Debug` and its whole chain) nor the probe's `Debug` may show
/// `secret` (the password its address or settings carry).
///
/// # Panics
///
/// When any of that does not hold; that is the point.
///
/// ```
/// # async fn check(probe: impl intake_core::LagProbe + std::fmt::Debug) {
/// intake_core::backend::testkit::assert_unreachable_lag_probe(&probe, Some("hunter2")).await;
/// # }
/// ```
pub async fn assert_unreachable_lag_probe<P: LagProbe + Debug>(probe: &P, secret: Option<&str>) {
    let answer = tokio::time::timeout(HANG, probe.lag())
        .await
        .expect("the probe keeps to its timeout");
    let error = match answer {
        Ok(lag) => panic!("a probe with no broker to ask answered {lag:?}"),
        Err(error) => error,
    };
    assert!(error.is_transient(), "{error:?}");
    if let Some(secret) = secret {
        let text = format!("{error:?} {}", ErrorChain::new(&error));
        assert!(!text.contains(secret), "the error shows the secret: {text}");
        let probe = format!("{probe:?}");
        assert!(
            !probe.contains(secret),
            "the probe shows the secret: {probe}"
        );
    }
}
