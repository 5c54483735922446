//! [`AmqpCounters`]: what went wrong on a source's connection, counted for
//! metrics.
//!
//! The runtime's metrics see messages; these see the connection under them:
//! lost channels, reconnect attempts that failed, and deliveries lapin could
//! not parse. Each is a relaxed atomic, bumped only on those rare events,
//! never per message.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
struct Counts {
    channel_losses: AtomicU64,
    reconnects: AtomicU64,
    failed_reconnects: AtomicU64,
    unparsable_deliveries: AtomicU64,
}

/// Counts of connection trouble of one [`AmqpSource`](crate::AmqpSource),
/// readable at any time from any thread (export them as counters, e.g. with
/// a Prometheus collector that reads them at scrape time).
///
/// ```no_run
/// # async fn run() -> Result<(), intake_amqp::Error> {
/// let source = intake_amqp::AmqpSource::builder("amqp://guest:guest@127.0.0.1:5672/%2f")
///     .queue("orders")
///     .build()
///     .await?;
/// let counters = source.counters();
/// // Later, from a metrics task:
/// let lost = counters.channel_losses();
/// # let _ = lost;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct AmqpCounters(Arc<Counts>);

impl AmqpCounters {
    /// Channels lost: the connection dropped, the broker closed the channel
    /// or cancelled the consumer, or a delivery could not be parsed.
    pub fn channel_losses(&self) -> u64 {
        self.0.channel_losses.load(Ordering::Relaxed)
    }

    /// Sessions opened again after a loss.
    pub fn reconnects(&self) -> u64 {
        self.0.reconnects.load(Ordering::Relaxed)
    }

    /// Reconnect attempts that failed (broker unreachable, vhost down, the
    /// queue's node down, a declaration refused, …), each retried after the
    /// reconnect backoff.
    pub fn failed_reconnects(&self) -> u64 {
        self.0.failed_reconnects.load(Ordering::Relaxed)
    }

    /// Channels lost to a delivery that lapin could not parse (a header name,
    /// message id or routing key that is not UTF-8). The broker redelivers
    /// such a message on every reconnect: a count that keeps growing means a
    /// poison message at the head of the queue (the log names it).
    pub fn unparsable_deliveries(&self) -> u64 {
        self.0.unparsable_deliveries.load(Ordering::Relaxed)
    }

    pub(crate) fn channel_lost(&self) {
        self.0.channel_losses.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn reconnected(&self) {
        self.0.reconnects.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn reconnect_failed(&self) {
        self.0.failed_reconnects.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn unparsable(&self) {
        self.0.unparsable_deliveries.fetch_add(1, Ordering::Relaxed);
    }
}
