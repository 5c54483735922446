//! Parking through the runtime on the memory broker: parked messages come
//! back after their delay, later messages of a parked key wait behind it,
//! other keys flow, and nothing is lost.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;
use tower::{Layer, ServiceBuilder};

use super::*;
use crate::consumer::{Consumer, DeliveryOrder, RunReport};
use crate::dead_letter::DeadLetterLayer;
use crate::error::{ErrorClass, HandlerError};
use crate::memory::{MemoryBroker, Record};
use crate::retry::RetryLayer;
use crate::{Exponential, Message};

const TOPIC: &str = "invoices";
const GROUP: &str = "billing";

/// One handler execution: the payload, its attempt and park count, and
/// when it ran (wall clock, to compare with the due time it carried).
#[derive(Clone, Debug)]
struct Run {
    payload: String,
    key: String,
    attempt: u32,
    parks: u32,
    due: Option<u128>,
    at: u128,
    /// What the handler was told of the message's first delivery.
    first: Option<crate::FirstDelivery>,
}

#[derive(Clone, Default)]
struct Journal(Arc<Mutex<Vec<Run>>>);

impl Journal {
    fn record(&self, message: &Message) {
        let text = |bytes: Option<&bytes::Bytes>| {
            bytes.map_or_else(String::new, |b| String::from_utf8_lossy(b).into_owned())
        };
        self.0.lock().expect("journal").push(Run {
            payload: text(Some(message.payload())),
            key: text(message.key()),
            attempt: message.metadata().attempt(),
            parks: parks_header(message),
            due: message
                .headers()
                .get_str(DUE)
                .and_then(|due| due.parse().ok()),
            at: now_millis(),
            first: message.metadata().parked_from().cloned(),
        });
    }

    fn runs(&self) -> Vec<Run> {
        self.0.lock().expect("journal").clone()
    }

    /// Payloads handled to the end (the handler answered `Ok`).
    async fn wait_until(&self, done: impl Fn(&[Run]) -> bool) {
        tokio::time::timeout(Duration::from_secs(20), async {
            while !done(&self.runs()) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("not done within the guard time: {:?}", self.runs()));
    }
}

fn now_millis() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis()
}

/// A handler that journals every run and answers "retry later" for the
/// first `later_times` runs of each payload in `later`.
fn handler(
    journal: &Journal,
    later: &'static [&'static str],
    later_times: u32,
    delay: Duration,
) -> impl tower::Service<Message, Response = (), Error = HandlerError, Future: Send>
+ Clone
+ Send
+ 'static {
    let journal = journal.clone();
    let seen: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    tower::service_fn(move |message: Message| {
        let journal = journal.clone();
        let seen = Arc::clone(&seen);
        async move {
            journal.record(&message);
            let payload = String::from_utf8_lossy(message.payload()).into_owned();
            let runs = {
                let mut seen = seen.lock().expect("seen");
                let runs = seen.entry(payload.clone()).or_default();
                *runs += 1;
                *runs
            };
            if later.contains(&payload.as_str()) && runs <= later_times {
                return Err(HandlerError::retry_later("the ledger is down", delay));
            }
            Ok(())
        }
    })
}

fn start<H>(
    broker: &MemoryBroker,
    handler: H,
) -> (CancellationToken, tokio::task::JoinHandle<RunReport>)
where
    H: tower::Service<Message, Response = (), Error = HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    let (source, acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    let consumer = Consumer::builder()
        .ordering(DeliveryOrder::Key)
        .max_in_flight(16)
        .commit_interval(Duration::from_millis(5))
        .build(source, acker, handler)
        .expect("valid settings");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { consumer.run(shutdown).await.expect("the run succeeds") }
    });
    (shutdown, task)
}

fn produce(broker: &MemoryBroker, records: &[(&str, &str)]) {
    broker
        .send_batch(
            TOPIC,
            records
                .iter()
                .map(|(key, payload)| Record::new(payload.to_string()).with_key(key.to_string())),
        )
        .expect("produce");
}

