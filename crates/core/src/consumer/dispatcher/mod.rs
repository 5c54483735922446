//! One run of a consumer: the loop that fetches, admits, dispatches,
//! completes and commits.
//!
//! Everything happens in the task that awaits the run. The source's `next`
//! future is polled side by side with the running handlers, the commit tick
//! and the timers, so a slow fetch never delays a completion and a slow
//! handler never delays a fetch. Handlers that finish on their first poll
//! (most do) are completed on the spot, without a wake-up.

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tower::Service;

use super::ack_loop::{AckQueue, AckRequest, ack_loop};
use super::backoff::{BackoffState, ConsumerBackoff, Gate, Signal};
use super::lanes::{LaneId, Lanes};
use super::report::{RunError, RunReport, SourceClose, Unfinished};
use super::shutdown::Shutdown;
use super::slots::{Caught, PanicPayload, SlotId, SlotState, Slots};
use super::{Ordering, Settings};
use crate::acker::{AckBatch, AckError, Acker};
use crate::catch_panic::Panicked;
use crate::commit_engine::{CommitEngine, PartitionId, Ticket};
use crate::deadline;
use crate::error::{ErrorClass, HandlerError};
use crate::lifecycle;
use crate::message::{Message, Position, SourceName};
use crate::observer::PartitionSnapshot;
use crate::source::{
    Revocation, RevocationOutcome, RevokedPartition, Source, SourceError, SourceEvent,
};

/// Runs a consumer to the end. See [`Consumer::run`](super::Consumer::run).
pub(crate) async fn run<S, A, H>(
    mut source: S,
    acker: A,
    handler: H,
    settings: Settings,
    shutdown: Shutdown,
) -> Result<RunReport, RunError>
where
    S: Source,
    A: Acker,
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    let started = Instant::now();
    let mode = acker.mode();
    let requeue = acker.supports_requeue();
    let slots = Slots::new(settings.max_in_flight);
    let ack_failures = Arc::new(AtomicUsize::new(0));
    let (acks, drain_acks) = ack_loop(
        acker,
        settings.observer.clone(),
        slots.runtime_waker().clone(),
        ack_failures.clone(),
    );
    let dispatch = async move {
        let mut dispatcher = Dispatcher::new(
            handler,
            slots,
            settings,
            CommitEngine::new(mode),
            requeue,
            acks,
        );
        let stop = dispatcher.drive(&mut source, shutdown.into_future()).await;
        // Every step from here on is bounded, whatever the broker does.
        let until = dispatcher.final_steps_deadline();
        let mut report = dispatcher.wind_down(until).await;
        drop(dispatcher);
        report.close = match tokio::time::timeout_at(until, source.close()).await {
            Ok(Ok(())) => SourceClose::Closed,
            Ok(Err(error)) => {
                tracing::warn!(%error, "closing the source failed");
                SourceClose::Failed
            }
            Err(_) => {
                tracing::error!(
                    "closing the source did not finish within the shutdown deadline; \
                     dropping it"
                );
                SourceClose::TimedOut
            }
        };
        report.ack_failures = ack_failures.load(AtomicOrdering::Acquire) as u64;
        report.elapsed = started.elapsed();
        let result = match stop {
            None => Ok(report),
            Some(Failure::Source(error)) => Err(RunError::Source {
                error,
                report: Box::new(report),
            }),
            Some(Failure::Handler(error)) => Err(RunError::HandlerUnavailable {
                error,
                report: Box::new(report),
            }),
        };
        (result, until)
    };
    // The ack loop runs beside the dispatcher until the run is over. The run
    // already waited (bounded) for its final commit, so by then the loop has
    // nothing left to do, unless an acker hangs: it gets what is left of the
    // final steps' time, and is then dropped rather than holding the run
    // open forever.
    //
    // Unconstrained by tokio's cooperative budget: under a backlog the
    // dispatcher yields only once it spent the task's budget, and a receive
    // polled after it with that exhausted budget is refused every time, so
    // no commit went out until the backlog was gone (issue 12, item 21).
    let mut drain_acks = pin!(tokio::task::unconstrained(drain_acks));
    let mut dispatch = pin!(dispatch);
    let mut drained = false;
    let (result, until) = loop {
        tokio::select! {
            biased;
            ended = &mut dispatch => break ended,
            () = &mut drain_acks, if !drained => drained = true,
        }
    };
    if !drained && tokio::time::timeout_at(until, drain_acks).await.is_err() {
        tracing::error!("the acker did not finish its last acknowledgement; dropping it");
    }
    result
}

