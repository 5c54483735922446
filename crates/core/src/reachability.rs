//! [`Reachability`]: whether a source reaches its broker, for sources that
//! reconnect on their own.
//!
//! A source that returns a transient [`SourceError`](crate::backend::SourceError)
//! lets the runtime retry, and health sees each error. Many clients retry
//! inside the source instead (a Redis reader reconnecting with its own
//! policy, librdkafka, a NATS client): `next` then just waits, and nothing
//! would tell readiness that the broker is gone. Such a source hands the
//! runtime a `Reachability` once and marks it from inside its retry loop;
//! the runtime reads it at each commit tick, never per message.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A shared mark of whether a source reaches its broker: set by the source,
/// read by the runtime at each commit tick.
///
/// A source that returns a transient [`SourceError`](crate::backend::SourceError)
/// lets the runtime retry, and health sees each error. Many clients retry
/// inside the source instead (a Redis reader reconnecting with its own
/// policy, librdkafka, a NATS client): `next` then just waits, and nothing
/// would tell readiness that the broker is gone. Such a source hands the
/// runtime a `Reachability` once and marks it from inside its retry loop;
/// the runtime reads it at each commit tick, never per message.
/// Cloning gives another handle to the same mark.
///
/// ```
/// use intake_core::backend::Reachability;
///
/// let reachability = Reachability::new();
/// assert_eq!(reachability.unreachable_for(), None);
/// reachability.unreachable(); // a reconnect attempt failed
/// assert!(reachability.unreachable_for().is_some());
/// reachability.reachable(); // a command worked again
/// assert_eq!(reachability.unreachable_for(), None);
/// ```
#[derive(Clone, Debug)]
pub struct Reachability {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// What `since` counts from.
    origin: Instant,
    /// Microseconds after `origin`, plus one, since when the broker has been
    /// unreachable; 0 while it is reachable.
    since: AtomicU64,
}

impl Default for Reachability {
    fn default() -> Self {
        Self::new()
    }
}

impl Reachability {
    /// A mark that starts out reachable.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                origin: Instant::now(),
                since: AtomicU64::new(0),
            }),
        }
    }

    /// The broker could not be reached (a connection or reconnect attempt
    /// failed). The first such mark in a row sets since when.
    pub fn unreachable(&self) {
        let now = u64::try_from(self.inner.origin.elapsed().as_micros())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1);
        // Only the first failure in a row sets the time: later ones keep it.
        let _ = self
            .inner
            .since
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// The broker answered again.
    pub fn reachable(&self) {
        // A load first: the usual case (already reachable) writes nothing,
        // so a source may call this after every command for free.
        if self.inner.since.load(Ordering::Relaxed) != 0 {
            self.inner.since.store(0, Ordering::Relaxed);
        }
    }

    /// How long the broker has been unreachable, or `None` while it is
    /// reachable.
    pub fn unreachable_for(&self) -> Option<Duration> {
        match self.inner.since.load(Ordering::Relaxed) {
            0 => None,
            since => {
                let at = Duration::from_micros(since - 1);
                Some(self.inner.origin.elapsed().saturating_sub(at))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_in_a_row_sets_since_when() {
        let reachability = Reachability::new();
        reachability.unreachable();
        std::thread::sleep(Duration::from_millis(20));
        reachability.unreachable();
        let since = reachability.unreachable_for().expect("unreachable");
        assert!(since >= Duration::from_millis(20), "{since:?}");
        let clone = reachability.clone();
        clone.reachable();
        assert_eq!(reachability.unreachable_for(), None);
    }
}
