//! How much the source may be asked for, and what a failed fetch does
//! (retried after the reconnect policy's delay, or the run stops).

use tokio::time::Instant;
use tower::Service;

use super::{Dispatcher, Failure};
use crate::deadline;
use crate::error::{HandlerError, chain_for_log};
use crate::message::Message;
use crate::source::SourceError;

impl<H> Dispatcher<H>
where
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    /// How the source may be asked now: `None`, not at all (stopping, or
    /// waiting to retry after an error); `Some(0)`, for assignment changes
    /// only (no free slot: a revocation must still get through, or a full
    /// budget of stuck handlers would hold a rebalance forever); `Some(n)`,
    /// for up to `n` deliveries.
    pub(super) fn fetch_plan(&mut self, buffered: usize) -> Option<usize> {
        if self.stop.is_some() || buffered > 0 || self.bytes.waiting_for_shared() {
            return None;
        }
        if let Some(at) = self.fetch_retry_at {
            if Instant::now() < at {
                return None;
            }
            self.fetch_retry_at = None;
        }
        if self.partitions.any_over_window() {
            return Some(0);
        }
        Some(
            self.slots
                .free_count()
                .min(self.settings.fetch_batch)
                .min(self.bytes.fetch_limit()),
        )
    }

    /// A transient error is retried after the reconnect policy's delay
    /// (capped by the policy, growing while the failures go on, from the
    /// start again after an event of the source); any other error, or one
    /// the policy gives up on, stops the run with the error as its reason.
    /// Each is logged and reported to the observer.
    pub(super) fn source_failed(&mut self, error: SourceError) {
        let retry_in = if error.is_transient() {
            self.fetch_failures = self.fetch_failures.saturating_add(1);
            self.settings.reconnect.delay(self.fetch_failures)
        } else {
            None
        };
        if let Some(observer) = &self.settings.observer {
            observer.on_source_error(&error, retry_in);
        }
        if let Some(delay) = retry_in {
            tracing::warn!(
                error = %chain_for_log(&error),
                failures = self.fetch_failures,
                retry_in = ?delay,
                "fetching failed; retrying"
            );
            self.fetch_retry_at = Some(deadline::after(Instant::now(), delay));
            return;
        }
        if error.is_transient() {
            tracing::error!(error = %chain_for_log(&error), attempts = self.fetch_failures, "fetching failed and retries are exhausted");
        } else {
            tracing::error!(error = %chain_for_log(&error), "fetching failed for good");
        }
        self.begin_stop(Some(Failure::Source(error)));
    }
}
