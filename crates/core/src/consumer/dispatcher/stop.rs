//! How a run ends: a graceful stop (shutdown or failure) with its deadline,
//! the end of an exhausted source, and the wind-down that cancels what still
//! runs, has the final commit made (see `commits.rs`) and writes the report.

use std::time::Duration;

use tokio::time::Instant;
use tower::Service;

use super::{Dispatcher, Failure, Stop};
use crate::consumer::report::{RunReport, Unfinished};
use crate::consumer::slots::SlotId;
use crate::deadline;
use crate::error::HandlerError;
use crate::message::Message;

/// The least time the final commit and the source's close get when the
/// handlers used the whole shutdown deadline (if the deadline itself is not
/// shorter).
const FINAL_STEPS_FLOOR: Duration = Duration::from_secs(5);

impl<H> Dispatcher<H>
where
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    /// Starts a graceful stop, unless one is under way: nothing new starts,
    /// running handlers get until the shutdown deadline, and the token they can
    /// read is cancelled. The first failure given is the run's reason.
    pub(super) fn begin_stop(&mut self, failure: Option<Failure>) {
        if self.failure.is_none() {
            self.failure = failure;
        }
        if !matches!(self.stop, Some(Stop::Graceful { .. })) {
            self.stop = Some(Stop::Graceful {
                deadline: deadline::after(Instant::now(), self.settings.shutdown_deadline),
            });
            tracing::info!(
                running = self.slots.running(),
                held = self.slots.held(),
                "shutting down: draining running handlers"
            );
        }
        if let Some(Stop::Graceful { deadline }) = self.stop {
            // Handlers read it: a retry due before it still runs.
            self.token.begin_drain(deadline);
        }
        // Deliveries waiting to be dispatched again do not start any more:
        // their key turns end now, unfinished, so the later deliveries of
        // their keys stop waiting for them (they fail as interrupted)
        // instead of holding the drain until its deadline.
        for &slot in self
            .ready
            .iter()
            .chain(self.held.iter().map(|(slot, _)| slot))
        {
            if self.turns.is_live(slot) {
                self.turns.end(slot, false);
            }
        }
    }

    /// Whether the run is over: it is stopping, and what it waits for is done
    /// (or, for a graceful stop, its deadline has passed).
    pub(super) fn is_drained(&self) -> bool {
        match self.stop {
            None => false,
            Some(Stop::Exhausted) => {
                self.slots.held() == 0 && self.revocations.is_empty() && self.waiting.is_empty()
            }
            Some(Stop::Graceful { deadline }) => {
                self.slots.running() == 0 || Instant::now() >= deadline
            }
        }
    }

    /// When the steps after the handlers' drain (the final commit, the
    /// source's close) must be over: what is left of the shutdown deadline,
    /// and at least `min(shutdown_deadline, 5 s)`.
    pub(super) fn final_steps_deadline(&self) -> Instant {
        let now = Instant::now();
        let floor = deadline::after(now, self.settings.shutdown_deadline.min(FINAL_STEPS_FLOOR));
        match self.stop {
            Some(Stop::Graceful { deadline }) => deadline.max(floor),
            // Exhausted (or never started): nothing drained against a
            // deadline, so the steps get a whole one.
            _ => deadline::after(now, self.settings.shutdown_deadline),
        }
    }

    /// Cancels what still runs, commits what finished, and reports. The
    /// final commit is over by `until`, answered or not.
    pub(super) async fn wind_down(&mut self, until: Instant) -> RunReport {
        let mut unfinished = Vec::new();
        let held: Vec<SlotId> = self.slots.held_slots().map(|(slot, _)| slot).collect();
        for slot in held {
            let entry = self.slots.get(slot);
            if let (Some(ticket), Some(position)) = (entry.ticket, entry.position)
                && let Some(partition) = self.partitions.engine().key(ticket.partition())
            {
                unfinished.push(Unfinished {
                    partition: partition.clone(),
                    position,
                    started: entry.started,
                });
            }
            self.slots.cancel(slot);
            self.free_slot(slot);
        }
        self.ready.clear();
        self.held.clear();
        let commit = self.final_commit(until).await;
        // Revocations still pending end with the run: what they held was
        // part of the final commit.
        for pending in std::mem::take(&mut self.revocations) {
            self.complete_revocation(pending, commit.confirmed);
        }
        let mut report = std::mem::take(&mut self.report);
        if commit.confirmed {
            report.committed = commit.watermarks;
        } else {
            report.not_committed = commit.watermarks;
        }
        unfinished.sort_by(|a, b| (&a.partition, a.position).cmp(&(&b.partition, b.position)));
        report.unfinished = unfinished;
        if report.not_committed.is_empty() {
            tracing::info!(
                succeeded = report.succeeded,
                unfinished = report.unfinished.len(),
                "consumer stopped"
            );
        } else {
            // Not "succeeded" alone: those whose commit failed are delivered
            // again, and an operator reading this line must not take the run
            // for finished.
            tracing::warn!(
                succeeded = report.succeeded,
                unfinished = report.unfinished.len(),
                not_committed = report.not_committed.len(),
                "consumer stopped, its final commit failed: finished messages are delivered again"
            );
        }
        report
    }
}
