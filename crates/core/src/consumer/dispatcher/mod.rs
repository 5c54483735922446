//! One run of a consumer: the loop that fetches, admits, dispatches,
//! completes and commits.
//!
//! Everything happens in the task that awaits the run. The source's `next`
//! future is polled side by side with the running handlers, the commit tick
//! and the timers, so a slow fetch never delays a completion and a slow
//! handler never delays a fetch. Handlers that finish on their first poll
//! (most do) are completed on the spot, without a wake-up.
//!
//! `Dispatcher` is the state of a run; each file holds one part of what it
//! does, under the section's name:
//! - `event_loop.rs`: the loop, and the pass that polls everything but the
//!   source;
//! - `fetch.rs`: how much the source may be asked for, and fetch errors;
//! - `admission.rs`: a fetched delivery's partition, ticket, slot and lane;
//! - `dispatch.rs`: the handler's readiness, the backoff gate, starting and
//!   polling handlers;
//! - `completion.rs`: outcomes, and freeing slots and lanes;
//! - `partitions.rs`: the commit engine and the runtime's entry for each
//!   partition, kept in step by one type;
//! - `commits.rs`: the commit tick, the batches for the ack loop, and the
//!   final commit;
//! - `pause.rs`: partitions paused through the control, their held
//!   deliveries, and the commands taken at each pass;
//! - `revocation.rs`: draining, committing and releasing revoked partitions;
//! - `stop.rs`: stopping, draining, and the wind-down that ends a run;
//! - `timer.rs`: the one timer that wakes the run when something is due.

mod admission;
mod commits;
mod completion;
mod dispatch;
mod event_loop;
mod fetch;
mod partitions;
mod pause;
mod revocation;
mod stop;
mod timer;

use std::collections::VecDeque;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::time::Instant;
use tower::Service;

