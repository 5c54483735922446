//! The run's one timer, armed at the earliest moment something is due (the
//! commit tick, the end of a backoff, a probe's or revocation's deadline, a
//! fetch retry, the shutdown deadline).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Waker};

use tokio::time::{Instant, Sleep};
use tower::Service;

use super::{Dispatcher, Stop};
use crate::consumer::gate::GateState;
use crate::error::HandlerError;
use crate::message::Message;

/// One sleep, moved to whichever due moment comes first.
pub(super) struct Timer {
    sleep: Pin<Box<Sleep>>,
    /// The moment `sleep` is set for, while it is armed.
    armed_at: Option<Instant>,
    /// Whether `sleep` was polled since it was set. It is polled with the
    /// runtime's own waker, which wakes whichever task runs the consumer
    /// now, so one poll registers it for good: polling it on every pass
    /// (about 330 instructions, several times per message for handlers
    /// that await) would learn nothing until its moment has come.
    registered: bool,
    /// The latest moment the timer woke the run for. Whatever was due by
    /// then was looked at by the pass it woke, so it never arms the timer
    /// again: a due time whose action waits on something else (a backoff
    /// that ended while the run is stopping or the handler is not ready)
    /// would otherwise wake the run in a loop.
    woken_for: Option<Instant>,
}

impl Timer {
    /// A timer that is not armed.
    pub(super) fn new() -> Self {
        Self {
            sleep: Box::pin(tokio::time::sleep_until(Instant::now())),
            armed_at: None,
            registered: false,
            woken_for: None,
        }
    }

    /// Arms the timer at the earliest of `due` it has not woken the run for
    /// yet (disarms it if there is none), and wakes the task now if that
    /// moment has come (by `now`, the pass's reading of the clock).
    /// `runtime` is the waker that wakes the task running the consumer.
    fn arm(&mut self, runtime: &Waker, now: Instant, due: impl Iterator<Item = Instant>) {
        let woken_for = self.woken_for;
        let Some(due) = due
            .filter(|&at| woken_for.is_none_or(|woken| at > woken))
            .min()
        else {
            self.armed_at = None;
            return;
        };
        if self.armed_at != Some(due) {
            self.sleep.as_mut().reset(due);
            self.armed_at = Some(due);
            self.registered = false;
        } else if self.registered && due > now {
            return;
        }
        self.registered = true;
        // Unconstrained: a sleep polled once the task's cooperative budget
        // is spent answers `Pending` without registering with the timer (it
        // only asks to be polled again), and an idle run whose sleep was
        // never registered would never tick again (no commit, no retried
        // commit after a broker outage).
        let mut sleep = tokio::task::unconstrained(self.sleep.as_mut());
        if Pin::new(&mut sleep)
            .poll(&mut Context::from_waker(runtime))
            .is_ready()
        {
            self.armed_at = None;
            self.woken_for = Some(due);
            // Something is due now: run another pass.
            runtime.wake_by_ref();
        }
    }
}

impl<H> Dispatcher<H>
where
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    /// Keeps the timer armed at the earliest moment something is due.
    pub(super) fn arm_timer(&mut self, now: Instant) {
        let backoff_ends = match self.gate.state() {
            GateState::BackingOff { until } if !self.ready.is_empty() => Some(until),
            _ => None,
        };
        let shutdown_deadline = match self.stop {
            Some(Stop::Graceful { deadline }) => Some(deadline),
            _ => None,
        };
        let revocation_deadlines = self
            .revocations
            .iter()
            .filter_map(|pending| pending.drain_deadline());
        let due = [
            backoff_ends,
            Some(self.next_tick_at),
            self.probe.map(|(_, deadline)| deadline),
            self.fetch_retry_at,
            shutdown_deadline,
        ]
        .into_iter()
        .flatten()
        .chain(revocation_deadlines);
        self.timer.arm(self.slots.runtime_waker(), now, due);
    }
}
