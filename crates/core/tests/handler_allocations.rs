//! Calling a handler allocates nothing the user did not ask for.
//!
//! A test binary of its own, because it replaces the global allocator with
//! one that counts the allocations of the thread under test.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use intake_core::{Json, Message, Meta, Metadata, Position, handler_fn};
use serde::Deserialize;
use tower::Service;

struct CountingAllocator;

thread_local! {
    // Per thread, so that tests running in parallel do not count each
    // other's allocations. Const-initialised: reading them never allocates.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn note_allocation() {
    if COUNTING.with(Cell::get) {
        ALLOCATIONS.with(|count| count.set(count.get() + 1));
    }
}

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Allocations made by `work` on this thread.
fn allocations_during<R>(work: impl FnOnce() -> R) -> (R, usize) {
    let before = ALLOCATIONS.with(Cell::get);
    COUNTING.with(|counting| counting.set(true));
    let result = work();
    COUNTING.with(|counting| counting.set(false));
    (result, ALLOCATIONS.with(Cell::get) - before)
}

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

#[test]
fn the_counter_sees_allocations() {
    let (boxed, allocations) = allocations_during(|| Box::new(1u64));
    assert_eq!(*boxed, 1);
    assert_eq!(allocations, 1);
}
