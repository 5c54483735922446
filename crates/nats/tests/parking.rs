//! Parking on NATS (`NatsParking`) with the parking layer, on the shared
//! server: what a park costs the messages that never failed (review R9),
//! the consumer's `max_ack_pending` (R26), and park headers a producer
//! wrote (R25).

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_core::backend::testkit::{Backend, TestMessage};
use intake_core::parking::ParkingLayer;
use intake_core::{Consumer, DeadLetterLayer, DeliveryOrder, HandlerError, Message};
use support::{NatsBackend, Running, wait_until};

/// What the handlers of a test saw: per payload, each call's attempt and
/// whether it succeeded, and which instance ran it.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<Call>>>);

#[derive(Clone, Debug)]
struct Call {
    payload: String,
    attempt: u32,
    ok: bool,
    instance: usize,
}

impl Calls {
    fn record(&self, message: &Message, ok: bool, instance: usize) {
        let payload = String::from_utf8_lossy(message.payload()).into_owned();
        if let Ok(mut calls) = self.0.lock() {
            calls.push(Call {
                payload,
                attempt: message.metadata().attempt(),
                ok,
                instance,
            });
        }
    }

    fn all(&self) -> Vec<Call> {
        self.0.lock().map(|calls| calls.clone()).unwrap_or_default()
    }

    fn of(&self, payload: &str) -> Vec<Call> {
        self.all()
            .into_iter()
            .filter(|call| call.payload == payload)
            .collect()
    }

    /// Payloads that succeeded at least once.
    fn succeeded(&self, payload: &str) -> bool {
        self.of(payload).iter().any(|call| call.ok)
    }
}

/// Fails each payload starting with `h` on its first `fails` calls with
/// "retry after `delay`"; everything else succeeds.
fn heads_fail(
    calls: Calls,
    instance: usize,
    fails: usize,
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
            let before = calls.of(&payload).len();
            if payload.starts_with('h') && before < fails {
                calls.record(&message, false, instance);
                return Err(HandlerError::retry_later("the head is not ready", delay));
            }
            calls.record(&message, true, instance);
            Ok(())
        }
    })
}

/// Keys `k0..k{keys}`, each a head `h<k>` and then `followers` messages
/// `f<k>.<i>` of the same key.
fn heads_and_followers(keys: usize, followers: usize) -> Vec<TestMessage> {
    let mut messages = Vec::new();
    for key in 0..keys {
        messages.push(TestMessage::new(format!("k{key}"), format!("h{key}")));
        for follower in 0..followers {
            messages.push(TestMessage::new(
                format!("k{key}"),
                format!("f{key}.{follower}"),
            ));
        }
    }
    messages
}

