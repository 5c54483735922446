//! Hostile content after the handshake, against a real RabbitMQ: messages
//! whose header names, message id or routing key are not UTF-8. AMQP short
//! strings are bytes and RabbitMQ passes them on, but lapin parses them as
//! `String` and closes the connection on the frame. The message goes back to
//! the queue and comes again on the next connection, so the source must back
//! off on every such loss (never start over as after a healthy session) and
//! say in its log which delivery it was.
//!
//! Each test skips with a printed reason when no broker listens on
//! 127.0.0.1:5672, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_amqp::AmqpSource;
use intake_core::backend::{AckBatch, Acker, Limits, PartitionAck, Source, SourceEvent};
use intake_core::consumer::DEFAULT_MAX_IN_FLIGHT_BYTES;
use support::raw::{RawMessage, table};
use support::{AmqpBackend, RecordingBackoff, inbound_exchange};

const PATIENCE: Duration = Duration::from_secs(20);

/// Log output of the test's thread.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|poison| poison.into_inner()))
            .into_owned()
    }
}

/// Publishes a good message and then `poison` to a fresh queue, consumes
/// until the connection was lost to the poison three times, and checks that
/// every reconnect backed off further and that the log names the delivery.
async fn poison_backs_off_and_is_named(test: &str, poison: impl FnOnce(&str) -> RawMessage) {
    let Some(backend) = AmqpBackend::connect_or_skip(test).await else {
        return;
    };
    let queue = backend.classic_queue("unparsable").await.unwrap();
    let good = RawMessage {
        exchange: inbound_exchange(&queue).into_bytes(),
        body: b"good".to_vec(),
        ..RawMessage::default()
    };
    backend
        .publish_raw(&[good, poison(&queue)])
        .await
        .expect("RabbitMQ takes the message as it is");

    let log = Log::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let log = log.clone();
            move || log.clone()
        })
        .with_ansi(false)
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);

    let policy = RecordingBackoff::default();
    let mut source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .reconnect_backoff(policy.clone())
        .build()
        .await
        .unwrap();
    source.set_limits(Limits::new(
        10,
        DEFAULT_MAX_IN_FLIGHT_BYTES,
        Duration::from_secs(10),
    ));
    let mut acker = source.acker();
    let mut buffer = Vec::new();
    let mut losses = 0;
    let mut good_deliveries = 0;
    tokio::time::timeout(PATIENCE, async {
        while losses < 3 {
            match source.next(&mut buffer, 10).await {
                Ok(SourceEvent::Revoked(_)) => losses += 1,
                Ok(SourceEvent::Delivered) => {
                    for message in buffer.drain(..) {
                        assert_eq!(&message.payload()[..], b"good");
                        good_deliveries += 1;
                        // As the runtime would: the next delivery (the
                        // poison) comes once this one is settled.
                        let mut ack = PartitionAck::new(message.metadata().partition_key());
                        ack.watermark = Some(message.metadata().position());
                        let _ = acker
                            .ack(&AckBatch {
                                partitions: vec![ack],
                                sync: true,
                            })
                            .await;
                    }
                }
                Ok(_) => {}
                Err(error) => panic!("the source gave up: {error}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("only {losses} connections were lost to the poison"));

    assert!(
        good_deliveries >= 1,
        "the message before the poison arrived"
    );
    let asked = policy.asked();
    assert!(
        asked.starts_with(&[1, 2, 3]),
        "each loss to the poison is one more failed attempt, never a fresh start: {asked:?}"
    );
    let log = log.text();
    let named = log
        .lines()
        .find(|line| line.contains("could not be parsed"))
        .unwrap_or_else(|| panic!("no log line names the poison:\n{log}"));
    assert!(named.contains(&format!("queue=\"{queue}\"")), "{named}");
    // The good message is tag 1 of each channel; the poison comes next.
    assert!(named.contains("tag=2"), "{named}");
    assert!(named.contains("UTF-8"), "{named}");
    source.close().await.unwrap();
    backend.cleanup().await;
}

#[tokio::test]
async fn a_header_name_that_is_not_utf8_backs_off_every_reconnect_and_is_named_in_the_log() {
    poison_backs_off_and_is_named("header_name_not_utf8", |queue| RawMessage {
        exchange: inbound_exchange(queue).into_bytes(),
        headers: table(&[(b"tenant-\xff\xfe", b"acme")]),
        body: b"poison".to_vec(),
        ..RawMessage::default()
    })
    .await;
}

#[tokio::test]
async fn a_message_id_that_is_not_utf8_backs_off_every_reconnect_and_is_named_in_the_log() {
    poison_backs_off_and_is_named("message_id_not_utf8", |queue| RawMessage {
        exchange: inbound_exchange(queue).into_bytes(),
        message_id: Some(b"id-\xc3\x28".to_vec()),
        body: b"poison".to_vec(),
        ..RawMessage::default()
    })
    .await;
}

#[tokio::test]
async fn a_routing_key_that_is_not_utf8_backs_off_every_reconnect_and_is_named_in_the_log() {
    poison_backs_off_and_is_named("routing_key_not_utf8", |queue| RawMessage {
        // The inbound exchange is a fanout: any routing key reaches the queue.
        exchange: inbound_exchange(queue).into_bytes(),
        routing_key: b"orders.\xe2\x82".to_vec(),
        body: b"poison".to_vec(),
        ..RawMessage::default()
    })
    .await;
}

#[tokio::test]
async fn a_poison_that_outlasts_the_reconnect_backoff_is_a_transient_error_that_names_it() {
    let Some(backend) = AmqpBackend::connect_or_skip("poison_outlasts_backoff").await else {
        return;
    };
    let queue = backend.classic_queue("unparsable-gives-up").await.unwrap();
    let poison = RawMessage {
        exchange: inbound_exchange(&queue).into_bytes(),
        headers: table(&[(b"\xff", b"x")]),
        body: b"poison".to_vec(),
        ..RawMessage::default()
    };
    backend.publish_raw(&[poison]).await.unwrap();
    let mut source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .reconnect_backoff(
            intake_core::Exponential::new(Duration::from_millis(1), Duration::from_millis(1))
                .max_retries(2),
        )
        .build()
        .await
        .unwrap();
    let counters = source.counters();
    let mut buffer = Vec::new();
    let error = tokio::time::timeout(PATIENCE, async {
        loop {
            match source.next(&mut buffer, 10).await {
                Ok(SourceEvent::Delivered) => panic!("the poison became a message"),
                Ok(_) => {}
                Err(error) => return error,
            }
        }
    })
    .await
    .expect("the backoff gives up after two retries");
    assert!(error.is_transient(), "{error:?}");
    let text = intake_core::ErrorChain::new(&error).to_string();
    assert!(text.contains(&queue) && text.contains("tag 1"), "{text}");
    assert_eq!(
        counters.unparsable_deliveries(),
        3,
        "the first loss and two retries"
    );
    assert_eq!(counters.channel_losses(), 3);
    assert_eq!(counters.reconnects(), 2);
    source.close().await.unwrap();
    backend.cleanup().await;
}

/// A header table nested `depth` arrays deep (five bytes a level).
fn nested_header(depth: usize) -> Vec<u8> {
    let mut value = vec![b'V'];
    for _ in 0..depth {
        let mut outer = vec![b'A'];
        outer.extend_from_slice(&u32::try_from(value.len()).unwrap_or(u32::MAX).to_be_bytes());
        outer.extend_from_slice(&value);
        value = outer;
    }
    let mut entry = vec![1, b'a'];
    entry.extend_from_slice(&value);
    let mut table = u32::try_from(entry.len())
        .unwrap_or(u32::MAX)
        .to_be_bytes()
        .to_vec();
    table.extend_from_slice(&entry);
    table
}

/// Documents a defect of lapin (amq-protocol-types 10.6) that intake cannot
/// catch: its parser recurses once per nesting level of a header table on
/// the `lapin-io-loop` thread, and a header nested a few thousand levels
/// deep (15 KB here, well within RabbitMQ's frame size) overflows that
/// thread's stack. Rust aborts the whole process; the message stays at the
/// head of the queue, so every restart aborts again. RabbitMQ passes such a
/// header on unchanged. The consumer runs in a child process so that the
/// abort can be observed; when lapin limits the depth, this test fails and
/// RELIABILITY.md's note goes.
#[tokio::test]
async fn a_header_nested_thousands_deep_overflows_lapins_parser_and_aborts_the_process() {
    const CHILD: &str = "INTAKE_AMQP_DEEP_HEADER_QUEUE";
    if let Ok(queue) = std::env::var(CHILD) {
        let mut source = AmqpSource::builder(support::url())
            .queue(queue)
            .build()
            .await
            .expect("the child connects");
        let mut buffer = Vec::new();
        for _ in 0..4 {
            let _ = tokio::time::timeout(PATIENCE, source.next(&mut buffer, 10)).await;
        }
        return;
    }
    let Some(backend) = AmqpBackend::connect_or_skip("deep_header").await else {
        return;
    };
    let queue = backend.classic_queue("deep-header").await.unwrap();
    let deep = RawMessage {
        exchange: inbound_exchange(&queue).into_bytes(),
        headers: nested_header(3_000),
        body: b"deep".to_vec(),
        ..RawMessage::default()
    };
    backend
        .publish_raw(&[deep])
        .await
        .expect("RabbitMQ takes it");
    let child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_header_nested_thousands_deep_overflows_lapins_parser_and_aborts_the_process",
            "--nocapture",
        ])
        .env(CHILD, &queue)
        // The default thread stack: a larger one only raises the depth.
        .env_remove("RUST_MIN_STACK")
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), child)
        .await
        .expect("the child ends")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the child survived: {stderr}");
    assert!(
        stderr.contains("'lapin-io-loop'") && stderr.contains("overflowed its stack"),
        "{stderr}"
    );
    backend.cleanup().await;
}

