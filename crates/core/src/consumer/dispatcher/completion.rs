//! Completion: a handler's outcome goes to the commit engine (or back to the
//! broker, or to be dispatched again), the backoff gate hears of it, and the
//! slot and lane go to the next delivery.

use tokio::time::Instant;
use tower::Service;

use super::{Dispatcher, Stop};
use crate::commit_engine::Ticket;
use crate::consumer::gate::{GateState, Signal};
use crate::consumer::slots::{SlotId, SlotState};
use crate::error::{ErrorClass, HandlerError, chain_for_log};
use crate::message::Message;
use crate::outcome::Outcome;

impl<H> Dispatcher<H>
where
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    /// Records the outcome of the handler in `slot` and tells the backoff gate
    /// what it says.
    pub(super) fn finish<E: Into<HandlerError>>(&mut self, slot: SlotId, output: Result<(), E>) {
        let entry = self.slots.get(slot);
        let probe = entry.probe;
        let Some(ticket) = entry.ticket else {
            self.release(slot);
            return;
        };
        let signal = match output {
            Ok(()) => {
                self.report.succeeded += 1;
                // Its turn, if any, is confirmed: `free_slot` ends it
                // without touching the later ones.
                self.partitions.complete(ticket);
                self.release(slot);
                Signal::Success
            }
            Err(error) => self.fail(slot, ticket, error.into()),
        };
        // A success while the gate is open changes nothing: skip the clock
        // read on the path every message takes.
        if signal == Signal::Success && self.gate.state() == GateState::Normal {
            return;
        }
        self.gate.record(signal, probe, Instant::now());
    }

    /// Handles a failure by its class; returns what it says to the backoff
    /// gate.
    fn fail(&mut self, slot: SlotId, ticket: Ticket, error: HandlerError) -> Signal {
        match error.class() {
            ErrorClass::Ignore => {
                // Counted as the layer that settled it says, whichever
                // layer it was.
                let count = match error.outcome() {
                    Some(Outcome::Succeeded) => &mut self.report.succeeded,
                    Some(Outcome::DeadLettered) => &mut self.report.dead_lettered,
                    Some(Outcome::Parked) => &mut self.report.parked,
                    Some(Outcome::Discarded) => &mut self.report.discarded,
                    Some(Outcome::Ignored) | None => &mut self.report.ignored,
                };
                *count += 1;
                self.complete(slot, ticket);
                self.release(slot);
                Signal::Neutral
            }
            ErrorClass::Permanent => {
                self.report.discarded += 1;
                tracing::error!(
                    partition = ?self.partitions.engine().key(ticket.partition()),
                    position = ?self.slots.get(slot).position,
                    error = %chain_for_log(&error),
                    "permanent failure with no dead-letter layer: the message is acknowledged and dropped"
                );
                self.complete(slot, ticket);
                self.release(slot);
                Signal::Neutral
            }
            ErrorClass::Interrupted
                if self.stop.is_none_or(|stop| stop == Stop::Exhausted)
                    && !self.partitions.is_revoking(ticket.partition()) =>
            {
                // Nothing is stopping: released unfinished, it would hold the
                // partition's watermark for good (and, past
                // `max_uncommitted`, pause fetching). It is retried like any
                // retryable failure, after the consumer backoff, so a
                // handler that keeps answering this way cannot spin.
                tracing::warn!(
                    partition = ?self.partitions.engine().key(ticket.partition()),
                    position = ?self.slots.get(slot).position,
                    error = %chain_for_log(&error),
                    "a handler was interrupted although the consumer is not stopping; retrying it"
                );
                self.fail(slot, ticket, error.reclassify(ErrorClass::Retryable))
            }
            ErrorClass::Interrupted => {
                // Not completed: the watermark stays before it and the broker
                // delivers it again. Its lane moves on, as for any outcome.
                self.report.interrupted += 1;
                self.release(slot);
                Signal::Neutral
            }
            ErrorClass::Retryable => {
                let asks_later = error.retry_after();
                let later = asks_later.filter(|_| self.delayed_requeue);
                // A failure that asks for later but cannot be handed back
                // with a delay is retried at once: the consumer backoff is
                // what keeps that from spinning.
                let signal = if error.affects_backoff() || (asks_later.is_some() && later.is_none())
                {
                    Signal::Failure
                } else {
                    Signal::Neutral
                };
                let revoking = self.partitions.is_revoking(ticket.partition());
                if let Some(delay) = later {
                    self.report.parked += 1;
                    self.partitions.requeue_after(ticket, delay);
                    self.release(slot);
                } else if self.requeue {
                    self.report.requeued += 1;
                    self.partitions.requeue(ticket);
                    self.release(slot);
                } else if matches!(self.stop, Some(Stop::Graceful { .. })) || revoking {
                    // No time to try again: leave it unacknowledged.
                    self.release(slot);
                } else {
                    // The broker cannot take it back: dispatch it again, in
                    // its lane, after the consumer-level backoff.
                    self.report.redispatched += 1;
                    tracing::debug!(error = %chain_for_log(&error), "retryable failure: dispatching the message again");
                    let entry = self.slots.get_mut(slot);
                    entry.probe = false;
                    if let Some(message) = entry.message.as_mut() {
                        let attempt = message.metadata().attempt().saturating_add(1);
                        message.metadata_mut().set_attempt(attempt);
                    }
                    entry.state = SlotState::Ready;
                    if self.lanes.released_early(slot) {
                        self.redispatch_in_turn(slot);
                    } else {
                        self.hold_lane(slot);
                        self.ready.push_back(slot);
                    }
                }
                signal
            }
        }
    }

    /// Records in the commit engine that `slot`'s delivery is done, and
    /// ends its key turn (if it took one) as completed.
    #[inline]
    fn complete(&mut self, slot: SlotId, ticket: Ticket) {
        self.partitions.complete(ticket);
        if self.turns.is_live(slot) {
            self.turns.end(slot, true);
        }
    }

    /// Queues a failed delivery that had handed its lane on (its outputs
    /// were sent) to be dispatched again, ahead of any later delivery of its
    /// key that waits to be: their attempts wait for it to send, and the
    /// backoff probe must not be one of them.
    #[cold]
    #[inline(never)]
    fn redispatch_in_turn(&mut self, slot: SlotId) {
        let mut later = std::mem::take(&mut self.released);
        self.turns.later(slot, &mut later);
        match self.ready.iter().position(|queued| later.contains(queued)) {
            Some(index) => self.ready.insert(index, slot),
            None => self.ready.push_back(slot),
        }
        later.clear();
        self.released = later;
    }

    /// Frees a delivery's slot and hands its lane to the next one. The
    /// delivery is acknowledged only if its ticket was completed before.
    pub(super) fn release(&mut self, slot: SlotId) {
        if let Some(next) = self.lanes.release(slot) {
            self.slots.get_mut(next).state = SlotState::Ready;
            self.ready.push_back(next);
        }
        self.free_slot(slot);
    }

    /// Frees a slot without touching its lane (the lane was dropped, or the
    /// run is over). Its delivery stays unacknowledged unless completed.
    pub(super) fn free_slot(&mut self, slot: SlotId) {
        let entry = self.slots.get(slot);
        if entry.probe && entry.state != SlotState::Running {
            self.gate.probe_abandoned();
        }
        if let Some(ticket) = entry.ticket {
            self.partitions.slot_freed(ticket.partition());
        }
        self.bytes.give_back(entry.bytes);
        if self.turns.any_live() {
            self.end_turn(slot);
        }
        self.slots.release(slot);
    }

    /// Ends the key turn of `slot`'s delivery, if it took one and it is not
    /// ended yet: it succeeded (its turn is confirmed), or it was not
    /// completed (handed back, released, cancelled; `complete` ended the
    /// others), which the later deliveries of its key hear of.
    #[cold]
    #[inline(never)]
    fn end_turn(&mut self, slot: SlotId) {
        if self.turns.is_live(slot) {
            self.turns.end(slot, false);
        }
    }
}
