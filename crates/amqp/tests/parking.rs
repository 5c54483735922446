//! `AmqpParking` at its limits, against a real RabbitMQ: a delay longer
//! than the longest wait tier, and which messages it takes for its own
//! copies (whose park headers the parking layer believes).
//!
//! Each test skips with a printed reason when no broker listens on
//! 127.0.0.1:5672, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use intake_amqp::lapin::BasicProperties;
use intake_amqp::lapin::types::{AMQPValue, FieldArray, FieldTable, LongString};
use intake_amqp::{AmqpParking, AmqpSource};
use intake_core::backend::testkit::{Backend, TestMessage};
use intake_core::parking::{
    DUE, ORIGIN, PARK_ID, PARKS, Parked, Parking, ParkingLayer, parks_header,
};
use intake_core::{HandlerError, Headers, Message, Metadata, Position};
use support::steps::{PATIENCE, ack_through, receive, settle_at};
use support::{AmqpBackend, expiring, inbound_exchange, unique};

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
    track_parking(backend, &parking);
    (queue, parking)
}

/// Has the fixture delete what `parking` declares.
fn track_parking(backend: &AmqpBackend, parking: &AmqpParking) {
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
}

fn unix_millis(time: SystemTime) -> u128 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis())
}

/// What a handler saw of one id.
#[derive(Clone, Debug, Default)]
struct Seen {
    /// Every call: when, and the parks its message carried.
    calls: Vec<(Instant, u32)>,
    handled: Option<Instant>,
}

type Record = Arc<Mutex<std::collections::BTreeMap<String, Seen>>>;

fn seen_of(record: &Record, id: &str) -> Seen {
    record.lock().unwrap().get(id).cloned().unwrap_or_default()
}

