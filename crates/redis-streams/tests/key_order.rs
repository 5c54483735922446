//! Order per key across a crash, a graceful restart and several consumers
//! of one group, on a real Redis.
//!
//! Entries carry `payload = n` (0, 1, 2, … in stream order) and
//! `key = k<n % KEYS>`. A handler records each `n` it starts and ends; a
//! key's order holds when each of its entries starts only after the one
//! before it in the stream ended (a redelivery of an entry handled but not
//! acknowledged before a crash may repeat it, right after itself).

mod support;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_core::{Consumer, DeliveryOrder, HandlerError, Message};
use redis::aio::MultiplexedConnection;
use tokio_util::sync::CancellationToken;

use support::*;

const KEYS: u64 = 8;

/// Adds entries `from..to` to `stream`, keyed `k<n % KEYS>`.
async fn produce_keyed(redis: &mut MultiplexedConnection, stream: &str, from: u64, to: u64) {
    let mut pipe = redis::pipe();
    for n in from..to {
        pipe.cmd("XADD")
            .arg(stream)
            .arg("*")
            .arg("payload")
            .arg(n.to_string())
            .arg("key")
            .arg(format!("k{}", n % KEYS))
            .ignore();
    }
    pipe.query_async::<()>(redis).await.expect("XADD");
}

fn number(message: &Message) -> u64 {
    std::str::from_utf8(message.payload())
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(u64::MAX)
}

/// A handler of any of the tests' kinds.
type Handler = tower::util::BoxCloneSyncService<Message, (), HandlerError>;

/// What every handler of a test did, in one order: `(n, started, ended)`
/// on one clock of events.
#[derive(Clone, Default)]
struct Journal {
    clock: Arc<AtomicU64>,
    runs: Arc<Mutex<Vec<(u64, u64, u64)>>>,
    done: Arc<Mutex<HashSet<u64>>>,
}

impl Journal {
    /// A handler that records each run, sleeps `pause` in it, and cancels
    /// `stop` once every number below `until` (but those in `skip`) ran.
    fn handler(&self, pause: Duration, until: u64, skip: u64, stop: CancellationToken) -> Handler {
        let journal = self.clone();
        Handler::new(tower::service_fn(move |message: Message| {
            let journal = journal.clone();
            let stop = stop.clone();
            async move {
                let n = number(&message);
                let started = journal.clock.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(pause).await;
                let ended = journal.clock.fetch_add(1, Ordering::SeqCst);
                journal
                    .runs
                    .lock()
                    .expect("not poisoned")
                    .push((n, started, ended));
                let mut done = journal.done.lock().expect("not poisoned");
                done.insert(n);
                if (skip..until).all(|n| done.contains(&n)) {
                    stop.cancel();
                }
                Ok::<_, HandlerError>(())
            }
        }))
    }

    /// The numbers that ran, per key, in the order they started.
    fn by_key(&self) -> BTreeMap<u64, Vec<(u64, u64, u64)>> {
        let mut runs = self.runs.lock().expect("not poisoned").clone();
        runs.sort_by_key(|&(_, started, _)| started);
        let mut keys: BTreeMap<u64, Vec<(u64, u64, u64)>> = BTreeMap::new();
        for run in runs {
            keys.entry(run.0 % KEYS).or_default().push(run);
        }
        keys
    }

    /// Keys whose entries did not run one after another in stream order,
    /// each with its runs: a number that started before the one before it
    /// ended, or after a later number of its key.
    fn out_of_order(&self) -> Vec<(u64, Vec<u64>)> {
        self.by_key()
            .into_iter()
            .filter(|(_, runs)| {
                runs.windows(2).any(|pair| {
                    let ((before, _, ended), (after, started, _)) = (pair[0], pair[1]);
                    after < before || started < ended
                })
            })
            .map(|(key, runs)| (key, runs.into_iter().map(|(n, _, _)| n).collect()))
            .collect()
    }
}

