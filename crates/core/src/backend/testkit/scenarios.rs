//! The scenarios every backend passes unchanged. Each is named after the
//! behaviour it proves and fails with a message saying what went wrong.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::harness::{Ledger, Running, id_of, numbered, unique_group, wait_until_acknowledged};
use super::{Backend, ConnectSettings, TestMessage};
use crate::app::App;
use crate::consumer::{Consumer, DeliveryOrder, SharedBudget};
use crate::error::HandlerError;
use crate::message::Message;

type Outcome = Result<(), HandlerError>;

fn recording(
    ledger: &Ledger,
) -> impl tower::Service<
    Message,
    Response = (),
    Error = HandlerError,
    Future = impl Future<Output = Outcome> + Send + use<>,
> + Clone
+ Send
+ use<> {
    recording_after(ledger, None)
}

/// Like [`recording`], each handler first waiting `pause` (so that
/// deliveries overlap and fill a budget).
fn recording_after(
    ledger: &Ledger,
    pause: Option<Duration>,
) -> impl tower::Service<
    Message,
    Response = (),
    Error = HandlerError,
    Future = impl Future<Output = Outcome> + Send + use<>,
> + Clone
+ Send
+ use<> {
    let ledger = ledger.clone();
    tower::service_fn(move |message: Message| {
        let ledger = ledger.clone();
        async move {
            if let Some(pause) = pause {
                tokio::time::sleep(pause).await;
            }
            ledger.record(id_of(&message)?);
            Ok(())
        }
    })
}

/// Every produced message reaches a handler, and afterwards nothing is left
/// unacknowledged.
pub async fn delivers_every_message<B: Backend>(backend: &B) {
    let partitions = if backend.capabilities().partitions {
        4
    } else {
        1
    };
    let source = backend
        .create_source(partitions)
        .await
        .expect("create the source");
    let group = unique_group("delivers");
    backend
        .produce(&source, numbered(0, 500))
        .await
        .expect("produce");
    let ledger = Ledger::default();
    let consumer = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder().ordering(DeliveryOrder::Key),
        64,
        recording(&ledger),
    )
    .await
    .expect("connect");
    ledger.wait_for_all(500, "all 500 messages").await;
    let report = consumer.stop().await;
    assert!(report.succeeded >= 500, "{} handled", report.succeeded);
    assert_eq!(
        backend
            .unacknowledged(&source, &group)
            .await
            .expect("inspect"),
        0,
        "{}: everything handled is acknowledged after a graceful shutdown",
        backend.name()
    );
}

/// Handlers finish out of order and one never finishes: the committed
/// position stays before it, so the next consumer receives it again.
pub async fn commit_never_passes_an_unfinished_message<B: Backend>(backend: &B) {
    let source = backend.create_source(1).await.expect("create the source");
    let group = unique_group("ordered-commit");
    backend
        .produce(&source, numbered(0, 100))
        .await
        .expect("produce");
    let ledger = Ledger::default();
    let stuck_started = CancellationToken::new();
    let handler = {
        let ledger = ledger.clone();
        let stuck_started = stuck_started.clone();
        tower::service_fn(move |message: Message| {
            let ledger = ledger.clone();
            let stuck_started = stuck_started.clone();
            async move {
                let id = id_of(&message)?;
                if id == 40 {
                    stuck_started.cancel();
                    std::future::pending::<()>().await;
                }
                // Later ids finish first.
                tokio::time::sleep(Duration::from_millis((100 - id) % 7)).await;
                ledger.record(id);
                Ok::<_, HandlerError>(())
            }
        })
    };
    let first = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder()
            .ordering(DeliveryOrder::Unordered)
            .shutdown_deadline(Duration::from_millis(200)),
        32,
        handler,
    )
    .await
    .expect("connect");
    ledger
        .wait_until("every message but the stuck one", || {
            ledger.distinct() == 99
        })
        .await;
    let report = first.stop().await;
    assert!(
        report
            .unfinished
            .iter()
            .any(|unfinished| unfinished.started),
        "the stuck message is reported unfinished"
    );
    assert!(
        backend
            .unacknowledged(&source, &group)
            .await
            .expect("inspect")
            >= 1,
        "{}: the stuck message was not acknowledged",
        backend.name()
    );

    let second_ledger = Ledger::default();
    let second = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder().ordering(DeliveryOrder::Unordered),
        32,
        recording(&second_ledger),
    )
    .await
    .expect("connect");
    second_ledger
        .wait_until("the stuck message to be delivered again", || {
            second_ledger.count(40) >= 1
        })
        .await;
    second.stop().await;
}

