//! How much the source may be asked for, the pauses of partitions over
//! their window that it is told of, and what a failed fetch does (retried
//! after the reconnect policy's delay, or the run stops).

use std::num::NonZeroUsize;

use tokio::time::Instant;
use tower::Service;

use super::{Dispatcher, Failure, Stop};
use crate::deadline;
use crate::error::{HandlerError, chain_for_log};
use crate::message::Message;
use crate::source::{Source, SourceError};

/// How long a run waits for shared room before it warns (once per wait).
const STARVED_WARNING: std::time::Duration = std::time::Duration::from_secs(60);

/// How the source may be asked: what [`Dispatcher::fetch_plan`] decides
/// before each fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Plan {
    /// Not at all: the run is stopping, or waits to retry after an error.
    Hold,
    /// For assignment changes only (`next` with `max` 0).
    Events,
    /// For up to this many deliveries.
    Deliveries(NonZeroUsize),
}

impl Plan {
    /// The `max` to hand to `Source::next`; `None` for no fetch at all.
    pub(super) fn max(self) -> Option<usize> {
        match self {
            Plan::Hold => None,
            Plan::Events => Some(0),
            Plan::Deliveries(max) => Some(max.get()),
        }
    }

    /// Whether this plan asks more of the source than `asked`, the plan a
    /// fetch under way was started with: if so, that fetch is dropped and
    /// the source asked again.
    pub(super) fn asks_more_than(self, asked: Plan) -> bool {
        matches!(
            (asked, self),
            (Plan::Hold, Plan::Events | Plan::Deliveries(_)) | (Plan::Events, Plan::Deliveries(_))
        )
    }
}

impl<H> Dispatcher<H>
where
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    /// How the source may be asked now: see [`Plan`]. The source is asked
    /// for assignment changes only (`Plan::Events`) while no delivery may
    /// be taken: no free slot, fetched deliveries wait for shared room, or
    /// a partition over its window stalls the run (see `partitions.rs`). A
    /// revocation must still get through then, or a full budget of stuck
    /// handlers, or a shared budget the other routes hold, would hold a
    /// rebalance until the source's revoke wait runs out and the partition
    /// goes to another member, whose deliveries this run would then still
    /// hold.
    ///
    /// Deliveries waiting for shared room are admitted here once room comes
    /// back, before the source is asked for more.
    pub(super) fn fetch_plan(&mut self) -> Plan {
        if !self.waiting.is_empty() {
            self.admit_waiting_if_room();
        }
        if self.bytes.denied_shared() || self.shared_wait_reported.is_some() {
            self.report_shared_wait();
        }
        if self.stop.is_some() {
            return Plan::Hold;
        }
        if let Some(at) = self.fetch_retry_at {
            if Instant::now() < at {
                return Plan::Hold;
            }
            self.fetch_retry_at = None;
        }
        if !self.waiting.is_empty() || self.partitions.stalled() {
            return Plan::Events;
        }
        let free = self.slots.free_count().min(self.settings.fetch_batch);
        if free == 0 {
            // Its own budget is full: it asks the shared one for nothing
            // (and is not denied room there).
            return Plan::Events;
        }
        match NonZeroUsize::new(free.min(self.bytes.fetch_limit())) {
            Some(max) => Plan::Deliveries(max),
            None => Plan::Events,
        }
    }

    /// Hands the queued pauses and resumes of partitions over their window
    /// to the source (see `partitions.rs`). Called between two fetches,
    /// when no `next` is pending.
    #[cold]
    #[inline(never)]
    pub(super) fn hand_pauses_to<S: Source>(&mut self, source: &mut S) {
        while let Some((partition, pause)) = self.partitions.take_pause() {
            if !pause {
                tracing::debug!(%partition, "resuming the partition: back under its window");
                source.resume(&partition);
            } else if source.pause(&partition) {
                tracing::debug!(%partition, "paused the partition: over its window");
            } else {
                self.partitions.pause_refused(&partition);
            }
        }
    }

    /// Admits the deliveries waiting for shared room if some is free (the
    /// run is woken when room is freed), unless the run is stopping
    /// gracefully (nothing new starts then: they stay unacknowledged, for
    /// the next consumer). Once the source is exhausted they are still
    /// admitted, and the run ends only after them.
    #[cold]
    fn admit_waiting_if_room(&mut self) {
        if matches!(self.stop, Some(Stop::Graceful { .. })) || self.bytes.waiting_for_shared() {
            return;
        }
        if self.admit_waiting() {
            // Called from the pass that polls everything, this may have
            // queued deliveries after the pass armed its timer (a backoff):
            // one more pass sees them.
            self.slots.runtime_waker().wake_by_ref();
        }
    }

    /// Tells the observer how long the run has been denied shared room, once
    /// that is a commit interval and then at most once per commit interval,
    /// and that the wait is over once it is.
    #[cold]
    fn report_shared_wait(&mut self) {
        let now = Instant::now();
        let interval = self.settings.commit_interval;
        let waited = self
            .bytes
            .denied_shared_for(now)
            .filter(|&waited| waited >= interval);
        let Some(waited) = waited else {
            if self.shared_wait_reported.take().is_some() {
                if std::mem::take(&mut self.shared_wait_warned) {
                    tracing::info!("room in the shared budget again");
                }
                if let Some(observer) = &self.settings.observer {
                    observer.on_shared_budget_wait(None);
                }
            }
            return;
        };
        if self
            .shared_wait_reported
            .is_some_and(|at| now.saturating_duration_since(at) < interval)
        {
            return;
        }
        if waited >= STARVED_WARNING && !self.shared_wait_warned {
            self.shared_wait_warned = true;
            tracing::warn!(
                ?waited,
                "no room in the shared budget for this long: the other consumers sharing it \
                 hold it all (lower their max_in_flight, or raise the shared budget)"
            );
        }
        self.shared_wait_reported = Some(now);
        if let Some(observer) = &self.settings.observer {
            observer.on_shared_budget_wait(Some(waited));
        }
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