/// A member `consumer` of `group` under the runtime, in key order with
/// `in_flight` deliveries at most.
async fn run_member(
    stream: &str,
    group: &str,
    consumer: &str,
    in_flight: usize,
    handler: Handler,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<intake_core::RunReport> {
    let source = group_builder(stream, group, consumer)
        .key_field("key")
        .build()
        .await
        .expect("connect");
    let acker = source.acker();
    let consumer = Consumer::builder()
        .max_in_flight(in_flight)
        .ordering(DeliveryOrder::Key)
        .shutdown_deadline(Duration::from_millis(500))
        .build(source, acker, handler)
        .expect("consumer");
    tokio::spawn(async move { consumer.run(stop).await.expect("run") })
}

/// Takes `count` entries as consumer `name` and leaves them pending, as a
/// process killed while it held them would: the source is dropped without
/// acknowledging them or closing.
async fn take_and_die(stream: &str, group: &str, name: &str, count: usize) -> Vec<u64> {
    let mut source = group_builder(stream, group, name)
        .key_field("key")
        .build()
        .await
        .expect("connect");
    let held = receive(&mut source, count, count, Duration::from_secs(5)).await;
    assert_eq!(held.len(), count, "the doomed consumer took its entries");
    drop(source);
    held.iter().map(number).collect()
}

/// Runs `consumer` until every entry below `total` ran, at most 30 s.
async fn run_until_done(
    stream: &str,
    group: &str,
    consumer: &str,
    journal: &Journal,
    total: u64,
) -> intake_core::RunReport {
    let stop = CancellationToken::new();
    let handler = journal.handler(Duration::from_millis(1), total, 0, stop.clone());
    let running = run_member(stream, group, consumer, 16, handler, stop.clone()).await;
    let guard = stop.clone();
    let report = tokio::time::timeout(Duration::from_secs(30), running).await;
    guard.cancel();
    report
        .expect("every entry ran within 30 s")
        .expect("joined")
}

/// A process killed while holding entries is replaced by one under a new
/// consumer name (the default `<host>-<pid>-<n>` changes with every
/// process). The entries the dead one held are older than the stream's
/// unread ones, and each key's order holds across them: the new consumer
/// runs none of a key's newer entries before the dead consumer's entries of
/// that key, which it can claim only once they are idle `claim_min_idle`.
#[tokio::test]
async fn a_replacement_under_a_new_name_runs_each_key_in_order_after_a_crash() {
    let Some(mut redis) = redis_or_skip("a_replacement_under_a_new_name_runs_each_key").await
    else {
        return;
    };
    let stream = unique("order-crash");
    let group = unique("group");
    produce_keyed(&mut redis, &stream, 0, 200).await;
    let held = take_and_die(&stream, &group, "killed", 40).await;
    assert_eq!(held, (0..40).collect::<Vec<_>>());
    produce_keyed(&mut redis, &stream, 200, 240).await;

    let journal = Journal::default();
    run_until_done(&stream, &group, "replacement", &journal, 240).await;
    assert_eq!(journal.out_of_order(), vec![], "keys out of order");
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

/// A process killed while holding entries is restarted under the same
/// consumer name (a pod name, a systemd instance): it re-reads its own
/// pending entries before any new one, so each key's order holds, and it
/// need not wait for `claim_min_idle`.
#[tokio::test]
async fn a_restart_under_the_same_name_runs_its_pending_entries_first() {
    let Some(mut redis) = redis_or_skip("a_restart_under_the_same_name").await else {
        return;
    };
    let stream = unique("order-restart");
    let group = unique("group");
    produce_keyed(&mut redis, &stream, 0, 200).await;
    take_and_die(&stream, &group, "stable", 40).await;
    produce_keyed(&mut redis, &stream, 200, 240).await;

    let journal = Journal::default();
    run_until_done(&stream, &group, "stable", &journal, 240).await;
    assert_eq!(journal.out_of_order(), vec![], "keys out of order");
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

/// A graceful stop leaves the entries whose handlers did not finish within
/// the shutdown deadline pending; a successor under a new name runs each
/// key in order after them.
#[tokio::test]
async fn a_successor_after_a_graceful_stop_runs_each_key_in_order() {
    let Some(mut redis) = redis_or_skip("a_successor_after_a_graceful_stop").await else {
        return;
    };
    let stream = unique("order-graceful");
    let group = unique("group");
    produce_keyed(&mut redis, &stream, 0, 120).await;

    // The first member handles slowly and is stopped after a few entries.
    let first = Journal::default();
    let stop = CancellationToken::new();
    let handler = first.handler(Duration::from_millis(300), 0, 0, CancellationToken::new());
    let running = run_member(&stream, &group, "first", 16, handler, stop.clone()).await;
    tokio::time::sleep(Duration::from_millis(450)).await;
    stop.cancel();
    let report = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("stopped within 10 s")
        .expect("joined");
    let pending = unacknowledged(&mut redis, &stream, &group)
        .await
        .expect("XINFO");
    assert!(
        pending > 0 && report.succeeded > 0,
        "the first member stopped with entries unfinished: {report:?}"
    );

    let journal = Journal::default();
    journal
        .runs
        .lock()
        .expect("not poisoned")
        .extend(first.runs.lock().expect("not poisoned").iter().copied());
    journal
        .done
        .lock()
        .expect("not poisoned")
        .extend(first.done.lock().expect("not poisoned").iter().copied());
    journal
        .clock
        .store(first.clock.load(Ordering::SeqCst), Ordering::SeqCst);
    run_until_done(&stream, &group, "second", &journal, 120).await;
    assert_eq!(journal.out_of_order(), vec![], "keys out of order");
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

/// Two live members of one group read the same stream at once: Redis
/// hands each entry to whichever reads first, so a key's entries are
/// spread over both. Each key still runs one entry at a time, in stream
/// order: a member holds an entry back while an older entry of its key is
/// pending with the other.
#[tokio::test]
async fn two_members_of_a_group_run_each_key_in_order_between_them() {
    let Some(mut redis) = redis_or_skip("two_members_of_a_group_run_each_key_in_order").await
    else {
        return;
    };
    let stream = unique("order-two");
    let group = unique("group");
    let journal = Journal::default();
    let stop = CancellationToken::new();
    let handler = || journal.handler(Duration::from_millis(2), 400, 0, stop.clone());
    let one = run_member(&stream, &group, "one", 16, handler(), stop.clone()).await;
    let two = run_member(&stream, &group, "two", 16, handler(), stop.clone()).await;
    // Written while both read, in small bursts, so that both take some.
    for burst in 0..20 {
        produce_keyed(&mut redis, &stream, burst * 20, burst * 20 + 20).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let guard = stop.clone();
    let reports = tokio::time::timeout(Duration::from_secs(30), async {
        (one.await.expect("joined"), two.await.expect("joined"))
    })
    .await;
    guard.cancel();
    let (one, two) = reports.expect("every entry ran within 30 s");
    assert!(
        one.succeeded > 0 && two.succeeded > 0,
        "both members took entries: {one:?} {two:?}"
    );
    assert_eq!(journal.out_of_order(), vec![], "keys out of order");
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

/// One of two live members is killed while it holds entries; the other
/// claims them once idle and runs each key in order after them: none of a
/// key's newer entries runs before the dead member's of that key.
#[tokio::test]
async fn the_survivor_of_two_members_runs_each_key_in_order_after_the_other_dies() {
    let Some(mut redis) = redis_or_skip("the_survivor_of_two_members").await else {
        return;
    };
    let stream = unique("order-survivor");
    let group = unique("group");
    let journal = Journal::default();
    let stop = CancellationToken::new();
    let survivor = run_member(
        &stream,
        &group,
        "survivor",
        16,
        journal.handler(Duration::from_millis(2), 300, 0, stop.clone()),
        stop.clone(),
    )
    .await;
    // The doomed member's handler never finishes: what it takes stays
    // pending until it is killed and its entries are claimed.
    let doomed_stop = CancellationToken::new();
    let doomed = run_member(
        &stream,
        &group,
        "doomed",
        16,
        Handler::new(tower::service_fn(|_message: Message| async {
            std::future::pending::<Result<(), HandlerError>>().await
        })),
        doomed_stop,
    )
    .await;
    for burst in 0..15 {
        produce_keyed(&mut redis, &stream, burst * 20, burst * 20 + 20).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    doomed.abort();
    let _ = doomed.await;
    let guard = stop.clone();
    let report = tokio::time::timeout(Duration::from_secs(30), survivor).await;
    guard.cancel();
    report
        .expect("every entry ran within 30 s")
        .expect("joined");
    assert_eq!(journal.out_of_order(), vec![], "keys out of order");
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

/// A retryable failure gives its entry back for a claim after
/// `claim_min_idle` (the runtime's requeue). The key's later entries wait
/// for it, other keys flow meanwhile.
#[tokio::test]
async fn a_key_waits_for_its_entry_given_back_for_a_retry_and_other_keys_flow() {
    let Some(mut redis) = redis_or_skip("a_key_waits_for_its_entry_given_back").await else {
        return;
    };
    let stream = unique("order-retry");
    let group = unique("group");
    produce_keyed(&mut redis, &stream, 0, 4 * KEYS).await;
    let journal = Journal::default();
    let stop = CancellationToken::new();
    let recorded = journal.handler(Duration::ZERO, 4 * KEYS, 0, stop.clone());
    // 0 (key k0) fails on its first attempt; everything else succeeds.
    let handler = Handler::new(tower::service_fn(move |message: Message| {
        let mut recorded = recorded.clone();
        async move {
            if number(&message) == 0 && message.metadata().attempt() == 1 {
                return Err(HandlerError::retryable("not yet").without_backoff());
            }
            tower::Service::call(&mut recorded, message).await
        }
    }));
    let running = run_member(&stream, &group, "only", 16, handler, stop.clone()).await;
    let guard = stop.clone();
    let report = tokio::time::timeout(Duration::from_secs(30), running).await;
    guard.cancel();
    let report = report
        .expect("every entry ran within 30 s")
        .expect("joined");
    assert_eq!(report.requeued, 1, "{report:?}");
    assert_eq!(journal.out_of_order(), vec![], "keys out of order");
    let by_key = journal.by_key();
    let k0: Vec<u64> = by_key[&0].iter().map(|run| run.0).collect();
    assert_eq!(k0, vec![0, 8, 16, 24], "k0 ran in order after its retry");
    // The other keys did not wait for k0's retry.
    let retried = by_key[&0][0].1;
    for key in 1..KEYS {
        let last = by_key[&key].last().expect("ran").1;
        assert!(last < retried, "k{key} waited for k0: {by_key:?}");
    }
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

/// Two members of an unordered consumer read the same stream: neither
/// holds an entry back for the other's (the consumer promises no order, so
/// the waits would only cost: two members ran 28-33k entries/s with them
/// and 160-262k/s without), and every entry still runs and is acknowledged.
#[tokio::test]
async fn members_of_an_unordered_consumer_never_wait_for_each_others_keys() {
    let Some(mut redis) = redis_or_skip("members_of_an_unordered_consumer").await else {
        return;
    };
    let stream = unique("order-none");
    let group = unique("group");
    let journal = Journal::default();
    let stop = CancellationToken::new();
    let mut members = Vec::new();
    let mut counters = Vec::new();
    for name in ["one", "two"] {
        let source = group_builder(&stream, &group, name)
            .key_field("key")
            .build()
            .await
            .expect("connect");
        counters.push(source.counters());
        let acker = source.acker();
        let consumer = Consumer::builder()
            .max_in_flight(16)
            .ordering(DeliveryOrder::Unordered)
            .shutdown_deadline(Duration::from_millis(500))
            .build(
                source,
                acker,
                journal.handler(Duration::from_millis(2), 400, 0, stop.clone()),
            )
            .expect("consumer");
        let stop = stop.clone();
        members.push(tokio::spawn(async move {
            consumer.run(stop).await.expect("run")
        }));
    }
    for burst in 0..20 {
        produce_keyed(&mut redis, &stream, burst * 20, burst * 20 + 20).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let guard = stop.clone();
    let reports = tokio::time::timeout(Duration::from_secs(30), async {
        let mut reports = Vec::new();
        for member in members {
            reports.push(member.await.expect("joined"));
        }
        reports
    })
    .await;
    guard.cancel();
    let reports = reports.expect("every entry ran within 30 s");
    assert!(
        reports.iter().all(|report| report.succeeded > 0),
        "both members took entries: {reports:?}"
    );
    let waits: Vec<u64> = counters
        .iter()
        .map(|counters| counters.key_order_waits())
        .collect();
    assert_eq!(
        waits,
        vec![0, 0],
        "entries waited for an order nobody keeps"
    );
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}
