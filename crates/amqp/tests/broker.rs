//! `AmqpBroker` against a real RabbitMQ, beyond the shared broker suite
//! (`conformance.rs`): the dead-letter queue it declares, the parked
//! backlog a probe of another broker value counts, what a shutdown stops,
//! and a route refused whole.
//!
//! Each test skips with a printed reason when no broker listens on
//! 127.0.0.1:5672, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use std::time::Duration;

use intake_amqp::lapin::options::QueueDeclareOptions;
use intake_amqp::lapin::types::FieldTable;
use intake_amqp::{AmqpBroker, AmqpParking, Error};
use intake_core::backend::{Broker, RouteAddress, RouteOptions};
use intake_core::lag::LagProbe;
use intake_core::parking::Parking;
use intake_core::{Message, Metadata, Position};
use support::steps::PATIENCE;
use support::{AmqpBackend, expiring, unique};

async fn backend() -> Option<AmqpBackend> {
    AmqpBackend::connect_or_skip("amqp broker").await
}

fn broker(backend: &AmqpBackend) -> AmqpBroker {
    AmqpBroker::new(intake_amqp::AmqpSettings::new(backend.url()).connection_name("broker test"))
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

/// Whether `queue` exists (a passive declare on a channel of its own).
async fn exists(backend: &AmqpBackend, queue: &str) -> bool {
    let connection = intake_amqp::lapin::Connection::connect(
        backend.url(),
        intake_amqp::lapin::ConnectionProperties::default(),
    )
    .await
    .expect("connect");
    let channel = connection.create_channel().await.expect("a channel");
    let declared = channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await;
    let _ = connection.close(200, "checked".into()).await;
    declared.is_ok()
}

/// A message of `queue` as its source would deliver it, keyed.
fn message_of(queue: &str, id: u64) -> Message {
    Message::new(
        id.to_string(),
        Metadata::new(queue.into(), 1, Position::Tag(id + 1)),
    )
    .with_key(format!("k{id}"))
}

#[tokio::test]
async fn a_route_declares_its_missing_dead_letter_queue_and_uses_an_existing_one_as_it_is() {
    let Some(backend) = backend().await else {
        return;
    };
    // A queue without a dead-letter queue.
    let queue = unique("broker-dlq");
    backend
        .channel()
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            expiring(),
        )
        .await
        .expect("declare the queue");
    backend.track_queue(&queue);
    let dead_letters = AmqpBroker::dead_letter_queue(&queue);
    backend.track_queue(&dead_letters);
    assert!(!exists(&backend, &dead_letters).await);
    let broker = broker(&backend);
    let parts = broker
        .route(&RouteAddress::new(&queue, "billing"), &RouteOptions::new())
        .await
        .expect("derive the route");
    assert!(parts.parking.is_none());
    assert!(
        exists(&backend, &dead_letters).await,
        "the route declared {dead_letters}"
    );
    drop(parts);

    // The fixture's queue has a dead-letter queue already, declared with
    // other settings (not durable, expiring): the route uses it as it is.
    let queue = backend.classic_queue("broker-dlq").await.expect("a queue");
    broker
        .route(&RouteAddress::new(&queue, "billing"), &RouteOptions::new())
        .await
        .expect("derive the route on an existing dead-letter queue");
    broker
        .shutdown(PATIENCE)
        .await
        .expect("nothing to stop in time");
    backend.cleanup().await;
}

#[tokio::test]
async fn a_probe_of_another_broker_value_counts_what_a_parking_with_default_tiers_holds() {
    let Some(backend) = backend().await else {
        return;
    };
    let queue = backend.classic_queue("broker-lag").await.expect("a queue");
    let address = RouteAddress::new(&queue, "billing");
    let broker = broker(&backend);
    // Two minutes is one of the default tiers.
    let later = Duration::from_secs(120);
    let parts = broker
        .route(&address, &RouteOptions::new().parking_tiers([later]))
        .await
        .expect("derive the route");
    let parking = parts.parking.expect("asked for parking");
    track_parking(&backend, &parking);
    for id in 0..3 {
        parking
            .park(&message_of(&queue, id), later)
            .await
            .expect("park");
    }
    let own = broker.lag_probe(&address).await.expect("a probe");
    // A broker value that derived no parking (as `intake lag` has) counts
    // the wait queues of the default tiers.
    let other = self::broker(&backend);
    let fresh = other.lag_probe(&address).await.expect("a probe");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let counted = (
            own.parked().await.expect("count"),
            fresh.parked().await.expect("count"),
        );
        if counted == (Some(3), Some(3)) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "counted {counted:?} parked, not 3 by each probe"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Broker lag does not count them: the queue itself is empty.
    let lag = own.lag().await.expect("lag");
    assert_eq!(lag.len(), 1);
    assert_eq!(lag[0].messages, Some(0));

    broker.shutdown(PATIENCE).await.expect("stop the parking");
    let refused = parking.park(&message_of(&queue, 9), later).await;
    assert!(
        refused.is_err(),
        "a parking stopped by the shutdown parks nothing more"
    );
    // What is parked stays parked.
    assert_eq!(fresh.parked().await.expect("count"), Some(3));
    backend.cleanup().await;
}

#[tokio::test]
async fn a_route_on_a_missing_queue_is_refused_whole() {
    let Some(backend) = backend().await else {
        return;
    };
    let queue = unique("broker-missing");
    let dead_letters = AmqpBroker::dead_letter_queue(&queue);
    backend.track_queue(&dead_letters);
    let broker = broker(&backend);
    let refused = broker
        .route(
            &RouteAddress::new(&queue, "billing"),
            &RouteOptions::new().parking(),
        )
        .await;
    assert!(
        matches!(refused, Err(Error::QueueNotFound { .. })),
        "{:?}",
        refused.err()
    );
    assert!(
        !exists(&backend, &dead_letters).await,
        "nothing is declared for a route refused"
    );
    assert!(format!("{broker:?}").contains("parkings: 0"), "{broker:?}");
    backend.cleanup().await;
}