/// The least time the final commit and the source's close get when the
/// handlers used the whole shutdown deadline (if the deadline itself is not
/// shorter).
const FINAL_STEPS_FLOOR: Duration = Duration::from_secs(5);

/// Why a run stopped early.
enum Failure {
    Source(SourceError),
    Handler(HandlerError),
}

/// How the run is ending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// Shutdown (or a failure): running handlers get until `deadline`;
    /// nothing new starts.
    Graceful { deadline: Instant },
    /// The source has nothing more: finish everything held, then stop.
    Exhausted,
}

/// Why the loop woke up.
enum Wake<E> {
    Fetched(E),
    Shutdown,
    /// The source may be asked (again, for more).
    Budget,
    Done,
}

/// Per-partition state of the runtime (the commit engine keeps the rest).
#[derive(Clone, Debug, Default)]
struct PartitionFlags {
    /// Slots held by deliveries of this partition.
    held: u32,
    revoking: bool,
    over_window: bool,
    /// The oldest unfinished position and since when it has been the oldest.
    oldest: Option<(Position, Instant)>,
}

struct PendingRevocation {
    revocation: Revocation,
    partitions: Vec<PartitionId>,
    deadline: Instant,
    reply: Option<oneshot::Receiver<Result<(), AckError>>>,
}

/// What a handler future resolves to.
type HandlerOutput<H> = Result<(), <H as Service<Message>>::Error>;

/// The state of one run.
struct Dispatcher<H: Service<Message>> {
    handler: H,
    slots: Slots<H::Future>,
    lanes: Lanes,
    engine: CommitEngine,
    settings: Settings,
    keep_copy: bool,
    requeue: bool,
    backoff: ConsumerBackoff,
    /// The backoff probe's slot and its deadline, while it runs.
    probe: Option<(SlotId, Instant)>,
    /// Deliveries that hold their lane and wait to start, oldest first.
    ready: VecDeque<SlotId>,
    /// Handler outputs collected from woken slots.
    finished: Vec<(SlotId, Caught<HandlerOutput<H>>)>,
    partitions: Vec<PartitionFlags>,
    over_window: usize,
    /// The partition of the previous delivery: most batches come from one
    /// partition, so this saves a map lookup per message.
    last_partition: Option<(SourceName, u32, PartitionId)>,
    acks: AckQueue,
    flush_due: bool,
    /// A commit tick queued a batch, or found one still queued: yield to the
    /// ack loop after this pass, so that the batch reaches the acker within
    /// the commit interval even while the source is always ready.
    yield_to_acks: bool,
    /// An acknowledgement failed and its work was put back: until the next
    /// commit tick only the tick sends a batch. Sending again at once would
    /// loop as fast as the broker refuses (a partition it already moved
    /// away, a broker that is down).
    resend_on_tick: bool,
    /// When the next commit tick is due.
    next_tick_at: Instant,
    timer: Pin<Box<Sleep>>,
    timer_at: Option<Instant>,
    /// The latest moment the timer woke the run for. Whatever was due by
    /// then was looked at by the pass it woke, so it never arms the timer
    /// again: a due time whose action waits on something else (a backoff
    /// that ended while the run is stopping or the handler is not ready)
    /// would otherwise wake the run in a loop.
    woken_for: Option<Instant>,
    fetch_retry_at: Option<Instant>,
    fetch_failures: u32,
    revocations: Vec<PendingRevocation>,
    stop: Option<Stop>,
    failure: Option<Failure>,
    token: CancellationToken,
    report: RunReport,
    scratch: Vec<SlotId>,
}

