//! Retries handed back to the server: `-NAK` with the redelivery backoff's
//! delay (no tight redelivery loop), the delivery count as the attempt, and
//! the retry cap (`max_deliveries`), past which the source dead-letters the
//! message itself. Parking (`NatsParking`): a message handed back with the
//! delay it asked for comes back after it, not before, also when the
//! process that parked it is gone.

mod support;

use std::time::Duration;

use std::sync::{Arc, Mutex};

use intake_core::backend::testkit::TestMessage;
use intake_core::backend::{AckBatch, Acker, PartitionAck, Source};
use intake_core::parking::{Parking, ParkingLayer};
use intake_core::{Constant, Consumer, DeliveryOrder, HandlerError, Message};
use support::{NatsBackend, Running, Seen, wait_until};
use tokio::time::Instant;

fn always_failing(
    seen: Seen,
) -> impl tower::Service<
    Message,
    Response = (),
    Error = HandlerError,
    Future = impl Future<Output = Result<(), HandlerError>> + Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |message: Message| {
        let seen = seen.clone();
        async move {
            seen.record(&message);
            Err::<(), _>(HandlerError::retryable("always fails"))
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_comes_back_after_the_redelivery_backoffs_delay_not_at_once() {
    let Some(backend) = NatsBackend::new("nak delay").await else {
        return;
    };
    let stream = support::unique("nakdelay");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    support::produce(backend.client(), &stream, support::numbered("m", 1))
        .await
        .expect("produce");
    let source = backend
        .source(&stream, "nak")
        .redelivery_backoff(Constant::new(Duration::from_secs(1)).retry_forever())
        .unlimited_deliveries()
        .build()
        .await
        .expect("source");
    let counters = source.counters();
    let acker = source.acker();
    let seen = Seen::default();
    let running = Running::start(
        Consumer::builder()
            .ordering(DeliveryOrder::Unordered)
            // The consumer-level backoff would space the attempts out too:
            // off, so only the nak's delay does.
            .backoff(intake_core::Disabled),
        source,
        acker,
        always_failing(seen.clone()),
    );
    wait_until("the first delivery", Duration::from_secs(30), || {
        seen.total() >= 1
    })
    .await;
    // 2.5 s with a 1 s delay: three deliveries at most. Without a delay the
    // server redelivers at once, hundreds of times.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    running.stop().await;
    let attempts = seen.attempts(b"m0");
    assert!(
        (2..=4).contains(&attempts.len()),
        "deliveries in 2.5 s with a 1 s nak delay: {attempts:?}"
    );
    assert_eq!(
        attempts,
        (1..=attempts.len() as u32).collect::<Vec<_>>(),
        "each delivery carries the server's count as its attempt"
    );
    assert!(counters.naks() >= 2, "{} naks", counters.naks());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_delivered_more_often_than_max_deliveries_is_dead_lettered_by_the_source() {
    let Some(backend) = NatsBackend::new("max deliveries").await else {
        return;
    };
    let stream = support::unique("maxdeliver");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    support::produce(backend.client(), &stream, support::numbered("m", 2))
        .await
        .expect("produce");
    let source = backend
        .source(&stream, "capped")
        .max_deliveries(3)
        .build()
        .await
        .expect("source");
    let counters = source.counters();
    let acker = source.acker();
    let seen = Seen::default();
    let handler = {
        let seen = seen.clone();
        tower::service_fn(move |message: Message| {
            let seen = seen.clone();
            async move {
                seen.record(&message);
                match &message.payload()[..] {
                    b"m0" => Err(HandlerError::retryable("m0 always fails")),
                    _ => Ok(()),
                }
            }
        })
    };
    let running = Running::start(
        Consumer::builder()
            .ordering(DeliveryOrder::Unordered)
            .backoff(intake_core::Disabled),
        source,
        acker,
        handler,
    );
    wait_until("the source's dead letter", Duration::from_secs(30), || {
        counters.source_dead_letters() >= 1
    })
    .await;
    wait_until("everything settled", Duration::from_secs(30), || {
        support::block_on_unacknowledged(backend.client(), &stream, "capped") == 0
    })
    .await;
    running.stop().await;
    assert_eq!(
        seen.attempts(b"m0"),
        [1, 2, 3],
        "three deliveries handled, the fourth dead-lettered"
    );
    assert_eq!(seen.count(b"m1"), 1);
    let letters = intake_core::backend::testkit::Backend::dead_letters(&backend, &stream, "capped")
        .await
        .expect("read the dead letters");
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(&letter.message.payload()[..], b"m0");
    assert_eq!(letter.class, intake_core::ErrorClass::Retryable);
    assert_eq!(letter.attempts, 3);
    assert!(
        letter.error.contains("max_deliveries = 3"),
        "{}",
        letter.error
    );
    assert_eq!(counters.terms(), 1, "the original is terminated");
}

/// Pulls until `count` deliveries arrived, each with when it arrived; at
/// most `patience`.
async fn pull_timed(
    source: &mut intake_nats::NatsSource,
    count: usize,
    patience: Duration,
) -> Vec<(Message, Instant)> {
    let deadline = Instant::now() + patience;
    let mut arrived = Vec::with_capacity(count);
    let mut batch = Vec::new();
    while arrived.len() < count {
        let pulled =
            tokio::time::timeout_at(deadline, source.next(&mut batch, count - arrived.len()))
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "{} of {count} deliveries within {patience:?}",
                        arrived.len()
                    )
                });
        pulled.expect("pull");
        let now = Instant::now();
        arrived.extend(batch.drain(..).map(|message| (message, now)));
    }
    arrived
}

