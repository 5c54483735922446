//! The consumer runtime over an `AmqpSource` against a real RabbitMQ, end to
//! end: through connections the broker closes, through the retry path to a
//! quorum queue's delivery limit, never running two copies of one message
//! at once, and parking what asks to be retried later in wait queues that
//! give it back once due.
//!
//! Each test skips with a printed reason when no broker listens on
//! 127.0.0.1:5672, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use intake_amqp::lapin::types::AMQPValue;
use intake_amqp::{AmqpParking, AmqpSource, Exchange, Queue, Topology};
use intake_core::backend::testkit::{Backend, TestMessage, skip_or_fail};
use intake_core::parking::{DUE, PARK_ID, Parked, Parking, ParkingLayer, parks_header};
use intake_core::{HandlerError, Headers, Message, Metadata, Position};
use support::steps::{PATIENCE, ack_through, publish_direct, receive, settle_at};
use support::{AmqpBackend, close_connection_named, dead_letter_queue, expiring, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_carries_on_after_the_broker_closes_the_connection_and_loses_nothing() {
    let Some(backend) = AmqpBackend::connect_or_skip("runtime_reconnect").await else {
        return;
    };
    let queue = backend.classic_queue("runtime-reconnect").await.unwrap();
    backend.publish_numbered(&queue, 200).await.unwrap();
    let name = unique("runtime-conn");
    let source = AmqpSource::builder(
        intake_amqp::AmqpSettings::new(backend.url()).connection_name(name.as_str()),
    )
    .queue(queue.as_str())
    .build()
    .await
    .unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    let handler = {
        let seen = seen.clone();
        tower::service_fn(move |message: Message| {
            let seen = seen.clone();
            async move {
                // Slow enough that the connection is closed mid-run.
                tokio::time::sleep(Duration::from_millis(5)).await;
                let id = String::from_utf8_lossy(message.payload()).into_owned();
                seen.lock().map(|mut seen| seen.insert(id)).ok();
                Ok::<_, intake_core::HandlerError>(())
            }
        })
    };
    let count = |seen: &std::sync::Mutex<BTreeSet<String>>| seen.lock().map_or(0, |s| s.len());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = spawn_consumer(source, handler, shutdown.clone());
    while count(&seen) < 20 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if let Err(why) = close_connection_named(&name).await {
        skip_or_fail(
            "runtime_reconnect",
            &format!("cannot close the connection: {why}"),
        );
        shutdown.cancel();
        let _ = running.await;
        return;
    }
    tokio::time::timeout(PATIENCE, async {
        while count(&seen) < 200 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("only {} of 200 handled after the reconnect", count(&seen)));
    shutdown.cancel();
    let report = running.await.unwrap().unwrap();
    assert!(report.succeeded >= 200);
    settle_at(&backend, &queue, 0).await;
    backend.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_keeps_failing_through_the_retry_path_reaches_the_quorum_delivery_limit() {
    let Some(backend) = AmqpBackend::connect_or_skip("runtime_delivery_limit").await else {
        return;
    };
    let queue = unique("runtime-limited");
    let dlx = format!("{queue}.dlx");
    let dlq = dead_letter_queue(&queue);
    let topology = Topology::new()
        .exchange(Exchange::direct(dlx.as_str()))
        .queue(Queue::classic(dlq.as_str()))
        .bind(dlq.as_str(), dlx.as_str(), queue.as_str())
        .queue(
            Queue::quorum(queue.as_str())
                .dead_letter_exchange(dlx.as_str())
                .delivery_limit(3),
        );
    let source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .declare(topology)
        .build()
        .await
        .unwrap();
    backend.track_queue(&queue);
    backend.track_queue(&dlq);
    backend.track_exchange(&dlx);
    publish_direct(&backend, &queue, b"poison").await;
    publish_direct(&backend, &queue, b"fine").await;

    let attempts = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let handler = {
        let attempts = attempts.clone();
        tower::service_fn(move |message: Message| {
            let attempts = attempts.clone();
            async move {
                if &message.payload()[..] == b"poison" {
                    attempts
                        .lock()
                        .map(|mut seen| seen.push(message.metadata().attempt()))
                        .ok();
                    return Err(intake_core::HandlerError::retryable(
                        "downstream refuses it",
                    ));
                }
                Ok(())
            }
        })
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = spawn_consumer(source, handler, shutdown.clone());
    let dead = tokio::time::timeout(PATIENCE, async {
        loop {
            let dead = backend.peek(&dlq).await.unwrap();
            if !dead.is_empty() {
                return dead;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the poison message reaches the dead-letter queue");
    shutdown.cancel();
    let report = running.await.unwrap().unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(&dead[0].0[..], b"poison");
    assert_eq!(report.succeeded, 1, "the good message was handled");
    let attempts = attempts.lock().map(|seen| seen.clone()).unwrap_or_default();
    assert_eq!(
        attempts,
        [1, 2, 3, 4],
        "limit 3: the fourth failure dead-letters it"
    );
    settle_at(&backend, &queue, 0).await;
    backend.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_of_a_lost_channel_never_runs_twice_at_once_in_one_consumer() {
    let Some(backend) = AmqpBackend::connect_or_skip("no_concurrent_copies").await else {
        return;
    };
    let queue = backend.classic_queue("no-concurrent-copies").await.unwrap();
    backend.publish(&queue, &[b"slow"]).await.unwrap();
    let name = unique("copies-conn");
    let source = AmqpSource::builder(
        intake_amqp::AmqpSettings::new(backend.url()).connection_name(name.as_str()),
    )
    .queue(queue.as_str())
    .build()
    .await
    .unwrap();

    /// Copies of the message running now, and the most seen at once.
    #[derive(Default)]
    struct Running {
        now: usize,
        most: usize,
        finished: usize,
    }
    struct Leaving(std::sync::Arc<std::sync::Mutex<Running>>);
    impl Drop for Leaving {
        fn drop(&mut self) {
            if let Ok(mut running) = self.0.lock() {
                running.now -= 1;
            }
        }
    }
    let running = std::sync::Arc::new(std::sync::Mutex::new(Running::default()));
    let started = std::sync::Arc::new(tokio::sync::Notify::new());
    let handler = {
        let (running, started) = (running.clone(), started.clone());
        tower::service_fn(move |message: Message| {
            let (running, started) = (running.clone(), started.clone());
            async move {
                {
                    let mut now = running.lock().unwrap();
                    now.now += 1;
                    now.most = now.most.max(now.now);
                }
                // Leaves when it returns or when the runtime cancels it.
                let _leaving = Leaving(running.clone());
                if message.metadata().attempt() == 1 {
                    started.notify_one();
                    // The first copy hangs until the runtime cancels it.
                    std::future::pending::<()>().await;
                }
                if let Ok(mut running) = running.lock() {
                    running.finished += 1;
                }
                Ok::<_, intake_core::HandlerError>(())
            }
        })
    };
    let acker = source.acker();
    let consumer = intake_core::Consumer::builder()
        .max_in_flight(8)
        .ordering(intake_core::DeliveryOrder::Unordered)
        .backoff(intake_core::Disabled)
        .revoke_timeout(Duration::from_secs(2))
        .build(source, acker, handler)
        .expect("valid consumer settings");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(consumer.run(shutdown.clone()));
    tokio::time::timeout(PATIENCE, started.notified())
        .await
        .expect("the first copy starts");
    if let Err(why) = close_connection_named(&name).await {
        skip_or_fail(
            "no_concurrent_copies",
            &format!("cannot close the connection: {why}"),
        );
        shutdown.cancel();
        let _ = run.await;
        backend.cleanup().await;
        return;
    }
    let finished = || running.lock().map_or(0, |running| running.finished);
    tokio::time::timeout(PATIENCE, async {
        while finished() == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the redelivered copy is handled");
    shutdown.cancel();
    let report = run.await.unwrap().unwrap();
    assert_eq!(report.succeeded, 1);
    let most = running.lock().map_or(0, |running| running.most);
    assert_eq!(
        most, 1,
        "the broker's redelivery ran beside the lost channel's copy"
    );
    settle_at(&backend, &queue, 0).await;
    backend.cleanup().await;
}

/// Runs a consumer over `source` until `shutdown` fires.
fn spawn_consumer<H>(
    source: AmqpSource,
    handler: H,
    shutdown: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<Result<intake_core::RunReport, intake_core::RunError>>
where
    H: tower::Service<Message, Response = (), Error = intake_core::HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    let acker = source.acker();
    let consumer = intake_core::Consumer::builder()
        .max_in_flight(8)
        .ordering(intake_core::DeliveryOrder::Unordered)
        .backoff(intake_core::Disabled)
        .build(source, acker, handler)
        .expect("valid consumer settings");
    tokio::spawn(consumer.run(shutdown))
}

/// A quorum queue the fixture produces to (keys as routing keys), and a
/// parking for it with `tiers`; what the parking declares is deleted with
/// the fixture.
async fn parked_queue(
    backend: &AmqpBackend,
    prefix: &str,
    tiers: &[Duration],
) -> (String, AmqpParking) {
    let queue = unique(prefix);
    let mut arguments = expiring();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    backend.declare_queue(&queue, arguments).await.unwrap();
    let parking = AmqpParking::builder(backend.url())
        .queue(queue.as_str())
        .tiers(tiers.iter().copied())
        .build()
        .await
        .unwrap();
    for tier in parking.tiers() {
        let wait = parking.wait_queue(tier).expect("a tier has its wait queue");
        backend.track_queue(wait);
        backend.track_exchange(wait);
    }
    backend.track_exchange(&parking.return_exchange());
    for relayed in [parking.hop_queue().to_owned(), parking.relay_queue()] {
        backend.track_queue(&relayed);
        backend.track_exchange(&relayed);
    }
    (queue, parking)
}

/// How early RabbitMQ may give a copy back from its wait queue. It expires
/// messages on its own timer: a quorum queue was measured giving copies
/// back up to 2.3 ms early on an idle machine and about 20 ms early under
/// the chaos suite's load. The parking layer holds such a copy until it is
/// due (`the_runtime_parks_what_asks_for_later_and_handles_it_once_due`
/// checks the handler strictly); here, at the broker, the check is that
/// the copy went through the tier of its delay, not a shorter one.
const EXPIRY_PRECISION_MS: u128 = 100;

fn unix_millis(time: SystemTime) -> u128 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis())
}

/// `message` with the park headers, as the parking layer hands it over:
/// due `delay` from now.
fn with_park_headers(message: &Message, delay: Duration, park_id: u64) -> (Message, u128) {
    let due = unix_millis(SystemTime::now() + delay);
    let mut copy = message.clone();
    copy.headers_mut().set(DUE, due.to_string());
    copy.headers_mut().set(PARK_ID, park_id.to_string());
    (copy, due)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_message_comes_back_to_its_queue_once_due_with_its_key_payload_and_headers() {
    let Some(backend) = AmqpBackend::connect_or_skip("parking_comes_back").await else {
        return;
    };
    let delay = Duration::from_secs(1);
    let (queue, parking) = parked_queue(&backend, "parking-back", &[delay]).await;
    let headers: Headers = [("tenant", "acme")].into_iter().collect();
    backend
        .produce(
            &queue,
            vec![TestMessage {
                key: Some(Bytes::from_static(b"orders.eu")),
                payload: Bytes::from_static(b"order-7"),
                headers,
            }],
        )
        .await
        .unwrap();
    let mut source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .build()
        .await
        .unwrap();
    let mut acker = source.acker();
    let original = receive(&mut source, 1, 1).await.messages.remove(0);
    let (copy, due) = with_park_headers(&original, delay, 7);
    assert_eq!(parking.park(&copy, delay).await.unwrap(), Parked::Moved);
    ack_through(&mut acker, &original).await.unwrap();

    let back = receive(&mut source, 1, 1).await.messages.remove(0);
    let arrived = unix_millis(SystemTime::now());
    assert!(
        arrived + EXPIRY_PRECISION_MS >= due,
        "back at {arrived} ms, due at {due} ms"
    );
    assert_eq!(back.payload(), original.payload());
    assert_eq!(back.key(), original.key());
    for name in ["tenant", DUE, PARK_ID] {
        assert_eq!(back.headers().get(name), copy.headers().get(name), "{name}");
    }
    // It came through its wait queue.
    assert_eq!(
        back.headers().get_str("x-first-death-queue"),
        parking.wait_queue(delay)
    );
    assert_eq!(parking.parked(), 1);
    ack_through(&mut acker, &back).await.unwrap();
    settle_at(&backend, &queue, 0).await;
    backend.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_messages_come_back_after_the_parking_that_parked_them_is_gone() {
    let Some(backend) = AmqpBackend::connect_or_skip("parking_dropped").await else {
        return;
    };
    let delay = Duration::from_secs(2);
    let (queue, parking) = parked_queue(&backend, "parking-dropped", &[delay]).await;
    let started = Instant::now();
    let parks = (0..20u64).map(|id| {
        let message = Message::new(
            Bytes::from(id.to_string()),
            Metadata::new(queue.as_str().into(), 1, Position::Tag(id + 1)),
        )
        .with_key(Bytes::from(format!("k{id}")));
        let (copy, _due) = with_park_headers(&message, delay, id);
        let parking = &parking;
        async move { parking.park(&copy, delay).await }
    });
    for parked in futures_util::future::join_all(parks).await {
        assert_eq!(parked.unwrap(), Parked::Moved);
    }
    parking.close().await;
    drop(parking);
    let gone_after = started.elapsed();

    let mut source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .build()
        .await
        .unwrap();
    let mut acker = source.acker();
    let back = receive(&mut source, 20, 20).await.messages;
    let arrived = unix_millis(SystemTime::now());
    let ids: BTreeSet<String> = back
        .iter()
        .map(|message| String::from_utf8_lossy(message.payload()).into_owned())
        .collect();
    assert_eq!(ids.len(), 20, "each parked id came back once: {ids:?}");
    for message in &back {
        let due: u128 = message.headers().get_str(DUE).unwrap().parse().unwrap();
        assert!(
            arrived + EXPIRY_PRECISION_MS >= due,
            "back at {arrived} ms, due at {due} ms"
        );
    }
    assert!(
        gone_after < delay,
        "the parking was gone only {gone_after:?} after the first park, not before they were due"
    );
    for message in &back {
        ack_through(&mut acker, message).await.unwrap();
    }
    settle_at(&backend, &queue, 0).await;
    backend.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_parks_what_asks_for_later_and_handles_it_once_due() {
    let Some(backend) = AmqpBackend::connect_or_skip("parking_runtime").await else {
        return;
    };
    let delay = Duration::from_secs(1);
    let (queue, parking) = parked_queue(&backend, "parking-runtime", &[delay]).await;
    let messages = (0..12)
        .map(|id| TestMessage {
            // A key of its own: no id waits behind another's park.
            key: Some(Bytes::from(format!("k{id}"))),
            payload: Bytes::from(id.to_string()),
            headers: Headers::new(),
        })
        .collect();
    backend.produce(&queue, messages).await.unwrap();
    let source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .build()
        .await
        .unwrap();

    #[derive(Default)]
    struct Seen {
        asked_later: BTreeMap<u32, Instant>,
        handled: BTreeMap<u32, Instant>,
    }
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Seen::default()));
    let handler = {
        let seen = seen.clone();
        tower::service_fn(move |message: Message| {
            let seen = seen.clone();
            async move {
                let id: u32 = String::from_utf8_lossy(message.payload()).parse().unwrap();
                let mut seen = seen.lock().unwrap();
                if id.is_multiple_of(3) && parks_header(&message) == 0 {
                    seen.asked_later.insert(id, Instant::now());
                    return Err(HandlerError::retry_later("not yet", Duration::from_secs(1)));
                }
                seen.handled.insert(id, Instant::now());
                Ok(())
            }
        })
    };
    let handler = tower::ServiceBuilder::new()
        .layer(ParkingLayer::new(parking))
        .service(handler);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = spawn_consumer(source, handler, shutdown.clone());
    let handled = || seen.lock().map_or(0, |seen| seen.handled.len());
    tokio::time::timeout(PATIENCE, async {
        while handled() < 12 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("only {} of 12 ids handled", handled()));
    shutdown.cancel();
    let report = running.await.unwrap().unwrap();
    assert_eq!(report.parked, 4, "{report:?}");
    assert_eq!(report.succeeded, 12, "{report:?}");
    {
        let seen = seen.lock().unwrap();
        assert_eq!(
            seen.asked_later.keys().copied().collect::<Vec<_>>(),
            [0, 3, 6, 9]
        );
        for (id, asked) in &seen.asked_later {
            let waited = seen.handled[id].duration_since(*asked);
            assert!(
                waited >= delay,
                "id {id} was handled {waited:?} after it asked for later"
            );
        }
    }
    settle_at(&backend, &queue, 0).await;
    backend.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_queue_deleted_by_hand_is_declared_again_by_a_later_park() {
    let Some(backend) = AmqpBackend::connect_or_skip("parking_redeclared").await else {
        return;
    };
    let delay = Duration::from_secs(1);
    let queue = backend.classic_queue("parking-redeclared").await.unwrap();
    // Classic wait queues, so that this kind is exercised too.
    let parking = AmqpParking::builder(backend.url())
        .queue(queue.as_str())
        .tiers([delay])
        .classic_wait_queues()
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let wait = parking.wait_queue(delay).unwrap().to_owned();
    backend.track_queue(&wait);
    backend.track_exchange(&wait);
    backend.track_exchange(&parking.return_exchange());
    for relayed in [parking.hop_queue().to_owned(), parking.relay_queue()] {
        backend.track_queue(&relayed);
        backend.track_exchange(&relayed);
    }
    backend
        .channel()
        .queue_delete(wait.as_str().into(), Default::default())
        .await
        .unwrap();

    let message = Message::new(
        Bytes::from_static(b"late"),
        Metadata::new(queue.as_str().into(), 1, Position::Tag(1)),
    );
    let (copy, due) = with_park_headers(&message, delay, 1);
    // The parking declared the tier moments ago, so the first park
    // publishes without declaring, to the exchange that went with the
    // queue: it fails (and the parking layer would retry the message the
    // ordinary way). It forgets the declaration, so the next park
    // declares the tier again.
    let first = parking.park(&copy, delay).await;
    assert!(first.is_err(), "{first:?}");
    let parked = parking.park(&copy, delay).await.unwrap();
    assert_eq!(parked, Parked::Moved);
    let back = tokio::time::timeout(PATIENCE, async {
        loop {
            let waiting = backend.peek(&queue).await.unwrap();
            if !waiting.is_empty() {
                return waiting;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the parked message comes back");
    let arrived = unix_millis(SystemTime::now());
    assert!(
        arrived + EXPIRY_PRECISION_MS >= due,
        "back at {arrived} ms, due at {due} ms"
    );
    assert_eq!(back.len(), 1);
    assert_eq!(&back[0].0[..], b"late");
    backend.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_park_that_would_come_back_to_another_queue_is_refused() {
    let Some(backend) = AmqpBackend::connect_or_skip("parking_refused").await else {
        return;
    };
    let tier = Duration::from_secs(1);
    let (_queue, parking) = parked_queue(&backend, "parking-refused", &[tier]).await;
    let message = Message::new(
        Bytes::from_static(b"x"),
        Metadata::new("another-queue".into(), 1, Position::Tag(1)),
    );
    let elsewhere = parking
        .park(&with_park_headers(&message, tier, 1).0, tier)
        .await;
    assert!(elsewhere.is_err(), "{elsewhere:?}");
    assert_eq!(parking.parked(), 0);
    assert_eq!(
        backend
            .messages_in(parking.wait_queue(tier).unwrap())
            .await
            .unwrap(),
        0
    );
    backend.cleanup().await;
}
