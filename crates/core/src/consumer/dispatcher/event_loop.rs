//! The loop of a run: fetch while the budget has room, and between fetches
//! poll everything else (handlers, the commit tick, acknowledgements,
//! revocations, the timer) in one pass, until the source has an event, the
//! run has something to react to, or it is over.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use tokio::time::Instant;
use tower::Service;

use super::fetch::Plan;
use super::{Dispatcher, Failure, Stop};
use crate::consumer::slots::WakeFlag;
use crate::deadline;
use crate::error::HandlerError;
use crate::message::Message;
use crate::shutdown_scope;
use crate::source::{Source, SourceError, SourceEvent};

/// The fetch of a pass that asks the source nothing (`Plan::Hold`).
type NoFetch<'a> = Pin<&'a mut std::future::Pending<Result<SourceEvent, SourceError>>>;

/// Why the loop woke up.
enum Wake<E> {
    Fetched(E),
    Shutdown,
    /// The source may be asked (again, for more).
    Budget,
    Done,
}

/// The shutdown signal, polled only once it woke the run (and once at the
/// start, to be woken at all) instead of on every pass: the future of a
/// `CancellationToken` takes the token tree's mutex each time it is polled.
pub(super) struct ShutdownSignal {
    signal: Pin<Box<dyn Future<Output = ()> + Send>>,
    flag: Arc<WakeFlag>,
    /// Sets `flag` and wakes the task running the consumer, whichever it is.
    waker: Waker,
}

impl ShutdownSignal {
    fn poll(&mut self) -> Poll<()> {
        if !self.flag.take() {
            return Poll::Pending;
        }
        // Unconstrained: a signal made of tokio primitives (a oneshot
        // receiver) polled once the task's cooperative budget is spent
        // answers `Pending` without registering its waker, and the flag
        // would never be set again.
        let mut signal = tokio::task::unconstrained(self.signal.as_mut());
        Pin::new(&mut signal).poll(&mut Context::from_waker(&self.waker))
    }
}

