//! What order per key NATS JetStream gives through intake, clause by
//! clause (for `docs/CONTRACT.md`): in steady state, after a retry handed
//! back to the server, across a park, after a crash, and after a graceful
//! stop with and without parked messages. The key is the subject.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_core::backend::Source;
use intake_core::backend::testkit::TestMessage;
use intake_core::parking::ParkingLayer;
use intake_core::{Consumer, DeliveryOrder, HandlerError, Message};
use support::{NatsBackend, Running, wait_until};

/// Every call of a test's handler, in the order they began: payload,
/// attempt, whether it succeeded.
#[derive(Clone, Default)]
struct Journal(Arc<Mutex<Vec<(String, u32, bool)>>>);

impl Journal {
    fn record(&self, message: &Message, ok: bool) {
        let payload = String::from_utf8_lossy(message.payload()).into_owned();
        if let Ok(mut calls) = self.0.lock() {
            calls.push((payload, message.metadata().attempt(), ok));
        }
    }

    fn all(&self) -> Vec<(String, u32, bool)> {
        self.0.lock().map(|calls| calls.clone()).unwrap_or_default()
    }

    /// The payloads that succeeded, in the order they ran.
    fn succeeded(&self) -> Vec<String> {
        self.all()
            .into_iter()
            .filter(|(_, _, ok)| *ok)
            .map(|(payload, _, _)| payload)
            .collect()
    }

    fn count_succeeded(&self) -> usize {
        self.succeeded().len()
    }

    /// Where `payload` first succeeded among the successes.
    fn done_at(&self, payload: &str) -> usize {
        self.succeeded()
            .iter()
            .position(|done| done == payload)
            .unwrap_or_else(|| panic!("{payload} never succeeded: {:?}", self.all()))
    }
}

/// A handler that records each call; `decide` says how a call ends
/// (`None`: success).
fn recording(
    journal: Journal,
    decide: impl Fn(&str, u32) -> Option<HandlerError> + Clone + Send + Sync + 'static,
) -> impl tower::Service<
    Message,
    Response = (),
    Error = HandlerError,
    Future = impl Future<Output = Result<(), HandlerError>> + Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |message: Message| {
        let journal = journal.clone();
        let decide = decide.clone();
        async move {
            let payload = String::from_utf8_lossy(message.payload()).into_owned();
            // A little work, longer for some messages, so that keys
            // interleave.
            let work = payload.len() as u64 % 3;
            tokio::time::sleep(Duration::from_millis(work)).await;
            match decide(&payload, message.metadata().attempt()) {
                Some(error) => {
                    journal.record(&message, false);
                    Err(error)
                }
                None => {
                    journal.record(&message, true);
                    Ok(())
                }
            }
        }
    })
}

fn keyed(key: &str, payloads: &[&str]) -> Vec<TestMessage> {
    payloads
        .iter()
        .map(|payload| TestMessage::new(key.to_owned(), (*payload).to_owned()))
        .collect()
}

/// Pulls until `count` deliveries arrived (at most 20 s).
async fn pull(source: &mut intake_nats::NatsSource, count: usize) -> Vec<Message> {
    let mut held = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), async {
        while held.len() < count {
            let want = count - held.len();
            source.next(&mut held, want).await.expect("pull");
        }
    })
    .await
    .expect("deliveries within 20 s");
    held
}