/// The batch the commit engine sends when `parked` are handed back for
/// `delay` and `done` are finished.
fn park_batch(parked: &[&Message], delay: Duration, done: &[&Message]) -> AckBatch {
    let key = parked
        .first()
        .or(done.first())
        .expect("a message")
        .metadata()
        .partition_key();
    let mut ack = PartitionAck::new(key);
    ack.requeue_after.extend(
        parked
            .iter()
            .map(|message| (message.metadata().position(), delay)),
    );
    ack.completed
        .extend(done.iter().map(|message| message.metadata().position()));
    AckBatch {
        partitions: vec![ack],
        sync: true,
    }
}

/// A delay longer than the consumer's `ack_wait` (2 s), after the source
/// held the delivery long enough to report it in progress: the server
/// counts `ack_wait` from a `+WPI` that lands behind the nak, which would
/// bring it back after 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_delivery_is_not_redelivered_before_its_delay() {
    let Some(backend) = NatsBackend::new("park delay").await else {
        return;
    };
    let stream = support::unique("parkdelay");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    support::produce(backend.client(), &stream, support::numbered("m", 2))
        .await
        .expect("produce");
    let mut source = backend
        .source(&stream, "park")
        .build()
        .await
        .expect("source");
    let mut acker = source.acker();
    assert!(acker.supports_delayed_requeue());
    let first = pull_timed(&mut source, 2, Duration::from_secs(20)).await;
    let (parked, done) = (&first[0].0, &first[1].0);
    // Past half of ack_wait the progress task reports both. Waited for,
    // not slept for: on a loaded machine (CI) the report came later than a
    // fixed 1.2 s.
    tokio::time::timeout(Duration::from_secs(20), async {
        while source.counters().progress_reports() < 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("reported in progress");
    let delay = Duration::from_secs(3);
    let handed_back = Instant::now();
    acker
        .ack(&park_batch(&[parked], delay, &[done]))
        .await
        .expect("confirmed");
    let again = pull_timed(&mut source, 1, Duration::from_secs(20)).await;
    let (back, arrived) = &again[0];
    let after = arrived.duration_since(handed_back);
    assert!(after >= delay, "back after {after:?}, parked for {delay:?}");
    assert_eq!(back.metadata().position(), parked.metadata().position());
    assert_eq!(back.payload(), parked.payload());
    assert_eq!(back.key(), parked.key());
    assert_eq!(back.metadata().attempt(), 2, "one more delivery");
    assert_eq!(source.parking().parks(back), 1);
    acker
        .ack(&park_batch(&[], delay, &[back]))
        .await
        .expect("confirmed");
    source.close().await.expect("close");
    assert_eq!(
        support::unacknowledged(backend.client(), &stream, "park")
            .await
            .expect("consumer info"),
        0
    );
}

/// The process parks four messages and goes away (closing, which hands
/// back at once what it still holds, the fifth): a new instance of the
/// group gets all five, the parked ones after their delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_parked_by_a_process_that_went_away_still_come_back_after_their_delay() {
    let Some(backend) = NatsBackend::new("park and go").await else {
        return;
    };
    let stream = support::unique("parkgone");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    support::produce(backend.client(), &stream, support::numbered("m", 5))
        .await
        .expect("produce");
    let delay = Duration::from_secs(1);
    let handed_back = {
        let mut source = backend
            .source(&stream, "gone")
            .build()
            .await
            .expect("source");
        let mut acker = source.acker();
        let held = pull_timed(&mut source, 5, Duration::from_secs(20)).await;
        let parked: Vec<&Message> = held[..4].iter().map(|(message, _)| message).collect();
        let handed_back = Instant::now();
        acker
            .ack(&park_batch(&parked, delay, &[]))
            .await
            .expect("confirmed");
        source.close().await.expect("close");
        handed_back
    };
    let mut source = backend
        .source(&stream, "gone")
        .build()
        .await
        .expect("source");
    let mut acker = source.acker();
    let back = pull_timed(&mut source, 5, Duration::from_secs(20)).await;
    let mut payloads: Vec<String> = back
        .iter()
        .map(|(message, _)| String::from_utf8_lossy(message.payload()).into_owned())
        .collect();
    payloads.sort();
    assert_eq!(payloads, ["m0", "m1", "m2", "m3", "m4"]);
    for (message, arrived) in &back {
        assert_eq!(message.metadata().attempt(), 2, "{message:?}");
        if &message.payload()[..] != b"m4" {
            let after = arrived.duration_since(handed_back);
            assert!(after >= delay, "{message:?} back after {after:?}");
        }
    }
    let all: Vec<&Message> = back.iter().map(|(message, _)| message).collect();
    acker
        .ack(&park_batch(&[], delay, &all))
        .await
        .expect("confirmed");
    source.close().await.expect("close");
}