/// Waits until every id in `ids` was handled, or one was called more than
/// `max_calls` times (a loop, which fails the test at once).
async fn until_handled(record: &Record, ids: &[&str], max_calls: usize) {
    let done = tokio::time::timeout(PATIENCE, async {
        loop {
            {
                let record = record.lock().unwrap();
                let looping = record.values().any(|seen| seen.calls.len() > max_calls);
                let handled = ids
                    .iter()
                    .all(|id| record.get(*id).is_some_and(|seen| seen.handled.is_some()));
                if looping || handled {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let record = record.lock().unwrap();
    for id in ids {
        let seen = record.get(*id).cloned().unwrap_or_default();
        assert!(
            done.is_ok() && seen.handled.is_some() && seen.calls.len() <= max_calls,
            "id {id}: called {} times (parks seen: {:?}), handled: {}",
            seen.calls.len(),
            seen.calls
                .iter()
                .map(|(_, parks)| *parks)
                .collect::<Vec<_>>(),
            seen.handled.is_some()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_longer_than_the_longest_tier_waits_in_steps_and_runs_once_due() {
    let Some(backend) = AmqpBackend::connect_or_skip("parking_beyond_longest_tier").await else {
        return;
    };
    // Review R16: the longest tier is 1 s and the handler asks for 3 s.
    let tier = Duration::from_secs(1);
    let delay = Duration::from_secs(3);
    let (queue, parking) = parked_queue(&backend, "parking-beyond", &[tier]).await;
    backend
        .produce(
            &queue,
            vec![TestMessage {
                key: Some(Bytes::from_static(b"k7")),
                payload: Bytes::from_static(b"7"),
                headers: Headers::new(),
            }],
        )
        .await
        .unwrap();
    let source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .build()
        .await
        .unwrap();
    let record = Record::default();
    let handler = {
        let record = record.clone();
        tower::service_fn(move |message: Message| {
            let record = record.clone();
            async move {
                let id = String::from_utf8_lossy(message.payload()).into_owned();
                let parks = parks_header(&message);
                let mut record = record.lock().unwrap();
                let seen = record.entry(id).or_default();
                seen.calls.push((Instant::now(), parks));
                if parks == 0 {
                    return Err(HandlerError::retry_later("not yet", delay));
                }
                seen.handled = Some(Instant::now());
                Ok(())
            }
        })
    };
    let parking = Arc::new(parking);
    let handler = tower::ServiceBuilder::new()
        .layer(ParkingLayer::new(parking.clone()))
        .service(handler);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = spawn_consumer(source, handler, shutdown.clone());
    until_handled(&record, &["7"], 2).await;
    shutdown.cancel();
    let report = running.await.unwrap().unwrap();
    let seen = seen_of(&record, "7");
    let asked = seen.calls[0].0;
    let waited = seen.handled.unwrap().duration_since(asked);
    assert!(
        waited >= delay,
        "handled {waited:?} after asking for {delay:?}"
    );
    assert_eq!(seen.calls.len(), 2, "{seen:?}");
    assert_eq!(report.parked, 1, "{report:?}");
    assert_eq!(report.succeeded, 1, "{report:?}");
    // Parked in the 1 s step, then relayed on: a step again, then the tier.
    assert_eq!(parking.parked(), 1);
    assert!(parking.relayed() >= 1, "relayed {}", parking.relayed());
    assert_eq!(
        backend.messages_in(&parking.relay_queue()).await.unwrap(),
        0
    );
    parking.close().await;
    settle_at(&backend, &queue, 0).await;
    backend.cleanup().await;
}

/// The headers a producer would write to pass a message off as a parked
/// copy: due soon, parked as often as allowed, from another origin.
fn forged_park_headers(table: &mut FieldTable, queue: &str) {
    let due = unix_millis(SystemTime::now() + Duration::from_millis(900));
    for (name, value) in [
        (DUE, due.to_string()),
        (PARKS, "10".to_owned()),
        (PARK_ID, "1".to_owned()),
        (ORIGIN, format!("{queue}-elsewhere")),
    ] {
        table.insert(name.into(), AMQPValue::LongString(value.into()));
    }
}

/// RabbitMQ's own record of a dead-lettering from `wait_queue` on expiry,
/// as a producer can write it.
fn forged_death_headers(table: &mut FieldTable, wait_queue: &str) {
    let text = |value: &str| AMQPValue::LongString(LongString::from(value));
    let mut death = FieldTable::default();
    death.insert("queue".into(), text(wait_queue));
    death.insert("reason".into(), text("expired"));
    death.insert("exchange".into(), text(wait_queue));
    death.insert("count".into(), AMQPValue::LongLongInt(1));
    table.insert(
        "x-death".into(),
        AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(death)])),
    );
    for (name, value) in [
        ("x-first-death-reason", "expired"),
        ("x-first-death-queue", wait_queue),
        ("x-first-death-exchange", wait_queue),
        ("x-last-death-reason", "expired"),
        ("x-last-death-queue", wait_queue),
        ("x-last-death-exchange", wait_queue),
    ] {
        table.insert(name.into(), text(value));
    }
}

/// Publishes `payload` with `headers` to `queue` through the fixture's
/// inbound exchange (a producer's way in), confirmed.
async fn publish_with(backend: &AmqpBackend, queue: &str, payload: &[u8], headers: FieldTable) {
    let confirm = backend
        .channel()
        .basic_publish(
            inbound_exchange(queue).as_str().into(),
            "forged".into(),
            Default::default(),
            payload,
            BasicProperties::default().with_headers(headers),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(confirm.is_ack());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_back_from_its_wait_queue_is_recognised_and_a_producers_message_is_not() {
    let Some(backend) = AmqpBackend::connect_or_skip("parking_returned_copy").await else {
        return;
    };
    let tier = Duration::from_secs(1);
    let (queue, parking) = parked_queue(&backend, "parking-recognised", &[tier]).await;
    let wait_queue = parking.wait_queue(tier).unwrap().to_owned();
    let mut source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .build()
        .await
        .unwrap();
    let mut acker = source.acker();

    // A copy the parking wrote, back from its wait queue.
    let parked = Message::new(
        Bytes::from_static(b"parked"),
        Metadata::new(queue.as_str().into(), 1, Position::Tag(1)),
    );
    let mut copy = parked.clone();
    copy.headers_mut().set(
        DUE,
        unix_millis(SystemTime::now() + tier)
            .to_string()
            .into_bytes(),
    );
    copy.headers_mut().set(PARKS, "1");
    assert_eq!(parking.park(&copy, tier).await.unwrap(), Parked::Moved);
    let back = receive(&mut source, 1, 1).await.messages.remove(0);
    assert_eq!(back.payload().as_ref(), b"parked");
    assert!(parking.is_returned_copy(&back), "{:?}", back.headers());
    ack_through(&mut acker, &back).await.unwrap();

    // A producer's message with park headers and no record of a death.
    let mut headers = FieldTable::default();
    forged_park_headers(&mut headers, &queue);
    publish_with(&backend, &queue, b"forged", headers).await;
    let forged = receive(&mut source, 1, 1).await.messages.remove(0);
    assert_eq!(forged.payload().as_ref(), b"forged");
    assert!(forged.headers().get(DUE).is_some());
    assert!(!parking.is_returned_copy(&forged), "{:?}", forged.headers());
    ack_through(&mut acker, &forged).await.unwrap();

    // A producer that writes RabbitMQ's death headers too: RabbitMQ 3.10
    // delivers them as written, so the parking cannot tell it from a copy
    // (the residual risk its docs state).
    let mut headers = FieldTable::default();
    forged_park_headers(&mut headers, &queue);
    forged_death_headers(&mut headers, &wait_queue);
    publish_with(&backend, &queue, b"forged-death", headers).await;
    let forged = receive(&mut source, 1, 1).await.messages.remove(0);
    assert_eq!(forged.payload().as_ref(), b"forged-death");
    assert_eq!(
        forged.headers().get_str("x-first-death-queue"),
        Some(wait_queue.as_str()),
        "{:?}",
        forged.headers()
    );
    assert!(parking.is_returned_copy(&forged), "{:?}", forged.headers());
    ack_through(&mut acker, &forged).await.unwrap();
    settle_at(&backend, &queue, 0).await;
    backend.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_believes_a_copys_park_headers_and_drops_a_producers() {
    let Some(backend) = AmqpBackend::connect_or_skip("parking_forged_headers").await else {
        return;
    };
    let tier = Duration::from_secs(1);
    let (queue, parking) = parked_queue(&backend, "parking-forged", &[tier]).await;
    // "honest" asks for later once; "forged" carries a producer's park
    // headers (due in 0.9 s, parked 10 times: the layer's max_parks), and
    // asks for later once too.
    backend
        .produce(
            &queue,
            vec![TestMessage {
                key: Some(Bytes::from_static(b"k1")),
                payload: Bytes::from_static(b"honest"),
                headers: Headers::new(),
            }],
        )
        .await
        .unwrap();
    let mut headers = FieldTable::default();
    forged_park_headers(&mut headers, &queue);
    publish_with(&backend, &queue, b"forged", headers).await;
    let source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .build()
        .await
        .unwrap();
    #[derive(Default)]
    struct Returned {
        /// Ids whose first call saw a park header.
        first_with_park_headers: Vec<String>,
        due_held: Vec<(String, bool)>,
        parked_from: Vec<(String, bool)>,
    }
    let returned = Arc::new(Mutex::new(Returned::default()));
    let record = Record::default();
    let handler = {
        let record = record.clone();
        let returned = returned.clone();
        tower::service_fn(move |message: Message| {
            let record = record.clone();
            let returned = returned.clone();
            async move {
                let id = String::from_utf8_lossy(message.payload()).into_owned();
                let parks = parks_header(&message);
                let now = unix_millis(SystemTime::now());
                let mut record = record.lock().unwrap();
                let seen = record.entry(id.clone()).or_default();
                seen.calls.push((Instant::now(), parks));
                let mut returned = returned.lock().unwrap();
                if seen.calls.len() == 1 {
                    if [DUE, ORIGIN, PARK_ID]
                        .iter()
                        .any(|name| message.headers().get(name).is_some())
                    {
                        returned.first_with_park_headers.push(id);
                    }
                    return Err(HandlerError::retry_later("not yet", tier));
                }
                let due: u128 = message
                    .headers()
                    .get_str(DUE)
                    .and_then(|due| due.parse().ok())
                    .unwrap_or(u128::MAX);
                returned.due_held.push((id.clone(), now >= due));
                returned
                    .parked_from
                    .push((id, message.metadata().parked_from().is_some()));
                seen.handled = Some(Instant::now());
                Ok(())
            }
        })
    };
    let handler = tower::ServiceBuilder::new()
        .layer(ParkingLayer::new(parking))
        .service(handler);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = spawn_consumer(source, handler, shutdown.clone());
    until_handled(&record, &["honest", "forged"], 2).await;
    shutdown.cancel();
    let report = running.await.unwrap().unwrap();
    assert_eq!(report.parked, 2, "{report:?}");
    assert_eq!(report.succeeded, 2, "{report:?}");
    for id in ["honest", "forged"] {
        let seen = seen_of(&record, id);
        let parks: Vec<u32> = seen.calls.iter().map(|(_, parks)| *parks).collect();
        assert_eq!(parks, [0, 1], "{id}: the copy counts its one park");
    }
    let returned = std::mem::take(&mut *returned.lock().unwrap());
    assert_eq!(
        returned.first_with_park_headers,
        Vec::<String>::new(),
        "a producer's park headers reached the handler"
    );
    for (id, held) in &returned.due_held {
        assert!(held, "{id} ran before its due time");
    }
    for (id, from) in &returned.parked_from {
        assert!(from, "{id}: the copy names its first delivery");
    }
    settle_at(&backend, &queue, 0).await;
    backend.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_between_steps_waits_for_a_relay_and_survives_a_lost_relay_connection() {
    let Some(backend) = AmqpBackend::connect_or_skip("parking_relay_restart").await else {
        return;
    };
    let tier = Duration::from_millis(500);
    let delay = Duration::from_millis(2_500);
    let (queue, first) = parked_queue(&backend, "parking-relay", &[tier]).await;
    let message = Message::new(
        Bytes::from_static(b"long"),
        Metadata::new(queue.as_str().into(), 1, Position::Tag(1)),
    )
    .with_key(Bytes::from_static(b"k"));
    let mut copy = message.clone();
    let due = unix_millis(SystemTime::now() + delay);
    copy.headers_mut().set(DUE, due.to_string());
    copy.headers_mut().set(PARKS, "1");
    assert_eq!(first.park(&copy, delay).await.unwrap(), Parked::Moved);
    // No relay runs: after its first step the copy waits in the relay queue.
    first.close().await;
    let relay_queue = first.relay_queue();
    drop(first);
    tokio::time::timeout(PATIENCE, async {
        while backend.messages_in(&relay_queue).await.unwrap_or(0) != 1 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the copy reaches the relay queue after one step");

    // The next parking's relay takes it on, through a connection the
    // broker closes under it.
    let name = unique("relay");
    let second = AmqpParking::builder(
        intake_amqp::AmqpSettings::new(backend.url()).connection_name(name.as_str()),
    )
    .queue(queue.as_str())
    .tiers([tier])
    .build()
    .await
    .unwrap();
    let relay_connection = format!("{name} (parking relay)");
    tokio::time::timeout(PATIENCE, async {
        while support::close_connection_named(&relay_connection)
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the relay connects");
    let mut source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .build()
        .await
        .unwrap();
    let mut acker = source.acker();
    let back = receive(&mut source, 1, 1).await.messages.remove(0);
    let arrived = unix_millis(SystemTime::now());
    // RabbitMQ's expiry may run a little early; the parking layer holds
    // such a copy until due.
    assert!(
        arrived + 100 >= due,
        "back at {arrived} ms, due at {due} ms"
    );
    assert_eq!(back.payload().as_ref(), b"long");
    assert_eq!(back.key().map(|key| key.as_ref()), Some(&b"k"[..]));
    assert_eq!(back.headers().get_str(PARKS), Some("1"));
    assert_eq!(
        back.headers().get_str("x-first-death-queue"),
        second.wait_queue(tier)
    );
    assert!(second.is_returned_copy(&back));
    assert!(second.relayed() >= 1, "relayed {}", second.relayed());
    ack_through(&mut acker, &back).await.unwrap();
    second.close().await;
    settle_at(&backend, &queue, 0).await;
    backend.cleanup().await;
}
