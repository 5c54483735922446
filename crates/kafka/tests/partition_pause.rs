//! Pausing one partition (review C7) on Apache Kafka on 127.0.0.1:9092: a
//! hung handler holds its partition's watermark, and once that partition
//! has `max_uncommitted` deliveries past it the runtime asks the source to
//! pause that partition alone (`Source::pause`): the other partitions keep
//! flowing and committing. A partition the runtime paused stays paused
//! across the source's own backpressure and its watchdog, comes back where
//! it stopped (no gap, no duplicate) when the runtime resumes it, and a
//! new assignment of it starts unpaused. Skipped with a printed reason when
//! no broker listens, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_core::backend::{Limits, RevocationOutcome, Source, SourceEvent};
use intake_core::{Consumer, DeliveryOrder, HandlerError, Message, PartitionKey, Position};
use intake_kafka::KafkaSource;
use intake_kafka::rdkafka::ClientConfig;
use intake_kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use support::{KafkaBackend, unique};

const PARTITIONS: u32 = 4;
const PER_PARTITION: i64 = 200;
const MAX_IN_FLIGHT: usize = 8;
const MAX_UNCOMMITTED: usize = 16;
/// The key of the one message that hangs (offset 0 of partition 0).
const HUNG: &str = "hung";
const PATIENCE: Duration = Duration::from_secs(60);

/// Offsets handled, per partition.
type Handled = Arc<Mutex<HashMap<u32, Vec<i64>>>>;

fn handled_of(handled: &Handled, partition: u32) -> Vec<i64> {
    handled
        .lock()
        .map(|handled| handled.get(&partition).cloned().unwrap_or_default())
        .unwrap_or_default()
}

/// Produces `count` records to each partition of `partitions` of `topic`,
/// in order per partition, keyed `key(partition, offset)`.
async fn produce(
    kafka: &KafkaBackend,
    topic: &str,
    partitions: std::ops::Range<u32>,
    count: i64,
    key: impl Fn(u32, i64) -> String,
) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka.brokers())
        .set("linger.ms", "5")
        // Each partition's records in order, whatever the retries.
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    for partition in partitions {
        let keys: Vec<String> = (0..count).map(|offset| key(partition, offset)).collect();
        let payloads: Vec<String> = (0..count).map(|offset| offset.to_string()).collect();
        let sends = keys.iter().zip(&payloads).map(|(key, payload)| {
            producer.send(
                FutureRecord::<[u8], [u8]>::to(topic)
                    .partition(partition as i32)
                    .key(key.as_bytes())
                    .payload(payload.as_bytes()),
                Duration::from_secs(30),
            )
        });
        for delivered in futures_util::future::join_all(sends).await {
            delivered.map_err(|(error, _)| error).expect("produced");
        }
    }
}

/// The group's committed offset per partition (`None`: nothing committed).
async fn committed(kafka: &KafkaBackend, topic: &str, group: &str) -> Vec<Option<i64>> {
    let mut offsets = kafka.offsets(topic, group).await.expect("offsets");
    offsets.sort_by_key(|(partition, _, _)| *partition);
    offsets
        .into_iter()
        .map(|(_, committed, _)| committed)
        .collect()
}

/// Waits (bounded by [`PATIENCE`]) until `done` holds, asking every 250 ms;
/// panics with `state` when it never does.
async fn wait_until<F, Fut>(what: &str, mut done: F, state: impl Fn() -> String)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {PATIENCE:?} waiting for {what}: {}",
            state()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Partition 0 starts with the hung message; the runtime, with a window of
