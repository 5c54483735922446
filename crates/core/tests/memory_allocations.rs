//! Fetching from the memory broker allocates nothing per message: a batch of
//! deliveries is clones of stored messages (reference-count bumps) into a
//! buffer that already has room.

#[path = "support/counting_allocator.rs"]
mod counting_allocator;

use counting_allocator::allocations_during;
use futures_util::FutureExt;
use intake_core::memory::{MemoryBroker, Record};
use intake_core::{
    Headers, Message,
    backend::{Source, SourceEvent},
};

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

    let (delivered, allocations) = allocations_during(|| {
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