/// A retryable failure is delivered again with a higher attempt number and
/// then succeeds.
pub async fn retries_then_succeeds<B: Backend>(backend: &B) {
    let source = backend.create_source(1).await.expect("create the source");
    let group = unique_group("retry");
    backend
        .produce(&source, numbered(0, 20))
        .await
        .expect("produce");
    let ledger = Ledger::default();
    let attempts_seen = Arc::new(AtomicUsize::new(0));
    let handler = {
        let ledger = ledger.clone();
        let attempts_seen = attempts_seen.clone();
        tower::service_fn(move |message: Message| {
            let ledger = ledger.clone();
            let attempts_seen = attempts_seen.clone();
            async move {
                let id = id_of(&message)?;
                let attempt = message.metadata().attempt();
                if id % 5 == 0 && attempt == 1 {
                    return Err(HandlerError::retryable(
                        "first attempts of every fifth id fail",
                    ));
                }
                if id % 5 == 0 {
                    attempts_seen.fetch_max(attempt as usize, Ordering::Relaxed);
                }
                ledger.record(id);
                Ok(())
            }
        })
    };
    let consumer = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder()
            .ordering(DeliveryOrder::Partition)
            .backoff(crate::backoff::Constant::new(Duration::from_millis(10)).retry_forever()),
        16,
        handler,
    )
    .await
    .expect("connect");
    ledger
        .wait_for_all(20, "all 20 messages, retried ones included")
        .await;
    consumer.stop().await;
    assert!(
        attempts_seen.load(Ordering::Relaxed) >= 2,
        "{}: a retried message carries its attempt number",
        backend.name()
    );
    assert_eq!(
        backend
            .unacknowledged(&source, &group)
            .await
            .expect("inspect"),
        0
    );
}

/// A consumer killed mid-run acknowledges nothing more; the next consumer
/// of the group receives everything it had not finished.
pub async fn redelivers_after_a_crash<B: Backend>(backend: &B) {
    let source = backend.create_source(1).await.expect("create the source");
    let group = unique_group("crash");
    backend
        .produce(&source, numbered(0, 200))
        .await
        .expect("produce");
    let ledger = Ledger::default();
    let handler = {
        let ledger = ledger.clone();
        tower::service_fn(move |message: Message| {
            let ledger = ledger.clone();
            async move {
                let id = id_of(&message)?;
                if id >= 100 {
                    // Hang, so the crash finds messages in flight.
                    std::future::pending::<()>().await;
                }
                ledger.record(id);
                Ok::<_, HandlerError>(())
            }
        })
    };
    let first = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder().ordering(DeliveryOrder::Unordered),
        32,
        handler,
    )
    .await
    .expect("connect");
    ledger.wait_for_all(100, "the first 100 messages").await;
    first.crash().await;
    tokio::time::sleep(backend.capabilities().crash_redelivery_after).await;

    let second = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder().ordering(DeliveryOrder::Unordered),
        32,
        recording(&ledger),
    )
    .await
    .expect("connect");
    ledger
        .wait_for_all(200, "every message after the crash")
        .await;
    second.stop().await;
    assert_eq!(
        backend
            .unacknowledged(&source, &group)
            .await
            .expect("inspect"),
        0
    );
}

