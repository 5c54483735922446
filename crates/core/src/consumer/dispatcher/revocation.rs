//! Revocation: the revoked partitions' waiting deliveries (those admitted
//! but not started, and those fetched but still waiting for shared room) are
//! released, the running ones get until the revoke timeout, then a final synchronous
//! commit, and the partitions leave the run. A partition assigned again
//! before its revocation completed ends its old assignment at once
//! (`take_back`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::oneshot;
use tokio::time::Instant;
use tower::Service;

use super::Dispatcher;
use crate::acker::{AckBatch, AckError};
use crate::commit_engine::PartitionId;
use crate::consumer::ack_loop::AckRequest;
use crate::consumer::slots::SlotState;
use crate::deadline;
use crate::error::HandlerError;
use crate::message::Message;
use crate::source::{Revocation, RevocationOutcome, RevokedPartition};

/// A revocation under way: its partitions' handlers drain until
/// `deadline`, then its final commit is sent and its reply awaited.
pub(super) struct PendingRevocation {
    revocation: Revocation,
    partitions: Vec<PartitionId>,
    deadline: Instant,
    /// The final commit's answer, once it is sent.
    reply: Option<oneshot::Receiver<Result<(), AckError>>>,
}

impl PendingRevocation {
    /// Until when the revoked partitions' handlers may run, while they still
    /// may (the final commit is not sent yet).
    pub(super) fn drain_deadline(&self) -> Option<Instant> {
        self.reply.is_none().then_some(self.deadline)
    }
}