use super::Settings;
use super::ack_loop::{AckQueue, ack_loop};
use super::byte_budget::ByteBudget;
use super::gate::BackoffGate;
use super::lanes::Lanes;
use super::report::{RunError, RunReport, SourceClose};
use super::shutdown::Shutdown;
use super::slots::{Caught, SlotId, Slots};
use super::turns::KeyTurns;
use crate::acker::Acker;
use crate::commit_engine::CommitEngine;
use crate::error::{HandlerError, chain_for_log};
use crate::message::Message;
use crate::source::{Limits, Source, SourceError};
use partitions::Partitions;
use revocation::PendingRevocation;
use timer::Timer;

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
    let delayed_requeue = requeue && acker.supports_delayed_requeue();
    let slots = Slots::new(settings.max_in_flight);
    source.set_limits(
        Limits::new(
            settings.max_in_flight,
            settings.max_in_flight_bytes,
            settings.revoke_timeout,
        )
        .with_ordering(settings.ordering),
    );
    let reachability = source.reachability();
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
        dispatcher.delayed_requeue = delayed_requeue;
        dispatcher.reachability = reachability;
        let stop = dispatcher.drive(&mut source, shutdown.into_future()).await;
        // Every step from here on is bounded, whatever the broker does.
        let until = dispatcher.final_steps_deadline();
        let mut report = dispatcher.wind_down(until).await;
        report.peak_in_flight_bytes = dispatcher.bytes.high_water() as u64;
        drop(dispatcher);
        report.close = match tokio::time::timeout_at(until, source.close()).await {
            Ok(Ok(())) => SourceClose::Closed,
            Ok(Err(error)) => {
                tracing::warn!(error = %chain_for_log(&error), "closing the source failed");
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
        report.ack_failures = ack_failures.load(Ordering::Acquire) as u64;
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

/// What a handler future resolves to.
type HandlerOutput<H> = Result<(), <H as Service<Message>>::Error>;

/// The state of one run.
struct Dispatcher<H: Service<Message>> {
    handler: H,
    /// The in-flight budget: one slot per delivery held.
    slots: Slots<H::Future>,
    /// The in-flight budget in bytes.
    bytes: ByteBudget,
    lanes: Lanes,
    /// The turns of keys whose handlers publish: what lets a key's next
    /// delivery run once the outputs of the one before are sent.
    turns: Arc<KeyTurns>,
    /// Slots whose turns handed their lane on, taken from `turns`.
    released: Vec<SlotId>,
    settings: Settings,
    /// Whether the broker takes a failed message back (the acker supports
    /// requeue); if not, each running delivery keeps a copy of its message
    /// to dispatch again.
    requeue: bool,
    /// Whether the broker takes a failed message back for a redelivery
    /// after a delay: a failure that asks to be
    /// [retried later](HandlerError::retry_after) goes back that way.
    delayed_requeue: bool,
    /// The consumer-level backoff gate.
    gate: BackoffGate,
    /// The backoff probe's slot and its deadline, while it runs.
    probe: Option<(SlotId, Instant)>,
    /// Deliveries that hold their lane and wait to start, oldest first.
    ready: VecDeque<SlotId>,
    /// Deliveries of partitions paused through the control, in the order
    /// they were held; `true` for those that joined their lane (taken from
    /// `ready`), `false` for those held at admission (see `pause.rs`).
    held: Vec<(SlotId, bool)>,
    /// Handler outputs collected from woken slots.
    finished: Vec<(SlotId, Caught<HandlerOutput<H>>)>,
    /// The commit engine and the runtime's entry for each partition.
    partitions: Partitions,
    acks: AckQueue,
    /// The commit tick asked for a batch, sent once none is under way.
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
    timer: Timer,
    /// After a fetch error: when the source may be asked again.
    fetch_retry_at: Option<Instant>,
    /// Fetch errors in a row (the reconnect policy's retry number).
    fetch_failures: u32,
    /// The source's mark of whether it reaches its broker, if it keeps one
    /// (reported at each tick).
    reachability: Option<crate::backend::Reachability>,
    revocations: Vec<PendingRevocation>,
    /// How the run is ending, once it is.
    stop: Option<Stop>,
    /// Why the run stops, if it stops for a failure.
    failure: Option<Failure>,
    /// Cancelled when the run stops; handlers read it through
    /// [`current_shutdown`](crate::shutdown_scope::current_shutdown). In an
    /// `Arc` so a pass can make it current while it changes the dispatcher:
    /// an `Arc` clone is one atomic increment, a token's takes a mutex.
    token: Arc<crate::shutdown_scope::ShutdownScope>,
    report: RunReport,
    /// A list of slots reused by revocations, so they allocate once.
    scratch: Vec<SlotId>,
    /// Fetched deliveries that wait for room in the shared budget (or for a
    /// free slot, which `admit` never lacks), oldest first. Held here
    /// rather than in the loop's fetch buffer, so the
    /// source is still asked for events (with `max` 0, into the empty
    /// buffer) while they wait: a revocation must reach the run before its
    /// source's revoke wait runs out and the partition goes to another
    /// member, and the waiting deliveries of a revoked partition are then
    /// released, never run (see `admission.rs`).
    waiting: Vec<Message>,
    /// When the run last told the observer that it waits for shared room
    /// (`None` once it said the wait is over, or never said it).
    shared_wait_reported: Option<Instant>,
    /// The current wait for shared room was logged as a warning.
    shared_wait_warned: bool,
}

impl<H> Dispatcher<H>
where
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    /// The state of a run that has fetched nothing yet.
    fn new(
        handler: H,
        slots: Slots<H::Future>,
        settings: Settings,
        engine: CommitEngine,
        requeue: bool,
        acks: AckQueue,
    ) -> Self {
        let capacity = slots.capacity();
        let bytes = ByteBudget::with_shared(
            settings.max_in_flight_bytes,
            settings.shared_budget.as_ref(),
            slots.runtime_waker(),
        );
        let turns = Arc::new(KeyTurns::new(
            capacity,
            settings.ordering,
            settings.key_with.clone(),
            slots.runtime_waker().clone(),
        ));
        Self {
            handler,
            slots,
            lanes: Lanes::with_capacity(capacity),
            turns,
            released: Vec::new(),
            bytes,
            requeue,
            delayed_requeue: false,
            gate: BackoffGate::new(settings.backoff.clone()),
            probe: None,
            ready: VecDeque::with_capacity(capacity),
            held: Vec::new(),
            finished: Vec::with_capacity(capacity),
            partitions: Partitions::new(engine, settings.max_uncommitted, settings.max_in_flight),
            acks,
            flush_due: false,
            yield_to_acks: false,
            resend_on_tick: false,
            next_tick_at: Instant::now(),
            timer: Timer::new(),
            fetch_retry_at: None,
            fetch_failures: 0,
            reachability: None,
            revocations: Vec::new(),
            stop: None,
            failure: None,
            token: Arc::default(),
            report: RunReport::default(),
            scratch: Vec::new(),
            // Swapped with the loop's buffer (see `admit_all`): as large,
            // so neither allocates when it is the one fetched into. Only a
            // shared budget leaves deliveries waiting (or a source that
            // delivers more than asked).
            waiting: if settings.shared_budget.is_some() {
                Vec::with_capacity(settings.fetch_batch)
            } else {
                Vec::new()
            },
            shared_wait_reported: None,
            shared_wait_warned: false,
            settings,
        }
    }
}