/// Two consumers of one group share the work; one leaving mid-run loses
/// nothing.
pub async fn rebalances_between_two_consumers<B: Backend>(backend: &B) {
    if !backend.capabilities().shared_groups {
        eprintln!("skipped: {} has no shared consumer groups", backend.name());
        return;
    }
    let partitions = if backend.capabilities().partitions {
        4
    } else {
        1
    };
    let source = backend
        .create_source(partitions)
        .await
        .expect("create the source");
    let group = unique_group("rebalance");
    let ledger = Ledger::default();
    let slow = |ledger: &Ledger| {
        let ledger = ledger.clone();
        tower::service_fn(move |message: Message| {
            let ledger = ledger.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(2)).await;
                ledger.record(id_of(&message)?);
                Ok::<_, HandlerError>(())
            }
        })
    };
    let first = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder().ordering(DeliveryOrder::Partition),
        16,
        slow(&ledger),
    )
    .await
    .expect("connect");
    backend
        .produce(&source, numbered(0, 400))
        .await
        .expect("produce");
    ledger
        .wait_until("the first consumer to start", || ledger.distinct() >= 20)
        .await;
    let second = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder().ordering(DeliveryOrder::Partition),
        16,
        slow(&ledger),
    )
    .await
    .expect("connect");
    backend
        .produce(&source, numbered(400, 400))
        .await
        .expect("produce");
    ledger
        .wait_until("half of the messages", || ledger.distinct() >= 400)
        .await;
    // The first consumer leaves gracefully mid-run: its partitions move.
    first.stop().await;
    ledger
        .wait_for_all(800, "every message after the first consumer left")
        .await;
    second.stop().await;
    assert_eq!(
        backend
            .unacknowledged(&source, &group)
            .await
            .expect("inspect"),
        0
    );
}

/// A graceful shutdown acknowledges everything that finished: a new
/// consumer of the group receives none of it again.
pub async fn graceful_shutdown_commits_finished_work<B: Backend>(backend: &B) {
    let source = backend.create_source(1).await.expect("create the source");
    let group = unique_group("shutdown");
    backend
        .produce(&source, numbered(0, 50))
        .await
        .expect("produce");
    let ledger = Ledger::default();
    let first = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder(),
        16,
        recording(&ledger),
    )
    .await
    .expect("connect");
    ledger.wait_for_all(50, "all 50 messages").await;
    let report = first.stop().await;
    assert!(report.unfinished.is_empty());
    assert_eq!(
        backend
            .unacknowledged(&source, &group)
            .await
            .expect("inspect"),
        0
    );

    backend
        .produce(&source, numbered(50, 1))
        .await
        .expect("produce");
    let second_ledger = Ledger::default();
    let second = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder(),
        16,
        recording(&second_ledger),
    )
    .await
    .expect("connect");
    second_ledger
        .wait_until("the message produced after the shutdown", || {
            second_ledger.count(50) == 1
        })
        .await;
    second.stop().await;
    assert_eq!(
        second_ledger.missing(50).len(),
        50,
        "{}: nothing finished before the shutdown is delivered again",
        backend.name()
    );
}

/// With a large backlog, never more than `max_in_flight` handlers run.
pub async fn in_flight_stays_within_its_bound<B: Backend>(backend: &B) {
    let source = backend.create_source(1).await.expect("create the source");
    let group = unique_group("bound");
    backend
        .produce(&source, numbered(0, 2_000))
        .await
        .expect("produce");
    let ledger = Ledger::default();
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (ledger, running, peak) = (ledger.clone(), running.clone(), peak.clone());
        tower::service_fn(move |message: Message| {
            let (ledger, running, peak) = (ledger.clone(), running.clone(), peak.clone());
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_micros(200)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                ledger.record(id_of(&message)?);
                Ok::<_, HandlerError>(())
            }
        })
    };
    let consumer = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder().ordering(DeliveryOrder::Unordered),
        8,
        handler,
    )
    .await
    .expect("connect");
    ledger.wait_for_all(2_000, "the whole backlog").await;
    consumer.stop().await;
    let peak = peak.load(Ordering::SeqCst);
    assert!(
        peak <= 8,
        "{}: {peak} handlers ran at once with max_in_flight 8",
        backend.name()
    );
    assert!(peak > 1, "handlers ran concurrently");
}

/// A payload the handler cannot read is a permanent failure: it is not
/// retried, and the consumer carries on with the rest.
pub async fn malformed_payloads_do_not_stop_the_consumer<B: Backend>(backend: &B) {
    let source = backend.create_source(1).await.expect("create the source");
    let group = unique_group("malformed");
    let mut messages = numbered(0, 10);
    messages.insert(5, TestMessage::new("k", &b"\xff\x00not a number"[..]));
    backend.produce(&source, messages).await.expect("produce");
    let ledger = Ledger::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (ledger, calls) = (ledger.clone(), calls.clone());
        tower::service_fn(move |message: Message| {
            let (ledger, calls) = (ledger.clone(), calls.clone());
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                ledger.record(id_of(&message)?);
                Ok::<_, HandlerError>(())
            }
        })
    };
    let consumer = Running::start(backend, &source, &group, Consumer::builder(), 4, handler)
        .await
        .expect("connect");
    ledger.wait_for_all(10, "the ten readable messages").await;
    let report = consumer.stop().await;
    assert_eq!(
        report.discarded, 1,
        "the malformed payload failed permanently, once"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        11,
        "no retry of a permanent failure"
    );
    assert_eq!(
        backend
            .unacknowledged(&source, &group)
            .await
            .expect("inspect"),
        0
    );
}

