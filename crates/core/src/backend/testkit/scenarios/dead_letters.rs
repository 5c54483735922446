//! Poison messages: a permanent failure does not stop the consumer, and
//! dead letters read back as the messages that were consumed.

use crate::backend::testkit::harness::{Ledger, Running, id_of, numbered, unique_group};
use crate::backend::testkit::{Backend, TestMessage};
use crate::consumer::Consumer;
use crate::error::HandlerError;
use crate::message::Message;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A payload the handler cannot read is a permanent failure: it is not
/// retried, and the consumer carries on with the rest.
pub async fn malformed_payloads_do_not_stop_the_consumer<B: Backend>(backend: &B) {
    let source = backend.create_source(1).await.expect("create the source");
    let group = unique_group("malformed");
    let mut messages = numbered(0, 10);
    messages.insert(5, TestMessage::new("k", &b"\xff\x00not a number"[..]));
    backend.produce(&source, messages).await.expect("produce");
    let ledger = Ledger::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let handler = {
        let (ledger, calls) = (ledger.clone(), calls.clone());
        tower::service_fn(move |message: Message| {
            let (ledger, calls) = (ledger.clone(), calls.clone());
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                ledger.record(id_of(&message)?);
                Ok::<_, HandlerError>(())
            }
        })
    };
    let consumer = Running::start(backend, &source, &group, Consumer::builder(), 4, handler)
        .await
        .expect("connect");
    ledger.wait_for_all(10, "the ten readable messages").await;
    let report = consumer.stop().await;
    assert_eq!(
        report.discarded, 1,
        "the malformed payload failed permanently, once"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        11,
        "no retry of a permanent failure"
    );
    assert_eq!(
        backend
            .unacknowledged(&source, &group)
            .await
            .expect("inspect"),
        0
    );
}

