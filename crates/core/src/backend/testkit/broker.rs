//! The scenarios every [`Broker`] passes unchanged: the parts of a route
//! derived from one broker value work together, on every backend.
//!
//! A backend crate implements [`BrokerBackend`] on its conformance fixture
//! (which already implements [`PublishingBackend`]) and lets
//! [`broker_suite!`](crate::broker_suite) write the tests:
//!
//! ```ignore
//! intake_core::broker_suite!(backend());
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::harness::{Ledger, PATIENCE, Running, id_of, unique_group, wait_until_acknowledged};
use super::{PublishingBackend, TestMessage};
use crate::backend::broker::{Broker, RouteAddress, RouteOptions};
use crate::consumer::{Consumer, DeliveryOrder};
use crate::dead_letter::DeadLetterLayer;
use crate::dead_letter::store::{DeadLetterStore, Filter};
use crate::error::HandlerError;
use crate::lag::LagProbe;
use crate::message::Message;
use crate::parking::ParkingLayer;
use crate::publish::{Output, Publisher};

/// A backend whose broker value the suite derives every part from.
pub trait BrokerBackend: PublishingBackend {
    /// The backend's broker value.
    type Broker: Broker;

    /// The broker value connected to the broker under test.
    fn broker(&self) -> Self::Broker;

    /// The address a route of `group` on `source` (made by
    /// [`create_source`](super::Backend::create_source)) has: by default
    /// the two names as they are.
    fn route_address(&self, source: &str, group: &str) -> RouteAddress {
        RouteAddress::new(source, group)
    }
}

/// Writes one `#[tokio::test]` per broker scenario, like
/// [`conformance_suite!`](crate::conformance_suite).
#[macro_export]
macro_rules! broker_suite {
    ($backend:expr) => {
        $crate::broker_suite!(@scenarios $backend;
            a_derived_route_dead_letters_into_its_derived_store,
            a_derived_route_with_parking_brings_every_parked_message_back_in_key_order,
            a_derived_lag_probe_counts_the_parked_backlog,
            a_derived_publisher_publishes_where_a_derived_route_reads,
        );
    };
    (@scenarios $backend:expr; $($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                let Some(backend) = $backend.await else {
                    return;
                };
                $crate::backend::testkit::broker::$scenario(&backend).await;
            }
        )*
    };
}

const KEYS: u64 = 4;

fn keyed(first: u64, count: u64, poison: impl Fn(u64) -> bool) -> Vec<TestMessage> {
    (first..first + count)
        .map(|id| {
            let payload = if poison(id) {
                format!("poison {id}")
            } else {
                id.to_string()
            };
            TestMessage::new(format!("k{}", id % KEYS), payload)
        })
        .collect()
}

fn partitions_of<B: BrokerBackend>(backend: &B) -> u32 {
    if backend.capabilities().partitions {
        2
    } else {
        1
    }
}

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("{what} within {PATIENCE:?}"))
}

/// A route's source, acker and dead-letter sink derived together: what the
/// handler refuses for good lands in the dead-letter store derived for the
/// same address, and everything else is handled and acknowledged.
pub async fn a_derived_route_dead_letters_into_its_derived_store<B: BrokerBackend>(backend: &B) {
    let source = backend
        .create_source(partitions_of(backend))
        .await
        .expect("create the source");
    let group = unique_group("derived-route");
    let address = backend.route_address(&source, &group);
    let broker = backend.broker();
    let poison = |id: u64| id % 10 == 7;
    backend
        .produce(&source, keyed(0, 40, poison))
        .await
        .expect("produce");

    let parts = within(
        "derive the route",
        broker.route(&address, &RouteOptions::new()),
    )
    .await
    .expect("derive the route");
    assert!(parts.parking.is_none(), "parking was not asked for");
    let ledger = Ledger::default();
    let handler = {
        let ledger = ledger.clone();
        tower::ServiceBuilder::new()
            .layer(DeadLetterLayer::new(parts.dead_letter_sink))
            .service_fn(move |message: Message| {
                let ledger = ledger.clone();
                async move {
                    ledger.record(id_of(&message)?);
                    Ok::<(), HandlerError>(())
                }
            })
    };
    let running = Running::run(parts.source, parts.acker, Consumer::builder(), 32, handler)
        .expect("start the consumer");
    ledger
        .wait_until("every message but the poison handled", || {
            (0..40)
                .filter(|id| !poison(*id))
                .all(|id| ledger.count(id) > 0)
        })
        .await;
    wait_until_acknowledged(backend, &source, &group, "messages").await;
    running.stop().await;

    let store = within(
        "derive the dead-letter store",
        broker.dead_letter_store(&address),
    )
    .await
    .expect("derive the dead-letter store");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let count = store
            .count(&Filter::all())
            .await
            .expect("count the dead letters");
        if count == 4 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}: the derived store counts {count} letters, not the 4 the route wrote",
            backend.name()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    within("shut the broker's parts down", broker.shutdown(PATIENCE))
        .await
        .expect("shut the broker's parts down");
}