/// A malformed message and one whose retries run out reach the dead-letter
/// destination; read back with [`DeadLetter::read`](crate::DeadLetter::read)
/// each is the message as it was consumed (payload, key, headers, origin)
/// with its error, class, attempts and times, and a producer header named
/// like an origin field changes nothing of the origin (it comes back as the
/// producer's header). Then they are acknowledged, and the rest of the
/// stream is processed.
pub async fn poison_messages_reach_the_dead_letter_destination<B: Backend>(backend: &B) {
    use crate::dead_letter::DeadLetterLayer;
    use crate::dead_letter::envelope::{Broker, ORIGIN_SOURCE};
    use crate::error::ErrorClass;
    use crate::retry::RetryLayer;

    let source = backend.create_source(1).await.expect("create the source");
    let group = unique_group("dead-letter");
    let mut messages = numbered(0, 20);
    let mut malformed = TestMessage::new("k", "{malformed");
    malformed.headers = [("tenant", "acme"), (ORIGIN_SOURCE, "spoofed")]
        .into_iter()
        .map(|(name, value)| (name, bytes::Bytes::from_static(value.as_bytes())))
        .collect();
    messages.insert(3, malformed);
    let started = std::time::SystemTime::now();
    backend.produce(&source, messages).await.expect("produce");
    let ledger = Ledger::default();
    let failed: Arc<std::sync::Mutex<Vec<Message>>> = Arc::default();
    let handler = {
        let ledger = ledger.clone();
        let failed = failed.clone();
        tower::service_fn(move |message: Message| {
            let ledger = ledger.clone();
            let failed = failed.clone();
            async move {
                let id = id_of(&message);
                if matches!(id, Err(_) | Ok(7)) {
                    failed
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(message.clone());
                }
                let id = id?;
                if id == 7 {
                    return Err(HandlerError::retryable("id 7 always times out"));
                }
                ledger.record(id);
                Ok(())
            }
        })
    };
    let sink = backend
        .dead_letter_sink(&source, &group)
        .await
        .expect("dead-letter sink");
    let handler = tower::ServiceBuilder::new()
        .layer(DeadLetterLayer::new(sink))
        .layer(RetryLayer::new(
            crate::backoff::Constant::new(Duration::from_millis(5)).max_retries(2),
        ))
        .service(handler);
    let consumer = Running::start(backend, &source, &group, Consumer::builder(), 8, handler)
        .await
        .expect("connect");
    ledger
        .wait_until("the 19 good messages", || ledger.distinct() == 19)
        .await;
    let deadline = tokio::time::Instant::now() + super::harness::PATIENCE;
    let letters = loop {
        let letters = backend
            .dead_letters(&source, &group)
            .await
            .expect("read dead letters");
        if letters.len() >= 2 || tokio::time::Instant::now() > deadline {
            break letters;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    consumer.stop().await;
    let ended = std::time::SystemTime::now();
    assert_eq!(letters.len(), 2, "{}: {letters:?}", backend.name());
    let consumed = |payload: &[u8]| {
        failed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .find(|message| &message.payload()[..] == payload)
            .cloned()
            .expect("the handler saw the message")
    };
    let broker = backend.capabilities().broker;
    let expected_group = match broker {
        Broker::Amqp => None,
        _ => Some(group.as_str()),
    };
    for (payload, class) in [
        (&b"{malformed"[..], ErrorClass::Permanent),
        (b"7", ErrorClass::Retryable),
    ] {
        let letter = letters
            .iter()
            .find(|letter| &letter.message.payload()[..] == payload)
            .unwrap_or_else(|| panic!("{}: no letter for {payload:?}", backend.name()));
        let original = consumed(payload);
        let what = format!("{}: the letter of {payload:?}", backend.name());
        assert_same_message(&letter.message, &original, &what);
        assert_eq!(letter.class, class, "{what}");
        let origin = letter
            .origin
            .as_ref()
            .expect("a letter read back has its origin");
        assert_eq!(origin.broker, broker, "{what}");
        assert_eq!(origin.group.as_deref(), expected_group, "{what}");
        assert_eq!(
            letter.first_failed_at, letter.failed_at,
            "{what}: failed once"
        );
        let millis = |time: std::time::SystemTime| {
            time.duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_millis())
        };
        assert!(
            (millis(started)..=millis(ended)).contains(&millis(letter.failed_at)),
            "{what}: failed at {:?}, outside the test's {started:?}..{ended:?}",
            letter.failed_at
        );
        assert_eq!(
            (letter.replays, letter.reference, letter.headers_omitted),
            (0, None, 0),
            "{what}"
        );
    }
    let malformed = letters
        .iter()
        .find(|letter| &letter.message.payload()[..] == b"{malformed")
        .expect("the malformed message was dead-lettered");
    assert_eq!(
        &**malformed.message.metadata().source(),
        source,
        "the producer's `{ORIGIN_SOURCE}` header is no origin"
    );
    assert_eq!(
        malformed.message.headers().get_str(ORIGIN_SOURCE),
        Some("spoofed"),
        "and it is kept as the producer's header"
    );
    assert!(
        malformed.error.contains("not a scenario id"),
        "{}",
        malformed.error
    );
    let exhausted = letters
        .iter()
        .find(|letter| &letter.message.payload()[..] == b"7")
        .expect("the message whose retries ran out was dead-lettered");
    assert_eq!(exhausted.attempts, 3, "one attempt and two retries");
    assert!(
        exhausted.error.contains("always times out"),
        "{}",
        exhausted.error
    );
    assert_eq!(
        backend
            .unacknowledged(&source, &group)
            .await
            .expect("inspect"),
        0,
        "{}: dead-lettered messages are acknowledged",
        backend.name()
    );
}

/// A consumer whose whole budget is held by handlers that do not finish
/// still takes part in its group: a member that joins gets work while the
/// first one's handlers are blocked (on Kafka the first one must serve the
/// rebalance with no room for a delivery), and once they are released
/// nothing is lost.
pub async fn a_full_budget_still_sees_assignment_changes<B: Backend>(backend: &B) {
    if !backend.capabilities().shared_groups {
        eprintln!("skipped: {} has no shared consumer groups", backend.name());
        return;
    }
    let partitions = if backend.capabilities().partitions {
        2
    } else {
        1
    };
    let source = backend
        .create_source(partitions)
        .await
        .expect("create the source");
    let group = unique_group("full-budget");
    backend
        .produce(&source, numbered(0, 40))
        .await
        .expect("produce");
    let ledger = Ledger::default();
    let release = CancellationToken::new();
    let blocked = {
        let (ledger, release) = (ledger.clone(), release.clone());
        tower::service_fn(move |message: Message| {
            let (ledger, release) = (ledger.clone(), release.clone());
            async move {
                ledger.record(id_of(&message)?);
                release.cancelled().await;
                Ok::<_, HandlerError>(())
            }
        })
    };
    let first = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder().ordering(DeliveryOrder::Unordered),
        4,
        blocked,
    )
    .await
    .expect("connect the first member");
    ledger
        .wait_until("the first member's budget of 4 to fill", || {
            ledger.distinct() >= 4
        })
        .await;
    let joined = Ledger::default();
    let second = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder().ordering(DeliveryOrder::Unordered),
        4,
        {
            let (ledger, joined) = (ledger.clone(), joined.clone());
            tower::service_fn(move |message: Message| {
                let (ledger, joined) = (ledger.clone(), joined.clone());
                async move {
                    let id = id_of(&message)?;
                    ledger.record(id);
                    joined.record(id);
                    Ok::<_, HandlerError>(())
                }
            })
        },
    )
    .await
    .expect("connect the second member");
    joined
        .wait_until(
            "the member that joined to get work while the first one's budget is full",
            || joined.distinct() > 0,
        )
        .await;
    release.cancel();
    ledger
        .wait_for_all(40, "every message once the first member's handlers finish")
        .await;
    // Acknowledged while both members run. Not after stopping them one by
    // one: a member that leaves starts a rebalance, and the other's final
    // commit may land in it and be refused (librdkafka's mock cluster
    // refuses every commit while the group is joining; Apache Kafka while
    // it completes), which is a redelivery to the next owner, not a loss.
    wait_until_acknowledged(backend, &source, &group, "messages (both members running)").await;
    first.stop().await;
    second.stop().await;
    assert_eq!(
        backend
            .unacknowledged(&source, &group)
            .await
            .expect("inspect"),
        0,
        "{}: stopping takes back no acknowledgement",
        backend.name()
    );
}

