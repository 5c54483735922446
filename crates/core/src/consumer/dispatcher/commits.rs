//! Commits: the commit tick, the batches taken from the commit engine and
//! handed to the ack loop, and the work of failed batches put back.

use tokio::sync::oneshot;
use tokio::time::Instant;
use tower::Service;

use super::Dispatcher;
use crate::acker::AckBatch;
use crate::consumer::ack_loop::AckRequest;
use crate::error::HandlerError;
use crate::message::Message;

impl<H> Dispatcher<H>
where
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
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
        }
    }

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
}