/// Up to RabbitMQ 4.2 a quorum queue counts a delivery returned by a closed
/// channel, so its delivery limit takes an unreadable message out of the
/// way: the broker dead-letters it, and consumption goes on. It counts every
/// delivery the closed channel held, too: the messages prefetched behind the
/// unreadable one must not reach the limit with it, so after such a loss
/// the source takes them one at a time.
#[tokio::test]
async fn an_unreadable_message_on_a_quorum_queue_with_a_delivery_limit_is_dead_lettered_by_the_broker()
 {
    let Some(backend) = AmqpBackend::connect_or_skip("unparsable_delivery_limit").await else {
        return;
    };
    let queue = support::unique("unparsable-limited");
    let dlq = support::dead_letter_queue(&queue);
    let topology = intake_amqp::Topology::new()
        .queue(intake_amqp::Queue::classic(dlq.as_str()))
        .queue(
            intake_amqp::Queue::quorum(queue.as_str())
                .dead_letter_exchange("")
                .dead_letter_routing_key(dlq.as_str())
                .delivery_limit(2),
        );
    topology.declare(backend.url()).await.unwrap();
    backend.track_queue(&queue);
    backend.track_queue(&dlq);
    let direct = |body: &[u8], headers: Vec<u8>| RawMessage {
        routing_key: queue.as_bytes().to_vec(),
        headers,
        body: body.to_vec(),
        ..RawMessage::default()
    };
    backend
        .publish_raw(&[
            direct(b"poison", table(&[(b"\xff", b"x")])),
            direct(b"good", Vec::new()),
        ])
        .await
        .unwrap();
    let policy = RecordingBackoff::default();
    let mut source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .reconnect_backoff(policy.clone())
        .build()
        .await
        .unwrap();
    let counters = source.counters();
    let mut acker = source.acker();
    let mut buffer = Vec::new();
    let mut handled = Vec::new();
    // A limit of 2 lets it come three times; each time the connection goes.
    tokio::time::timeout(PATIENCE, async {
        while counters.unparsable_deliveries() < 3 || handled.is_empty() {
            match source.next(&mut buffer, 10).await {
                Ok(SourceEvent::Delivered) => {
                    for message in buffer.drain(..) {
                        let mut ack = PartitionAck::new(message.metadata().partition_key());
                        ack.watermark = Some(message.metadata().position());
                        let _ = acker
                            .ack(&AckBatch {
                                partitions: vec![ack],
                                sync: true,
                            })
                            .await;
                        handled.push(String::from_utf8_lossy(message.payload()).into_owned());
                    }
                }
                Ok(_) => {}
                Err(error) => panic!("the source gave up: {error}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{} losses to the unreadable message, handled {handled:?}",
            counters.unparsable_deliveries()
        )
    });
    assert_eq!(handled, ["good"]);
    assert_eq!(policy.asked(), [1, 2, 3]);
    // Dead-lettering reaches the dead-letter queue a moment later: the
    // unreadable message alone, the good one having been handled.
    let mut dead = 0;
    for _ in 0..50 {
        dead = backend.messages_in(&dlq).await.unwrap();
        if dead > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(dead, 1, "only the unreadable message is dead-lettered");
    settle_queue(&backend, &queue).await;
    source.close().await.unwrap();
    backend.cleanup().await;
}

/// Waits until `queue` is empty (acknowledgements are asynchronous).
async fn settle_queue(backend: &AmqpBackend, queue: &str) {
    for _ in 0..100 {
        if backend.messages_in(queue).await.ok() == Some(0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{queue} still holds messages");
}
