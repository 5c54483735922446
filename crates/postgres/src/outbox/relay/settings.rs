//! [`RelaySettings`]: how an [`OutboxRelay`](super::OutboxRelay) runs (its
//! batch size, poll interval, confirm timeout, backoff and key order), and
//! their check.

use std::time::Duration;

use intake_core::{ConfigError, Exponential};

/// How an [`OutboxRelay`](super::OutboxRelay) runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RelaySettings {
    /// Rows published per transaction (at most).
    pub batch_size: u32,
    /// Pause before looking again when the outbox had fewer rows than a
    /// batch: the most a new row waits before it is picked up.
    pub poll_interval: Duration,
    /// The longest wait for room to send one output, and then for its
    /// confirmation, on top of the publisher's own timeouts; past it the
    /// row stays and is published again. A batch also sends no new row
    /// after this long (the rest is the next batch's), so that it ends
    /// within about twice this.
    pub confirm_timeout: Duration,
    /// Pauses after failed batches (retry `n` after `n` failures in a row).
    /// The relay never gives up on a row the broker may still take: a
    /// policy that would (past its `max_retries`) keeps its longest delay.
    /// (A row the broker refuses is not retried: it goes to the
    /// [failed table](crate::OutboxTable#the-failed-table).)
    pub backoff: Exponential,
    /// Whether a keyed row is sent only once the rows before it with the
    /// same destination and key are confirmed (default `true`). Then a row
    /// is never stored ahead of an earlier row of its key that failed, and
    /// the first copy of each row reaches the broker in id order per key.
    /// Off, every row of a batch is sent before any confirmation is awaited
    /// (one round trip a batch where a key repeats), and after a failure a
    /// later row of its key may be stored first (see
    /// [order](super::OutboxRelay#order)).
    pub key_order: bool,
}

impl Default for RelaySettings {
    /// 100 rows a batch, a look every 100 ms when idle, 30 s for a
    /// confirmation, 100 ms to 10 s between failed batches, and key order.
    fn default() -> Self {
        Self {
            batch_size: 100,
            poll_interval: Duration::from_millis(100),
            confirm_timeout: Duration::from_secs(30),
            backoff: Exponential::new(Duration::from_millis(100), Duration::from_secs(10)),
            key_order: true,
        }
    }
}

impl RelaySettings {
    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// A zero batch size, poll interval or confirmation timeout, or a
    /// backoff that [`Exponential::validate`] refuses.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.batch_size == 0 {
            return Err(ConfigError::new(
                "outbox.batch_size",
                "is 0; use at least 1",
            ));
        }
        if self.poll_interval.is_zero() {
            return Err(ConfigError::new(
                "outbox.poll_interval",
                "is zero, which would query the outbox without pause; use a few to a few \
                 hundred milliseconds",
            ));
        }
        if self.confirm_timeout.is_zero() {
            return Err(ConfigError::new(
                "outbox.confirm_timeout",
                "is zero, so no output could be confirmed; use the publisher's own timeout",
            ));
        }
        self.backoff.validate()
    }
}