/// Review R9: two instances on one durable, the source's default
/// `max_deliveries` (5), keys whose first message asks for later three
/// times. The messages behind those heads never fail. None of them may be
/// dead-lettered, and each must run.
///
/// Before the fix each follow was a `-NAK` with a delay, one delivery
/// more, to whichever instance pulled next; a follower turned away
/// behind its head five times was dead-lettered by the source without
/// running ("delivered 5 times without being acknowledged").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_waiting_behind_a_parked_head_are_never_dead_lettered() {
    let Some(backend) = NatsBackend::new("followers of a parked head").await else {
        return;
    };
    let stream = support::unique("follow");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    let (keys, followers) = (8, 4);
    let calls = Calls::default();
    let mut instances = Vec::new();
    let mut pulls = Vec::new();
    for instance in 0..2 {
        let source = backend.source(&stream, "g").build().await.expect("source");
        let acker = source.acker();
        pulls.push(source.counters());
        let sink = source.dead_letter_sink().build().await.expect("sink");
        let handler = tower::ServiceBuilder::new()
            .layer(DeadLetterLayer::new(sink))
            .layer(ParkingLayer::new(source.parking()))
            .service(heads_fail(
                calls.clone(),
                instance,
                3,
                Duration::from_millis(300),
            ));
        // A small budget: each pull asks for a few messages, so both
        // instances get a share of every key.
        instances.push(Running::start(
            Consumer::builder()
                .ordering(DeliveryOrder::Key)
                .max_in_flight(4),
            source,
            acker,
            handler,
        ));
    }
    // Both instances wait with pull requests out before anything is
    // published, so each gets a share.
    wait_until("both instances pulling", Duration::from_secs(30), || {
        pulls.iter().all(|counters| counters.pull_requests() > 0)
    })
    .await;
    support::produce(
        backend.client(),
        &stream,
        heads_and_followers(keys, followers),
    )
    .await
    .expect("produce");
    wait_until("everything settled", Duration::from_secs(90), || {
        support::block_on_unacknowledged(backend.client(), &stream, "g") == 0
    })
    .await;
    for running in instances {
        running.stop().await;
    }
    let letters = backend
        .dead_letters(&stream, "g")
        .await
        .expect("read the dead letters");
    let lettered: Vec<(String, String)> = letters
        .iter()
        .map(|letter| {
            (
                String::from_utf8_lossy(letter.message.payload()).into_owned(),
                letter.error.clone(),
            )
        })
        .collect();
    let followers_lettered: Vec<&(String, String)> = lettered
        .iter()
        .filter(|(payload, _)| payload.starts_with('f'))
        .collect();
    let mut attempts: HashMap<String, Vec<u32>> = HashMap::new();
    let mut per_instance = [0usize; 2];
    for call in calls.all() {
        per_instance[call.instance] += 1;
        attempts.entry(call.payload).or_default().push(call.attempt);
    }
    eprintln!("calls per instance: {per_instance:?}");
    assert!(
        followers_lettered.is_empty(),
        "{} of {} messages that never failed were dead-lettered: {followers_lettered:?}",
        followers_lettered.len(),
        keys * followers
    );
    for key in 0..keys {
        for follower in 0..followers {
            let payload = format!("f{key}.{follower}");
            assert!(
                calls.succeeded(&payload),
                "{payload} never ran: {attempts:?}"
            );
        }
        let head = format!("h{key}");
        assert!(calls.succeeded(&head), "{head}: {:?}", calls.of(&head));
    }
    assert!(lettered.is_empty(), "{lettered:?}");
    // The order per key, in the instance that parked the head: a follower
    // it held runs after its head succeeded. (A follower the server gave
    // the other instance runs there as it comes: instances sharing a
    // durable have no order between them.)
    let all = calls.all();
    for key in 0..keys {
        let head = format!("h{key}");
        let Some((done, head_call)) = all
            .iter()
            .enumerate()
            .find(|(_, call)| call.payload == head && call.ok)
        else {
            continue;
        };
        let first_try = all
            .iter()
            .position(|call| call.payload == head)
            .unwrap_or(done);
        for (index, call) in all.iter().enumerate() {
            let follows = call.payload.starts_with(&format!("f{key}."));
            if follows && call.instance == head_call.instance && index > first_try {
                assert!(
                    index > done,
                    "{} ran on instance {} after {head} first failed there and before it \
                     succeeded: {all:?}",
                    call.payload,
                    call.instance
                );
            }
        }
    }
}

/// Fails `p<n>` payloads on their first call with "retry after `delay`";
/// everything else succeeds. Records every call.
fn parks_first_try(
    calls: Calls,
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
            if payload.starts_with('p') && calls.of(&payload).is_empty() {
                calls.record(&message, false, 0);
                return Err(HandlerError::retry_later("later", delay));
            }
            calls.record(&message, true, 0);
            Ok(())
        }
    })
}