/// Clause: in steady state, with `DeliveryOrder::Key`, one instance handles
/// each subject's messages in stream order, one at a time, while subjects
/// run in parallel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_keeps_each_subjects_order_in_steady_state() {
    let Some(backend) = NatsBackend::new("key order, steady state").await else {
        return;
    };
    let stream = support::unique("order");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    let (keys, per_key) = (8, 40);
    let mut messages = Vec::new();
    for n in 0..per_key {
        for key in 0..keys {
            messages.push(TestMessage::new(format!("k{key}"), format!("k{key}-{n}")));
        }
    }
    support::produce(backend.client(), &stream, messages)
        .await
        .expect("produce");
    let source = backend.source(&stream, "g").build().await.expect("source");
    let acker = source.acker();
    let journal = Journal::default();
    let running = Running::start(
        Consumer::builder()
            .ordering(DeliveryOrder::Key)
            .max_in_flight(64),
        source,
        acker,
        recording(journal.clone(), |_, _| None),
    );
    wait_until("every message", Duration::from_secs(60), || {
        journal.count_succeeded() >= keys * per_key
    })
    .await;
    running.stop().await;
    let done = journal.succeeded();
    for key in 0..keys {
        let order: Vec<usize> = done
            .iter()
            .filter_map(|payload| payload.strip_prefix(&format!("k{key}-")))
            .map(|n| n.parse().expect("a number"))
            .collect();
        assert_eq!(
            order,
            (0..per_key).collect::<Vec<_>>(),
            "k{key} in stream order"
        );
    }
}

/// Clause: a retryable failure that reaches the runtime is handed back to
/// the server (`-NAK` with the redelivery backoff), and the later messages
/// of its key run before it comes back: the order per key is not kept
/// across such a retry. (In-process retries, `RetryLayer`, or a park,
/// below, keep it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_handed_back_to_the_server_comes_back_after_later_messages_of_its_key() {
    let Some(backend) = NatsBackend::new("key order, nak").await else {
        return;
    };
    let stream = support::unique("ordernak");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    support::produce(backend.client(), &stream, keyed("k", &["m0", "m1", "m2"]))
        .await
        .expect("produce");
    let source = backend.source(&stream, "g").build().await.expect("source");
    let acker = source.acker();
    let journal = Journal::default();
    let running = Running::start(
        Consumer::builder()
            .ordering(DeliveryOrder::Key)
            .backoff(intake_core::Disabled),
        source,
        acker,
        recording(journal.clone(), |payload, attempt| {
            (payload == "m0" && attempt == 1).then(|| HandlerError::retryable("once"))
        }),
    );
    wait_until("every message", Duration::from_secs(30), || {
        journal.count_succeeded() >= 3
    })
    .await;
    running.stop().await;
    assert_eq!(
        journal.succeeded(),
        ["m1", "m2", "m0"],
        "m0 back from the server after the later ones: {:?}",
        journal.all()
    );
}

/// Clause: a parked message and the later messages of its key that this
/// process received keep their order (the later ones wait behind it in
/// the process, `NatsParking`), while other keys flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_message_keeps_its_place_before_the_later_ones_of_its_key() {
    let Some(backend) = NatsBackend::new("key order, park").await else {
        return;
    };
    let stream = support::unique("orderpark");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    let mut messages = keyed("k", &["m0", "m1", "m2", "m3"]);
    messages.extend(keyed("other", &["o0"]));
    support::produce(backend.client(), &stream, messages)
        .await
        .expect("produce");
    let source = backend.source(&stream, "g").build().await.expect("source");
    let acker = source.acker();
    let journal = Journal::default();
    let handler = tower::ServiceBuilder::new()
        .layer(ParkingLayer::new(source.parking()))
        .service(recording(journal.clone(), |payload, attempt| {
            (payload == "m0" && attempt == 1)
                .then(|| HandlerError::retry_later("later", Duration::from_millis(500)))
        }));
    let running = Running::start(
        Consumer::builder().ordering(DeliveryOrder::Key),
        source,
        acker,
        handler,
    );
    wait_until("every message", Duration::from_secs(30), || {
        journal.count_succeeded() >= 5
    })
    .await;
    running.stop().await;
    let done = journal.succeeded();
    let keyed: Vec<&String> = done.iter().filter(|p| p.starts_with('m')).collect();
    assert_eq!(keyed, ["m0", "m1", "m2", "m3"], "{:?}", journal.all());
    assert!(
        journal.done_at("o0") < journal.done_at("m0"),
        "another key ran while m0 was parked: {:?}",
        journal.all()
    );
}

