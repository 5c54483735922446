//! Outside text in logs and spans is bounded: a handler error that quotes a
//! whole megabyte payload, on a message whose key is a megabyte too, goes
//! through the runtime with the trace, dead-letter (discard) and retry
//! layers, and no log line (with its span's fields) grows with either.

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use intake_core::consumer::Consumer;
use intake_core::dead_letter::{DeadLetterLayer, FailurePolicy};
use intake_core::memory::{MemoryBroker, Record};
use intake_core::retry::RetryLayer;
use intake_core::trace::TraceLayer;
use intake_core::{Constant, HandlerError, Payload, handler_fn};
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;

const MIB: usize = 1 << 20;

/// A log writer into a buffer the test reads.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn an_error_quoting_a_huge_payload_leaves_every_log_line_bounded() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);

    let broker = MemoryBroker::new();
    broker.create_topic("orders", 1).expect("topic");
    let huge = "p".repeat(MIB);
    broker
        .send(
            "orders",
            Record::new(huge.clone()).with_key("k".repeat(MIB)),
        )
        .expect("sent");
    let handler = ServiceBuilder::new()
        .layer(TraceLayer::new("billing"))
        .layer(DeadLetterLayer::with_policy(FailurePolicy::discard()))
        .layer(RetryLayer::new(
            Constant::new(Duration::from_millis(1)).max_retries(1),
        ))
        .service(handler_fn(|Payload(payload): Payload| async move {
            let quoted = String::from_utf8_lossy(&payload).into_owned();
            Err::<(), _>(HandlerError::permanent(format!("cannot bill {quoted}")))
        }));
    let (source, acker) = broker.consumer("orders", "billing").expect("consumer");
    let consumer = Consumer::builder()
        .commit_interval(Duration::from_millis(5))
        .build(source, acker, handler)
        .expect("valid settings");
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(consumer.run(shutdown.clone()));
    let mut waited = Duration::ZERO;
    while broker.lag("orders", "billing").expect("group") > 0 {
        assert!(
            waited < Duration::from_secs(10),
            "the message was not discarded"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
        waited += Duration::from_millis(5);
    }
    shutdown.cancel();
    let report = run.await.expect("no panic").expect("clean run");
    assert_eq!(report.succeeded, 0);

    let logs = captured
        .0
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let logs = String::from_utf8_lossy(&logs);
    let discarded = logs
        .lines()
        .find(|line| line.contains("message discarded"))
        .unwrap_or_else(|| panic!("the discard is logged: {:.2000}", logs));
    // The error's text and the key are there, cut.
    assert!(discarded.contains("cannot bill ppp"), "{discarded:.300}");
    assert!(discarded.contains("more bytes)"), "{discarded:.300}");
    for line in logs.lines() {
        // The error (4 KiB of cause) and the key (256 bytes) at most, each
        // maybe twice (the event and its span), with the other fields.
        assert!(
            line.len() < 16 * 1024,
            "{} bytes: {:.300}",
            line.len(),
            line
        );
    }
    assert!(logs.len() < MIB, "{} bytes of logs", logs.len());
}
