//! Commits keep landing while a saturated backlog drains (issue 12, item 21).
//!
//! The clock is tokio's paused clock, moved forward by the handler itself:
//! each message costs a fixed amount of virtual time, so the clock counts work done,
//! not wall time, and the gaps between commits are measured in that work.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Waker};
use std::time::Duration;

use intake_core::backend::{AckBatch, AckError, AckMode, Acker};
use intake_core::consumer::{Consumer, DeliveryOrder};
use intake_core::memory::{MemoryBroker, Record};
use intake_core::{HandlerError, Message};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The backlog of the measurement.
const BACKLOG: u64 = 1_000_000;
/// Virtual time one message costs: the backlog takes 10 default commit
/// intervals to drain.
const COST: Duration = Duration::from_micros(1);
const INTERVAL: Duration = Duration::from_millis(100);

/// A backlog drained by a handler ten times slower, so that the work one
/// task poll does before tokio's cooperative budget makes it yield (128
/// fetches of up to 256 messages, about 330 ms here) outlasts the interval.
const SLOW_BACKLOG: u64 = 100_000;
const SLOW_COST: Duration = Duration::from_micros(10);

/// Moves tokio's paused clock forward by `cost` now. The first poll of
/// `tokio::time::advance` moves the clock; what is left of it is a yield,
/// which is dropped here, so the handler stays synchronous (it finishes on
/// its first poll, the saturated case).
fn spend(cost: Duration) {
    let mut advance = pin!(tokio::time::advance(cost));
    let _ = advance
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()));
}

/// The memory broker's acker, recording when each batch reached it.
struct TimedAcker<A> {
    inner: A,
    at: Arc<Mutex<Vec<Instant>>>,
}

impl<A: Acker> Acker for TimedAcker<A> {
    fn mode(&self) -> AckMode {
        self.inner.mode()
    }

    async fn ack(&mut self, batch: &AckBatch) -> Result<(), AckError> {
        if let Ok(mut at) = self.at.lock() {
            at.push(Instant::now());
        }
        self.inner.ack(batch).await
    }
}

struct Drained {
    /// The largest gap between the start, each commit batch, and the end.
    largest_gap: Duration,
    batches: usize,
    elapsed: Duration,
    lag: u64,
}

/// Drains a prefilled backlog of `backlog` messages with the default
/// settings and a handler that costs `cost` each; `spawned` runs the
/// consumer as a task of the runtime rather than as the future the runtime
/// blocks on.
async fn drain_backlog(backlog: u64, cost: Duration, spawned: bool) -> Drained {
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 4).expect("topic");
    broker
        .send_batch(
            "orders",
            (0..backlog).map(|index| Record::new("{}").to_partition((index % 4) as u32)),
        )
        .expect("prefill");
    let (source, acker) = broker.consumer("orders", "billing").expect("join");
    let at: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let acker = TimedAcker {
        inner: acker,
        at: at.clone(),
    };
    let shutdown = CancellationToken::new();
    let handled = Arc::new(AtomicU64::new(0));
    let handler = {
        let (stop, handled) = (shutdown.clone(), handled.clone());
        tower::service_fn(move |_message: Message| {
            spend(cost);
            if handled.fetch_add(1, Ordering::Relaxed) + 1 == backlog {
                stop.cancel();
            }
            std::future::ready(Ok::<_, HandlerError>(()))
        })
    };
    let consumer = Consumer::builder()
        .ordering(DeliveryOrder::Partition)
        .commit_interval(INTERVAL)
        .build(source, acker, handler)
        .expect("valid settings");
    let started = Instant::now();
    let report = if spawned {
        tokio::spawn(consumer.run(shutdown))
            .await
            .expect("the run joins")
    } else {
        consumer.run(shutdown).await
    }
    .expect("the run succeeds");
    let ended = Instant::now();
    assert_eq!(report.succeeded, backlog);
    let at = at.lock().map(|at| at.clone()).unwrap_or_default();
    let mut moments = vec![started];
    moments.extend(at.iter().copied());
    moments.push(ended);
    let largest_gap = moments
        .windows(2)
        .map(|pair| pair[1].duration_since(pair[0]))
        .max()
        .unwrap_or_default();
    Drained {
        largest_gap,
        batches: at.len(),
        elapsed: ended.duration_since(started),
        lag: broker.lag("orders", "billing").unwrap_or(u64::MAX),
    }
}

fn assert_commits_kept_pace(drained: &Drained) {
    eprintln!(
        "{} commit batches over {:?} of virtual time; largest gap {:?}",
        drained.batches, drained.elapsed, drained.largest_gap
    );
    assert_eq!(drained.lag, 0, "everything was committed at the end");
    assert!(
        drained.elapsed >= INTERVAL * 9,
        "the handler's cost moved the clock: {:?}",
        drained.elapsed
    );
    assert!(
        drained.largest_gap <= INTERVAL * 2,
        "the largest gap between commit batches was {:?} ({} batches over {:?}); \
         the commit interval is {INTERVAL:?}",
        drained.largest_gap,
        drained.batches,
        drained.elapsed,
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn commits_land_within_the_interval_while_a_backlog_of_a_million_drains() {
    assert_commits_kept_pace(&drain_backlog(BACKLOG, COST, false).await);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn commits_land_within_the_interval_while_a_spawned_consumer_drains_a_backlog() {
    assert_commits_kept_pace(&drain_backlog(BACKLOG, COST, true).await);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn commits_land_within_the_interval_when_one_budget_of_work_outlasts_it() {
    assert_commits_kept_pace(&drain_backlog(SLOW_BACKLOG, SLOW_COST, false).await);
}
