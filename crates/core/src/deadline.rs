//! Moments a delay from now, for delays that come from user settings.
//!
//! `Instant + Duration` panics when the sum overflows, and settings such as
//! `shutdown_deadline(Duration::MAX)` ("wait as long as it takes") are
//! reasonable to write. A delay too long to add means "never" here.

use std::time::Duration;

/// About thirty years: as good as never for a deadline, and small enough to
/// add to any instant a clock gives out.
const NEVER: Duration = Duration::from_secs(30 * 365 * 24 * 60 * 60);

/// `now + delay` on tokio's clock; a far future moment if that overflows.
pub(crate) fn after(now: tokio::time::Instant, delay: Duration) -> tokio::time::Instant {
    now.checked_add(delay)
        .or_else(|| now.checked_add(NEVER))
        .unwrap_or(now)
}

/// `now + delay` on the standard clock; a far future moment if that
/// overflows.
pub(crate) fn after_std(now: std::time::Instant, delay: Duration) -> std::time::Instant {
    now.checked_add(delay)
        .or_else(|| now.checked_add(NEVER))
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delay_too_long_to_add_is_a_far_future_moment() {
        let now = tokio::time::Instant::now();
        assert_eq!(
            after(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        assert!(after(now, Duration::MAX) >= now + NEVER);
        let now = std::time::Instant::now();
        assert!(after_std(now, Duration::MAX) >= now + NEVER);
    }
}