impl<H> Dispatcher<H>
where
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    /// Fetches and dispatches until the run is over.
    pub(super) async fn drive<S: Source>(
        &mut self,
        source: &mut S,
        shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
    ) -> Option<Failure> {
        let (flag, waker) = self.slots.flag_waker();
        let mut shutdown = ShutdownSignal {
            signal: shutdown,
            flag,
            waker,
        };
        let mut buffer: Vec<Message> = Vec::with_capacity(self.settings.fetch_batch);
        self.settings.control.attach(self.slots.runtime_waker());
        loop {
            if !buffer.is_empty() {
                // Leaves it empty: what is not admitted waits for room.
                self.admit_all(&mut buffer);
            }
            if self.settings.control.due() {
                self.apply_control();
            }
            if self.partitions.pauses_due() {
                self.hand_pauses_to(source);
            }
            let plan = self.fetch_plan();
            let wake = match plan.max() {
                Some(max) => {
                    let mut fetch = pin!(source.next(&mut buffer, max));
                    poll_fn(|cx| self.poll_until(cx, Some(fetch.as_mut()), plan, &mut shutdown))
                        .await
                }
                None => {
                    poll_fn(|cx| self.poll_until(cx, None::<NoFetch<'_>>, plan, &mut shutdown))
                        .await
                }
            };
            match wake {
                Wake::Fetched(Ok(event)) => {
                    self.fetch_failures = 0;
                    match event {
                        SourceEvent::Delivered => self.admit_all(&mut buffer),
                        SourceEvent::Assigned(partitions) => {
                            for partition in partitions {
                                self.assign(partition);
                            }
                        }
                        SourceEvent::Revoked(revocation) => self.begin_revoke(revocation),
                        SourceEvent::Exhausted => {
                            if self.stop.is_none() {
                                self.stop = Some(Stop::Exhausted);
                            }
                        }
                    }
                    // A source that is always ready would otherwise keep
                    // this task from yielding on a current-thread runtime.
                    tokio::task::consume_budget().await;
                }
                Wake::Fetched(Err(error)) => self.source_failed(error),
                Wake::Shutdown => self.begin_stop(None),
                Wake::Budget => {}
                Wake::Done => break,
            }
            if std::mem::take(&mut self.yield_to_acks) {
                // The ack loop runs when this task yields: a busy source
                // would otherwise keep it waiting for the whole budget.
                tokio::task::yield_now().await;
            }
        }
        self.settings.control.detach();
        // Deliveries fetched but never admitted stay unacknowledged.
        drop(buffer);
        self.failure.take()
    }

    /// Polls everything but the source until the source has an event, the
    /// run should react to something, or it is over. `fetch` is the
    /// source's `next`, started under `asked` (none under `Plan::Hold`).
    fn poll_until<F, E>(
        &mut self,
        cx: &mut Context<'_>,
        fetch: Option<Pin<&mut F>>,
        asked: Plan,
        shutdown: &mut ShutdownSignal,
    ) -> Poll<Wake<E>>
    where
        F: Future<Output = E>,
    {
        self.slots.ready_set().register(cx.waker());
        let (token, turns) = (self.token.clone(), self.turns.clone());
        shutdown_scope::with_shutdown(&token, || {
            turns.scope(|| self.poll_inner(cx, fetch, asked, shutdown))
        })
    }

    fn poll_inner<F, E>(
        &mut self,
        cx: &mut Context<'_>,
        fetch: Option<Pin<&mut F>>,
        asked: Plan,
        shutdown: &mut ShutdownSignal,
    ) -> Poll<Wake<E>>
    where
        F: Future<Output = E>,
    {
        if matches!(self.stop, None | Some(Stop::Exhausted)) && shutdown.poll().is_ready() {
            return Poll::Ready(Wake::Shutdown);
        }
        self.poll_handlers();
        self.pump();
        // The commit tick is read from the clock on every pass, not from a
        // timer alone: under a saturated backlog this task seldom parks, and
        // tokio fires a timer only when it turns its time driver (when the
        // runtime parks, or every few dozen task polls), so a timer-driven
        // tick came a whole cooperative budget of work late, or later. The
        // timer (`arm_timer`) still wakes an idle run or a hung handler's
        // for it (the observer's snapshots, a commit resent after a failure).
        let now = Instant::now();
        if now >= self.next_tick_at {
            self.next_tick_at = deadline::after(now, self.settings.commit_interval);
            self.on_tick();
        }
        if self.probe.is_some() {
            self.expire_probe(now);
        }
        if self.restore_failed() {
            self.resend_on_tick = true;
        }
        // Revocations first: one whose final commit just came back is
        // completed (its partitions leave the engine) before the next batch
        // is taken, so no batch sent after a revocation's final one carries
        // work of the revoked assignment (work restored from a failed batch,
        // for instance), which the broker would accept if the partition came
        // back to this consumer meanwhile.
        self.poll_revocations(cx);
        self.flush_if_due();
        if self.is_drained() {
            return Poll::Ready(Wake::Done);
        }
        self.arm_timer(now);
        if let Some(fetch) = fetch
            && let Poll::Ready(event) = fetch.poll(cx)
        {
            return Poll::Ready(Wake::Fetched(event));
        }
        // A partition left its window (or entered it): the source hears of
        // it before it is asked again. And a fetch asked for less than the
        // run may now take (assignment changes only, and slots are free
        // now; or nothing, and the retry is due) is asked again. A fetch
        // for deliveries is never asked more of: the plan is not even
        // computed then, on the path of every batch.
        if self.partitions.pauses_due()
            || self.settings.control.due()
            || (!matches!(asked, Plan::Deliveries(_)) && self.fetch_plan().asks_more_than(asked))
        {
            return Poll::Ready(Wake::Budget);
        }
        Poll::Pending
    }
}