impl<H> Dispatcher<H>
where
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    fn new(
        handler: H,
        slots: Slots<H::Future>,
        settings: Settings,
        engine: CommitEngine,
        requeue: bool,
        acks: AckQueue,
    ) -> Self {
        let capacity = slots.capacity();
        Self {
            handler,
            slots,
            lanes: Lanes::with_capacity(capacity),
            engine,
            keep_copy: !requeue,
            requeue,
            backoff: ConsumerBackoff::new(settings.backoff.clone()),
            probe: None,
            ready: VecDeque::with_capacity(capacity),
            finished: Vec::with_capacity(capacity),
            partitions: Vec::new(),
            over_window: 0,
            last_partition: None,
            acks,
            flush_due: false,
            yield_to_acks: false,
            resend_on_tick: false,
            next_tick_at: Instant::now(),
            timer: Box::pin(tokio::time::sleep_until(Instant::now())),
            timer_at: None,
            woken_for: None,
            fetch_retry_at: None,
            fetch_failures: 0,
            revocations: Vec::new(),
            stop: None,
            failure: None,
            token: CancellationToken::new(),
            report: RunReport::default(),
            scratch: Vec::new(),
            settings,
        }
    }

    /// Fetches and dispatches until the run is over.
    async fn drive<S: Source>(
        &mut self,
        source: &mut S,
        mut shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
    ) -> Option<Failure> {
        let mut buffer: Vec<Message> = Vec::with_capacity(self.settings.fetch_batch);
        loop {
            if !buffer.is_empty() {
                self.admit_all(&mut buffer);
            }
            let wake = match self.fetch_plan(buffer.len()) {
                Some(max) => {
                    let mut fetch = pin!(source.next(&mut buffer, max));
                    poll_fn(|cx| {
                        self.poll_until(cx, Some((fetch.as_mut(), max)), shutdown.as_mut())
                    })
                    .await
                }
                None => {
                    poll_fn(|cx| {
                        self.poll_until(
                            cx,
                            None::<(
                                Pin<&mut std::future::Pending<Result<SourceEvent, SourceError>>>,
                                usize,
                            )>,
                            shutdown.as_mut(),
                        )
                    })
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
        // Deliveries fetched but never admitted stay unacknowledged.
        drop(buffer);
        self.failure.take()
    }

    /// Polls everything but the source until the source has an event, the
    /// run should react to something, or it is over.
    fn poll_until<F, E>(
        &mut self,
        cx: &mut Context<'_>,
        fetch: Option<(Pin<&mut F>, usize)>,
        shutdown: Pin<&mut (dyn Future<Output = ()> + Send)>,
    ) -> Poll<Wake<E>>
    where
        F: Future<Output = E>,
    {
        self.slots.ready_set().register(cx.waker());
        let token = self.token.clone();
        lifecycle::with_shutdown(&token, || self.poll_inner(cx, fetch, shutdown))
    }

    fn poll_inner<F, E>(
        &mut self,
        cx: &mut Context<'_>,
        fetch: Option<(Pin<&mut F>, usize)>,
        shutdown: Pin<&mut (dyn Future<Output = ()> + Send)>,
    ) -> Poll<Wake<E>>
    where
        F: Future<Output = E>,
    {
        if matches!(self.stop, None | Some(Stop::Exhausted)) && shutdown.poll(cx).is_ready() {
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
        while let Some(failed) = self.acks.take_failed() {
            for ack in failed.partitions {
                self.engine.restore(ack);
            }
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
        if self.failure.is_none() && self.stop.is_some() && self.is_drained() {
            return Poll::Ready(Wake::Done);
        }
        if self.failure.is_some() && self.stop.is_some() && self.is_drained() {
            return Poll::Ready(Wake::Done);
        }
        self.arm_timer(cx);
        match fetch {
            Some((fetch, max)) => {
                if let Poll::Ready(event) = fetch.poll(cx) {
                    return Poll::Ready(Wake::Fetched(event));
                }
                // Asked for assignment changes only, and slots are free now:
                // ask again, for deliveries.
                if max == 0 && self.fetch_plan(0).is_some_and(|max| max > 0) {
                    return Poll::Ready(Wake::Budget);
                }
            }
            None => {
                if self.fetch_plan(0).is_some() {
                    return Poll::Ready(Wake::Budget);
                }
            }
        }
        Poll::Pending
    }

    /// How the source may be asked now: `None`, not at all (stopping, or
    /// waiting to retry after an error); `Some(0)`, for assignment changes
    /// only (no free slot: a revocation must still get through, or a full
    /// budget of stuck handlers would hold a rebalance forever); `Some(n)`,
    /// for up to `n` deliveries.
    fn fetch_plan(&mut self, buffered: usize) -> Option<usize> {
        if self.stop.is_some() || buffered > 0 {
            return None;
        }
        if let Some(at) = self.fetch_retry_at {
            if Instant::now() < at {
                return None;
            }
            self.fetch_retry_at = None;
        }
        if self.over_window > 0 {
            return Some(0);
        }
        Some(self.slots.free_count().min(self.settings.fetch_batch))
    }

    // ---- admission -------------------------------------------------------

    fn admit_all(&mut self, buffer: &mut Vec<Message>) {
        let token = self.token.clone();
        lifecycle::with_shutdown(&token, || {
            let admitted = buffer.len().min(self.slots.free_count());
            for message in buffer.drain(..admitted) {
                self.admit(message);
            }
            self.pump();
        });
    }

    fn admit(&mut self, message: Message) {
        let partition = self.partition_of(&message);
        let flags = &mut self.partitions[partition.index()];
        if flags.revoking {
            // Fetched after the revocation began: it belongs to the next
            // owner, who will receive it; acknowledging nothing is correct.
            self.report.released_on_revoke += 1;
            return;
        }
        let position = message.metadata().position();
        let Some(ticket) = self.engine.admit(partition, position) else {
            return;
        };
        let Some(slot) = self.slots.acquire() else {
            // `admit_all` admits no more than the free slots; keep the
            // engine consistent anyway.
            tracing::error!("no free slot for an admitted delivery; it stays unacknowledged");
            return;
        };
        let flags = &mut self.partitions[partition.index()];
        flags.held += 1;
        if !flags.over_window && self.engine.uncommitted(partition) >= self.settings.max_uncommitted
        {
            flags.over_window = true;
            self.over_window += 1;
            tracing::warn!(
                partition = %message.metadata().partition_key(),
                max_uncommitted = self.settings.max_uncommitted,
                "a message holds this partition's watermark; fetching pauses until it finishes"
            );
        }
        let lane = match self.settings.ordering {
            Ordering::Unordered => None,
            Ordering::Partition => Some(LaneId::Partition(partition)),
            Ordering::Key => message.key().map(|key| self.lanes.key_lane(partition, key)),
        };
        let entry = self.slots.get_mut(slot);
        entry.ticket = Some(ticket);
        entry.position = Some(position);
        entry.message = Some(message);
        entry.lane = lane;
        entry.state = SlotState::Ready;
        // The fast path: nothing waits before it and its lane is free, so it
        // starts now. It takes its lane only if its handler does not finish
        // on the first poll (see `start`), which most do not need.
        let lane_free = lane.is_none_or(|lane| !self.lanes.is_busy(lane));
        if lane_free && self.ready.is_empty() && self.may_start_now() {
            self.start(slot, false);
            return;
        }
        if let Some(lane) = lane {
            if !self.lanes.acquire(lane, slot, &mut self.slots) {
                return;
            }
            self.slots.get_mut(slot).holds_lane = true;
        }
        self.ready.push_back(slot);
    }

    /// Whether a delivery may start right now without being the backoff
    /// probe (so the fast path never decides a probe).
    fn may_start_now(&mut self) -> bool {
        if matches!(self.stop, Some(Stop::Graceful { .. })) {
            return false;
        }
        if !matches!(
            self.backoff.state(),
            BackoffState::Normal | BackoffState::Disabled
        ) {
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
                HandlerError::retryable(panic)
            }
        };
        tracing::error!(%error, "the handler service failed; the consumer stops");
        self.begin_stop(Some(Failure::Handler(error)));
        false
    }

    fn partition_of(&mut self, message: &Message) -> PartitionId {
        let metadata = message.metadata();
        if let Some((source, partition, id)) = &self.last_partition
            && *partition == metadata.partition()
            && (Arc::ptr_eq(source, metadata.source()) || **source == **metadata.source())
        {
            return *id;
        }
        let key = metadata.partition_key();
        let id = match self.engine.lookup(&key) {
            Some(id) => id,
            None => self.assign(key),
        };
        self.last_partition = Some((metadata.source().clone(), metadata.partition(), id));
        id
    }

    fn assign(&mut self, partition: crate::message::PartitionKey) -> PartitionId {
        if let Some(id) = self.engine.lookup(&partition)
            && self.partitions[id.index()].revoking
        {
            self.take_back(id);
        }
        let id = self.engine.assign(partition);
        if self.partitions.len() <= id.index() {
            self.partitions
                .resize(id.index() + 1, PartitionFlags::default());
        }
        let flags = &mut self.partitions[id.index()];
        if flags.over_window {
            self.over_window -= 1;
        }
        // Deliveries of an earlier assignment that was not revoked may still
        // run; their tickets are stale now, and `held` keeps counting them
        // until they finish.
        let held = flags.held;
        *flags = PartitionFlags {
            held,
            ..PartitionFlags::default()
        };
        self.last_partition = None;
        id
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
    fn take_back(&mut self, id: PartitionId) {
        tracing::info!(
            partition = ?self.engine.key(id),
            "a partition being revoked is assigned again: its old assignment ends now"
        );
        self.cancel_partitions(&[id]);
        for pending in &mut self.revocations {
            pending.partitions.retain(|&revoked| revoked != id);
        }
        // Batches of the old assignment may still wait for the acker: they
        // must not commit it now that the new one redelivers from the
        // broker's committed position.
        if let Some(partition) = self.engine.key(id) {
            self.acks.fence(partition.clone());
        }
    }

    // ---- dispatch --------------------------------------------------------

    fn gate(&mut self) -> Gate {
        match self.backoff.state() {
            BackoffState::Normal | BackoffState::Disabled => Gate::Open,
            _ => self.backoff.gate(Instant::now()),
        }
    }

    /// Starts waiting deliveries while the backoff gate and the handler allow.
    fn pump(&mut self) {
        if matches!(self.stop, Some(Stop::Graceful { .. })) {
            return;
        }
        while let Some(&slot) = self.ready.front() {
            if !self.handler_ready() {
                return;
            }
            let probe = match self.gate() {
                Gate::Open => false,
                Gate::Probe => {
                    let deadline = deadline::after(Instant::now(), self.settings.probe_timeout);
                    self.probe = Some((slot, deadline));
                    true
                }
                Gate::Closed(_) => return,
            };
            self.ready.pop_front();
            self.start(slot, probe);
        }
    }

    /// Ends the wait for a backoff probe that outlived the probe timeout: a
    /// hung handler must not hold every other delivery back.
    fn expire_probe(&mut self, now: Instant) {
        let Some((slot, deadline)) = self.probe else {
            return;
        };
        let entry = self.slots.get(slot);
        let waiting = entry.probe
            && entry.state == SlotState::Running
            && self.backoff.state() == (BackoffState::Probing { in_flight: true });
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
        self.backoff.probe_timed_out(now);
        let entry = self.slots.get(slot);
        tracing::warn!(
            partition = ?entry.ticket.and_then(|ticket| self.engine.key(ticket.partition())),
            position = ?entry.position,
            timeout = ?self.settings.probe_timeout,
            "the backoff probe is still running after the probe timeout: backing off again \
             without its outcome"
        );
        if let Some(observer) = &self.settings.observer {
            observer.on_probe_timeout();
        }
    }

    fn start(&mut self, slot: SlotId, probe: bool) {
        let keep_copy = self.keep_copy;
        let entry = self.slots.get_mut(slot);
        let Some(message) = entry.message.take() else {
            self.release(slot);
            return;
        };
        entry.probe = probe;
        let message = if keep_copy {
            entry.message = Some(message.clone());
            message
        } else {
            message
        };
        // The runtime catches a handler's panics itself, with or without a
        // `CatchPanicLayer`: unwound through `Consumer::run`, a panic took the
        // consumer down, and the message, delivered again, took the next one.
        let (handler, slots) = (&mut self.handler, &mut self.slots);
        let started = catch_unwind(AssertUnwindSafe(|| {
            let future = handler.call(message);
            slots.start(slot, future)
        }));
        match started {
            Ok(Poll::Ready(output)) => self.finish(slot, output),
            Ok(Poll::Pending) => self.hold_lane(slot),
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
            .and_then(|ticket| self.engine.key(ticket.partition()));
        tracing::error!(
            partition = ?partition,
            position = ?self.slots.get(slot).position,
            panic = %panic.message(),
            "the handler panicked; its message fails as a retryable error"
        );
        if let (Some(observer), Some(partition)) = (&self.settings.observer, partition) {
            observer.on_panic(partition);
        }
        self.finish::<HandlerError>(slot, Err(HandlerError::retryable(panic)));
    }

    /// Makes a delivery that started on the fast path hold its lane, now that
    /// it will keep running (or run again). Its lane is free: nothing else
    /// ran in between.
    fn hold_lane(&mut self, slot: SlotId) {
        let entry = self.slots.get(slot);
        if let (Some(lane), false) = (entry.lane, entry.holds_lane) {
            let taken = self.lanes.acquire(lane, slot, &mut self.slots);
            debug_assert!(taken, "a fast-path delivery's lane is free");
            self.slots.get_mut(slot).holds_lane = true;
        }
    }

    fn poll_handlers(&mut self) {
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
    }

    // ---- completion ------------------------------------------------------

    fn finish<E: Into<HandlerError>>(&mut self, slot: SlotId, output: Result<(), E>) {
        let entry = self.slots.get(slot);
        let probe = entry.probe;
        let Some(ticket) = entry.ticket else {
            self.release(slot);
            return;
        };
        let signal = match output {
            Ok(()) => {
                self.report.succeeded += 1;
                self.engine.complete(ticket);
                self.release(slot);
                Signal::Success
            }
            Err(error) => self.fail(slot, ticket, error.into()),
        };
        if signal == Signal::Success && self.backoff.state() == BackoffState::Normal {
            return;
        }
        self.backoff.record(signal, probe, Instant::now());
    }

    fn fail(&mut self, slot: SlotId, ticket: Ticket, error: HandlerError) -> Signal {
        match error.class() {
            ErrorClass::Ignore => {
                self.report.ignored += 1;
                self.engine.complete(ticket);
                self.release(slot);
                Signal::Neutral
            }
            ErrorClass::Permanent => {
                self.report.discarded += 1;
                tracing::error!(
                    partition = ?self.engine.key(ticket.partition()),
                    position = ?self.slots.get(slot).position,
                    %error,
                    "permanent failure with no dead-letter layer: the message is acknowledged and dropped"
                );
                self.engine.complete(ticket);
                self.release(slot);
                Signal::Neutral
            }
            ErrorClass::Interrupted
                if self.stop.is_none_or(|stop| stop == Stop::Exhausted)
                    && !self.partitions[ticket.partition().index()].revoking =>
            {
                // Nothing is stopping: released unfinished, it would hold the
                // partition's watermark for good (and, past
                // `max_uncommitted`, pause fetching). It is retried like any
                // retryable failure, after the consumer backoff, so a
                // handler that keeps answering this way cannot spin.
                tracing::warn!(
                    partition = ?self.engine.key(ticket.partition()),
                    position = ?self.slots.get(slot).position,
                    %error,
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
                let signal = if error.affects_backoff() {
                    Signal::Failure
                } else {
                    Signal::Neutral
                };
                let revoking = self.partitions[ticket.partition().index()].revoking;
                if self.requeue {
                    self.report.requeued += 1;
                    self.engine.requeue(ticket);
                    self.release(slot);
                } else if matches!(self.stop, Some(Stop::Graceful { .. })) || revoking {
                    // No time to try again: leave it unacknowledged.
                    self.release(slot);
                } else {
                    // The broker cannot take it back: dispatch it again, in
                    // its lane, after the consumer-level backoff.
                    self.report.redispatched += 1;
                    tracing::debug!(%error, "retryable failure: dispatching the message again");
                    let entry = self.slots.get_mut(slot);
                    entry.probe = false;
                    if let Some(message) = entry.message.as_mut() {
                        let attempt = message.metadata().attempt().saturating_add(1);
                        message.metadata_mut().set_attempt(attempt);
                    }
                    entry.state = SlotState::Ready;
                    self.hold_lane(slot);
                    self.ready.push_back(slot);
                }
                signal
            }
        }
    }

    /// Frees a delivery's slot and hands its lane to the next one. The
    /// delivery is acknowledged only if its ticket was completed before.
    fn release(&mut self, slot: SlotId) {
        let entry = self.slots.get(slot);
        if let (Some(lane), true) = (entry.lane, entry.holds_lane)
            && let Some(next) = self.lanes.release(lane, slot, &mut self.slots)
        {
            let next_entry = self.slots.get_mut(next);
            next_entry.state = SlotState::Ready;
            next_entry.holds_lane = true;
            self.ready.push_back(next);
        }
        self.free_slot(slot);
    }

    /// Frees a slot without touching its lane (the lane was dropped, or the
    /// run is over). Its delivery stays unacknowledged unless completed.
    fn free_slot(&mut self, slot: SlotId) {
        let entry = self.slots.get(slot);
        if entry.probe && entry.state != SlotState::Running {
            self.backoff.probe_abandoned();
        }
        if let Some(ticket) = entry.ticket {
            let index = ticket.partition().index();
            if let Some(flags) = self.partitions.get_mut(index) {
                flags.held = flags.held.saturating_sub(1);
                if flags.over_window
                    && self.engine.uncommitted(ticket.partition()) < self.settings.max_uncommitted
                {
                    flags.over_window = false;
                    self.over_window -= 1;
                }
            }
        }
        self.slots.release(slot);
    }

    // ---- commits -----------------------------------------------------------

    fn on_tick(&mut self) {
        self.flush_due = true;
        if self.acks.outstanding() > 0 {
            // A batch sent before still waits for the ack loop: the tick's
            // own batch can only follow it.
            self.yield_to_acks = true;
        }
        if let Some(observer) = self.settings.observer.clone() {
            observer.on_in_flight(self.slots.held());
            let now = Instant::now();
            let mut snapshots = Vec::new();
            for id in self.engine.assigned().collect::<Vec<_>>() {
                let Some(stats) = self.engine.stats(id) else {
                    continue;
                };
                let flags = &mut self.partitions[id.index()];
                let age = match (stats.oldest_unfinished, flags.oldest) {
                    (None, _) => {
                        flags.oldest = None;
                        None
                    }
                    (Some(position), Some((tracked, since))) if tracked == position => {
                        Some(now.duration_since(since))
                    }
                    (Some(position), _) => {
                        flags.oldest = Some((position, now));
                        Some(Duration::ZERO)
                    }
                };
                snapshots.push(PartitionSnapshot {
                    stats,
                    oldest_unfinished_age: age,
                });
            }
            observer.on_partitions(&snapshots);
        }
    }

    fn flush_if_due(&mut self) {
        let pending = self.engine.pending();
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
            self.engine.take_batch(&mut batch);
            // A batch of the tick goes out now; one of the threshold may
            // wait for the task's next yield (at the latest when its
            // cooperative budget is spent), which costs no yield per batch.
            if !batch.is_empty() && self.acks.send(AckRequest { batch, reply: None }) && ticked {
                self.yield_to_acks = true;
            }
        }
    }

    // ---- revocation --------------------------------------------------------

    fn begin_revoke(&mut self, revocation: Revocation) {
        let mut partitions = Vec::new();
        for key in revocation.partitions() {
            if let Some(id) = self.engine.lookup(key) {
                self.partitions[id.index()].revoking = true;
                partitions.push(id);
            }
        }
        self.last_partition = None;
        // Deliveries of these partitions that have not started are released
        // unacknowledged: the next owner receives them. Running ones may
        // finish until the revoke timeout.
        let mut lanes = Vec::new();
        let mut waiting = std::mem::take(&mut self.scratch);
        for (slot, entry) in self.slots.held_slots() {
            let Some(ticket) = entry.ticket else { continue };
            if partitions.contains(&ticket.partition()) {
                lanes.extend(entry.lane);
                if entry.state != SlotState::Running {
                    waiting.push(slot);
                }
            }
        }
        let mut queued = Vec::new();
        for lane in lanes {
            self.lanes.drop_lane(lane, &mut self.slots, &mut queued);
        }
        let slots = &self.slots;
        self.ready.retain(|&slot| {
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

    fn poll_revocations(&mut self, cx: &mut Context<'_>) {
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
                    .map(|id| self.partitions[id.index()].held)
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
                    self.engine.take_final_batch(id, &mut batch);
                }
                let pending = &mut self.revocations[index];
                // Sent even when empty: the acker handles batches in order,
                // so its reply also confirms earlier batches still under way.
                {
                    let (reply, receiver) = oneshot::channel();
                    if self.acks.send(AckRequest {
                        batch,
                        reply: Some(reply),
                    }) {
                        pending.reply = Some(receiver);
                    }
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
                self.backoff.probe_abandoned();
            }
            self.slots.cancel(slot);
            self.report.released_on_revoke += 1;
            self.free_slot(slot);
        }
        cancelled.clear();
        self.scratch = cancelled;
    }

    fn complete_revocation(&mut self, pending: PendingRevocation, committed: bool) {
        let mut outcome = RevocationOutcome::default();
        for &id in &pending.partitions {
            let Some(partition) = self.engine.key(id).cloned() else {
                continue;
            };
            let unfinished = self.engine.uncommitted(id);
            outcome.partitions.push(RevokedPartition {
                committed: if committed {
                    self.engine.watermark(id)
                } else {
                    None
                },
                partition: partition.clone(),
                unfinished,
            });
            self.engine.revoke(id);
            let flags = &mut self.partitions[id.index()];
            if flags.over_window {
                self.over_window -= 1;
            }
            *flags = PartitionFlags::default();
            if let Some(observer) = &self.settings.observer {
                observer.on_revoked(&partition);
            }
        }
        tracing::info!(partitions = ?pending.revocation.partitions(), committed, "revocation complete");
        pending.revocation.complete(outcome);
    }

    // ---- lifecycle -----------------------------------------------------------

    /// A transient error is retried after the reconnect policy's delay
    /// (capped by the policy, growing while the failures go on, from the
    /// start again after an event of the source); any other error, or one
    /// the policy gives up on, stops the run with the error as its reason.
    /// Each is logged and reported to the observer.
    fn source_failed(&mut self, error: SourceError) {
        let retry_in = match error.is_transient() {
            true => {
                self.fetch_failures = self.fetch_failures.saturating_add(1);
                self.settings.reconnect.delay(self.fetch_failures)
            }
            false => None,
        };
        if let Some(observer) = &self.settings.observer {
            observer.on_source_error(&error, retry_in);
        }
        if let Some(delay) = retry_in {
            tracing::warn!(
                %error,
                failures = self.fetch_failures,
                retry_in = ?delay,
                "fetching failed; retrying"
            );
            self.fetch_retry_at = Some(deadline::after(Instant::now(), delay));
            return;
        }
        if error.is_transient() {
            tracing::error!(%error, attempts = self.fetch_failures, "fetching failed and retries are exhausted");
        } else {
            tracing::error!(%error, "fetching failed for good");
        }
        self.begin_stop(Some(Failure::Source(error)));
    }

    fn begin_stop(&mut self, failure: Option<Failure>) {
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
        self.token.cancel();
    }

    fn is_drained(&self) -> bool {
        match self.stop {
            None => false,
            Some(Stop::Exhausted) => self.slots.held() == 0 && self.revocations.is_empty(),
            Some(Stop::Graceful { deadline }) => {
                self.slots.running() == 0 || Instant::now() >= deadline
            }
        }
    }

    /// Keeps one timer armed at the earliest moment something is due.
    fn arm_timer(&mut self, cx: &mut Context<'_>) {
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

    /// When the steps after the handlers' drain (the final commit, the
    /// source's close) must be over: what is left of the shutdown deadline,
    /// and at least `min(shutdown_deadline, 5 s)`.
    fn final_steps_deadline(&self) -> Instant {
        let now = Instant::now();
        let floor = deadline::after(now, self.settings.shutdown_deadline.min(FINAL_STEPS_FLOOR));
        match self.stop {
            Some(Stop::Graceful { deadline }) => deadline.max(floor),
            // Exhausted (or never started): nothing drained against a
            // deadline, so the steps get a whole one.
            _ => deadline::after(now, self.settings.shutdown_deadline),
        }
    }

    /// Puts the work of acknowledgements that failed back into the engine.
    fn restore_failed(&mut self) {
        while let Some(failed) = self.acks.take_failed() {
            for ack in failed.partitions {
                self.engine.restore(ack);
            }
        }
    }

    /// Sends `batch` and waits for the acker's answer until `until`;
    /// `false` when it failed, did not come, or the ack loop is gone.
    async fn send_and_wait(&mut self, batch: AckBatch, until: Instant) -> bool {
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

    /// Cancels what still runs, commits what finished, and reports. The
    /// final commit is over by `until`, answered or not.
    async fn wind_down(&mut self, until: Instant) -> RunReport {
        let mut unfinished = Vec::new();
        let held: Vec<SlotId> = self.slots.held_slots().map(|(slot, _)| slot).collect();
        for slot in held {
            let entry = self.slots.get(slot);
            if let (Some(ticket), Some(position)) = (entry.ticket, entry.position)
                && let Some(partition) = self.engine.key(ticket.partition())
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
        let mut ids: Vec<PartitionId> = self.engine.assigned().collect();
        ids.sort();
        let mut watermarks = Vec::with_capacity(ids.len());
        for &id in &ids {
            if let (Some(partition), Some(watermark)) =
                (self.engine.key(id), self.engine.watermark(id))
            {
                watermarks.push((partition.clone(), watermark));
            }
            self.engine.take_final_batch(id, &mut batch);
        }
        self.engine.take_batch(&mut batch);
        let committed_ok = if batch.is_empty() {
            reachable
        } else {
            reachable && self.send_and_wait(batch, until).await
        };
        if !committed_ok {
            tracing::error!(
                "the final commit failed or was not answered in time; finished messages may be \
                 delivered again"
            );
        }
        // Revocations still pending end with the run: what they held was
        // part of the final commit.
        for pending in std::mem::take(&mut self.revocations) {
            if let Some(receiver) = pending.reply {
                drop(receiver);
            }
            let PendingRevocation {
                revocation,
                partitions,
                deadline,
                ..
            } = pending;
            self.complete_revocation(
                PendingRevocation {
                    revocation,
                    partitions,
                    deadline,
                    reply: None,
                },
                committed_ok,
            );
        }
        let mut report = std::mem::take(&mut self.report);
        if committed_ok {
            report.committed = watermarks;
        } else {
            report.not_committed = watermarks;
        }
        unfinished.sort_by(|a, b| (&a.partition, a.position).cmp(&(&b.partition, b.position)));
        report.unfinished = unfinished;
        tracing::info!(
            succeeded = report.succeeded,
            unfinished = report.unfinished.len(),
            "consumer stopped"
        );
        report
    }
}
