//! Calling a handler allocates nothing the user did not ask for.
//!
//! A test binary of its own, because it replaces the global allocator with
//! one that counts the allocations of the thread under test.

#[path = "support/counting_allocator.rs"]
mod counting_allocator;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use counting_allocator::allocations_during;
use intake_core::{Json, Message, Meta, Metadata, Position, handler_fn};
use serde::Deserialize;
use tower::Service;

#[derive(Deserialize)]
struct Order {
    id: u64,
    quantity: u32,
}

#[test]
fn calling_a_json_handler_allocates_nothing() {
    let total = Arc::new(AtomicU64::new(0));
    let sum = total.clone();
    let mut handler = handler_fn(move |Meta(meta): Meta, Json(order): Json<Order>| {
        let sum = sum.clone();
        async move {
            let value = order.id + u64::from(order.quantity) + meta.partition() as u64;
            sum.fetch_add(value, Ordering::Relaxed);
        }
    });
    let message = Message::new(
        Bytes::from_static(br#"{"id":1000000,"quantity":37}"#),
        Metadata::new("orders".into(), 1, Position::Offset(10)),
    );
    let mut cx = Context::from_waker(Waker::noop());

    for round in 1..=3u64 {
        // The runtime keeps a copy for redelivery; cloning is a count bump.
        let delivery = message.clone();
        let (outcome, allocations) = allocations_during(|| {
            let ready = handler.poll_ready(&mut cx).is_ready();
            let mut future = pin!(handler.call(delivery));
            (ready, future.as_mut().poll(&mut cx))
        });
        assert!(outcome.0, "a handler fn is always ready");
        assert!(matches!(outcome.1, Poll::Ready(Ok(()))), "{:?}", outcome.1);
        assert_eq!(allocations, 0, "allocations in call {round}");
        assert_eq!(total.load(Ordering::Relaxed), round * 1_000_038);
    }
}

/// What a `State` handler shares: not `Clone` itself, behind an `Arc`.
struct Ledger {
    total: AtomicU64,
}

#[derive(Clone)]
struct Services {
    ledger: Arc<Ledger>,
}

impl intake_core::handler::FromRef<Services> for Arc<Ledger> {
    fn from_ref(services: &Services) -> Self {
        services.ledger.clone()
    }
}

#[test]
fn calling_a_handler_with_state_allocates_nothing() {
    use intake_core::handler::{State, handler_fn_with_state};

    let ledger = Arc::new(Ledger {
        total: AtomicU64::new(0),
    });
    let mut handler = handler_fn_with_state(
        Services {
            ledger: ledger.clone(),
        },
        async |State(ledger): State<Arc<Ledger>>, Json(order): Json<Order>| {
            let value = order.id + u64::from(order.quantity);
            ledger.total.fetch_add(value, Ordering::Relaxed);
        },
    );
    let message = Message::new(
        Bytes::from_static(br#"{"id":1000000,"quantity":37}"#),
        Metadata::new("orders".into(), 1, Position::Offset(10)),
    );
    let mut cx = Context::from_waker(Waker::noop());

    for round in 1..=3u64 {
        let delivery = message.clone();
        let (outcome, allocations) = allocations_during(|| {
            let mut future = pin!(handler.call(delivery));
            future.as_mut().poll(&mut cx)
        });
        assert!(matches!(outcome, Poll::Ready(Ok(()))), "{outcome:?}");
        assert_eq!(allocations, 0, "allocations in call {round}");
        assert_eq!(ledger.total.load(Ordering::Relaxed), round * 1_000_037);
    }
}

#[test]
fn the_counter_sees_allocations() {
    let (boxed, allocations) = allocations_during(|| Box::new(1u64));
    assert_eq!(*boxed, 1);
    assert_eq!(allocations, 1);
}
