//! What the replay tests share: messages, letters and records of them, a
//! recording handler, and a consumer run until drained.

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;
use tower::Service;

use crate::consumer::{Consumer, RunReport};
use crate::dead_letter::envelope::{self, Broker, Carrier, Envelope};
use crate::dead_letter::{DeadLetter, ReplayRefused};
use crate::error::HandlerError;
use crate::memory::{MemoryBroker, Record};
use crate::message::{Headers, Message, Metadata, Position};

pub(super) const TOPIC: &str = "orders";
pub(super) const GROUP: &str = "billing";
pub(super) const DEAD_LETTERS: &str = "orders.billing.dlq";

/// The original message `id`: its payload, key and a producer header.
pub(super) fn original(id: i64) -> Record {
    Record::new(format!("order-{id}"))
        .with_key(format!("customer-{id}"))
        .with_header("tenant", "acme")
}

/// The message `id` as consumed from `orders` at offset `id`.
pub(super) fn consumed(id: i64) -> Message {
    let headers: Headers = [("tenant", Bytes::from_static(b"acme"))]
        .into_iter()
        .collect();
    Message::new(
        format!("order-{id}"),
        Metadata::new(TOPIC.into(), 0, Position::Offset(id)),
    )
    .with_key(format!("customer-{id}"))
    .with_headers(headers)
}

/// `letter` as a memory-broker dead-letter topic holds it and a consumer of
/// it receives it.
pub(super) fn record_of(letter: &DeadLetter) -> Message {
    let envelope = Envelope::new(letter, &Carrier::keyed(Broker::Memory).with_group(GROUP));
    let headers: Headers = envelope
        .pairs()
        .map(|(name, value)| (name.into_owned(), Bytes::copy_from_slice(value)))
        .collect();
    let record = Message::new(
        envelope.payload().clone(),
        Metadata::new(DEAD_LETTERS.into(), 0, Position::Offset(0)),
    )
    .with_headers(headers);
    match envelope.key() {
        Some(key) => record.with_key(key.clone()),
        None => record,
    }
}

/// A letter of message `id` replayed `replays` times already.
pub(super) fn letter(id: i64, replays: u32) -> DeadLetter {
    let mut message = consumed(id);
    if replays > 0 {
        message
            .headers_mut()
            .set(envelope::REPLAYS, replays.to_string());
    }
    DeadLetter::new(message, "no such customer", 1)
}

/// A handler that succeeds at once and keeps every message it was called
/// with.
#[derive(Clone, Default)]
pub(super) struct Recorder(Arc<Mutex<Vec<Message>>>);

impl Recorder {
    pub(super) fn seen(&self) -> Vec<Message> {
        self.0.lock().expect("seen").clone()
    }

    pub(super) fn calls(&self) -> usize {
        self.0.lock().expect("seen").len()
    }
}

impl Service<Message> for Recorder {
    type Response = ();
    type Error = HandlerError;
    type Future = std::future::Ready<Result<(), HandlerError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), HandlerError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, message: Message) -> Self::Future {
        self.0.lock().expect("seen").push(message);
        std::future::ready(Ok(()))
    }
}

pub(super) fn refusal(error: &HandlerError) -> Option<&ReplayRefused> {
    error.cause().downcast_ref::<ReplayRefused>()
}

/// Runs a consumer of `topic` for `group` until the group has committed
/// everything the topic holds, then stops it.
pub(super) async fn run_until_drained<H>(
    broker: &MemoryBroker,
    topic: &str,
    group: &str,
    handler: H,
) -> RunReport
where
    H: Service<Message, Response = (), Error = HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    let (source, acker) = broker.consumer(topic, group).expect("consumer");
    let consumer = Consumer::builder()
        .commit_interval(Duration::from_millis(5))
        .build(source, acker, handler)
        .expect("valid settings");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { consumer.run(shutdown).await.expect("the run succeeds") }
    });
    tokio::time::timeout(Duration::from_secs(10), async {
        while broker.lag(topic, group).expect("lag") > 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{group} drained {topic} within the guard time; lag {}",
            broker.lag(topic, group).unwrap_or(u64::MAX)
        )
    });
    shutdown.cancel();
    task.await.expect("consumer task")
}

/// What the handler saw of one replayed message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Seen {
    pub(super) payload: String,
    pub(super) key: Option<String>,
    pub(super) tenant: Option<String>,
    pub(super) source: String,
    pub(super) partition: u32,
    pub(super) position: Position,
    pub(super) attempt: u32,
    pub(super) replays: Option<String>,
}

impl Seen {
    pub(super) fn of(message: &Message) -> Self {
        let text = |bytes: &Bytes| String::from_utf8_lossy(bytes).into_owned();
        let metadata = message.metadata();
        Self {
            payload: text(message.payload()),
            key: message.key().map(text),
            tenant: message.headers().get_str("tenant").map(str::to_owned),
            source: metadata.source().to_string(),
            partition: metadata.partition(),
            position: metadata.position(),
            attempt: metadata.attempt(),
            replays: message
                .headers()
                .get_str(envelope::REPLAYS)
                .map(str::to_owned),
        }
    }
}

/// Exactly-once markers keyed by origin: how often each (source,
/// partition, position) was applied.
pub(super) type Markers = Arc<Mutex<HashMap<(String, u32, Position), u32>>>;

pub(super) fn marker(message: &Message) -> (String, u32, Position) {
    let metadata = message.metadata();
    (
        metadata.source().to_string(),
        metadata.partition(),
        metadata.position(),
    )
}

pub(super) fn offset(message: &Message) -> i64 {
    match message.metadata().position() {
        Position::Offset(offset) => offset,
        other => panic!("memory positions are offsets, got {other:?}"),
    }
}

/// Polls `future` once: every outcome here is ready at once (the handler
/// is scripted, the verdicts need no waiting).
pub(super) fn poll_once<F: Future>(future: F) -> F::Output {
    let future = pin!(future);
    match future.poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the replay waited on nothing"),
    }
}