/// A broker that does not answer is a typed error within a bounded wait,
/// never a hang, and neither its text nor its `Debug` holds the password
/// the address carried. Skipped where the backend has no address (the
/// memory broker).
pub async fn an_unreachable_broker_is_an_error_without_its_password<B: Backend>(backend: &B) {
    const PASSWORD: &str = "s3cret-conformance-password";
    let group = unique_group("unreachable");
    let attempt = tokio::time::timeout(
        super::harness::PATIENCE,
        backend.connect_unreachable("intake-unreachable", &group, PASSWORD),
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{}: connecting to a broker that does not answer hung",
            backend.name()
        )
    });
    let Some(result) = attempt else {
        eprintln!("skipped: {} has no broker address", backend.name());
        return;
    };
    let error = match result {
        Ok(_) => panic!(
            "{}: a source was built although no broker answers",
            backend.name()
        ),
        Err(error) => error,
    };
    let mut chain = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        chain.push_str(": ");
        chain.push_str(&inner.to_string());
        cause = inner.source();
    }
    let debug = format!("{error:?}");
    assert!(
        !chain.is_empty(),
        "{}: the error says nothing",
        backend.name()
    );
    assert!(
        !chain.contains(PASSWORD) && !debug.contains(PASSWORD),
        "{}: the password is in the error: {chain} / {debug}",
        backend.name()
    );
}