/// One call of a parking test's handler: payload, attempt, when, and
/// whether it succeeded.
type Call = (String, u32, Instant, bool);

/// What a parking test's handler saw.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<Call>>>);

impl Calls {
    fn record(&self, message: &Message, ok: bool) {
        let payload = String::from_utf8_lossy(message.payload()).into_owned();
        if let Ok(mut calls) = self.0.lock() {
            calls.push((payload, message.metadata().attempt(), Instant::now(), ok));
        }
    }

    fn of(&self, payload: &str) -> Vec<(u32, Instant, bool)> {
        self.0
            .lock()
            .map(|calls| {
                calls
                    .iter()
                    .filter(|call| call.0 == payload)
                    .map(|call| (call.1, call.2, call.3))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn succeeded(&self) -> usize {
        self.0
            .lock()
            .map(|calls| calls.iter().filter(|call| call.3).count())
            .unwrap_or_default()
    }
}

/// Fails the first delivery of `later` with "retry after `delay`".
fn asks_for_later(
    calls: Calls,
    later: &'static [&'static str],
    delay: Duration,
) -> impl tower::Service<
    Message,
    Response = (),
    Error = HandlerError,
    Future = impl Future<Output = Result<(), HandlerError>> + Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |message: Message| {
        let calls = calls.clone();
        async move {
            let payload = String::from_utf8_lossy(message.payload()).into_owned();
            if message.metadata().attempt() == 1 && later.contains(&payload.as_str()) {
                calls.record(&message, false);
                return Err(HandlerError::retry_later("not now", delay));
            }
            calls.record(&message, true);
            Ok(())
        }
    })
}

