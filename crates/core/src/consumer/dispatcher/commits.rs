//! Commits: the commit tick, the batches taken from the commit engine and
//! handed to the ack loop, the work of failed batches put back, and the
//! final commit of a run.

use tokio::sync::oneshot;
use tokio::time::Instant;
use tower::Service;

use super::Dispatcher;
use crate::acker::AckBatch;
use crate::commit_engine::PartitionId;
use crate::consumer::ack_loop::AckRequest;
use crate::error::HandlerError;
use crate::message::{Message, PartitionKey, Position};

/// What the final commit of a run carried, and whether the broker confirmed
/// it.
pub(super) struct FinalCommit {
    /// The broker answered, and accepted every batch up to the final one.
    pub(super) confirmed: bool,
    /// Each assigned partition's watermark, as the final commit sent it.
    pub(super) watermarks: Vec<(PartitionKey, Position)>,
}

impl<H> Dispatcher<H>
where
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    /// The commit tick: the next pass sends a batch, and the observer gets the
    /// in-flight count, a snapshot of each partition, whether the source
    /// reaches its broker and the backoff level.
    pub(super) fn on_tick(&mut self) {
        self.flush_due = true;
        if self.acks.outstanding() > 0 {
            // A batch sent before still waits for the ack loop: the tick's
            // own batch can only follow it.
            self.yield_to_acks = true;
        }
        if let Some(observer) = self.settings.observer.clone() {
            observer.on_in_flight(self.slots.held());
            let now = Instant::now();
            let snapshots = self.partitions.snapshots(now);
            observer.on_partitions(&snapshots);
            observer.on_reachability(
                self.reachability
                    .as_ref()
                    .and_then(crate::backend::Reachability::unreachable_for),
            );
            observer.on_backoff(self.gate.level());
        }
    }

    /// Hands the engine's pending work to the ack loop when the tick asked for
    /// it or enough completions wait, unless a batch is still under way.
    pub(super) fn flush_if_due(&mut self) {
        let pending = self.partitions.engine().pending();
        if pending == 0 || self.acks.outstanding() > 0 {
            return;
        }
        // Capped by the budget: see `ConsumerBuilder::commit_batch`.
        let threshold = self
            .settings
            .commit_batch
            .min((self.settings.max_in_flight / 4).max(1));
        if self.flush_due || (pending >= threshold && !self.resend_on_tick) {
            let ticked = std::mem::take(&mut self.flush_due);
            self.resend_on_tick = false;
            let mut batch = AckBatch::default();
            self.partitions.take_batch(&mut batch);
            // A batch of the tick goes out now; one of the threshold may
            // wait for the task's next yield (at the latest when its
            // cooperative budget is spent), which costs no yield per batch.
            if !batch.is_empty() && self.acks.send(AckRequest { batch, reply: None }) && ticked {
                self.yield_to_acks = true;
            }
        }
    }

    /// Puts the work of acknowledgements that failed back into the engine;
    /// `true` if any had failed.
    pub(super) fn restore_failed(&mut self) -> bool {
        let mut restored = false;
        while let Some(failed) = self.acks.take_failed() {
            for ack in failed.partitions {
                self.partitions.restore(ack);
            }
            restored = true;
        }
        restored
    }

    /// Sends `batch` and waits for the acker's answer until `until`;
    /// `false` when it failed, did not come, or the ack loop is gone.
    pub(super) async fn send_and_wait(&mut self, batch: AckBatch, until: Instant) -> bool {
        let (reply, receiver) = oneshot::channel();
        if !self.acks.send(AckRequest {
            batch,
            reply: Some(reply),
        }) {
            return false;
        }
        matches!(
            tokio::time::timeout_at(until, receiver).await,
            Ok(Ok(Ok(())))
        )
    }

    /// The final commit of a run: every assigned partition's watermark and
    /// every id still to acknowledge, after the batches still with the
    /// acker. Over by `until`, answered or not.
    pub(super) async fn final_commit(&mut self, until: Instant) -> FinalCommit {
        // Batches still with the acker answer first (it handles them in
        // order; an empty batch is a barrier), so that the work of any that
        // fail goes out again in the final commit rather than being taken
        // for committed. Were the barrier not answered, the acker is stuck,
        // and a final commit queued behind it would not be either.
        self.restore_failed();
        let mut reachable = true;
        if self.acks.outstanding() > 0 {
            reachable = self
                .send_and_wait(
                    AckBatch {
                        partitions: Vec::new(),
                        sync: true,
                    },
                    until,
                )
                .await;
            self.restore_failed();
        }
        // The final commit: every assigned partition's watermark, sent again
        // even if it was sent before (its answer then confirms it), and
        // every id still to acknowledge.
        let mut batch = AckBatch {
            partitions: Vec::new(),
            sync: true,
        };
        let mut ids: Vec<PartitionId> = self.partitions.engine().assigned().collect();
        ids.sort();
        let mut watermarks = Vec::with_capacity(ids.len());
        for &id in &ids {
            if let (Some(partition), Some(watermark)) = (
                self.partitions.engine().key(id),
                self.partitions.engine().watermark(id),
            ) {
                watermarks.push((partition.clone(), watermark));
            }
            self.partitions.take_final_batch(id, &mut batch);
        }
        self.partitions.take_batch(&mut batch);
        let confirmed = if batch.is_empty() {
            reachable
        } else {
            reachable && self.send_and_wait(batch, until).await
        };
        if !confirmed {
            // The report lists them too (`not_committed`); the run's own
            // summary counts only deliveries, so name them here.
            tracing::error!(
                not_committed = ?watermarks,
                "the final commit failed or was not answered in time: these partitions are not \
                 committed up to the positions shown, and the messages finished there are \
                 delivered again to the next consumer"
            );
        }
        FinalCommit {
            confirmed,
            watermarks,
        }
    }
}