/// A broadcast consumer's instances each receive every message produced
/// after they started. Skipped where the backend has no broadcast mode.
pub async fn broadcast_delivers_to_every_instance<B: Backend>(backend: &B) {
    let source = backend.create_source(1).await.expect("create the source");
    let settings = super::ConnectSettings { max_in_flight: 16 };
    let mut instances = Vec::new();
    let mut ledgers = Vec::new();
    for _ in 0..2 {
        let Some(connected) = backend.connect_broadcast(&source, settings).await else {
            eprintln!("skipped: {} has no broadcast mode", backend.name());
            return;
        };
        let (source, acker) = connected.expect("connect a broadcast instance");
        let ledger = Ledger::default();
        instances.push(
            Running::run(source, acker, Consumer::builder(), 16, recording(&ledger))
                .expect("start a broadcast instance"),
        );
        ledgers.push(ledger);
    }
    // An instance receives what is produced once it has started, which the
    // broker does not announce: probe until every instance has received one.
    const PROBE: u64 = 1_000_000;
    let deadline = tokio::time::Instant::now() + super::harness::PATIENCE;
    let mut probe = PROBE;
    while ledgers.iter().any(|ledger| ledger.distinct() == 0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}: a broadcast instance received nothing within {:?}",
            backend.name(),
            super::harness::PATIENCE
        );
        backend
            .produce(&source, numbered(probe, 1))
            .await
            .expect("produce a probe");
        probe += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    backend
        .produce(&source, numbered(0, 100))
        .await
        .expect("produce");
    for (number, ledger) in ledgers.iter().enumerate() {
        ledger
            .wait_until(&format!("instance {number} to receive all 100"), || {
                ledger.missing(100).is_empty()
            })
            .await;
    }
    for instance in instances {
        instance.stop().await;
    }
}

/// Asserts that `read` (a message read back from a dead letter) is
/// `original` as the handler received it: payload, key, headers (as a set:
/// an AMQP header table keeps no order) and origin.
fn assert_same_message(read: &Message, original: &Message, what: &str) {
    assert_eq!(read.payload(), original.payload(), "{what}: payload");
    assert_eq!(read.key(), original.key(), "{what}: key");
    let sorted = |message: &Message| {
        let mut headers: Vec<_> = message
            .headers()
            .iter()
            .map(|header| (header.name.clone(), header.value.clone()))
            .collect();
        headers.sort();
        headers
    };
    assert_eq!(sorted(read), sorted(original), "{what}: headers");
    let (read, original) = (read.metadata(), original.metadata());
    assert_eq!(
        (read.source(), read.partition(), read.position()),
        (original.source(), original.partition(), original.position()),
        "{what}: origin"
    );
}