/// A malformed message and one whose retries run out reach the dead-letter
/// destination; read back with [`DeadLetter::read`](crate::DeadLetter::read)
/// each is the message as it was consumed (payload, key, headers, origin)
/// with its error, class, attempts and times, and a producer header named
/// like an origin field changes nothing of the origin (it comes back as the
/// producer's header). Then they are acknowledged, and the rest of the
/// stream is processed.
pub async fn poison_messages_reach_the_dead_letter_destination<B: Backend>(backend: &B) {
    use crate::dead_letter::DeadLetterLayer;
    use crate::dead_letter::envelope::{Broker, ORIGIN_SOURCE};
    use crate::error::ErrorClass;
    use crate::retry::RetryLayer;

    let source = backend.create_source(1).await.expect("create the source");
    let group = unique_group("dead-letter");
    let mut messages = numbered(0, 20);
    let mut malformed = TestMessage::new("k", "{malformed");
    malformed.headers = [("tenant", "acme"), (ORIGIN_SOURCE, "spoofed")]
        .into_iter()
        .map(|(name, value)| (name, bytes::Bytes::from_static(value.as_bytes())))
        .collect();
    messages.insert(3, malformed);
    let started = std::time::SystemTime::now();
    backend.produce(&source, messages).await.expect("produce");
    let ledger = Ledger::default();
    let failed: Arc<std::sync::Mutex<Vec<Message>>> = Arc::default();
    let handler = {
        let ledger = ledger.clone();
        let failed = failed.clone();
        tower::service_fn(move |message: Message| {
            let ledger = ledger.clone();
            let failed = failed.clone();
            async move {
                let id = id_of(&message);
                if matches!(id, Err(_) | Ok(7)) {
                    failed
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(message.clone());
                }
                let id = id?;
                if id == 7 {
                    return Err(HandlerError::retryable("id 7 always times out"));
                }
                ledger.record(id);
                Ok(())
            }
        })
    };
    let sink = backend
        .dead_letter_sink(&source, &group)
        .await
        .expect("dead-letter sink");
    let handler = tower::ServiceBuilder::new()
        .layer(DeadLetterLayer::new(sink))
        .layer(RetryLayer::new(
            crate::backoff::Constant::new(Duration::from_millis(5)).max_retries(2),
        ))
        .service(handler);
    let consumer = Running::start(backend, &source, &group, Consumer::builder(), 8, handler)
        .await
        .expect("connect");
    ledger
        .wait_until("the 19 good messages", || ledger.distinct() == 19)
        .await;
    let deadline = tokio::time::Instant::now() + crate::backend::testkit::harness::PATIENCE;
    let letters = loop {
        let letters = backend
            .dead_letters(&source, &group)
            .await
            .expect("read dead letters");
        if letters.len() >= 2 || tokio::time::Instant::now() > deadline {
            break letters;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    consumer.stop().await;
    let ended = std::time::SystemTime::now();
    assert_eq!(letters.len(), 2, "{}: {letters:?}", backend.name());
    let consumed = |payload: &[u8]| {
        failed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .find(|message| &message.payload()[..] == payload)
            .cloned()
            .expect("the handler saw the message")
    };
    let broker = backend.capabilities().broker;
    let expected_group = match broker {
        Broker::Amqp => None,
        _ => Some(group.as_str()),
    };
    for (payload, class) in [
        (&b"{malformed"[..], ErrorClass::Permanent),
        (b"7", ErrorClass::Retryable),
    ] {
        let letter = letters
            .iter()
            .find(|letter| &letter.message.payload()[..] == payload)
            .unwrap_or_else(|| panic!("{}: no letter for {payload:?}", backend.name()));
        let original = consumed(payload);
        let what = format!("{}: the letter of {payload:?}", backend.name());
        assert_same_message(&letter.message, &original, &what);
        assert_eq!(letter.class, class, "{what}");
        let origin = letter
            .origin
            .as_ref()
            .expect("a letter read back has its origin");
        assert_eq!(origin.broker, broker, "{what}");
        assert_eq!(origin.group.as_deref(), expected_group, "{what}");
        assert_eq!(
            letter.first_failed_at, letter.failed_at,
            "{what}: failed once"
        );
        let millis = |time: std::time::SystemTime| {
            time.duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| since.as_millis())
        };
        assert!(
            (millis(started)..=millis(ended)).contains(&millis(letter.failed_at)),
            "{what}: failed at {:?}, outside the test's {started:?}..{ended:?}",
            letter.failed_at
        );
        assert_eq!(
            (letter.replays, letter.reference, letter.headers_omitted),
            (0, None, 0),
            "{what}"
        );
    }
    let malformed = letters
        .iter()
        .find(|letter| &letter.message.payload()[..] == b"{malformed")
        .expect("the malformed message was dead-lettered");
    assert_eq!(
        &**malformed.message.metadata().source(),
        source,
        "the producer's `{ORIGIN_SOURCE}` header is no origin"
    );
    assert_eq!(
        malformed.message.headers().get_str(ORIGIN_SOURCE),
        Some("spoofed"),
        "and it is kept as the producer's header"
    );
    assert!(
        malformed.error.contains("not a scenario id"),
        "{}",
        malformed.error
    );
    let exhausted = letters
        .iter()
        .find(|letter| &letter.message.payload()[..] == b"7")
        .expect("the message whose retries ran out was dead-lettered");
    assert_eq!(exhausted.attempts, 3, "one attempt and two retries");
    assert!(
        exhausted.error.contains("always times out"),
        "{}",
        exhausted.error
    );
    assert_eq!(
        backend
            .unacknowledged(&source, &group)
            .await
            .expect("inspect"),
        0,
        "{}: dead-lettered messages are acknowledged",
        backend.name()
    );
}

/// Asserts that `read` (a message read back from a dead letter) is
/// `original` as the handler received it: payload, key, headers (as a set:
/// an AMQP header table keeps no order) and origin.
fn assert_same_message(read: &Message, original: &Message, what: &str) {
    assert_eq!(read.payload(), original.payload(), "{what}: payload");
    assert_eq!(read.key(), original.key(), "{what}: key");
    let sorted = |message: &Message| {
        let mut headers: Vec<_> = message
            .headers()
            .iter()
            .map(|header| (header.name.clone(), header.value.clone()))
            .collect();
        headers.sort();
        headers
    };
    assert_eq!(sorted(read), sorted(original), "{what}: headers");
    let (read, original) = (read.metadata(), original.metadata());
    assert_eq!(
        (read.source(), read.partition(), read.position()),
        (original.source(), original.partition(), original.position()),
        "{what}: origin"
    );
}