/// m0..m5 on keys of their own, m6 on m1's key: m1 and m3 ask for later on
/// their first delivery, m6 waits behind m1 without running.
fn parking_messages() -> Vec<TestMessage> {
    let mut messages: Vec<TestMessage> = (0..6)
        .map(|n| TestMessage::new(format!("k{n}"), format!("m{n}")))
        .collect();
    messages.push(TestMessage::new("k1", "m6"));
    messages
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_asking_for_later_is_parked_and_handled_after_its_delay() {
    let Some(backend) = NatsBackend::new("parking end to end").await else {
        return;
    };
    let stream = support::unique("parkrun");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    support::produce(backend.client(), &stream, parking_messages())
        .await
        .expect("produce");
    let source = backend
        .source(&stream, "run")
        .build()
        .await
        .expect("source");
    let counters = source.counters();
    let acker = source.acker();
    let delay = Duration::from_secs(1);
    let calls = Calls::default();
    let handler = tower::ServiceBuilder::new()
        .layer(ParkingLayer::new(source.parking()))
        .service(asks_for_later(calls.clone(), &["m1", "m3"], delay));
    let running = Running::start(
        Consumer::builder().ordering(DeliveryOrder::Key),
        source,
        acker,
        handler,
    );
    wait_until("every message handled", Duration::from_secs(20), || {
        calls.succeeded() >= 7
    })
    .await;
    wait_until("everything acknowledged", Duration::from_secs(20), || {
        support::block_on_unacknowledged(backend.client(), &stream, "run") == 0
    })
    .await;
    let report = running.stop().await;
    for id in ["m0", "m2", "m4", "m5"] {
        let calls = calls.of(id);
        assert_eq!(calls.len(), 1, "{id}: {calls:?}");
        assert!(calls[0].2, "{id} succeeded");
    }
    for id in ["m1", "m3"] {
        let calls = calls.of(id);
        assert_eq!(calls.len(), 2, "{id}: {calls:?}");
        let ((first, failed_at, failed), (second, handled_at, handled)) = (calls[0], calls[1]);
        assert!(!failed && handled, "{id}: {calls:?}");
        assert_eq!(
            (first, second),
            (1, 2),
            "{id}: back from its park on its next attempt"
        );
        let after = handled_at.duration_since(failed_at);
        assert!(
            after >= delay,
            "{id} handled {after:?} after it asked for {delay:?}"
        );
    }
    let m6 = calls.of("m6");
    assert_eq!(m6.len(), 1, "m6 waited without running: {m6:?}");
    assert!(
        m6[0].1 >= calls.of("m1")[1].1,
        "m6 handled after m1, the earlier message of its key"
    );
    assert_eq!(
        m6[0].0, 1,
        "m6 waited behind m1 in this process: no delivery more, no attempt"
    );
    assert_eq!(counters.parked_here(), 3, "m1, m3, m6 waited here");
    assert_eq!(counters.naks(), 0, "nothing went back to the server");
    assert_eq!(report.parked, 3, "m1, m3, and m6 behind m1: {report:?}");
    assert_eq!(report.dead_lettered, 0, "{report:?}");
    assert_eq!(counters.source_dead_letters(), 0);
}

/// A park is no delivery: a message that keeps asking for later is
/// parked `max_parks` times (10 by default) and then fails for good, with
/// its own failure in its letter. The source's `max_deliveries` (5 by
/// default) does not cut it short: until the fix of review R9, every park
/// was a `-NAK` and one delivery more, and the source dead-lettered the
/// message on its sixth delivery ("delivered 5 times without being
/// acknowledged").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_parked_as_often_as_allowed_is_dead_lettered_with_its_failure() {
    let Some(backend) = NatsBackend::new("parked max_parks times").await else {
        return;
    };
    let stream = support::unique("parkcap");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    support::produce(backend.client(), &stream, support::numbered("m", 2))
        .await
        .expect("produce");
    let source = backend
        .source(&stream, "cap")
        .build()
        .await
        .expect("source");
    let counters = source.counters();
    let acker = source.acker();
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let calls = Calls::default();
    let handler = {
        let calls = calls.clone();
        tower::service_fn(move |message: Message| {
            let calls = calls.clone();
            async move {
                let later = &message.payload()[..] == b"m0";
                calls.record(&message, !later);
                match later {
                    true => Err(HandlerError::retry_later(
                        "not now",
                        Duration::from_millis(100),
                    )),
                    false => Ok(()),
                }
            }
        })
    };
    let handler = tower::ServiceBuilder::new()
        .layer(intake_core::DeadLetterLayer::new(sink))
        .layer(ParkingLayer::new(source.parking()))
        .service(handler);
    let running = Running::start(Consumer::builder(), source, acker, handler);
    wait_until("everything settled", Duration::from_secs(30), || {
        support::block_on_unacknowledged(backend.client(), &stream, "cap") == 0
    })
    .await;
    let report = running.stop().await;
    let attempts: Vec<u32> = calls.of("m0").iter().map(|call| call.0).collect();
    assert_eq!(
        attempts,
        (1..=11).collect::<Vec<u32>>(),
        "parked after each of the first ten, the eleventh failed for good"
    );
    assert_eq!(report.parked, 10, "{report:?}");
    assert_eq!(report.dead_lettered, 1, "{report:?}");
    assert_eq!(counters.source_dead_letters(), 0);
    assert_eq!(counters.parked_here(), 10);
    assert_eq!(calls.of("m1").len(), 1);
    let letters = intake_core::backend::testkit::Backend::dead_letters(&backend, &stream, "cap")
        .await
        .expect("read the dead letters");
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(&letters[0].message.payload()[..], b"m0");
    assert_eq!(letters[0].class, intake_core::ErrorClass::Permanent);
    assert!(letters[0].error.contains("not now"), "{}", letters[0].error);
}