impl<H> Dispatcher<H>
where
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    /// Starts a revocation: see the module docs.
    pub(super) fn begin_revoke(&mut self, revocation: Revocation) {
        // Fetched before the revocation and still waiting for shared room:
        // the next owner receives them.
        self.release_waiting(|waiting| revocation.partitions().contains(waiting));
        let mut partitions = Vec::new();
        for key in revocation.partitions() {
            if let Some(id) = self.partitions.begin_revoke(key) {
                partitions.push(id);
            }
        }
        // Deliveries of these partitions that have not started are released
        // unacknowledged: the next owner receives them. Running ones may
        // finish until the revoke timeout.
        let mut lanes = Vec::new();
        let mut waiting = std::mem::take(&mut self.scratch);
        for (slot, entry) in self.slots.held_slots() {
            let Some(ticket) = entry.ticket else { continue };
            if partitions.contains(&ticket.partition()) {
                lanes.extend(self.lanes.lane_of(slot));
                if entry.state != SlotState::Running {
                    waiting.push(slot);
                }
            }
        }
        for lane in lanes {
            self.lanes.drop_lane(lane);
        }
        let slots = &self.slots;
        self.ready.retain(|&slot| {
            slots
                .get(slot)
                .ticket
                .is_none_or(|ticket| !partitions.contains(&ticket.partition()))
        });
        // Held for a pause: released as well (the pause itself stays, for
        // the partition's next assignment).
        self.held.retain(|&(slot, _)| {
            slots
                .get(slot)
                .ticket
                .is_none_or(|ticket| !partitions.contains(&ticket.partition()))
        });
        for &slot in &waiting {
            self.report.released_on_revoke += 1;
            self.free_slot(slot);
        }
        waiting.clear();
        self.scratch = waiting;
        tracing::info!(partitions = ?revocation.partitions(), "revoking partitions: draining");
        self.revocations.push(PendingRevocation {
            revocation,
            partitions,
            deadline: deadline::after(Instant::now(), self.settings.revoke_timeout),
            reply: None,
        });
    }

    /// Moves each pending revocation on: once its partitions' handlers are
    /// done (or the revoke timeout passed) its final commit is sent, and once
    /// that is answered it completes.
    pub(super) fn poll_revocations(&mut self, cx: &mut Context<'_>) {
        if self.revocations.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut index = 0;
        while index < self.revocations.len() {
            let pending = &mut self.revocations[index];
            if pending.reply.is_none() {
                let running: u32 = pending
                    .partitions
                    .iter()
                    .map(|&id| self.partitions.held(id))
                    .sum();
                if running > 0 && now < pending.deadline {
                    index += 1;
                    continue;
                }
                let partitions = pending.partitions.clone();
                if running > 0 {
                    tracing::warn!(
                        running,
                        timeout = ?self.settings.revoke_timeout,
                        "revoke timeout: cancelling the revoked partitions' running handlers"
                    );
                    self.cancel_partitions(&partitions);
                }
                let mut batch = AckBatch {
                    partitions: Vec::new(),
                    sync: true,
                };
                for &id in &partitions {
                    self.partitions.take_final_batch(id, &mut batch);
                }
                // Sent even when empty: the acker handles batches in order,
                // so its reply also confirms earlier batches still under way.
                let (reply, receiver) = oneshot::channel();
                if self.acks.send(AckRequest {
                    batch,
                    reply: Some(reply),
                }) {
                    self.revocations[index].reply = Some(receiver);
                }
            }
            let pending = &mut self.revocations[index];
            let committed = match pending.reply.as_mut() {
                None => true,
                // No deadline here: released before its final commit
                // answered, the partition could come back to this consumer
                // (or go to another) while that commit still waits in the
                // acker, which would then commit past the new assignment's
                // running messages or move the position back. The acker
                // bounds its own round trip (each backend's request timeout).
                Some(receiver) => match Pin::new(receiver).poll(cx) {
                    Poll::Pending => {
                        index += 1;
                        continue;
                    }
                    Poll::Ready(Ok(Ok(()))) => true,
                    Poll::Ready(_) => false,
                },
            };
            let pending = self.revocations.swap_remove(index);
            self.complete_revocation(pending, committed);
        }
    }

    /// Cancels the running handlers of `partitions` and frees their slots; their
    /// deliveries stay unacknowledged.
    fn cancel_partitions(&mut self, partitions: &[PartitionId]) {
        let mut cancelled = std::mem::take(&mut self.scratch);
        cancelled.extend(self.slots.held_slots().filter_map(|(slot, entry)| {
            entry
                .ticket
                .filter(|ticket| partitions.contains(&ticket.partition()))
                .map(|_| slot)
        }));
        for &slot in &cancelled {
            if self.slots.get(slot).probe {
                self.gate.probe_abandoned();
            }
            self.slots.cancel(slot);
            self.report.released_on_revoke += 1;
            self.free_slot(slot);
        }
        cancelled.clear();
        self.scratch = cancelled;
    }

    /// Ends a revocation: its partitions leave the run, and the source learns
    /// what was committed (nothing unless `committed`: the final commit was
    /// confirmed).
    pub(super) fn complete_revocation(&mut self, pending: PendingRevocation, committed: bool) {
        let mut outcome = RevocationOutcome::default();
        for &id in &pending.partitions {
            let Some(partition) = self.partitions.engine().key(id).cloned() else {
                continue;
            };
            let unfinished = self.partitions.engine().uncommitted(id);
            outcome.partitions.push(RevokedPartition {
                committed: if committed {
                    self.partitions.engine().watermark(id)
                } else {
                    None
                },
                partition: partition.clone(),
                unfinished,
            });
            self.partitions.revoke(id);
            if let Some(observer) = &self.settings.observer {
                observer.on_revoked(&partition);
            }
        }
        tracing::info!(partitions = ?pending.revocation.partitions(), committed, "revocation complete");
        pending.revocation.complete(outcome);
    }

    /// Ends the draining of a revoked partition that is assigned to this
    /// consumer again before its revocation completed: the broker stopped
    /// waiting for it (a rebalance timeout) and handed it back, perhaps
    /// through a member that left since.
    ///
    /// The new assignment starts over from the committed position, so the old
    /// one ends here: its handlers still running are cancelled, as the
    /// revoke timeout would have done (the new assignment delivers their
    /// messages again, in order, and a message never runs twice at once in
    /// one consumer), the pending revocation goes on without the partition,
    /// and the old assignment's work still queued for the acker is dropped.
    /// Left in the revocation, the partition would be cancelled, committed
    /// and revoked under the new assignment when the revocation completes,
    /// and the broker, whose cursor moved on, would never deliver the
    /// cancelled messages again; left in the queue, the old watermark would
    /// be committed past the new assignment's deliveries, and the new
    /// assignment's first commit would move the position back.
    pub(super) fn take_back(&mut self, id: PartitionId) {
        tracing::info!(
            partition = ?self.partitions.engine().key(id),
            "a partition being revoked is assigned again: its old assignment ends now"
        );
        self.cancel_partitions(&[id]);
        for pending in &mut self.revocations {
            pending.partitions.retain(|&revoked| revoked != id);
        }
        // Batches of the old assignment may still wait for the acker: they
        // must not commit it now that the new one redelivers from the
        // broker's committed position.
        if let Some(partition) = self.partitions.engine().key(id) {
            self.acks.fence(partition.clone());
        }
    }
}