/// A route derived with parking: every message's first attempt asks to be
/// retried later, every one comes back through the route's own source
/// (nothing is stranded in a return path nobody reads), none is
/// dead-lettered, and each key's messages succeed in the order they were
/// produced.
pub async fn a_derived_route_with_parking_brings_every_parked_message_back_in_key_order<
    B: BrokerBackend,
>(
    backend: &B,
) {
    const COUNT: u64 = 24;
    let source = backend.create_source(1).await.expect("create the source");
    let group = unique_group("derived-parking");
    let address = backend.route_address(&source, &group);
    let broker = backend.broker();
    backend
        .produce(&source, keyed(0, COUNT, |_| false))
        .await
        .expect("produce");
    let options = RouteOptions::new().parking_tiers([Duration::from_secs(1)]);
    let parts = within("derive the route", broker.route(&address, &options))
        .await
        .expect("derive the route");
    let parking = parts.parking.expect("the route was derived with parking");

    let ledger = Ledger::default();
    let order: Arc<Mutex<BTreeMap<u64, Vec<u64>>>> = Arc::default();
    let handler = {
        let ledger = ledger.clone();
        let order = Arc::clone(&order);
        tower::ServiceBuilder::new()
            .layer(DeadLetterLayer::new(parts.dead_letter_sink))
            .layer(ParkingLayer::new(parking))
            .service_fn(move |message: Message| {
                let ledger = ledger.clone();
                let order = Arc::clone(&order);
                async move {
                    let id = id_of(&message)?;
                    if message.metadata().parked_from().is_none() {
                        return Err(HandlerError::retry_later(
                            "the first attempt asks for later",
                            Duration::from_secs(1),
                        ));
                    }
                    if ledger.count(id) == 0 {
                        order
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .entry(id % KEYS)
                            .or_default()
                            .push(id);
                    }
                    ledger.record(id);
                    Ok::<(), HandlerError>(())
                }
            })
    };
    let running = Running::run(
        parts.source,
        parts.acker,
        Consumer::builder().ordering(DeliveryOrder::Key),
        32,
        handler,
    )
    .expect("start the consumer");
    ledger.wait_for_all(COUNT, "parked and back").await;
    wait_until_acknowledged(backend, &source, &group, "messages").await;
    let report = running.stop().await;
    assert_eq!(
        report.dead_lettered,
        0,
        "{}: parked messages were dead-lettered",
        backend.name()
    );
    let order = order
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    for (key, ids) in order {
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        assert_eq!(
            ids,
            sorted,
            "{}: key k{key} succeeded out of order",
            backend.name()
        );
    }
    let probe = within("derive the lag probe", broker.lag_probe(&address))
        .await
        .expect("derive the lag probe");
    let parked = probe.parked().await.expect("count the parked backlog");
    assert!(
        matches!(parked, None | Some(0)),
        "{}: {parked:?} still parked after every message came back",
        backend.name()
    );
    within("shut the broker's parts down", broker.shutdown(PATIENCE))
        .await
        .expect("shut the broker's parts down");
}