/// The composition the parking docs show: the dead-letter layer outside
/// the parking layer. A handed-back park leaves the parking layer as a
/// retryable failure (the runtime naks it with its delay), and the
/// dead-letter layer takes any retryable failure that reaches it for one
/// whose retries are used up: it writes the letter and the original is
/// terminated. Found with this test: m1, m3 and m6 (which never ran) end
/// up as dead letters and are never handled. The fix belongs in
/// intake-core's dead-letter layer (pass a `ParkedMessage` failure through,
/// as it passes `Ignore`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_handed_back_is_parked_not_dead_lettered_under_a_dead_letter_layer() {
    let Some(backend) = NatsBackend::new("parking under a dead-letter layer").await else {
        return;
    };
    let stream = support::unique("parkdlq");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    support::produce(backend.client(), &stream, parking_messages())
        .await
        .expect("produce");
    let source = backend
        .source(&stream, "run")
        .build()
        .await
        .expect("source");
    let acker = source.acker();
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let calls = Calls::default();
    let handler = tower::ServiceBuilder::new()
        .layer(intake_core::DeadLetterLayer::new(sink))
        .layer(ParkingLayer::new(source.parking()))
        .service(asks_for_later(
            calls.clone(),
            &["m1", "m3"],
            Duration::from_secs(1),
        ));
    let running = Running::start(
        Consumer::builder().ordering(DeliveryOrder::Key),
        source,
        acker,
        handler,
    );
    wait_until("every message handled", Duration::from_secs(20), || {
        calls.succeeded() >= 7
    })
    .await;
    let report = running.stop().await;
    assert_eq!(report.parked, 3, "{report:?}");
    assert_eq!(report.dead_lettered, 0, "{report:?}");
    let letters = intake_core::backend::testkit::Backend::dead_letters(&backend, &stream, "run")
        .await
        .expect("read the dead letters");
    assert!(letters.is_empty(), "{letters:?}");
}

/// The consumer's `num_redelivered`: messages the server delivered more
/// than once.
async fn redelivered(client: &intake_nats::async_nats::Client, stream: &str, group: &str) -> usize {
    intake_nats::async_nats::jetstream::new(client.clone())
        .get_stream(stream)
        .await
        .expect("stream")
        .consumer_info(group)
        .await
        .expect("consumer info")
        .num_redelivered
}

