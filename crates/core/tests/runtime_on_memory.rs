//! The runtime over the memory broker: a consumer crashed at seeded moments
//! loses nothing, and a large backlog never exceeds the in-flight budget.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_core::consumer::{Consumer, DeliveryOrder};
use intake_core::memory::{MemoryBroker, Record};
use intake_core::{HandlerError, Message};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;

const MESSAGES: u64 = 2_000;

fn id_of(message: &Message) -> u64 {
    std::str::from_utf8(message.payload())
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(u64::MAX)
}

/// Runs a consumer whose handler records ids and sleeps a seeded amount.
fn spawn_consumer(
    broker: &MemoryBroker,
    seen: Arc<Mutex<HashSet<u64>>>,
    seed: u64,
) -> (tokio::task::JoinHandle<()>, CancellationToken) {
    let (source, acker) = broker.consumer("orders", "crash").expect("join the group");
    let rng = Arc::new(Mutex::new(StdRng::seed_from_u64(seed)));
    let handler = tower::service_fn(move |message: Message| {
        let (seen, rng) = (seen.clone(), rng.clone());
        async move {
            let pause = rng
                .lock()
                .map(|mut rng| rng.random_range(0..300))
                .unwrap_or(0);
            tokio::time::sleep(Duration::from_micros(pause)).await;
            seen.lock()
                .map(|mut seen| seen.insert(id_of(&message)))
                .ok();
            Ok::<_, HandlerError>(())
        }
    });
    let consumer = Consumer::builder()
        .max_in_flight(32)
        .ordering(DeliveryOrder::Key)
        .commit_interval(Duration::from_millis(3))
        .build(source, acker, handler)
        .expect("valid settings");
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let task = tokio::spawn(async move {
        let _ = consumer.run(token).await;
    });
    (task, shutdown)
}

async fn wait_until(what: &str, condition: impl Fn() -> bool) {
    for _ in 0..3_000 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_consumers_uncommitted_messages_reach_the_next_consumer() {
    for seed in 0..10u64 {
        let broker = MemoryBroker::new();
        broker.create_topic("orders", 4).expect("topic");
        broker
            .send_batch(
                "orders",
                (0..MESSAGES)
                    .map(|id| Record::new(id.to_string()).with_key(format!("k{}", id % 64))),
            )
            .expect("produce");
        let crash_after =
            StdRng::seed_from_u64(seed ^ 0x5eed).random_range(50..MESSAGES as usize - 50);

        let first_seen: Arc<Mutex<HashSet<u64>>> = Arc::default();
        let (first, _) = spawn_consumer(&broker, first_seen.clone(), seed);
        wait_until("the crash point", || {
            first_seen.lock().map(|seen| seen.len()).unwrap_or_default() >= crash_after
        })
        .await;
        // SIGKILL, in process: the run future is dropped mid-flight and the
        // source is never closed.
        first.abort();
        let _ = first.await;

        let second_seen: Arc<Mutex<HashSet<u64>>> = Arc::default();
        let (second, shutdown) = spawn_consumer(&broker, second_seen.clone(), seed + 1000);
        wait_until("the group to commit everything", || {
            broker.lag("orders", "crash").is_ok_and(|lag| lag == 0)
        })
        .await;
        shutdown.cancel();
        let _ = second.await;

        let first_seen = first_seen
            .lock()
            .map(|seen| seen.clone())
            .unwrap_or_default();
        let second_seen = second_seen
            .lock()
            .map(|seen| seen.clone())
            .unwrap_or_default();
        let lost: Vec<u64> = (0..MESSAGES)
            .filter(|id| !first_seen.contains(id) && !second_seen.contains(id))
            .collect();
        assert!(
            lost.is_empty(),
            "seed {seed}: lost {lost:?} after a crash at {crash_after}"
        );
        // How many depends on timing (what completed since the last commit);
        // the deterministic simulation checks the bound under a paused clock.
        let duplicates = first_seen.intersection(&second_seen).count();
        eprintln!(
            "seed {seed}: crash after {crash_after}, {duplicates} delivered twice, none lost"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_in_flight_is_never_exceeded_with_a_backlog_of_100_000() {
    const BACKLOG: u64 = 100_000;
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 4).expect("topic");
    broker
        .send_batch(
            "orders",
            (0..BACKLOG).map(|id| Record::new(id.to_string()).with_key(format!("k{}", id % 1000))),
        )
        .expect("produce");
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let handled = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (running, peak, handled) = (running.clone(), peak.clone(), handled.clone());
        tower::service_fn(move |message: Message| {
            let (running, peak, handled) = (running.clone(), peak.clone(), handled.clone());
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                if id_of(&message).is_multiple_of(4) {
                    tokio::task::yield_now().await;
                }
                running.fetch_sub(1, Ordering::SeqCst);
                handled.fetch_add(1, Ordering::SeqCst);
                Ok::<_, HandlerError>(())
            }
        })
    };
    let (source, acker) = broker.consumer("orders", "bounded").expect("join");
    let consumer = Consumer::builder()
        .max_in_flight(64)
        .ordering(DeliveryOrder::Unordered)
        .build(source, acker, handler)
        .expect("valid settings");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(consumer.run(shutdown.clone()));
    wait_until("the whole backlog to be committed", || {
        broker.lag("orders", "bounded").is_ok_and(|lag| lag == 0)
    })
    .await;
    shutdown.cancel();
    let report = task.await.expect("joins").expect("run succeeds");
    assert_eq!(report.succeeded, BACKLOG);
    let peak = peak.load(Ordering::SeqCst);
    assert!(
        peak <= 64,
        "{peak} handlers ran at once with max_in_flight 64"
    );
    assert!(peak > 1, "handlers overlapped");
}
