//! Replay as a consumer: dead letters consumed from their destination by the
//! runtime and handed to the handler as the messages that failed.

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use tokio_util::sync::CancellationToken;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

use super::envelope::{self, Broker, Carrier, Envelope};
use super::replay::{DryRunCounted, ReplayCounts};
use super::store::{DeadLetterStore, Filter};
use super::*;
use crate::consumer::{Consumer, RunReport};
use crate::error::{ErrorClass, HandlerError};
use crate::layer_testing::{Scripted, Step};
use crate::memory::{MemoryBroker, Record};
use crate::message::{Metadata, Position};

const TOPIC: &str = "orders";
const GROUP: &str = "billing";
const DEAD_LETTERS: &str = "orders.billing.dlq";

/// The original message `id`: its payload, key and a producer header.
fn original(id: i64) -> Record {
    Record::new(format!("order-{id}"))
        .with_key(format!("customer-{id}"))
        .with_header("tenant", "acme")
}

/// The message `id` as consumed from `orders` at offset `id`.
fn consumed(id: i64) -> Message {
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
fn record_of(letter: &DeadLetter) -> Message {
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
fn letter(id: i64, replays: u32) -> DeadLetter {
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
struct Recorder(Arc<Mutex<Vec<Message>>>);

impl Recorder {
    fn seen(&self) -> Vec<Message> {
        self.0.lock().expect("seen").clone()
    }

    fn calls(&self) -> usize {
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

fn refusal(error: &HandlerError) -> Option<&ReplayRefused> {
    error.cause().downcast_ref::<ReplayRefused>()
}

/// Runs a consumer of `topic` for `group` until the group has committed
/// everything the topic holds, then stops it.
async fn run_until_drained<H>(
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
struct Seen {
    payload: String,
    key: Option<String>,
    tenant: Option<String>,
    source: String,
    partition: u32,
    position: Position,
    attempt: u32,
    replays: Option<String>,
}

impl Seen {
    fn of(message: &Message) -> Self {
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
type Markers = Arc<Mutex<HashMap<(String, u32, Position), u32>>>;

fn marker(message: &Message) -> (String, u32, Position) {
    let metadata = message.metadata();
    (
        metadata.source().to_string(),
        metadata.partition(),
        metadata.position(),
    )
}

fn offset(message: &Message) -> i64 {
    match message.metadata().position() {
        Position::Offset(offset) => offset,
        other => panic!("memory positions are offsets, got {other:?}"),
    }
}

#[tokio::test]
async fn poison_messages_dead_lettered_by_a_run_are_replayed_once_each_as_the_original_message() {
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 1).expect("topic");
    for id in 0..6 {
        broker.send(TOPIC, original(id)).expect("produce");
    }
    let markers: Markers = Arc::default();

    // The first run bills 0, 2 and 5; 1, 3 and 4 fail for good. 4 fails
    // after its effect was applied (and its marker written): a replay must
    // not apply it twice.
    let broken = {
        let markers = markers.clone();
        tower::service_fn(move |message: Message| {
            let markers = markers.clone();
            async move {
                let id = offset(&message);
                if id != 1 && id != 3 {
                    *markers
                        .lock()
                        .expect("markers")
                        .entry(marker(&message))
                        .or_default() += 1;
                }
                match id {
                    1 | 3 | 4 => Err(HandlerError::permanent("no such customer")),
                    _ => Ok(()),
                }
            }
        })
    };
    let sink = broker.dead_letter_sink(TOPIC, GROUP).expect("sink");
    let first = run_until_drained(
        &broker,
        TOPIC,
        GROUP,
        DeadLetterLayer::new(sink.clone()).layer(broken),
    )
    .await;
    assert_eq!((first.succeeded, first.dead_lettered), (3, 3));
    // Something that is no dead letter lands in the destination too.
    broker
        .send(DEAD_LETTERS, Record::new("not a letter").with_key("x"))
        .expect("produce");

    // The fixed handler, under the same stack, on the dead-letter topic.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let fixed = {
        let (markers, seen) = (markers.clone(), seen.clone());
        tower::service_fn(move |message: Message| {
            let (markers, seen) = (markers.clone(), seen.clone());
            async move {
                seen.lock().expect("seen").push(Seen::of(&message));
                let mut markers = markers.lock().expect("markers");
                let applied = markers.entry(marker(&message)).or_default();
                if *applied == 0 {
                    *applied += 1;
                }
                Ok::<(), HandlerError>(())
            }
        })
    };
    let replay = ReplayLayer::keyed();
    let report = replay.report();
    let run = run_until_drained(
        &broker,
        DEAD_LETTERS,
        "billing.replay",
        ServiceBuilder::new()
            .layer(replay)
            .layer(DeadLetterLayer::new(sink))
            .service(fixed),
    )
    .await;

    let mut seen = seen.lock().expect("seen").clone();
    seen.sort_by_key(|seen| seen.position);
    let expected: Vec<Seen> = [1, 3, 4]
        .into_iter()
        .map(|id| Seen {
            payload: format!("order-{id}"),
            key: Some(format!("customer-{id}")),
            tenant: Some("acme".to_owned()),
            source: TOPIC.to_owned(),
            partition: 0,
            position: Position::Offset(id),
            attempt: 1,
            replays: Some("1".to_owned()),
        })
        .collect();
    assert_eq!(seen, expected, "each original once, as it was consumed");
    let markers = markers.lock().expect("markers").clone();
    assert_eq!(markers.len(), 6, "{markers:?}");
    assert!(
        markers.values().all(|&applied| applied == 1),
        "a marker keyed by origin applies each message once: {markers:?}"
    );
    assert_eq!((run.succeeded, run.discarded), (3, 1), "{run:?}");
    let mut expected_counts = ReplayCounts {
        records: 4,
        replayed: 3,
        succeeded: 3,
        unreadable: 1,
        ..ReplayCounts::default()
    };
    expected_counts.by_class.insert("permanent", 3);
    assert_eq!(report.snapshot(), expected_counts);
}

#[tokio::test]
async fn a_letter_that_fails_on_every_replay_goes_round_max_replays_times_then_is_refused() {
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 1).expect("topic");
    let sink = broker.dead_letter_sink(TOPIC, GROUP).expect("sink");
    sink.write(&letter(7, 0)).await.expect("written");
    // Refused letters are kept by a dead-letter layer outside the replay.
    let refused = broker
        .dead_letter_sink(DEAD_LETTERS, "replay")
        .expect("sink of refused letters");

    let handler = Scripted::new(std::iter::repeat_n(Step::Permanent("still broken"), 10));
    let replay = ReplayLayer::keyed().max_replays(2);
    let report = replay.report();
    let run = run_until_drained(
        &broker,
        DEAD_LETTERS,
        "replay",
        ServiceBuilder::new()
            .layer(DeadLetterLayer::new(refused))
            .layer(replay)
            // A replay that fails again is written back where it was read.
            .layer(DeadLetterLayer::new(sink))
            .service(handler.clone()),
    )
    .await;

    assert_eq!(handler.calls(), 2, "replayed twice, then refused");
    let letters = broker.dead_letters(TOPIC, GROUP).expect("letters");
    let replays: Vec<u32> = letters.iter().map(|letter| letter.replays).collect();
    assert_eq!(replays, [0, 1, 2]);
    assert!(
        letters
            .iter()
            .all(|letter| letter.first_failed_at == letters[0].first_failed_at),
        "every round keeps the first failure"
    );
    assert!(
        letters
            .iter()
            .all(|letter| letter.message.metadata().position() == Position::Offset(7))
    );
    assert_eq!(run.dead_lettered, 3, "two rounds and the refusal: {run:?}");
    let counts = report.snapshot();
    assert_eq!(
        (
            counts.records,
            counts.replayed,
            counts.over_limit,
            counts.succeeded
        ),
        (3, 2, 1, 0)
    );

    // The outer letter holds the refused dead letter whole.
    let outer = broker
        .dead_letters(DEAD_LETTERS, "replay")
        .expect("refused letters");
    assert_eq!(outer.len(), 1);
    assert_eq!(outer[0].class, ErrorClass::Permanent);
    assert!(
        outer[0].error.contains("replayed 2 time(s) already"),
        "{}",
        outer[0].error
    );
    let held = &outer[0].message;
    let inner = DeadLetter::read(held.key().cloned(), held.payload().clone(), held.headers())
        .expect("the refused letter reads back");
    assert_eq!(inner.replays, 2);
    assert_eq!(inner.message.metadata().position(), Position::Offset(7));
    assert_eq!(&inner.message.payload()[..], b"order-7");
}

#[tokio::test]
async fn a_letter_at_the_limit_is_refused_as_permanent_without_calling_the_handler() {
    let handler = Recorder::default();
    let replay = ReplayLayer::keyed();
    let refused = replay
        .layer(handler.clone())
        .oneshot(record_of(&letter(7, ReplayLayer::DEFAULT_MAX_REPLAYS)))
        .await
        .expect_err("refused");
    assert_eq!(refused.class(), ErrorClass::Permanent);
    assert!(
        matches!(
            refusal(&refused),
            Some(ReplayRefused::ReplayLimit {
                replays: 3,
                max_replays: 3
            })
        ),
        "{refused:?}"
    );
    assert_eq!(handler.calls(), 0);

    // One below the limit is replayed, as its last round.
    replay
        .layer(handler.clone())
        .oneshot(record_of(&letter(7, 2)))
        .await
        .expect("replayed");
    let seen = handler.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].headers().get_str(envelope::REPLAYS), Some("3"));

    let nothing = ReplayLayer::keyed()
        .max_replays(0)
        .layer(handler.clone())
        .oneshot(record_of(&letter(8, 0)))
        .await
        .expect_err("max_replays(0) replays nothing");
    assert!(matches!(
        refusal(&nothing),
        Some(ReplayRefused::ReplayLimit { replays: 0, .. })
    ));
    assert_eq!(handler.calls(), 1);
    let counts = replay.report().snapshot();
    assert_eq!((counts.replayed, counts.over_limit), (1, 1));
}

#[tokio::test]
async fn a_reference_letter_is_refused_it_has_no_payload_to_replay() {
    let handler = Recorder::default();
    let replay = ReplayLayer::keyed();
    let refused = replay
        .layer(handler.clone())
        .oneshot(record_of(&letter(7, 0).to_reference()))
        .await
        .expect_err("refused");
    assert_eq!(refused.class(), ErrorClass::Permanent);
    assert!(matches!(refusal(&refused), Some(ReplayRefused::Reference)));
    assert_eq!(handler.calls(), 0);
    assert_eq!(replay.report().snapshot().references, 1);
}

#[tokio::test]
async fn a_keyless_replay_takes_the_key_from_the_envelope_never_from_the_record() {
    let letter = letter(7, 0);
    let envelope = Envelope::new(&letter, &Carrier::keyless(Broker::Redis));
    let headers: Headers = envelope
        .pairs()
        .map(|(name, value)| (name.into_owned(), Bytes::copy_from_slice(value)))
        .collect();
    // An AMQP source gives the routing key as the record's key.
    let record = Message::new(
        envelope.payload().clone(),
        Metadata::new("orders:dlq".into(), 0, Position::StreamId { ms: 1, seq: 0 }),
    )
    .with_key("orders.dlq")
    .with_headers(headers);
    let handler = Recorder::default();
    ReplayLayer::keyless()
        .layer(handler.clone())
        .oneshot(record.clone())
        .await
        .expect("replayed");
    let seen = handler.seen();
    assert_eq!(seen[0].key().map(|key| &key[..]), Some(&b"customer-7"[..]));
    assert_eq!(seen[0].metadata().position(), Position::Offset(7));

    // Without the envelope's key, a keyless replay gives none.
    let mut no_key = letter.clone();
    no_key.message = Message::new("order-7", no_key.message.metadata().clone());
    let envelope = Envelope::new(&no_key, &Carrier::keyless(Broker::Redis));
    let headers: Headers = envelope
        .pairs()
        .map(|(name, value)| (name.into_owned(), Bytes::copy_from_slice(value)))
        .collect();
    ReplayLayer::keyless()
        .layer(handler.clone())
        .oneshot(record.with_headers(headers))
        .await
        .expect("replayed");
    assert_eq!(handler.seen()[1].key(), None);
}

/// A record's headers, as pairs to edit.
type Pairs = Vec<(String, Bytes)>;

/// Records that are no readable dead letter, each with what is wrong.
fn hostile_records() -> Vec<(&'static str, Message)> {
    let valid = record_of(&letter(7, 0));
    let with = |edit: &dyn Fn(&mut Pairs)| {
        let mut pairs: Pairs = valid
            .headers()
            .iter()
            .map(|header| (header.name.to_string(), header.value.clone()))
            .collect();
        edit(&mut pairs);
        valid.clone().with_headers(pairs.into_iter().collect())
    };
    let set = |name: &'static str, value: &'static [u8]| {
        with(&move |pairs: &mut Pairs| {
            for pair in pairs.iter_mut().filter(|pair| pair.0 == name) {
                pair.1 = Bytes::from_static(value);
            }
        })
    };
    vec![
        (
            "no envelope at all",
            Message::new("order-7", valid.metadata().clone()),
        ),
        ("a newer version", set(envelope::VERSION, b"2")),
        ("an unknown broker", set(envelope::ORIGIN_BROKER, b"pulsar")),
        (
            "a position of no broker",
            set(envelope::ORIGIN_POSITION, b"-"),
        ),
        (
            "a partition not a number",
            set(envelope::ORIGIN_PARTITION, b"\xff\xfe"),
        ),
        ("replays not a number", set(envelope::REPLAYS, b"many")),
        (
            "the origin twice",
            with(&|pairs: &mut Pairs| {
                pairs.push((
                    envelope::ORIGIN_SOURCE.to_owned(),
                    Bytes::from_static(b"payments"),
                ));
            }),
        ),
        (
            "no error class",
            with(&|pairs: &mut Pairs| {
                pairs.retain(|pair| pair.0 != envelope::ERROR_CLASS);
            }),
        ),
    ]
}

#[tokio::test]
async fn a_record_that_is_no_dead_letter_is_refused_with_the_envelope_error_as_cause() {
    let handler = Recorder::default();
    let replay = ReplayLayer::keyed();
    let hostile = hostile_records();
    for (what, record) in &hostile {
        let refused = replay
            .layer(handler.clone())
            .oneshot(record.clone())
            .await
            .expect_err(what);
        assert_eq!(refused.class(), ErrorClass::Permanent, "{what}");
        let Some(cause @ ReplayRefused::Unreadable(_)) = refusal(&refused) else {
            panic!("{what}: {refused:?}");
        };
        let source = std::error::Error::source(cause)
            .and_then(|source| source.downcast_ref::<EnvelopeError>());
        assert!(source.is_some(), "{what}: the envelope error is the source");
    }
    assert_eq!(handler.calls(), 0);
    assert_eq!(replay.report().snapshot().unreadable, hostile.len() as u64);
}

#[tokio::test]
async fn a_dry_run_counts_by_class_and_verdict_calls_no_handler_and_leaves_the_letters_for_the_replay()
 {
    let broker = MemoryBroker::new();
    broker.create_topic(TOPIC, 1).expect("topic");
    let sink = broker.dead_letter_sink(TOPIC, GROUP).expect("sink");
    let letters = [
        letter(1, 0),
        letter(2, 1),
        letter(3, 0).with_class(ErrorClass::Retryable),
        letter(4, ReplayLayer::DEFAULT_MAX_REPLAYS),
        letter(5, 0).to_reference(),
    ];
    for letter in &letters {
        sink.write(letter).await.expect("written");
    }
    broker
        .send(DEAD_LETTERS, Record::new("not a letter"))
        .expect("produce");

    let handler = Recorder::default();
    let dry = ReplayLayer::keyed().dry_run(true);
    let report = dry.report();
    let run = run_until_drained(
        &broker,
        DEAD_LETTERS,
        "billing.dry-run",
        dry.layer(handler.clone()),
    )
    .await;

    assert_eq!(handler.calls(), 0, "a dry run handles nothing");
    assert_eq!(
        (run.ignored, run.discarded, run.dead_lettered),
        (6, 0, 0),
        "{run:?}"
    );
    let mut expected = ReplayCounts {
        records: 6,
        replayed: 3,
        over_limit: 1,
        references: 1,
        unreadable: 1,
        ..ReplayCounts::default()
    };
    expected.by_class.insert("permanent", 2);
    expected.by_class.insert("retryable", 1);
    assert_eq!(report.snapshot(), expected);

    // The letters are all still there, and the group that replays has
    // not moved.
    let store = broker.dead_letter_store(TOPIC, GROUP).expect("store");
    assert_eq!(store.count(&Filter::all()).await.expect("count"), 6);
    assert_eq!(broker.lag(DEAD_LETTERS, "billing.replay").expect("lag"), 6);
    let replay = ReplayLayer::keyed();
    let counts = replay.report();
    run_until_drained(
        &broker,
        DEAD_LETTERS,
        "billing.replay",
        replay.layer(handler.clone()),
    )
    .await;
    assert_eq!(handler.calls(), 3);
    assert_eq!(
        ReplayCounts {
            succeeded: 0,
            ..counts.snapshot()
        },
        expected
    );
    assert_eq!(counts.snapshot().succeeded, 3);
}

#[test]
fn a_dry_run_outcome_is_an_ignored_failure_the_runtime_acknowledges() {
    let outcome = poll_once(
        ReplayLayer::keyed()
            .dry_run(true)
            .layer(Recorder::default())
            .call(record_of(&letter(1, 0))),
    )
    .expect_err("counted, not handled");
    assert_eq!(outcome.class(), ErrorClass::Ignore);
    assert!(outcome.cause().is::<DryRunCounted>());
}

/// Polls `future` once: every outcome here is ready at once (the handler
/// is scripted, the verdicts need no waiting).
fn poll_once<F: Future>(future: F) -> F::Output {
    let future = pin!(future);
    match future.poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the replay waited on nothing"),
    }
}

/// One change to a valid letter's headers.
#[derive(Clone, Debug)]
enum Edit {
    Drop,
    Duplicate,
    Replace(Vec<u8>),
}

fn edit() -> impl Strategy<Value = (usize, Edit)> {
    (
        0usize..32,
        prop_oneof![
            Just(Edit::Drop),
            Just(Edit::Duplicate),
            proptest::collection::vec(any::<u8>(), 0..12).prop_map(Edit::Replace),
            proptest::sample::select(vec![
                "0",
                "1",
                "3",
                "-1",
                "18446744073709551616",
                "memory",
                "kafka",
                "1-0"
            ])
            .prop_map(|text| Edit::Replace(text.as_bytes().to_vec())),
        ],
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn no_record_makes_the_replay_panic_and_each_is_replayed_or_refused_as_permanent(
        edits in proptest::collection::vec(edit(), 0..6),
        keyed in any::<bool>(),
    ) {
        let valid = record_of(&letter(7, 1));
        let mut pairs: Vec<(Arc<str>, Bytes)> = valid
            .headers()
            .iter()
            .map(|header| (header.name.clone(), header.value.clone()))
            .collect();
        for (at, edit) in edits {
            if pairs.is_empty() {
                break;
            }
            let at = at % pairs.len();
            match edit {
                Edit::Drop => {
                    pairs.remove(at);
                }
                Edit::Duplicate => pairs.push(pairs[at].clone()),
                Edit::Replace(value) => pairs[at].1 = Bytes::from(value),
            }
        }
        let record = valid.with_headers(pairs.into_iter().collect());
        let handler = Recorder::default();
        let replay = if keyed { ReplayLayer::keyed() } else { ReplayLayer::keyless() };
        let outcome = poll_once(replay.layer(handler.clone()).call(record));
        match outcome {
            Ok(()) => prop_assert_eq!(handler.calls(), 1),
            Err(error) => {
                prop_assert_eq!(error.class(), ErrorClass::Permanent);
                prop_assert!(refusal(&error).is_some(), "{:?}", error);
                prop_assert_eq!(handler.calls(), 0);
            }
        }
    }
}