/// Review R26: every parked message holds a slot of the consumer's
/// `max_ack_pending` until it is due (the server counts it delivered and
/// unacknowledged). With a budget of 520, `max_ack_pending` was sized for
/// the budget alone (twice it, 1,040): with 1,040 messages parked for
/// 20 s the server sent nothing new, and a healthy message published after
/// them was handled 19.86 s later. The source now leaves room for parked
/// messages beyond the budget (`park_room`, default 1,000): the healthy
/// message runs at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_messages_leave_room_for_new_ones() {
    let Some(backend) = NatsBackend::new("room for parks").await else {
        return;
    };
    let stream = support::unique("room");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    let budget = 520;
    let parked = 2 * budget;
    let messages: Vec<TestMessage> = (0..parked)
        .map(|n| TestMessage::new(format!("k{n}"), format!("p{n}")))
        .collect();
    support::produce(backend.client(), &stream, messages)
        .await
        .expect("produce");
    let source = backend.source(&stream, "g").build().await.expect("source");
    let counters = source.counters();
    let acker = source.acker();
    let calls = Calls::default();
    let delay = Duration::from_secs(20);
    let handler = tower::ServiceBuilder::new()
        .layer(ParkingLayer::new(source.parking()))
        .service(parks_first_try(calls.clone(), delay));
    let running = Running::start(
        Consumer::builder()
            .ordering(DeliveryOrder::Key)
            .max_in_flight(budget),
        source,
        acker,
        handler,
    );
    wait_until("every p parked", Duration::from_secs(60), || {
        counters.parked_here() + counters.naks() >= parked as u64
    })
    .await;
    let published = tokio::time::Instant::now();
    support::produce(
        backend.client(),
        &stream,
        vec![TestMessage::new("healthy", "healthy")],
    )
    .await
    .expect("produce");
    let patience = delay / 4;
    let handled = tokio::time::timeout(patience, async {
        while !calls.succeeded("healthy") {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let waited = published.elapsed();
    let pending = jetstream_info(backend.client(), &stream, "g").await;
    running.shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(60), running.task).await;
    assert!(
        handled.is_ok(),
        "with {parked} messages parked (budget {budget}, the consumer's max_ack_pending {}, \
         {} pending), a new message was not handled within {patience:?} ({waited:?})",
        pending.0,
        pending.1
    );
}

/// The consumer's `max_ack_pending` and `num_ack_pending`.
async fn jetstream_info(
    client: &intake_nats::async_nats::Client,
    stream: &str,
    group: &str,
) -> (i64, usize) {
    let info = intake_nats::async_nats::jetstream::new(client.clone())
        .get_stream(stream)
        .await
        .expect("stream")
        .consumer_info(group)
        .await
        .expect("consumer info");
    (info.config.max_ack_pending, info.num_ack_pending)
}

/// What the room leaves: once `max_ack_pending` messages are parked, the
/// server sends nothing new until parked ones come back. Budget 2,
/// `max_ack_pending` 6 (twice the budget and a room of 2; set explicitly,
/// since a consumer the source creates starts at 1,000 and is never
/// lowered): six messages park, and the healthy one published after them
/// runs only after a parked one came back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_park_room_holds_new_messages_until_parked_ones_come_back() {
    let Some(backend) = NatsBackend::new("park room full").await else {
        return;
    };
    let stream = support::unique("roomfull");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    let (budget, room) = (2, 2);
    let parked = 2 * budget + room;
    let messages: Vec<TestMessage> = (0..parked)
        .map(|n| TestMessage::new(format!("k{n}"), format!("p{n}")))
        .collect();
    support::produce(backend.client(), &stream, messages)
        .await
        .expect("produce");
    let source = backend
        .source(&stream, "g")
        .max_ack_pending((2 * budget + room) as i64)
        .build()
        .await
        .expect("source");
    let counters = source.counters();
    let acker = source.acker();
    let calls = Calls::default();
    let handler = tower::ServiceBuilder::new()
        .layer(ParkingLayer::new(source.parking()))
        .service(parks_first_try(calls.clone(), Duration::from_secs(2)));
    let running = Running::start(
        Consumer::builder()
            .ordering(DeliveryOrder::Key)
            .max_in_flight(budget),
        source,
        acker,
        handler,
    );
    wait_until("every p parked", Duration::from_secs(30), || {
        counters.parked_here() >= parked as u64
    })
    .await;
    let (max_ack_pending, pending) = jetstream_info(backend.client(), &stream, "g").await;
    assert_eq!(max_ack_pending, parked as i64);
    assert_eq!(pending, parked);
    support::produce(
        backend.client(),
        &stream,
        vec![TestMessage::new("healthy", "healthy")],
    )
    .await
    .expect("produce");
    wait_until("the healthy message", Duration::from_secs(30), || {
        calls.succeeded("healthy")
    })
    .await;
    wait_until("everything settled", Duration::from_secs(30), || {
        support::block_on_unacknowledged(backend.client(), &stream, "g") == 0
    })
    .await;
    running.stop().await;
    let all = calls.all();
    let healthy = all
        .iter()
        .position(|call| call.payload == "healthy")
        .expect("handled");
    let first_back = all
        .iter()
        .position(|call| call.payload.starts_with('p') && call.ok)
        .expect("a parked message back");
    assert!(
        first_back < healthy,
        "the healthy message ran before any parked one came back: {all:?}"
    );
}