/// Clause: after a crash, the crashed process's unacknowledged messages
/// come back after `ack_wait` (2 s here), to any instance; a later message
/// of the same key published meanwhile runs first. The ones that come back
/// together come in stream order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_crash_a_later_message_of_the_key_runs_before_the_redelivered_ones() {
    let Some(backend) = NatsBackend::new("key order, crash").await else {
        return;
    };
    let stream = support::unique("ordercrash");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    support::produce(
        backend.client(),
        &stream,
        keyed("k", &["m0", "m1", "m2", "m3"]),
    )
    .await
    .expect("produce");
    {
        // Pulls the four and dies: no acknowledgement, no progress report,
        // no nak (dropped without `close`).
        let mut crashed = backend.source(&stream, "g").build().await.expect("source");
        let held = pull(&mut crashed, 4).await;
        assert_eq!(held.len(), 4);
        drop(crashed);
    }
    support::produce(backend.client(), &stream, keyed("k", &["m4"]))
        .await
        .expect("produce");
    let source = backend.source(&stream, "g").build().await.expect("source");
    let acker = source.acker();
    let journal = Journal::default();
    let running = Running::start(
        Consumer::builder().ordering(DeliveryOrder::Key),
        source,
        acker,
        recording(journal.clone(), |_, _| None),
    );
    wait_until("every message", Duration::from_secs(30), || {
        journal.count_succeeded() >= 5
    })
    .await;
    running.stop().await;
    assert_eq!(
        journal.succeeded(),
        ["m4", "m0", "m1", "m2", "m3"],
        "{:?}",
        journal.all()
    );
    let attempts: Vec<u32> = journal.all().iter().map(|call| call.1).collect();
    assert_eq!(attempts, [1, 2, 2, 2, 2]);
}

/// Clause: a graceful stop hands what the process held back at once
/// (`-NAK`), and the next instance gets those before a later message of the
/// key: the order per key holds across a graceful restart (for messages
/// that were not parked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_graceful_stop_the_handed_back_messages_run_first() {
    let Some(backend) = NatsBackend::new("key order, graceful stop").await else {
        return;
    };
    let stream = support::unique("orderstop");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    support::produce(
        backend.client(),
        &stream,
        keyed("k", &["m0", "m1", "m2", "m3"]),
    )
    .await
    .expect("produce");
    {
        let mut stopped = backend.source(&stream, "g").build().await.expect("source");
        let held = pull(&mut stopped, 4).await;
        assert_eq!(held.len(), 4);
        stopped.close().await.expect("close");
    }
    support::produce(backend.client(), &stream, keyed("k", &["m4"]))
        .await
        .expect("produce");
    let source = backend.source(&stream, "g").build().await.expect("source");
    let acker = source.acker();
    let journal = Journal::default();
    let running = Running::start(
        Consumer::builder().ordering(DeliveryOrder::Key),
        source,
        acker,
        recording(journal.clone(), |_, _| None),
    );
    wait_until("every message", Duration::from_secs(30), || {
        journal.count_succeeded() >= 5
    })
    .await;
    running.stop().await;
    assert_eq!(
        journal.succeeded(),
        ["m0", "m1", "m2", "m3", "m4"],
        "{:?}",
        journal.all()
    );
}