/// A park through `NatsParking` waits in the process, still held: the
/// source reports it in progress, so the server neither delivers it again
/// nor counts a delivery, however much longer than `ack_wait` (2 s) the
/// delay is; the source gives it back once due, the same delivery without
/// the park headers the layer wrote, on its next attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_park_waits_in_the_process_and_is_given_back_once_due_without_a_delivery() {
    let Some(backend) = NatsBackend::new("park here").await else {
        return;
    };
    let stream = support::unique("parkhere");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    let mut headed = TestMessage::new("k0", "m0");
    headed.headers.set("trace", "t0");
    support::produce(
        backend.client(),
        &stream,
        vec![headed, TestMessage::new("k1", "m1")],
    )
    .await
    .expect("produce");
    let mut source = backend
        .source(&stream, "here")
        .build()
        .await
        .expect("source");
    let mut acker = source.acker();
    let parking = source.parking();
    let first = pull_timed(&mut source, 2, Duration::from_secs(20)).await;
    let (parked, done) = (&first[0].0, &first[1].0);
    // What the parking layer hands a park for the message's own failure.
    let mut copy = parked.clone();
    copy.headers_mut().set(intake_core::parking::PARKS, "1");
    copy.headers_mut().set(intake_core::parking::DUE, "1");
    let delay = Duration::from_secs(5);
    assert_eq!(
        parking.park(&copy, delay).await.expect("parked"),
        intake_core::parking::Parked::HandedBack
    );
    let handed_back = Instant::now();
    acker
        .ack(&park_batch(&[parked], delay, &[done]))
        .await
        .expect("confirmed");
    assert_eq!(source.parked_waiting(), 1);
    let again = pull_timed(&mut source, 1, Duration::from_secs(20)).await;
    let (back, arrived) = &again[0];
    let after = arrived.duration_since(handed_back);
    assert!(after >= delay, "back after {after:?}, parked for {delay:?}");
    assert_eq!(back.metadata().position(), parked.metadata().position());
    assert_eq!(back.payload(), parked.payload());
    assert_eq!(back.key(), parked.key());
    assert_eq!(back.headers(), parked.headers(), "no park header");
    assert_eq!(back.metadata().attempt(), 2, "its next attempt");
    assert_eq!(source.parking().parks(back), 1);
    assert_eq!(source.counters().parked_here(), 1);
    assert_eq!(source.counters().naks(), 0);
    assert!(
        source.counters().progress_reports() >= 2,
        "held and reported in progress while it waited"
    );
    assert_eq!(
        redelivered(backend.client(), &stream, "here").await,
        0,
        "the server delivered nothing again"
    );
    acker
        .ack(&park_batch(&[], delay, &[back]))
        .await
        .expect("confirmed");
    source.close().await.expect("close");
    assert_eq!(
        support::unacknowledged(backend.client(), &stream, "here")
            .await
            .expect("consumer info"),
        0
    );
}

/// A process that closes while messages are parked in it hands each back
/// to the server with what is left of its delay: another instance of the
/// group gets them no sooner than they were due, and what was held
/// unparked at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_parked_here_go_back_to_the_server_with_their_remaining_delay_at_close() {
    let Some(backend) = NatsBackend::new("park here and close").await else {
        return;
    };
    let stream = support::unique("parkclose");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    support::produce(backend.client(), &stream, support::numbered("m", 3))
        .await
        .expect("produce");
    let delay = Duration::from_secs(3);
    let handed_back = {
        let mut source = backend
            .source(&stream, "close")
            .build()
            .await
            .expect("source");
        let mut acker = source.acker();
        let parking = source.parking();
        let held = pull_timed(&mut source, 3, Duration::from_secs(20)).await;
        let parked: Vec<&Message> = held[..2].iter().map(|(message, _)| message).collect();
        for message in &parked {
            parking.park(message, delay).await.expect("parked");
        }
        let handed_back = Instant::now();
        acker
            .ack(&park_batch(&parked, delay, &[]))
            .await
            .expect("confirmed");
        assert_eq!(source.parked_waiting(), 2);
        tokio::time::sleep(Duration::from_secs(1)).await;
        source.close().await.expect("close");
        handed_back
    };
    let mut source = backend
        .source(&stream, "close")
        .build()
        .await
        .expect("source");
    let mut acker = source.acker();
    let back = pull_timed(&mut source, 3, Duration::from_secs(20)).await;
    let mut payloads: Vec<String> = back
        .iter()
        .map(|(message, _)| String::from_utf8_lossy(message.payload()).into_owned())
        .collect();
    payloads.sort();
    assert_eq!(payloads, ["m0", "m1", "m2"]);
    for (message, arrived) in &back {
        assert_eq!(message.metadata().attempt(), 2, "{message:?}");
        let after = arrived.duration_since(handed_back);
        if &message.payload()[..] == b"m2" {
            assert!(after < delay, "m2 was not parked: back at once ({after:?})");
        } else {
            assert!(after >= delay, "{message:?} back after {after:?}");
        }
    }
    let all: Vec<&Message> = back.iter().map(|(message, _)| message).collect();
    acker
        .ack(&park_batch(&[], delay, &all))
        .await
        .expect("confirmed");
    source.close().await.expect("close");
}
