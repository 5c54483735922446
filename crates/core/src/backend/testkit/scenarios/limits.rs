//! Limits: the in-flight bound holds under a backlog.

use crate::backend::testkit::Backend;
use crate::backend::testkit::harness::{Ledger, Running, id_of, numbered, unique_group};
use crate::consumer::{Consumer, DeliveryOrder};
use crate::error::HandlerError;
use crate::message::Message;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// With a large backlog, never more than `max_in_flight` handlers run.
pub async fn in_flight_stays_within_its_bound<B: Backend>(backend: &B) {
    let source = backend.create_source(1).await.expect("create the source");
    let group = unique_group("bound");
    backend
        .produce(&source, numbered(0, 2_000))
        .await
        .expect("produce");
    let ledger = Ledger::default();
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (ledger, running, peak) = (ledger.clone(), running.clone(), peak.clone());
        tower::service_fn(move |message: Message| {
            let (ledger, running, peak) = (ledger.clone(), running.clone(), peak.clone());
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_micros(200)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                ledger.record(id_of(&message)?);
                Ok::<_, HandlerError>(())
            }
        })
    };
    let consumer = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder().ordering(DeliveryOrder::Unordered),
        8,
        handler,
    )
    .await
    .expect("connect");
    ledger.wait_for_all(2_000, "the whole backlog").await;
    consumer.stop().await;
    let peak = peak.load(Ordering::SeqCst);
    assert!(
        peak <= 8,
        "{}: {peak} handlers ran at once with max_in_flight 8",
        backend.name()
    );
    assert!(peak > 1, "handlers ran concurrently");
}