/// Payloads whose handler ran to `Ok`, in the order they did, per key.
fn succeeded_by_key(
    runs: &[Run],
    later: &[&str],
    later_times: u32,
) -> HashMap<String, Vec<String>> {
    let mut counts: HashMap<&str, u32> = HashMap::new();
    let mut done: HashMap<String, Vec<String>> = HashMap::new();
    for run in runs {
        let count = counts.entry(run.payload.as_str()).or_default();
        *count += 1;
        let failed = later.contains(&run.payload.as_str()) && *count <= later_times;
        if !failed {
            done.entry(run.key.clone())
                .or_default()
                .push(run.payload.clone());
        }
    }
    done
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_message_comes_back_after_its_delay_and_does_not_hold_its_partition() {
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 1).expect("topic");
    let journal = Journal::default();
    let parking = broker.parking(TOPIC, GROUP).expect("parking");
    let stack = ServiceBuilder::new()
        .layer(ParkingLayer::new(parking.clone()))
        .service(handler(&journal, &["a1"], 1, Duration::from_millis(400)));
    let (shutdown, task) = start(&broker, stack);
    produce(&broker, &[("a", "a1"), ("b", "b1"), ("b", "b2")]);

    // The partition's commit moves past the parked message at once: its
    // copy is parked, the original acknowledged.
    tokio::time::timeout(Duration::from_secs(10), async {
        while broker.committed(TOPIC, GROUP).expect("committed")[0] != Some(3) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the parked message's offset is committed before it comes back");
    assert_eq!(parking.waiting(), 1, "{:?}", journal.runs());

    journal
        .wait_until(|runs| runs.iter().filter(|run| run.payload == "a1").count() == 2)
        .await;
    shutdown.cancel();
    let report = task.await.expect("run");

    let runs = journal.runs();
    let back = runs
        .iter()
        .filter(|run| run.payload == "a1")
        .nth(1)
        .expect("a1 came back");
    let due = back.due.expect("a parked copy carries its due time");
    assert!(
        back.at >= due,
        "handled at {} before its due time {due}",
        back.at
    );
    assert_eq!(back.parks, 1);
    assert_eq!(back.attempt, 2, "the attempts travel with the parked copy");
    assert_eq!(report.parked, 1);
    assert_eq!(report.succeeded, 3);
    // b's messages ran while a1 was parked.
    let first_a1 = runs.iter().position(|run| run.payload == "a1").expect("a1");
    let b2 = runs.iter().position(|run| run.payload == "b2").expect("b2");
    let second_a1 = runs
        .iter()
        .rposition(|run| run.payload == "a1")
        .expect("a1");
    assert!(first_a1 < b2 && b2 < second_a1, "{runs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_messages_of_a_parked_key_wait_behind_it_and_other_keys_flow() {
    const LATER: &[&str] = &["k1-0"];
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 2).expect("topic");
    let journal = Journal::default();
    let layer = ParkingLayer::new(broker.parking(TOPIC, GROUP).expect("parking"));
    let stack = ServiceBuilder::new().layer(layer.clone()).service(handler(
        &journal,
        LATER,
        2,
        Duration::from_millis(150),
    ));
    let (shutdown, task) = start(&broker, stack);
    let records: Vec<(String, String)> = (0..5)
        .flat_map(|n| {
            ["k1", "k2", "k3"]
                .into_iter()
                .map(move |key| (key.to_owned(), format!("{key}-{n}")))
        })
        .collect();
    let borrowed: Vec<(&str, &str)> = records
        .iter()
        .map(|(key, payload)| (key.as_str(), payload.as_str()))
        .collect();
    produce(&broker, &borrowed);

    journal
        .wait_until(|runs| {
            succeeded_by_key(runs, LATER, 2)
                .values()
                .map(Vec::len)
                .sum::<usize>()
                == 15
        })
        .await;
    shutdown.cancel();
    let report = task.await.expect("run");

    let runs = journal.runs();
    let done = succeeded_by_key(&runs, LATER, 2);
    for key in ["k1", "k2", "k3"] {
        let expected: Vec<String> = (0..5).map(|n| format!("{key}-{n}")).collect();
        assert_eq!(done[key], expected, "order of {key}: {runs:?}");
    }
    // k1's later messages never ran while k1-0 was parked: each ran once.
    for n in 1..5 {
        let payload = format!("k1-{n}");
        let count = runs.iter().filter(|run| run.payload == payload).count();
        assert_eq!(count, 1, "{payload} ran {count} times: {runs:?}");
    }
    // The other keys finished before k1-0 was done.
    let k1_done = runs
        .iter()
        .rposition(|run| run.payload == "k1-0")
        .expect("k1-0");
    for key in ["k2", "k3"] {
        let last = runs
            .iter()
            .rposition(|run| run.payload == format!("{key}-4"))
            .expect("last of key");
        assert!(last < k1_done, "{key} waited for k1: {runs:?}");
    }
    assert!(report.parked >= 2 + 4, "{report:?}");
    assert_eq!(
        layer.parked(),
        0,
        "every parked message came back and finished"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_parked_as_often_as_allowed_is_dead_lettered() {
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 1).expect("topic");
    let journal = Journal::default();
    let stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(
            broker.dead_letter_sink(TOPIC, GROUP).expect("sink"),
        ))
        .layer(ParkingLayer::new(broker.parking(TOPIC, GROUP).expect("parking")).max_parks(2))
        .service(handler(
            &journal,
            &["a1"],
            u32::MAX,
            Duration::from_millis(20),
        ));
    let (shutdown, task) = start(&broker, stack);
    produce(&broker, &[("a", "a1"), ("a", "a2")]);

    tokio::time::timeout(Duration::from_secs(10), async {
        while broker
            .dead_letters(TOPIC, GROUP)
            .expect("letters")
            .is_empty()
            || !journal.runs().iter().any(|run| run.payload == "a2")
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("a1 dead-lettered and a2 handled");
    shutdown.cancel();
    let report = task.await.expect("run");

    let letters = broker.dead_letters(TOPIC, GROUP).expect("letters");
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert_eq!(letter.class, ErrorClass::Permanent);
    assert_eq!(letter.attempts, 3, "three runs: the first and two parks");
    assert!(
        letter.first_failed_at < letter.failed_at,
        "the first failure's time travelled with the parks"
    );
    let runs = journal.runs();
    assert_eq!(runs.iter().filter(|run| run.payload == "a1").count(), 3);
    let a2 = runs.iter().position(|run| run.payload == "a2").expect("a2");
    let last_a1 = runs
        .iter()
        .rposition(|run| run.payload == "a1")
        .expect("a1");
    assert!(
        last_a1 < a2,
        "a2 waited behind a1 until a1 was given up: {runs:?}"
    );
    // a2 came back while a1 was parked again, and went back behind it.
    assert!(
        report.parked >= 4,
        "a1 twice, a2 behind it each time: {report:?}"
    );
    assert_eq!(report.dead_lettered, 1);
}

/// A parking place that refuses every park.
struct Refusing;

#[async_trait::async_trait]
impl Parking for Refusing {
    async fn park(&self, _: &Message, _: Duration) -> Result<Parked, ParkError> {
        Err(ParkError::new("the retry topic is full"))
    }

    fn is_returned_copy(&self, _: &Message) -> bool {
        false
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_park_leaves_the_failure_retryable_and_the_message_unlost() {
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 1).expect("topic");
    let journal = Journal::default();
    let stack = ServiceBuilder::new()
        .layer(ParkingLayer::new(Refusing))
        .service(handler(&journal, &["a1"], 2, Duration::from_secs(3600)));
    let (source, acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    let consumer = Consumer::builder()
        .ordering(DeliveryOrder::Key)
        .backoff(Exponential::new(
            Duration::from_millis(5),
            Duration::from_millis(20),
        ))
        .commit_interval(Duration::from_millis(5))
        .build(source, acker, stack)
        .expect("valid settings");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { consumer.run(shutdown).await.expect("the run succeeds") }
    });
    produce(&broker, &[("a", "a1")]);
    journal
        .wait_until(|runs| runs.iter().filter(|run| run.payload == "a1").count() == 3)
        .await;
    shutdown.cancel();
    let report = task.await.expect("run");
    assert_eq!(report.parked, 0);
    assert_eq!(
        report.redispatched, 2,
        "retried in process, as any retryable failure"
    );
    assert_eq!(report.succeeded, 1);
}

#[tokio::test]
async fn the_retry_layer_asks_for_later_once_its_attempts_are_used_up_and_never_retries_a_later() {
    let calls = Arc::new(Mutex::new(0u32));
    let failing = {
        let calls = Arc::clone(&calls);
        tower::service_fn(move |_: Message| {
            *calls.lock().expect("calls") += 1;
            async { Err::<(), _>(HandlerError::retryable("the ledger is down")) }
        })
    };
    let mut retry = ServiceBuilder::new()
        .layer(
            RetryLayer::new(Exponential::new(Duration::ZERO, Duration::ZERO).max_retries(2))
                .then_retry_later(Duration::from_secs(30)),
        )
        .service(failing);
    let message = || {
        Message::new(
            "m",
            crate::Metadata::new("t".into(), 0, crate::Position::Offset(0)),
        )
    };
    let error = tower::Service::call(&mut retry, message())
        .await
        .expect_err("fails");
    assert_eq!(*calls.lock().expect("calls"), 3);
    assert_eq!(error.retry_after(), Some(Duration::from_secs(30)));
    assert_eq!(error.attempts(), 3);

    let later = {
        let calls = Arc::clone(&calls);
        tower::service_fn(move |_: Message| {
            *calls.lock().expect("calls") += 1;
            async {
                Err::<(), _>(HandlerError::retry_later(
                    "rate limited",
                    Duration::from_secs(5),
                ))
            }
        })
    };
    let mut retry = ServiceBuilder::new()
        .layer(RetryLayer::new(
            Exponential::new(Duration::ZERO, Duration::ZERO).max_retries(2),
        ))
        .service(later);
    *calls.lock().expect("calls") = 0;
    let error = tower::Service::call(&mut retry, message())
        .await
        .expect_err("fails");
    assert_eq!(
        *calls.lock().expect("calls"),
        1,
        "a later is not retried now"
    );
    assert_eq!(error.retry_after(), Some(Duration::from_secs(5)));
    assert!(
        !error.affects_backoff(),
        "a later says nothing about the consumer's health"
    );
}

/// A parking place whose broker redelivers the original itself (NATS).
struct HandingBack;

#[async_trait::async_trait]
impl Parking for HandingBack {
    async fn park(&self, _: &Message, _: Duration) -> Result<Parked, ParkError> {
        Ok(Parked::HandedBack)
    }

    fn is_returned_copy(&self, _: &Message) -> bool {
        false
    }
}

#[tokio::test]
async fn a_message_handed_back_passes_a_dead_letter_layer_as_parked_not_failed() {
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 1).expect("topic");
    let mut stack = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(
            broker.dead_letter_sink(TOPIC, GROUP).expect("sink"),
        ))
        .layer(ParkingLayer::new(HandingBack))
        .service(tower::service_fn(|_: Message| async {
            Err::<(), _>(HandlerError::retry_later(
                "rate limited",
                Duration::from_secs(5),
            ))
        }));
    let message = Message::new(
        "m",
        crate::Metadata::new(TOPIC.into(), 0, crate::Position::Offset(0)),
    )
    .with_key("a");
    let error = tower::Service::call(&mut stack, message)
        .await
        .expect_err("parked");
    assert!(error.cause().is::<ParkedMessage>(), "{error:?}");
    assert_eq!(error.retry_after(), Some(Duration::from_secs(5)));
    assert!(!error.affects_backoff());
    assert!(
        broker
            .dead_letters(TOPIC, GROUP)
            .expect("letters")
            .is_empty(),
        "a parked message is no dead letter"
    );
}

#[test]
fn a_copy_back_through_a_return_destination_keeps_its_origin_keys_order() {
    use super::keys::{Admission, ParkId, ParkedKeys};
    let keys = ParkedKeys::with_capacity(usize::MAX);
    let now = SystemTime::now();
    let key = bytes::Bytes::from_static(b"a");
    let origin: crate::SourceName = "orders".into();
    let consumed = |source: &str, offset: i64, headers: &[(&str, &str)]| {
        let mut all = crate::Headers::default();
        for (name, value) in headers {
            all.insert(name.to_string(), value.to_string());
        }
        Message::new(
            "m",
            crate::Metadata::new(source.into(), 0, crate::Position::Offset(offset)),
        )
        .with_key(key.clone())
        .with_headers(all)
    };
    // a1 was parked from `orders` as copy 7.
    let a1 = consumed("orders", 1, &[]);
    keys.parked(
        &origin,
        &key,
        ParkId::of(&a1),
        ParkId::Moved(7),
        now,
        Duration::from_secs(1),
    );
    // a2 of the same key, consumed from the origin, waits behind it.
    let a2 = consumed("orders", 2, &[]);
    assert!(matches!(
        keys.admit(&a2, &key, Duration::from_secs(600), now),
        Admission::Follow { .. }
    ));
    // a1's copy comes back through the group's return topic: it is the
    // head of its origin's key, not a stranger of another source.
    let back = consumed(
        "orders.billing.returned",
        0,
        &[(PARK_ID, "7"), (ORIGIN, "orders")],
    );
    assert_eq!(
        keys.admit(&back, &key, Duration::from_secs(600), now),
        Admission::Head(ParkId::Moved(7))
    );
    keys.done(&super::keys::origin_of(&back), &key, ParkId::Moved(7));
    assert_eq!(keys.len(), 0);
}

#[test]
fn a_key_waits_for_a_late_parked_message_as_long_as_its_delay_then_lets_go() {
    use super::keys::{Admission, ParkId, ParkedKeys};
    let keys = ParkedKeys::with_capacity(usize::MAX);
    let parked_at = SystemTime::now();
    let key = bytes::Bytes::from_static(b"a");
    let source: crate::SourceName = "orders".into();
    let message = |offset: i64| {
        Message::new(
            "m",
            crate::Metadata::new(source.clone(), 0, crate::Position::Offset(offset)),
        )
        .with_key(key.clone())
    };
    let delay = Duration::from_secs(3600);
    keys.parked(
        &source,
        &key,
        ParkId::of(&message(1)),
        ParkId::Moved(1),
        parked_at + delay,
        delay,
    );
    let overdue_after = Duration::from_secs(600);
    // Twenty minutes late: a broker's longer delay tier may do that to an
    // hour's park; the key still waits.
    let late = parked_at + delay + Duration::from_secs(1200);
    assert!(matches!(
        keys.admit(&message(2), &key, overdue_after, late),
        Admission::Follow { .. }
    ));
    // Late by more than its own delay: it is not coming back.
    let gone = parked_at + delay + delay + Duration::from_secs(1);
    assert_eq!(
        keys.admit(&message(3), &key, overdue_after, gone),
        Admission::Run
    );
    assert_eq!(keys.len(), 0);
}

/// The highest consumer-backoff level seen at the commit ticks.
#[derive(Default)]
struct BackoffLevels(std::sync::atomic::AtomicU32);

impl crate::observer::ConsumerObserver for BackoffLevels {
    fn on_backoff(&self, level: u32) {
        self.0
            .fetch_max(level, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Runs 40 messages of keys `a` and `b`; every `a` message fails with
/// `failure` on its first run. Returns the highest backoff level seen.
async fn highest_backoff_level(failure: fn() -> HandlerError) -> u32 {
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 2).expect("topic");
    let journal = Journal::default();
    let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stack = ServiceBuilder::new()
        .layer(ParkingLayer::new(
            broker.parking(TOPIC, GROUP).expect("parking"),
        ))
        .service(tower::service_fn({
            let journal = journal.clone();
            let handled = Arc::clone(&handled);
            move |message: Message| {
                journal.record(&message);
                let first = message.metadata().attempt() == 1;
                let outcome = if message.key().is_some_and(|key| &key[..] == b"a") && first {
                    Err(failure())
                } else {
                    handled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok(())
                };
                std::future::ready(outcome)
            }
        }));
    let levels = Arc::new(BackoffLevels::default());
    let (source, acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    let consumer = Consumer::builder()
        .ordering(DeliveryOrder::Key)
        .commit_interval(Duration::from_millis(5))
        .backoff(Exponential::new(
            Duration::from_millis(50),
            Duration::from_millis(50),
        ))
        .observer(levels.clone())
        .build(source, acker, stack)
        .expect("valid settings");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { consumer.run(shutdown).await.expect("the run succeeds") }
    });
    let records: Vec<(String, String)> = (0..40)
        .map(|n| {
            let key = if n % 2 == 0 { "a" } else { "b" };
            (key.to_owned(), format!("{key}-{n}"))
        })
        .collect();
    let borrowed: Vec<(&str, &str)> = records
        .iter()
        .map(|(key, payload)| (key.as_str(), payload.as_str()))
        .collect();
    produce(&broker, &borrowed);
    tokio::time::timeout(Duration::from_secs(20), async {
        while handled.load(std::sync::atomic::Ordering::SeqCst) < 40 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("not all handled: {:?}", journal.runs()));
    shutdown.cancel();
    task.await.expect("run");
    levels.0.load(std::sync::atomic::Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_key_does_not_push_the_consumer_into_backoff_where_a_plain_retry_does() {
    let parked = highest_backoff_level(|| {
        HandlerError::retry_later("the ledger is down", Duration::from_millis(20))
    })
    .await;
    assert_eq!(parked, 0, "parking one key backed the whole consumer off");
    // The same failures as plain retries do back the consumer off: the
    // observer sees it.
    let retried = highest_backoff_level(|| HandlerError::retryable("the ledger is down")).await;
    assert!(retried > 0, "plain retryable failures never backed off");
}

/// A copy of `payload` as it comes back from a park due `due_in` from now,
/// with the due time it carries in milliseconds.
fn back_early(payload: &'static str, due_in: Duration) -> (Message, u128) {
    let due = now_millis() + due_in.as_millis();
    let mut headers = crate::Headers::default();
    headers.insert(DUE.to_string(), due.to_string());
    headers.insert(PARK_ID.to_string(), "1".to_string());
    let message = Message::new(
        payload,
        crate::Metadata::new(TOPIC.into(), 0, crate::Position::Offset(0)),
    )
    .with_key("a")
    .with_headers(headers);
    (message, due)
}

/// A parking that takes every message for a copy it gave back, as a
/// backend does for what it reads from its return destination.
struct GivesBack(crate::memory::MemoryParking);

#[async_trait::async_trait]
impl Parking for GivesBack {
    async fn park(&self, message: &Message, delay: Duration) -> Result<Parked, ParkError> {
        self.0.park(message, delay).await
    }

    fn is_returned_copy(&self, _: &Message) -> bool {
        true
    }
}

/// Handles `message`, a copy back from a park, once through a parking
/// layer set up by `configure`, within a guard time, and returns the
/// handler's runs.
async fn handle_once(
    message: Message,
    configure: impl FnOnce(ParkingLayer) -> ParkingLayer,
) -> Vec<Run> {
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 1).expect("topic");
    let journal = Journal::default();
    let stack = ServiceBuilder::new()
        .layer(configure(ParkingLayer::new(GivesBack(
            broker.parking(TOPIC, GROUP).expect("parking"),
        ))))
        .service(handler(&journal, &[], 0, Duration::ZERO));
    tokio::time::timeout(
        Duration::from_secs(20),
        tower::ServiceExt::oneshot(stack, message),
    )
    .await
    .expect("handled within the guard time")
    .expect("handled");
    journal.runs()
}

#[tokio::test]
async fn a_copy_that_comes_back_before_its_due_time_is_handled_only_once_due() {
    // RabbitMQ's quorum-queue expiry gives copies back up to ~20 ms early
    // on a loaded machine (measured in the chaos suite): the layer waits.
    let (message, due) = back_early("early", Duration::from_millis(120));
    let runs = handle_once(message, |layer| layer).await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(
        runs[0].at >= due,
        "handled at {} ms, due at {due} ms",
        runs[0].at
    );
}

#[tokio::test]
async fn a_copy_due_further_ahead_than_the_early_wait_runs_as_it_comes() {
    // A due time an hour ahead is no broker's early expiry but clocks that
    // disagree between hosts: holding it would stall the partition.
    let (message, due) = back_early("skewed", Duration::from_secs(3600));
    let runs = handle_once(message, |layer| {
        layer.max_early_wait(Duration::from_secs(1))
    })
    .await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(runs[0].at < due, "ran as it came");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn park_headers_a_producer_wrote_are_ignored_and_a_copy_keeps_its_first_delivery() {
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 1).expect("topic");
    // A producer writes what only a park should: due in 900 ms (it would
    // be held unpolled), parked ten times already (the first "later" would
    // fail for good), from another source and position (it would steer the
    // order per key and the exactly-once identity).
    let due = now_millis() + 900;
    let forged = [
        (DUE, due.to_string()),
        (PARKS, "10".to_owned()),
        (ATTEMPTS, "99".to_owned()),
        (PARK_ID, "7".to_owned()),
        (ORIGIN, "payments".to_owned()),
        (ORIGIN_PARTITION, "5".to_owned()),
        (ORIGIN_POSITION, "12345".to_owned()),
    ];
    let mut record = Record::new("forged").with_key("a");
    for (name, value) in &forged {
        record = record.with_header(*name, value.clone());
    }
    broker.send(TOPIC, record).expect("produce");
    produce(&broker, &[("b", "plain")]);
    let journal = Journal::default();
    let handler = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(
            broker.dead_letter_sink(TOPIC, GROUP).expect("sink"),
        ))
        .layer(ParkingLayer::new(broker.parking(TOPIC, GROUP).expect("parking")).max_parks(3))
        // Parked twice, then done.
        .service(handler(&journal, &["forged"], 2, Duration::from_millis(50)));
    let (shutdown, task) = start(&broker, handler);
    journal
        .wait_until(|runs| runs.iter().filter(|run| run.payload == "forged").count() == 3)
        .await;
    shutdown.cancel();
    let report = task.await.expect("the run");
    let runs: Vec<Run> = journal
        .runs()
        .into_iter()
        .filter(|run| run.payload == "forged")
        .collect();
    assert!(
        runs[0].at < due,
        "held back by a due time a producer wrote: ran at {}, 'due' {due}",
        runs[0].at
    );
    assert_eq!(
        (runs[0].attempt, runs[0].parks, runs[0].first.clone()),
        (1, 0, None),
        "the first delivery sees no park a producer claimed: {runs:?}"
    );
    let first = crate::FirstDelivery {
        source: TOPIC.into(),
        partition: 0,
        position: crate::Position::Offset(0),
    };
    for (run, parks) in runs[1..].iter().zip([1, 2]) {
        assert_eq!(run.parks, parks, "{runs:?}");
        assert_eq!(
            run.first.as_ref(),
            Some(&first),
            "a copy is the message of its first delivery, however often parked: {runs:?}"
        );
    }
    assert_eq!(report.parked, 2, "{report:?}");
    assert!(
        broker
            .dead_letters(TOPIC, GROUP)
            .expect("letters")
            .is_empty(),
        "a forged park count made a 'later' permanent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_of_a_returned_copy_names_its_first_delivery() {
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 1).expect("topic");
    produce(&broker, &[("a", "x"), ("a", "poison")]);
    let journal = Journal::default();
    let failing = handler(&journal, &["poison"], 1, Duration::from_millis(20));
    // Once back, "poison" fails for good inside the parking layer, where
    // the dead-letter layer sees the copy's first delivery.
    let handler = ParkingLayer::new(broker.parking(TOPIC, GROUP).expect("parking")).layer(
        DeadLetterLayer::new(broker.dead_letter_sink(TOPIC, GROUP).expect("sink")).layer(
            tower::service_fn(move |message: Message| {
                let mut failing = failing.clone();
                async move {
                    let back = message.metadata().parked_from().is_some();
                    tower::Service::call(&mut failing, message).await?;
                    if back {
                        return Err(HandlerError::permanent("still poison"));
                    }
                    Ok(())
                }
            }),
        ),
    );
    let (shutdown, task) = start(&broker, handler);
    tokio::time::timeout(Duration::from_secs(20), async {
        while broker
            .dead_letters(TOPIC, GROUP)
            .expect("letters")
            .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("dead-lettered within the guard time");
    shutdown.cancel();
    task.await.expect("the run");
    let letters = broker.dead_letters(TOPIC, GROUP).expect("letters");
    let metadata = letters[0].message.metadata();
    assert_eq!(
        (
            &**metadata.source(),
            metadata.partition(),
            metadata.position()
        ),
        (TOPIC, 0, crate::Position::Offset(1)),
        "the letter names the message's own first delivery, not the copy's"
    );
}

#[test]
fn followers_behind_a_message_due_and_not_back_wait_longer_each_time_not_a_millisecond() {
    use super::keys::{Admission, ParkId, ParkedKeys};
    let keys = ParkedKeys::with_capacity(usize::MAX);
    let now = SystemTime::now();
    let key = bytes::Bytes::from_static(b"a");
    let source: crate::SourceName = TOPIC.into();
    let message = |offset: i64| {
        Message::new(
            "m",
            crate::Metadata::new(source.clone(), 0, crate::Position::Offset(offset)),
        )
        .with_key(key.clone())
    };
    // The head was due a second ago and is not back here: it is late, or
    // another consumer of the group took it.
    keys.parked(
        &source,
        &key,
        ParkId::of(&message(1)),
        ParkId::Moved(1),
        now - Duration::from_secs(1),
        Duration::from_secs(5),
    );
    let overdue_after = Duration::from_secs(600);
    // A follower parked behind it before, back as copy 2.
    keys.parked(
        &source,
        &key,
        ParkId::of(&message(2)),
        ParkId::Moved(2),
        now,
        Duration::from_millis(1),
    );
    let copy = message(2).with_headers([(PARK_ID, "2")].into_iter().collect());
    // The follower comes back each time it is due, until the head is
    // overdue and it runs.
    let mut at = now;
    let mut waits = Vec::new();
    loop {
        match keys.admit(&copy, &key, overdue_after, at) {
            Admission::Follow { delay } => {
                // Parked again, as the layer does.
                keys.parked(
                    &source,
                    &key,
                    ParkId::Moved(2),
                    ParkId::Moved(2),
                    at + delay,
                    delay,
                );
                waits.push(delay);
                at += delay;
            }
            Admission::Head(_) => break,
            Admission::Run => panic!("a parked follower ran without its turn"),
        }
        assert!(waits.len() < 100, "{waits:?}");
    }
    // Each wait is twice the one before: a copy a moment late costs a
    // millisecond, one gone elsewhere about twenty parks until it is
    // overdue, where the loop once made one per millisecond for ten
    // minutes.
    assert!(waits[0] <= Duration::from_millis(2), "{waits:?}");
    assert!(waits.windows(2).all(|pair| pair[1] >= pair[0]), "{waits:?}");
    assert!(waits.len() <= 25, "{} parks: {waits:?}", waits.len());
    assert!(waits.iter().all(|wait| *wait <= overdue_after), "{waits:?}");
    assert!(at >= now + overdue_after, "ran before its head was overdue");
}

#[test]
fn a_follower_behind_a_head_running_here_waits_a_part_of_its_run() {
    use super::keys::{Admission, ParkId, ParkedKeys};
    let keys = ParkedKeys::with_capacity(usize::MAX);
    let parked_at = SystemTime::now();
    let key = bytes::Bytes::from_static(b"a");
    let source: crate::SourceName = TOPIC.into();
    let copy = Message::new(
        "m",
        crate::Metadata::new(source.clone(), 0, crate::Position::Offset(9)),
    )
    .with_key(key.clone())
    .with_headers([(PARK_ID, "1")].into_iter().collect());
    keys.parked(
        &source,
        &key,
        ParkId::Moved(1),
        ParkId::Moved(1),
        parked_at,
        Duration::from_millis(10),
    );
    let overdue_after = Duration::from_secs(600);
    // The head came back and runs, for eight seconds by now.
    assert_eq!(
        keys.admit(&copy, &key, overdue_after, parked_at),
        Admission::Head(ParkId::Moved(1))
    );
    let later = Message::new(
        "m",
        crate::Metadata::new(source.clone(), 0, crate::Position::Offset(10)),
    )
    .with_key(key.clone());
    match keys.admit(
        &later,
        &key,
        overdue_after,
        parked_at + Duration::from_secs(8),
    ) {
        Admission::Follow { delay } => assert!(delay >= Duration::from_secs(2), "{delay:?}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_parked_keys_kept_are_bounded() {
    use super::keys::{Admission, ParkId, ParkedKeys};
    let keys = ParkedKeys::with_capacity(2);
    let now = SystemTime::now();
    let source: crate::SourceName = TOPIC.into();
    let message = |key: &'static str, offset: i64| {
        Message::new(
            "m",
            crate::Metadata::new(source.clone(), 0, crate::Position::Offset(offset)),
        )
        .with_key(key)
    };
    for (offset, key) in ["a", "b", "c"].into_iter().enumerate() {
        let offset = offset as i64;
        keys.parked(
            &source,
            &bytes::Bytes::from_static(key.as_bytes()),
            ParkId::of(&message(key, offset)),
            ParkId::Moved(offset as u64),
            now + Duration::from_secs(60),
            Duration::from_secs(60),
        );
    }
    assert_eq!(keys.len(), 2, "at most the capacity is kept");
    let later = |key: &'static str| {
        keys.admit(
            &message(key, 10),
            &bytes::Bytes::from_static(key.as_bytes()),
            Duration::from_secs(600),
            now,
        )
    };
    assert!(matches!(later("a"), Admission::Follow { .. }));
    assert_eq!(later("c"), Admission::Run, "an untracked key flows");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_per_key_follows_the_consumers_key_function() {
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 1).expect("topic");
    // No broker key: the account is a header, as the consumer orders by.
    for (account, payload) in [("A", "a1"), ("A", "a2"), ("B", "b1"), ("A", "a3")] {
        broker
            .send(TOPIC, Record::new(payload).with_header("account", account))
            .expect("produce");
    }
    fn account(message: &Message) -> Option<&[u8]> {
        message.headers().get("account").map(|value| &value[..])
    }
    let journal = Journal::default();
    let handler = ParkingLayer::new(broker.parking(TOPIC, GROUP).expect("parking"))
        .key_with(account)
        .layer(handler(&journal, &["a1"], 1, Duration::from_millis(100)));
    let (source, acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    let consumer = Consumer::builder()
        .ordering(DeliveryOrder::Key)
        .key_with(account)
        .commit_interval(Duration::from_millis(5))
        .build(source, acker, handler)
        .expect("valid settings");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { consumer.run(shutdown).await.expect("the run") }
    });
    journal
        .wait_until(|runs| {
            let count = |payload: &str| runs.iter().filter(|run| run.payload == payload).count();
            (count("a1"), count("a2"), count("a3"), count("b1")) == (2, 1, 1, 1)
        })
        .await;
    shutdown.cancel();
    task.await.expect("the run");
    let order: Vec<String> = journal
        .runs()
        .into_iter()
        .filter(|run| run.payload.starts_with('a'))
        .skip(1)
        .map(|run| run.payload)
        .collect();
    assert_eq!(
        order,
        ["a1", "a2", "a3"],
        "a2 and a3 of account A ran before a1, parked: their key is the header"
    );
}