/// What a route parked counts in its derived lag probe while it waits,
/// beside broker lag, where the backend moves parked copies away and
/// acknowledges the originals; a backend that holds parks in the consumer
/// (NATS) answers `None` and counts them in broker lag.
pub async fn a_derived_lag_probe_counts_the_parked_backlog<B: BrokerBackend>(backend: &B) {
    // One message per key: a key's later messages would be parked behind
    // its first without reaching the handler.
    const COUNT: u64 = KEYS;
    let source = backend.create_source(1).await.expect("create the source");
    let group = unique_group("derived-lag");
    let address = backend.route_address(&source, &group);
    let broker = backend.broker();
    backend
        .produce(&source, keyed(0, COUNT, |_| false))
        .await
        .expect("produce");
    let later = Duration::from_secs(120);
    let options = RouteOptions::new().parking_tiers([later]);
    let parts = within("derive the route", broker.route(&address, &options))
        .await
        .expect("derive the route");
    let parking = parts.parking.expect("the route was derived with parking");
    let seen = Ledger::default();
    let handler = {
        let seen = seen.clone();
        tower::ServiceBuilder::new()
            .layer(DeadLetterLayer::new(parts.dead_letter_sink))
            .layer(ParkingLayer::new(parking))
            .service_fn(move |message: Message| {
                let seen = seen.clone();
                async move {
                    seen.record(id_of(&message)?);
                    Err::<(), _>(HandlerError::retry_later("not before two minutes", later))
                }
            })
    };
    let running = Running::run(
        parts.source,
        parts.acker,
        Consumer::builder().ordering(DeliveryOrder::Unordered),
        32,
        handler,
    )
    .expect("start the consumer");
    seen.wait_for_all(COUNT, "asked to be parked").await;

    let probe = within("derive the lag probe", broker.lag_probe(&address))
        .await
        .expect("derive the lag probe");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let counted = loop {
        let parked = probe.parked().await.expect("count the parked backlog");
        match parked {
            // A backend that holds parks in the consumer (NATS) counts them
            // in broker lag instead: they are not acknowledged.
            None => break false,
            Some(parked) if parked == COUNT => break true,
            Some(parked) => assert!(
                tokio::time::Instant::now() < deadline,
                "{}: the probe counts {parked} parked, not {COUNT}",
                backend.name()
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    if counted {
        // Counted beside broker lag because the originals were acknowledged.
        wait_until_acknowledged(backend, &source, &group, "originals").await;
        // Per tier: the same count, every message at the one tier it was
        // parked at (a tier of its own, `exact` or `all`), and a due time,
        // where the backend tells one, within the park's two minutes.
        let tiers = probe
            .parked_tiers()
            .await
            .expect("count the parked backlog per tier")
            .expect("a backend that counts the total counts its tiers");
        let holding: Vec<_> = tiers.iter().filter(|tier| tier.messages > 0).collect();
        assert_eq!(
            tiers.iter().map(|tier| tier.messages).sum::<u64>(),
            COUNT,
            "{}: {tiers:?}",
            backend.name()
        );
        assert_eq!(holding.len(), 1, "{}: {tiers:?}", backend.name());
        assert!(!holding[0].tier.is_empty(), "{}: {tiers:?}", backend.name());
        if let Some(due) = holding[0].next_due {
            let wait = due
                .duration_since(std::time::SystemTime::now())
                .unwrap_or_default();
            assert!(
                wait <= later,
                "{}: due in {wait:?}: {tiers:?}",
                backend.name()
            );
        }
    }
    running.stop().await;
    within("shut the broker's parts down", broker.shutdown(PATIENCE))
        .await
        .expect("shut the broker's parts down");
}

/// The broker's publisher writes where a route derived from the same
/// broker reads.
pub async fn a_derived_publisher_publishes_where_a_derived_route_reads<B: BrokerBackend>(
    backend: &B,
) {
    const COUNT: u64 = 20;
    let source = backend
        .create_source(partitions_of(backend))
        .await
        .expect("create the source");
    let group = unique_group("derived-publisher");
    let address = backend.route_address(&source, &group);
    let broker = backend.broker();
    let parts = within(
        "derive the route",
        broker.route(&address, &RouteOptions::new()),
    )
    .await
    .expect("derive the route");
    let ledger = Ledger::default();
    let handler = {
        let ledger = ledger.clone();
        tower::service_fn(move |message: Message| {
            let ledger = ledger.clone();
            async move {
                ledger.record(id_of(&message)?);
                Ok::<(), HandlerError>(())
            }
        })
    };
    let running = Running::run(parts.source, parts.acker, Consumer::builder(), 32, handler)
        .expect("start the consumer");

    let publisher = within("derive the publisher", broker.publisher())
        .await
        .expect("derive the publisher");
    let destination: Arc<str> = backend.destination(&source).into();
    for id in 0..COUNT {
        let output = Output::new(Arc::clone(&destination), id.to_string())
            .with_key(format!("k{}", id % KEYS));
        within("publish", publisher.publish(output))
            .await
            .unwrap_or_else(|error| panic!("publish output {id}: {error}"));
    }
    ledger.wait_for_all(COUNT, "published").await;
    running.stop().await;
    within("shut the broker's parts down", broker.shutdown(PATIENCE))
        .await
        .expect("shut the broker's parts down");
}
