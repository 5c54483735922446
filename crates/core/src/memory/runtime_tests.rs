//! The memory broker under the consumer runtime: rebalances, crashes and
//! faults as a real consumer lives through them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::consumer::{Consumer, DeliveryOrder, RunReport};
use crate::error::HandlerError;
use crate::message::{Message, Position};

const TOPIC: &str = "payments";
const GROUP: &str = "ledger";

/// One handler execution: who ran it, on what, and when it started and
/// ended on a global clock of events.
#[derive(Clone, Copy, Debug)]
struct Execution {
    consumer: usize,
    partition: u32,
    offset: i64,
    attempt: u32,
    started: u64,
    ended: u64,
}

#[derive(Clone, Default)]
struct Journal {
    clock: Arc<AtomicU64>,
    executions: Arc<Mutex<Vec<Execution>>>,
    /// Offsets whose handler started and never finished.
    hung: Arc<Mutex<Vec<i64>>>,
}

impl Journal {
    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst)
    }

    fn executions(&self) -> Vec<Execution> {
        self.executions.lock().expect("journal").clone()
    }

    fn distinct(&self) -> usize {
        let executions = self.executions.lock().expect("journal");
        let mut seen: Vec<(u32, i64)> =
            executions.iter().map(|e| (e.partition, e.offset)).collect();
        seen.sort_unstable();
        seen.dedup();
        seen.len()
    }

    async fn wait_for(&self, distinct: usize) {
        tokio::time::timeout(Duration::from_secs(30), async {
            while self.distinct() < distinct {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{distinct} messages within the guard time, got {}",
                self.distinct()
            )
        });
    }
}

fn offset_of(message: &Message) -> i64 {
    match message.metadata().position() {
        Position::Offset(offset) => offset,
        other => panic!("memory positions are offsets, got {other:?}"),
    }
}