/// Clause: a graceful stop hands a parked message back with what is left
/// of its delay; a later message of its key published meanwhile runs on
/// the next instance before the parked one comes back (the order per key
/// across parks is kept only within one process's life).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_graceful_stop_a_later_message_runs_before_the_parked_ones() {
    let Some(backend) = NatsBackend::new("key order, stop while parked").await else {
        return;
    };
    let stream = support::unique("orderparkstop");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    support::produce(backend.client(), &stream, keyed("k", &["m0", "m1"]))
        .await
        .expect("produce");
    let journal = Journal::default();
    let decide = |payload: &str, attempt: u32| {
        (payload == "m0" && attempt == 1)
            .then(|| HandlerError::retry_later("later", Duration::from_secs(3)))
    };
    {
        let source = backend.source(&stream, "g").build().await.expect("source");
        let counters = source.counters();
        let acker = source.acker();
        let handler = tower::ServiceBuilder::new()
            .layer(ParkingLayer::new(source.parking()))
            .service(recording(journal.clone(), decide));
        let running = Running::start(
            Consumer::builder().ordering(DeliveryOrder::Key),
            source,
            acker,
            handler,
        );
        // m0 parked, m1 parked behind it.
        wait_until("m0 and m1 parked", Duration::from_secs(20), || {
            counters.parked_here() >= 2
        })
        .await;
        running.stop().await;
    }
    support::produce(backend.client(), &stream, keyed("k", &["m2"]))
        .await
        .expect("produce");
    let source = backend.source(&stream, "g").build().await.expect("source");
    let acker = source.acker();
    let handler = tower::ServiceBuilder::new()
        .layer(ParkingLayer::new(source.parking()))
        .service(recording(journal.clone(), decide));
    let running = Running::start(
        Consumer::builder().ordering(DeliveryOrder::Key),
        source,
        acker,
        handler,
    );
    wait_until("every message", Duration::from_secs(30), || {
        journal.count_succeeded() >= 3
    })
    .await;
    running.stop().await;
    assert_eq!(
        journal.succeeded(),
        ["m2", "m0", "m1"],
        "{:?}",
        journal.all()
    );
}

/// Clause: instances sharing a durable consumer split a key's messages
/// between them (the server hands each to whichever instance pulls), so
/// there is no order per key across instances: each keeps the order of
/// what it received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_sharing_a_durable_split_a_keys_messages_between_them() {
    let Some(backend) = NatsBackend::new("key order, two instances").await else {
        return;
    };
    let stream = support::unique("ordertwo");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    let count = 20;
    let journals = [Journal::default(), Journal::default()];
    let mut instances = Vec::new();
    let mut counters = Vec::new();
    for journal in &journals {
        let source = backend.source(&stream, "g").build().await.expect("source");
        counters.push(source.counters());
        let acker = source.acker();
        let handler = tower::ServiceBuilder::new()
            .then(|result: Result<(), HandlerError>| async move {
                // Long enough that the other instance pulls meanwhile.
                tokio::time::sleep(Duration::from_millis(20)).await;
                result
            })
            .service(recording(journal.clone(), |_, _| None));
        instances.push(Running::start(
            Consumer::builder()
                .ordering(DeliveryOrder::Key)
                .max_in_flight(1),
            source,
            acker,
            handler,
        ));
    }
    wait_until("both instances pulling", Duration::from_secs(30), || {
        counters.iter().all(|counters| counters.pull_requests() > 0)
    })
    .await;
    let payloads: Vec<String> = (0..count).map(|n| format!("m{n:02}")).collect();
    let refs: Vec<&str> = payloads.iter().map(String::as_str).collect();
    support::produce(backend.client(), &stream, keyed("k", &refs))
        .await
        .expect("produce");
    wait_until("every message", Duration::from_secs(30), || {
        journals.iter().map(Journal::count_succeeded).sum::<usize>() >= count
    })
    .await;
    for running in instances {
        running.stop().await;
    }
    let [a, b] = [journals[0].succeeded(), journals[1].succeeded()];
    assert!(
        !a.is_empty() && !b.is_empty(),
        "one key's messages went to both instances: {a:?} / {b:?}"
    );
    for handled in [&a, &b] {
        let mut sorted = handled.clone();
        sorted.sort();
        assert_eq!(handled, &sorted, "each instance in stream order");
    }
}