/// Two routes of one app, each on a source of its own, under one shared
/// in-flight budget: every message reaches its own route's handler, the
/// budget is never exceeded, and after the app stops everything handled is
/// acknowledged.
pub async fn an_app_runs_two_routes_under_one_budget<B: Backend>(backend: &B) {
    const BUDGET: usize = 8;
    let orders = backend.create_source(1).await.expect("create a source");
    let payments = backend.create_source(1).await.expect("create a source");
    let group = unique_group("app");
    // Orders are ids 0..100, payments 100..200: a message on the wrong
    // route would show in the other's ledger.
    backend
        .produce(&orders, numbered(0, 100))
        .await
        .expect("produce");
    backend
        .produce(&payments, numbered(100, 100))
        .await
        .expect("produce");
    let (orders_seen, payments_seen) = (Ledger::default(), Ledger::default());
    let budget = SharedBudget::new(BUDGET, 1 << 30).expect("a budget");
    let mut app = App::new().shared_budget(budget.clone());
    for (name, source, ledger) in [
        ("orders", &orders, &orders_seen),
        ("payments", &payments, &payments_seen),
    ] {
        let (source, acker) = backend
            .connect(source, &group, ConnectSettings { max_in_flight: 64 })
            .await
            .expect("connect");
        let consumer = Consumer::builder()
            .ordering(DeliveryOrder::Unordered)
            .max_in_flight(64)
            .commit_interval(Duration::from_millis(20))
            .build(
                source,
                acker,
                recording_after(ledger, Some(Duration::from_millis(1))),
            )
            .expect("settings");
        app = app.route(name, consumer);
    }
    let stop = CancellationToken::new();
    let running = tokio::spawn(app.run_until(stop.clone()));
    orders_seen.wait_for_all(100, "every order").await;
    payments_seen
        .wait_until("every payment", || payments_seen.distinct() == 100)
        .await;
    assert_eq!(
        payments_seen.missing(200),
        (0..100).collect::<Vec<_>>(),
        "{}: payments reached only the payments route",
        backend.name()
    );
    assert_eq!(
        orders_seen.distinct(),
        100,
        "and orders only the orders route"
    );
    stop.cancel();
    let report = running
        .await
        .expect("the app task")
        .expect("a stop is not a failure");
    assert_eq!(report.routes.len(), 2);
    let peak = budget.peak_messages();
    assert!(
        (1..=BUDGET as u64).contains(&peak),
        "{}: the shared budget held {peak} at most, against {BUDGET}",
        backend.name()
    );
    for source in [&orders, &payments] {
        assert_eq!(
            backend
                .unacknowledged(source, &group)
                .await
                .expect("inspect"),
            0,
            "{}: everything handled is acknowledged after the app stopped",
            backend.name()
        );
    }
}

/// A startup hook that fails stops the app before any route consumes: the
/// handler never runs, and every message is still there for the next start.
pub async fn a_failed_startup_consumes_nothing<B: Backend>(backend: &B) {
    let source = backend.create_source(1).await.expect("create the source");
    let group = unique_group("startup");
    backend
        .produce(&source, numbered(0, 10))
        .await
        .expect("produce");
    let seen = Ledger::default();
    let (connected, acker) = backend
        .connect(&source, &group, ConnectSettings { max_in_flight: 16 })
        .await
        .expect("connect");
    let consumer = Consumer::builder()
        .build(connected, acker, recording(&seen))
        .expect("settings");
    let app = App::new()
        .on_startup("migrate", || async {
            Err::<(), _>(std::io::Error::other("the database refused the migration"))
        })
        .route("orders", consumer);
    let ended = tokio::time::timeout(
        Duration::from_secs(30),
        app.run_until(CancellationToken::new()),
    )
    .await
    .expect("a failed start returns at once");
    let error = ended.expect_err("the start failed");
    assert!(
        error.to_string().contains("migrate"),
        "the error names the hook: {error}"
    );
    assert_eq!(seen.distinct(), 0, "no handler ran");
    assert_eq!(
        backend
            .unacknowledged(&source, &group)
            .await
            .expect("inspect"),
        10,
        "{}: every message is still there",
        backend.name()
    );
}
