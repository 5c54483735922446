//! Dispatch: whether a delivery may start (the handler's readiness, the
//! backoff gate and its probe), starting it in its slot, and polling the
//! handlers that were woken.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::task::{Context, Poll};

use tokio::time::Instant;
use tower::Service;

use super::{Dispatcher, Failure, Stop};
use crate::catch_panic::Panicked;
use crate::consumer::gate::{Decision, GateState};
use crate::consumer::slots::{PanicPayload, SlotId, SlotState};
use crate::consumer::turns::set_current_slot;
use crate::deadline;
use crate::error::{HandlerError, chain_for_log};
use crate::message::Message;

impl<H> Dispatcher<H>
where
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    /// Whether a delivery may start right now without being the backoff
    /// probe (so the fast path never decides a probe).
    pub(super) fn may_start_now(&mut self) -> bool {
        if matches!(self.stop, Some(Stop::Graceful { .. })) {
            return false;
        }
        if !matches!(self.gate.state(), GateState::Normal | GateState::Disabled) {
            return false;
        }
        self.handler_ready()
    }

    /// Polls the handler service's readiness; a failed service stops the run.
    /// So does a panic: a service that panics when asked whether it can take
    /// a message cannot take any.
    fn handler_ready(&mut self) -> bool {
        let mut cx = Context::from_waker(self.slots.runtime_waker());
        let handler = &mut self.handler;
        let polled = catch_unwind(AssertUnwindSafe(|| handler.poll_ready(&mut cx)));
        let error: HandlerError = match polled {
            Ok(Poll::Ready(Ok(()))) => return true,
            Ok(Poll::Pending) => return false,
            Ok(Poll::Ready(Err(error))) => error.into(),
            Err(panic) => {
                let panic = Panicked::from_payload(&*panic);
                self.report.panicked += 1;
                tracing::error!(panic = %panic.message(), "the handler service panicked in poll_ready");
                HandlerError::panicked(panic)
            }
        };
        tracing::error!(error = %chain_for_log(&error), "the handler service failed; the consumer stops");
        self.begin_stop(Some(Failure::Handler(error)));
        false
    }

    /// The gate's decision for the next delivery, without reading the clock
    /// while the gate is open, which it is except after failures.
    fn gate_decision(&mut self) -> Decision {
        match self.gate.state() {
            GateState::Normal | GateState::Disabled => Decision::Open,
            _ => self.gate.decide(Instant::now()),
        }
    }

    /// Starts waiting deliveries while the backoff gate and the handler allow.
    pub(super) fn pump(&mut self) {
        if matches!(self.stop, Some(Stop::Graceful { .. })) {
            return;
        }
        while let Some(&slot) = self.ready.front() {
            if self.partitions.any_user_paused() && self.hold_if_paused(slot) {
                continue;
            }
            if !self.handler_ready() {
                return;
            }
            let probe = match self.gate_decision() {
                Decision::Open => false,
                Decision::Probe => {
                    let deadline = deadline::after(Instant::now(), self.settings.probe_timeout);
                    self.probe = Some((slot, deadline));
                    true
                }
                Decision::Closed(_) => return,
            };
            self.ready.pop_front();
            self.start(slot, probe);
        }
    }

    /// Ends the wait for a backoff probe that outlived the probe timeout: a
    /// hung handler must not hold every other delivery back.
    pub(super) fn expire_probe(&mut self, now: Instant) {
        let Some((slot, deadline)) = self.probe else {
            return;
        };
        let entry = self.slots.get(slot);
        let waiting = entry.probe
            && entry.state == SlotState::Running
            && self.gate.state() == (GateState::Probing { in_flight: true });
        if !waiting {
            // It finished, failed or was abandoned: its outcome was recorded.
            self.probe = None;
            return;
        }
        if now < deadline {
            return;
        }
        self.probe = None;
        self.slots.get_mut(slot).probe = false;
        self.gate.probe_timed_out(now);
        let entry = self.slots.get(slot);
        let partition = entry
            .ticket
            .and_then(|ticket| self.partitions.engine().key(ticket.partition()));
        tracing::warn!(
            partition = ?partition,
            position = ?entry.position,
            timeout = ?self.settings.probe_timeout,
            "the backoff probe is still running after the probe timeout: backing off again \
             without its outcome"
        );
        if let Some(observer) = &self.settings.observer {
            observer.on_probe_timeout();
        }
    }

    /// Starts the handler of the delivery in `slot` (as the backoff probe if
    /// `probe`), and completes it at once if it finishes on its first poll.
    pub(super) fn start(&mut self, slot: SlotId, probe: bool) {
        let keep_copy = !self.requeue;
        let entry = self.slots.get_mut(slot);
        let Some(message) = entry.message.take() else {
            self.release(slot);
            return;
        };
        entry.probe = probe;
        if keep_copy {
            entry.message = Some(message.clone());
        }
        // The runtime catches a handler's panics itself, with or without a
        // `CatchPanicLayer`: unwound through `Consumer::run`, a panic took the
        // consumer down, and the message, delivered again, took the next one.
        //
        // Called and polled with its slot current (the pass made the run's
        // turns current), so that a `PublishService` takes its key's turn.
        set_current_slot(slot);
        let (handler, slots) = (&mut self.handler, &mut self.slots);
        let started = catch_unwind(AssertUnwindSafe(|| {
            let future = handler.call(message);
            slots.start(slot, future)
        }));
        match started {
            Ok(Poll::Ready(output)) => self.finish(slot, output),
            Ok(Poll::Pending) => {
                // Its outputs may be sent already (the lane goes on now).
                self.take_released();
                self.hold_lane(slot);
            }
            Err(panic) => {
                self.slots.recover(slot);
                self.panicked(slot, &panic);
            }
        }
    }

    /// A handler panicked while called or polled: the panic becomes a
    /// retryable failure of its message, logged and counted.
    fn panicked(&mut self, slot: SlotId, panic: &PanicPayload) {
        let panic = Panicked::from_payload(&**panic);
        self.report.panicked += 1;
        let partition = self
            .slots
            .get(slot)
            .ticket
            .and_then(|ticket| self.partitions.engine().key(ticket.partition()));
        tracing::error!(
            partition = ?partition,
            position = ?self.slots.get(slot).position,
            panic = %panic.message(),
            "the handler panicked; its message fails as a retryable error"
        );
        if let (Some(observer), Some(partition)) = (&self.settings.observer, partition) {
            observer.on_panic(partition);
        }
        self.finish::<HandlerError>(slot, Err(HandlerError::panicked(panic)));
    }

    /// Makes a delivery that started on the fast path hold its lane, now that
    /// it will keep running (or run again). Its lane is free: nothing else
    /// ran in between, unless the delivery handed it on (its outputs were
    /// sent), and then it takes it no more.
    pub(super) fn hold_lane(&mut self, slot: SlotId) {
        let taken = self.lanes.acquire(slot);
        debug_assert!(taken, "a fast-path delivery's lane is free");
    }

    /// Hands on the lanes of deliveries whose outputs were sent (their
    /// turns say so): the next delivery of each key may run while they wait
    /// for their confirmations.
    #[inline]
    pub(super) fn take_released(&mut self) {
        if self.turns.any_released() {
            self.hand_lanes_on();
        }
    }

    #[cold]
    #[inline(never)]
    fn hand_lanes_on(&mut self) {
        let mut released = std::mem::take(&mut self.released);
        self.turns.take_released(&mut released);
        for slot in released.drain(..) {
            if let Some(next) = self.lanes.release_early(slot) {
                self.slots.get_mut(next).state = SlotState::Ready;
                self.ready.push_back(next);
            }
        }
        self.released = released;
    }

    /// Polls the running handlers that were woken, and completes those that
    /// finished.
    pub(super) fn poll_handlers(&mut self) {
        if self.slots.running() == 0 {
            return;
        }
        let mut finished = std::mem::take(&mut self.finished);
        self.slots.poll_woken(&mut finished);
        for (slot, output) in finished.drain(..) {
            match output {
                Ok(output) => self.finish(slot, output),
                Err(panic) => self.panicked(slot, &panic),
            }
        }
        self.finished = finished;
        self.take_released();
    }
}
