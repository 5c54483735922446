//! The run's one timer, armed at the earliest moment something is due (the
//! commit tick, the end of a backoff, a probe's or revocation's deadline, a
//! fetch retry, the shutdown deadline).

use std::future::Future;
use std::task::Context;

use tokio::time::Instant;
use tower::Service;

use super::{Dispatcher, Stop};
use crate::consumer::backoff::BackoffState;
use crate::error::HandlerError;
use crate::message::Message;

impl<H> Dispatcher<H>
where
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    /// Keeps one timer armed at the earliest moment something is due.
    pub(super) fn arm_timer(&mut self, cx: &mut Context<'_>) {
        let mut due: Option<Instant> = None;
        let woken_for = self.woken_for;
        let mut consider = |at: Option<Instant>| {
            if let Some(at) = at.filter(|&at| woken_for.is_none_or(|woken| at > woken)) {
                due = Some(due.map_or(at, |due| due.min(at)));
            }
        };
        if let BackoffState::BackingOff { until } = self.backoff.state()
            && !self.ready.is_empty()
        {
            consider(Some(until));
        }
        consider(Some(self.next_tick_at));
        consider(self.probe.map(|(_, deadline)| deadline));
        consider(self.fetch_retry_at);
        for pending in &self.revocations {
            if pending.reply.is_none() {
                consider(Some(pending.deadline));
            }
        }
        if let Some(Stop::Graceful { deadline }) = self.stop {
            consider(Some(deadline));
        }
        let Some(due) = due else {
            self.timer_at = None;
            return;
        };
        if self.timer_at != Some(due) {
            self.timer.as_mut().reset(due);
            self.timer_at = Some(due);
        }
        if self.timer.as_mut().poll(cx).is_ready() {
            self.timer_at = None;
            self.woken_for = Some(due);
            // Something is due now: run another pass.
            cx.waker().wake_by_ref();
        }
    }
}
