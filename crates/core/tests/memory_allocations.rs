//! Fetching from the memory broker allocates nothing per message: a batch of
//! deliveries is clones of stored messages (reference-count bumps) into a
//! buffer that already has room.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use futures_util::FutureExt;
use intake_core::memory::{MemoryBroker, Record};
use intake_core::{Headers, Message, Source, SourceEvent};

/// Counts allocations made by the thread that turned counting on, so the
/// test harness's own threads do not disturb the count.
struct CountingAllocator;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn note_allocation() {
    // `try_with`: the allocator also runs while thread locals are torn down.
    let _ = COUNTING.try_with(|counting| {
        if counting.get() {
            let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
        }
    });
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
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Allocations made by `work` on this thread.
fn allocations_during<R>(work: impl FnOnce() -> R) -> (usize, R) {
    ALLOCATIONS.with(|count| count.set(0));
    COUNTING.with(|counting| counting.set(true));
    let result = work();
    COUNTING.with(|counting| counting.set(false));
    (ALLOCATIONS.with(Cell::get), result)
}

/// One `next` call, which must complete without waiting: the partitions are
/// prefilled.
fn fetch(source: &mut impl Source, buf: &mut Vec<Message>, max: usize) -> SourceEvent {
    match source.next(buf, max).now_or_never() {
        Some(Ok(event)) => event,
        Some(Err(error)) => panic!("fetch failed: {error}"),
        None => panic!("a prefilled partition must not make `next` wait"),
    }
}

#[test]
fn fetching_a_prefilled_batch_allocates_nothing() {
    const BATCH: usize = 256;
    const BATCHES: usize = 20;
    let broker = MemoryBroker::new();
    broker.create_topic("bench", 4).expect("topic");
    let headers: Headers = [("content-type", "application/json")].into_iter().collect();
    for n in 0..BATCH * BATCHES {
        // `Bytes::from` a `Vec<u8>` whose length is its capacity is the
        // promotable kind whose first clone allocates: the broker must store
        // it so that no delivery does.
        let payload = format!("{{\"order\":{n}}}").as_bytes().to_vec();
        let key = format!("customer-{}", n % 97).as_bytes().to_vec();
        assert_eq!(payload.len(), payload.capacity());
        broker
            .send(
                "bench",
                Record::new(payload)
                    .with_key(key)
                    .with_headers(headers.clone()),
            )
            .expect("send");
    }
    let (mut source, _acker) = broker.consumer("bench", "group").expect("consumer");
    let mut buf = Vec::with_capacity(BATCH);
    assert!(matches!(
        fetch(&mut source, &mut buf, BATCH),
        SourceEvent::Assigned(_)
    ));

    let (allocations, delivered) = allocations_during(|| {
        let mut delivered = 0;
        for _ in 0..BATCHES {
            buf.clear();
            assert!(matches!(
                fetch(&mut source, &mut buf, BATCH),
                SourceEvent::Delivered
            ));
            // Touch what a handler would: payload, key and headers.
            for message in &buf {
                assert!(!message.payload().is_empty());
                assert!(message.key().is_some());
                assert!(message.headers().get("content-type").is_some());
            }
            delivered += buf.len();
        }
        delivered
    });
    assert_eq!(delivered, BATCH * BATCHES);
    assert_eq!(
        allocations, 0,
        "allocations while fetching {delivered} messages"
    );
}