/// Item 5 (review R25 on NATS): `NatsParking::is_returned_copy` is always
/// `false`, so the parking layer drops every park header a producer wrote
/// before anything reads it. Published with a due time 50 s ahead (the
/// layer would hold the message unpolled that long: its `max_early_wait`
/// is raised to 60 s here), `intake.parks = 10` (the first park would be
/// permanent), `intake.attempts = 50`, a park id and an origin naming
/// another stream. The handler sees none of them, on the server's attempt;
/// the message is parked once and handled again from the park, without the
/// headers, its `parked_from` naming its own delivery (never the forged
/// origin); nothing is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn park_headers_a_producer_wrote_are_ignored() {
    let Some(backend) = NatsBackend::new("forged park headers").await else {
        return;
    };
    let stream = support::unique("forged");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    let due = std::time::SystemTime::now() + Duration::from_secs(50);
    let due_ms = due
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis();
    let mut forged = TestMessage::new("k", "p0");
    forged.headers = [
        ("trace", "t1".to_owned()),
        (intake_core::parking::DUE, due_ms.to_string()),
        (intake_core::parking::PARKS, "10".to_owned()),
        (intake_core::parking::ATTEMPTS, "50".to_owned()),
        (intake_core::parking::FAILED_FIRST, "1".to_owned()),
        (intake_core::parking::PARK_ID, "42".to_owned()),
        (intake_core::parking::ORIGIN, "another_stream".to_owned()),
        (intake_core::parking::ORIGIN_PARTITION, "3".to_owned()),
        (intake_core::parking::ORIGIN_POSITION, "7".to_owned()),
    ]
    .into_iter()
    .collect();
    support::produce(backend.client(), &stream, vec![forged])
        .await
        .expect("produce");
    let source = backend.source(&stream, "g").build().await.expect("source");
    let acker = source.acker();
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let seen: Arc<Mutex<Vec<Message>>> = Arc::default();
    let calls = Calls::default();
    let handler = {
        let seen = seen.clone();
        let inner = parks_first_try(calls.clone(), Duration::from_millis(200));
        tower::ServiceBuilder::new()
            .layer(DeadLetterLayer::new(sink))
            .layer(ParkingLayer::new(source.parking()).max_early_wait(Duration::from_secs(60)))
            .map_request(move |message: Message| {
                if let Ok(mut seen) = seen.lock() {
                    seen.push(message.clone());
                }
                message
            })
            .service(inner)
    };
    let running = Running::start(
        Consumer::builder().ordering(DeliveryOrder::Key),
        source,
        acker,
        handler,
    );
    wait_until("handled after its park", Duration::from_secs(20), || {
        calls.succeeded("p0")
    })
    .await;
    let report = running.stop().await;
    let seen = seen.lock().expect("seen").clone();
    assert_eq!(seen.len(), 2, "run, parked, run again: {seen:?}");
    for (run, message) in seen.iter().enumerate() {
        let names: Vec<&str> = message.headers().iter().map(|h| &*h.name).collect();
        assert_eq!(
            names,
            ["trace"],
            "run {run}: only the producer's own header"
        );
        let parked_from = message.metadata().parked_from();
        match run {
            0 => assert!(parked_from.is_none(), "run 0: {parked_from:?}"),
            _ => assert_eq!(
                parked_from,
                Some(&seen[0].metadata().first_delivery()),
                "run {run}: back from its park, first delivered where it was"
            ),
        }
        assert_eq!(message.metadata().attempt() as usize, run + 1, "run {run}");
    }
    assert_eq!(report.parked, 1, "{report:?}");
    assert_eq!(report.dead_lettered, 0, "{report:?}");
    let letters = backend
        .dead_letters(&stream, "g")
        .await
        .expect("read the dead letters");
    assert!(letters.is_empty(), "{letters:?}");
}

/// Past the room for parked messages (the consumer's byte budget), a park
/// for a message's own failure goes back to the server (`-NAK` with its
/// delay: one delivery more); a message that only waits behind its key is
/// still kept in the process, so it is never counted as a delivery and
/// never dead-lettered for waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_room_heads_go_back_to_the_server_and_followers_stay() {
    let Some(backend) = NatsBackend::new("park room in bytes").await else {
        return;
    };
    let stream = support::unique("bytes");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    let (keys, followers) = (8, 3);
    support::produce(
        backend.client(),
        &stream,
        heads_and_followers(keys, followers),
    )
    .await
    .expect("produce");
    let source = backend.source(&stream, "g").build().await.expect("source");
    let counters = source.counters();
    let acker = source.acker();
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let calls = Calls::default();
    let handler = tower::ServiceBuilder::new()
        .layer(DeadLetterLayer::new(sink))
        .layer(ParkingLayer::new(source.parking()))
        .service(heads_fail(calls.clone(), 0, 2, Duration::from_millis(300)));
    // Room for about two parked messages (each about 100 bytes with its
    // subject as key).
    let running = Running::start(
        Consumer::builder()
            .ordering(DeliveryOrder::Key)
            .max_in_flight_bytes(250),
        source,
        acker,
        handler,
    );
    wait_until("everything settled", Duration::from_secs(60), || {
        support::block_on_unacknowledged(backend.client(), &stream, "g") == 0
    })
    .await;
    running.stop().await;
    let letters = backend
        .dead_letters(&stream, "g")
        .await
        .expect("read the dead letters");
    assert!(letters.is_empty(), "{letters:?}");
    assert!(counters.naks() > 0, "some heads went back to the server");
    assert!(counters.parked_here() > 0);
    for call in calls.all() {
        if call.payload.starts_with('f') {
            assert!(call.ok, "{call:?}");
            assert_eq!(call.attempt, 1, "never delivered again: {call:?}");
        }
    }
    for key in 0..keys {
        for follower in 0..followers {
            assert!(calls.succeeded(&format!("f{key}.{follower}")));
        }
    }
}
