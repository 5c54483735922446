//! How much memory the dead-letter store holds in a pass, against a real
//! RabbitMQ: alone in its test binary, so that the process's peak resident
//! size (`VmHWM`) is this test's.
//!
//! Skips with a printed reason when no broker listens on 127.0.0.1:5672,
//! unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use bytes::Bytes;
use intake_amqp::{AmqpDeadLetterSink, AmqpDeadLetterStore, AmqpPublisher};
use intake_core::backend::DeadLetterSink;
use intake_core::dead_letter::store::{DeadLetterStore, Filter};
use intake_core::{DeadLetter, ErrorClass, Message, Metadata, Position};
use support::AmqpBackend;

/// The peak resident size of this process so far, in bytes (Linux).
fn peak_resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

const MIB: u64 = 1 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_over_large_letters_holds_no_more_than_a_few_of_them() {
    let Some(backend) = AmqpBackend::connect_or_skip("dead_letter_store_memory").await else {
        return;
    };
    if peak_resident_bytes().is_none() {
        intake_core::backend::testkit::skip_or_fail(
            "dead_letter_store_memory",
            "no /proc/self/status to read the peak resident size from",
        );
        return;
    }
    // Review R19: 48 letters of 1 MiB each.
    let letters: u64 = 48;
    let origin = backend.classic_queue("store-memory-origin").await.unwrap();
    let dead_letters = backend.classic_queue("store-memory").await.unwrap();
    let sink = AmqpDeadLetterSink::builder(backend.url())
        .exchange("")
        .routing_key(dead_letters.as_str())
        .build()
        .await
        .unwrap();
    let payload = Bytes::from(vec![b'x'; MIB as usize]);
    for tag in 1..=letters {
        let message = Message::new(
            payload.clone(),
            Metadata::new(origin.as_str().into(), 1, Position::Tag(tag)),
        );
        sink.write(&DeadLetter::new(message, "too big to handle", 1))
            .await
            .unwrap();
    }
    drop(payload);
    let publisher = AmqpPublisher::builder(backend.url()).build().await.unwrap();
    let store = AmqpDeadLetterStore::builder(backend.url())
        .queue(dead_letters.as_str())
        .build(publisher)
        .await
        .unwrap();
    let before = peak_resident_bytes().unwrap();
    let summary = store
        .summary(&Filter::all().with_class(ErrorClass::Permanent))
        .await
        .unwrap();
    assert_eq!(summary.total, letters);
    let page = store.list(&Filter::all(), 100, None).await.unwrap();
    assert_eq!(page.letters.len() as u64, letters);
    let grown = peak_resident_bytes().unwrap().saturating_sub(before);
    assert!(
        grown < 16 * MIB,
        "the peak resident size grew by {} MiB over a pass of {letters} letters of 1 MiB",
        grown / MIB
    );
    backend.cleanup().await;
}