/// A handler that journals each execution; it takes a little while, and
/// never finishes messages at or past `hang_from`.
fn journaling(
    journal: &Journal,
    consumer: usize,
    hang_from: Option<i64>,
) -> impl tower::Service<Message, Response = (), Error = HandlerError, Future: Send> + Send + 'static
{
    let journal = journal.clone();
    tower::service_fn(move |message: Message| {
        let journal = journal.clone();
        async move {
            let started = journal.tick();
            let offset = offset_of(&message);
            if hang_from.is_some_and(|from| offset >= from) {
                journal.hung.lock().expect("journal").push(offset);
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
            let ended = journal.tick();
            journal.executions.lock().expect("journal").push(Execution {
                consumer,
                partition: message.metadata().partition(),
                offset,
                attempt: message.metadata().attempt(),
                started,
                ended,
            });
            Ok::<_, HandlerError>(())
        }
    })
}

struct Running {
    shutdown: CancellationToken,
    task: JoinHandle<RunReport>,
}

impl Running {
    fn start(
        broker: &MemoryBroker,
        ordering: DeliveryOrder,
        handler: impl tower::Service<Message, Response = (), Error = HandlerError, Future: Send>
        + Send
        + 'static,
    ) -> Self {
        let (source, acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
        let consumer = Consumer::builder()
            .ordering(ordering)
            .max_in_flight(16)
            .commit_interval(Duration::from_millis(5))
            .build(source, acker, handler)
            .expect("valid settings");
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { consumer.run(shutdown).await.expect("the run succeeds") }
        });
        Self { shutdown, task }
    }

    async fn stop(self) -> RunReport {
        self.shutdown.cancel();
        self.task.await.expect("consumer task")
    }

    async fn crash(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// Waits until the group committed everything produced so far, while its
/// consumers run: committing is checked apart from the shutdown.
async fn wait_until_committed(broker: &MemoryBroker) {
    tokio::time::timeout(Duration::from_secs(30), async {
        while broker.lag(TOPIC, GROUP).expect("lag") > 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "lag {} within the guard time",
            broker.lag(TOPIC, GROUP).unwrap_or(u64::MAX)
        )
    });
}

fn produce(broker: &MemoryBroker, count: usize) {
    let records =
        (0..count).map(|n| Record::new(format!("{n}")).with_key(format!("account-{}", n % 13)));
    broker.send_batch(TOPIC, records).expect("produce");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalance_between_runtimes_processes_every_message_exactly_once() {
    const MESSAGES: usize = 600;
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 4).expect("topic");
    produce(&broker, MESSAGES);
    let journal = Journal::default();

    let first = Running::start(
        &broker,
        DeliveryOrder::Partition,
        journaling(&journal, 1, None),
    );
    journal.wait_for(60).await;
    let second = Running::start(
        &broker,
        DeliveryOrder::Partition,
        journaling(&journal, 2, None),
    );
    journal.wait_for(MESSAGES).await;
    wait_until_committed(&broker).await;
    let second_report = second.stop().await;
    let first_report = first.stop().await;

    let executions = journal.executions();
    // The old owner drained and committed the partitions it gave up before
    // releasing them, and the new owner started from that commit: nothing
    // ran twice.
    let mut runs: HashMap<(u32, i64), usize> = HashMap::new();
    for execution in &executions {
        *runs
            .entry((execution.partition, execution.offset))
            .or_default() += 1;
    }
    assert_eq!(runs.len(), MESSAGES);
    assert!(
        runs.values().all(|&count| count == 1),
        "a message ran twice"
    );
    // On a partition that changed hands, everything the first consumer ran
    // ended before the second consumer started anything.
    for partition in 0..4 {
        let last_of_first = executions
            .iter()
            .filter(|e| e.partition == partition && e.consumer == 1)
            .map(|e| e.ended)
            .max();
        let first_of_second = executions
            .iter()
            .filter(|e| e.partition == partition && e.consumer == 2)
            .map(|e| e.started)
            .min();
        if let (Some(last), Some(first)) = (last_of_first, first_of_second) {
            assert!(
                last < first,
                "partition {partition} ran on both consumers at once"
            );
        }
    }
    assert!(
        second_report.completed() > 0,
        "the second consumer took over partitions"
    );
    assert_eq!(
        first_report.completed() + second_report.completed(),
        MESSAGES as u64
    );
    assert_eq!(broker.lag(TOPIC, GROUP).expect("lag"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_runtimes_unfinished_messages_return_as_later_attempts() {
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 1).expect("topic");
    produce(&broker, 40);
    let journal = Journal::default();

    let crashed = Running::start(
        &broker,
        DeliveryOrder::Unordered,
        journaling(&journal, 1, Some(20)),
    );
    journal.wait_for(20).await;
    crashed.crash().await;

    let next = Running::start(
        &broker,
        DeliveryOrder::Unordered,
        journaling(&journal, 2, None),
    );
    journal.wait_for(40).await;
    wait_until_committed(&broker).await;
    next.stop().await;

    let hung = journal.hung.lock().expect("journal").clone();
    assert!(!hung.is_empty(), "the crash found messages in flight");
    let redelivered: HashMap<i64, u32> = journal
        .executions()
        .into_iter()
        .filter(|e| e.consumer == 2)
        .map(|e| (e.offset, e.attempt))
        .collect();
    for offset in hung {
        let attempt = redelivered.get(&offset).copied();
        assert!(
            attempt.is_some_and(|attempt| attempt >= 2),
            "offset {offset}, in flight at the crash, came back as attempt {attempt:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_fetch_failures_only_delay_the_runtime() {
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 2).expect("topic");
    produce(&broker, 50);
    broker
        .faults(TOPIC, GROUP)
        .expect("faults")
        .fail_next_fetches(3);
    let journal = Journal::default();
    let running = Running::start(
        &broker,
        DeliveryOrder::Partition,
        journaling(&journal, 1, None),
    );
    journal.wait_for(50).await;
    wait_until_committed(&broker).await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_commit_is_superseded_by_a_later_one() {
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 1).expect("topic");
    produce(&broker, 30);
    broker
        .faults(TOPIC, GROUP)
        .expect("faults")
        .fail_next_commits(2);
    let journal = Journal::default();
    let running = Running::start(
        &broker,
        DeliveryOrder::Partition,
        journaling(&journal, 1, None),
    );
    // A lost commit is made good by the next watermark, so keep messages
    // coming until one commit gets through.
    tokio::time::timeout(Duration::from_secs(30), async {
        while broker.lag(TOPIC, GROUP).expect("lag") > 0 {
            produce(&broker, 1);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("a commit got through");
    let report = running.stop().await;
    assert_eq!(
        report.ack_failures, 2,
        "each injected failure failed one commit"
    );
}