/// 16 and a budget of 8, must pause partition 0 alone: partitions 1 to 3,
/// produced once partition 0 is at its window, are handled to their end
/// and committed while the hung message holds,
/// nothing of partition 0 is committed, and partition 0 takes no more than
/// its window and one budget. Released, partition 0 goes on to its end.
async fn one_hung_handler_pauses_only_its_partition(ordering: DeliveryOrder) {
    support::init_tracing();
    let test = "one_hung_handler_pauses_only_its_partition";
    let Some(kafka) = KafkaBackend::real(test) else {
        return;
    };
    let topic = unique("intake-pause");
    kafka.create_topic(&topic, PARTITIONS).await.expect("topic");
    let key = |partition: u32, offset: i64| {
        if partition == 0 && offset == 0 {
            HUNG.to_owned()
        } else {
            format!("p{partition}-k{}", offset % 50)
        }
    };
    produce(&kafka, &topic, 0..1, PER_PARTITION, key).await;

    let group = unique("g");
    let source = kafka.source(&topic, &group).build().await.expect("source");
    let acker = source.acker();
    let handled: Handled = Arc::default();
    let release = Arc::new(Notify::new());
    let handler = {
        let (handled, release) = (handled.clone(), release.clone());
        tower::service_fn(move |message: Message| {
            let (handled, release) = (handled.clone(), release.clone());
            async move {
                if message.key().is_some_and(|key| &key[..] == HUNG.as_bytes()) {
                    release.notified().await;
                }
                let Position::Offset(offset) = message.metadata().position() else {
                    return Err(HandlerError::permanent("kafka positions are offsets"));
                };
                if let Ok(mut handled) = handled.lock() {
                    handled
                        .entry(message.metadata().partition())
                        .or_default()
                        .push(offset);
                }
                Ok::<_, HandlerError>(())
            }
        })
    };
    let consumer = Consumer::builder()
        .max_in_flight(MAX_IN_FLIGHT)
        .max_uncommitted(MAX_UNCOMMITTED)
        .ordering(ordering)
        .commit_interval(Duration::from_millis(50))
        .build(source, acker, handler)
        .expect("valid settings");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(consumer.run(shutdown.clone()));
    let counts = || -> Vec<usize> {
        (0..PARTITIONS)
            .map(|partition| handled_of(&handled, partition).len())
            .collect()
    };

    // librdkafka hands a fetch's partitions over one after the other: had
    // the other partitions' records been there from the start, they could
    // all have been taken before partition 0 reached its window. They are
    // produced once partition 0 is there (the hung message and 15 more
    // handled), so they can only flow past a partition over its window.
    wait_until(
        "partition 0 to reach its window",
        || {
            let handled = &handled;
            async move { handled_of(handled, 0).len() + 1 >= MAX_UNCOMMITTED }
        },
        || format!("handled per partition {:?}", counts()),
    )
    .await;
    produce(&kafka, &topic, 1..PARTITIONS, PER_PARTITION, key).await;

    let last_committed = Arc::new(Mutex::new(Vec::new()));
    wait_until(
        "partitions 1 to 3 to be handled to their end and committed while offset 0 of \
         partition 0 hangs",
        || {
            let (kafka, topic, group) = (&kafka, &topic, &group);
            let (handled, last_committed) = (&handled, &last_committed);
            async move {
                let committed = committed(kafka, topic, group).await;
                let done = (1..PARTITIONS).all(|partition| {
                    handled_of(handled, partition).len() == PER_PARTITION as usize
                        && committed.get(partition as usize) == Some(&Some(PER_PARTITION))
                });
                if let Ok(mut last) = last_committed.lock() {
                    *last = committed;
                }
                done
            }
        },
        || {
            format!(
                "handled per partition {:?}, committed {:?}",
                counts(),
                last_committed
                    .lock()
                    .map(|last| last.clone())
                    .unwrap_or_default()
            )
        },
    )
    .await;
    let while_hung = counts();
    let committed_while_hung = committed(&kafka, &topic, &group).await;
    assert!(
        committed_while_hung[0].is_none_or(|offset| offset == 0),
        "nothing of partition 0 is committed past its hung message: {committed_while_hung:?}"
    );
    assert!(
        while_hung[0] < MAX_UNCOMMITTED + MAX_IN_FLIGHT,
        "partition 0 took {} deliveries past its hung message, window {MAX_UNCOMMITTED}: \
         the source kept delivering it",
        while_hung[0]
    );

    release.notify_one();
    wait_until(
        "everything to be committed once the hung message finished",
        || {
            let (kafka, topic, group) = (&kafka, &topic, &group);
            async move {
                committed(kafka, topic, group)
                    .await
                    .iter()
                    .all(|offset| *offset == Some(PER_PARTITION))
            }
        },
        || format!("handled per partition {:?}", counts()),
    )
    .await;
    shutdown.cancel();
    let report = run.await.expect("join").expect("a clean run");
    assert_eq!(
        report.succeeded,
        u64::from(PARTITIONS) * PER_PARTITION as u64
    );
    for partition in 0..PARTITIONS {
        let mut offsets = handled_of(&handled, partition);
        offsets.sort_unstable();
        offsets.dedup();
        assert_eq!(
            offsets,
            (0..PER_PARTITION).collect::<Vec<_>>(),
            "partition {partition}: every offset handled"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_key_order_a_hung_handler_pauses_only_its_partition() {
    one_hung_handler_pauses_only_its_partition(DeliveryOrder::Key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unordered_a_hung_handler_pauses_only_its_partition() {
    one_hung_handler_pauses_only_its_partition(DeliveryOrder::Unordered).await;
}

/// The offsets taken per partition.
type Offsets = BTreeMap<u32, Vec<i64>>;

fn offset_of(message: &Message) -> i64 {
    match message.metadata().position() {
        Position::Offset(offset) => offset,
        other => panic!("a kafka position is an offset, not {other:?}"),
    }
}

/// Takes from `source` as the runtime would, `max` at a time, until
/// `enough` holds for what was taken or `patience` passed; sleeps `pace`
/// between takes (a slow runtime: the hand-over queue fills and the source
/// pauses its fetching for its own backpressure). Assignments and
/// revocations are answered at once.
async fn take_until(
    source: &mut KafkaSource,
    taken: &mut Offsets,
    max: usize,
    pace: Duration,
    patience: Duration,
    enough: impl Fn(&Offsets) -> bool,
) {
    let mut buffer = Vec::new();
    let deadline = tokio::time::Instant::now() + patience;
    while !enough(taken) {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return;
        }
        let Ok(event) = tokio::time::timeout(deadline - now, source.next(&mut buffer, max)).await
        else {
            return;
        };
        match event.expect("no source error") {
            SourceEvent::Delivered => {
                for message in buffer.drain(..) {
                    taken
                        .entry(message.metadata().partition())
                        .or_default()
                        .push(offset_of(&message));
                }
            }
            SourceEvent::Revoked(revocation) => revocation.complete(RevocationOutcome::default()),
            _ => {}
        }
        if !pace.is_zero() {
            tokio::time::sleep(pace).await;
        }
    }
}

/// Whether each partition of `partitions` was taken up to `end`.
fn taken_to(taken: &Offsets, partitions: std::ops::Range<u32>, end: i64) -> bool {
    partitions
        .into_iter()
        .all(|partition| taken.get(&partition).and_then(|o| o.last()) == Some(&(end - 1)))
}

/// A partition paused with `Source::pause` delivers nothing, while the
/// source pauses and resumes its whole assignment for its own backpressure
/// (a hand-over queue of 8) and its watchdog looks for stalled partitions
/// every 300 ms (the paused partition is behind its high watermark all
/// along); resumed, it goes on from where it stopped: every offset once,
/// in order, including those the source had fetched before the pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_partition_stays_paused_through_backpressure_and_resumes_where_it_stopped() {
    support::init_tracing();
    let test = "a_paused_partition_stays_paused_through_backpressure_and_resumes_where_it_stopped";
    let Some(kafka) = KafkaBackend::real(test) else {
        return;
    };
    const RECORDS: i64 = 1000;
    let topic = unique("intake-pause");
    kafka.create_topic(&topic, PARTITIONS).await.expect("topic");
    produce(
        &kafka,
        &topic,
        0..PARTITIONS,
        RECORDS,
        |partition, offset| format!("p{partition}-{offset}"),
    )
    .await;
    let mut source = kafka
        .source(&topic, &unique("g"))
        .watchdog_interval(Duration::from_millis(300))
        .build()
        .await
        .expect("source");
    source.set_limits(Limits::new(8, 64 << 20, Duration::from_secs(10)));
    let paused = PartitionKey::new(topic.as_str(), 0);

    let mut taken = Offsets::new();
    take_until(
        &mut source,
        &mut taken,
        8,
        Duration::ZERO,
        PATIENCE,
        |taken| taken.get(&0).is_some_and(|offsets| !offsets.is_empty()),
    )
    .await;
    let before_pause = taken.get(&0).map_or(0, Vec::len);
    assert!(before_pause > 0, "partition 0 delivers before the pause");
    assert!(
        source.pause(&paused),
        "the kafka source pauses one partition"
    );

    // Slowly (the queue fills, and the source pauses and resumes its
    // fetching for itself), then idle long enough for several watchdog
    // checks.
    take_until(
        &mut source,
        &mut taken,
        8,
        Duration::from_millis(2),
        PATIENCE,
        |taken| taken_to(taken, 1..PARTITIONS, RECORDS),
    )
    .await;
    assert!(
        taken_to(&taken, 1..PARTITIONS, RECORDS),
        "partitions 1 to 3 flow to their end while partition 0 is paused: {:?}",
        taken.iter().map(|(p, o)| (*p, o.len())).collect::<Vec<_>>()
    );
    take_until(
        &mut source,
        &mut taken,
        8,
        Duration::ZERO,
        Duration::from_secs(3),
        |_| false,
    )
    .await;
    let during_pause = taken.get(&0).map_or(0, Vec::len);
    assert_eq!(
        during_pause,
        before_pause,
        "partition 0 delivered {} records while paused",
        during_pause - before_pause
    );

    source.resume(&paused);
    take_until(
        &mut source,
        &mut taken,
        8,
        Duration::ZERO,
        PATIENCE,
        |taken| taken_to(taken, 0..1, RECORDS),
    )
    .await;
    for partition in 0..PARTITIONS {
        assert_eq!(
            taken.get(&partition).cloned().unwrap_or_default(),
            (0..RECORDS).collect::<Vec<_>>(),
            "partition {partition}: every offset once, in order"
        );
    }
    source.close().await.expect("close");
}

/// A pause ends with the assignment: a partition paused, revoked (another
/// member joined) and assigned again (it left) is fetched again without a
/// resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_assigned_afresh_is_no_longer_paused() {
    support::init_tracing();
    let test = "a_partition_assigned_afresh_is_no_longer_paused";
    let Some(kafka) = KafkaBackend::real(test) else {
        return;
    };
    const RECORDS: i64 = 20;
    let topic = unique("intake-pause");
    kafka.create_topic(&topic, PARTITIONS).await.expect("topic");
    produce(
        &kafka,
        &topic,
        0..PARTITIONS,
        RECORDS,
        |partition, offset| format!("p{partition}-{offset}"),
    )
    .await;
    let group = unique("g");
    let mut first = kafka.source(&topic, &group).build().await.expect("source");
    let mut taken = Offsets::new();
    take_until(
        &mut first,
        &mut taken,
        64,
        Duration::ZERO,
        PATIENCE,
        |taken| taken_to(taken, 0..PARTITIONS, RECORDS),
    )
    .await;
    assert!(taken_to(&taken, 0..PARTITIONS, RECORDS), "{taken:?}");
    assert!(first.pause(&PartitionKey::new(topic.as_str(), 0)));

    // Another member joins (every partition is revoked, some assigned
    // again), then leaves: the first gets all four afresh, and reads them
    // again from their start (nothing was committed).
    let mut second = kafka.source(&topic, &group).build().await.expect("source");
    let mut second_taken = Offsets::new();
    let mut again = Offsets::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while second_taken.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second member was never assigned a partition"
        );
        take_until(
            &mut first,
            &mut again,
            64,
            Duration::ZERO,
            Duration::from_millis(200),
            |_| false,
        )
        .await;
        take_until(
            &mut second,
            &mut second_taken,
            64,
            Duration::ZERO,
            Duration::from_millis(200),
            |_| false,
        )
        .await;
    }
    second.close().await.expect("close");
    drop(second);
    take_until(
        &mut first,
        &mut again,
        64,
        Duration::ZERO,
        PATIENCE,
        |again| {
            again
                .get(&0)
                .is_some_and(|offsets| offsets.len() >= RECORDS as usize)
        },
    )
    .await;
    assert_eq!(
        again.get(&0).map(|offsets| offsets.last().copied()),
        Some(Some(RECORDS - 1)),
        "partition 0, assigned afresh, is read again to its end without a resume: {:?}",
        again.iter().map(|(p, o)| (*p, o.len())).collect::<Vec<_>>()
    );
    first.close().await.expect("close");
}
