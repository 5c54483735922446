//! Dead letters at the limits of RabbitMQ, against a real broker: a letter
//! its destination refuses (the original must not be acknowledged away
//! with only a reference written), and the store's passes over a queue
//! that holds more than one pass takes.
//!
//! Each test skips with a printed reason when no broker listens on
//! 127.0.0.1:5672, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use intake_amqp::lapin::types::{AMQPValue, FieldTable};
use intake_amqp::{AmqpDeadLetterSink, AmqpDeadLetterStore, AmqpPublisher, AmqpSource};
use intake_core::backend::DeadLetterSink;
use intake_core::dead_letter::store::{
    DeadLetterStore, Filter, LetterId, Replay, Selection, StoreError,
};
use intake_core::{
    Constant, DeadLetter, DeadLetterLayer, ErrorChain, ErrorClass, FailurePolicy, HandlerError,
    Message, Metadata, Position,
};
use support::steps::PATIENCE;
use support::{AmqpBackend, expiring, unique};

/// Declares a classic queue that takes at most `max_bytes` of message
/// bodies and refuses (nacks) a publish beyond that.
async fn small_queue(backend: &AmqpBackend, prefix: &str, max_bytes: i64) -> String {
    let queue = unique(prefix);
    let mut arguments: FieldTable = expiring();
    arguments.insert(
        "x-max-length-bytes".into(),
        AMQPValue::LongLongInt(max_bytes),
    );
    arguments.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    backend
        .channel()
        .queue_declare(queue.as_str().into(), Default::default(), arguments)
        .await
        .unwrap();
    backend.track_queue(&queue);
    queue
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_letter_its_queue_refuses_leaves_the_original_in_its_queue_not_a_reference() {
    let Some(backend) = AmqpBackend::connect_or_skip("dead_letter_refused_reference").await else {
        return;
    };
    // Review R11: the dead-letter queue takes 2,000 bytes; the poison
    // message is 10,000, so its letter is refused, and a reference (no
    // payload) would fit.
    let queue = backend.classic_queue("refused-letter").await.unwrap();
    let dead_letters = small_queue(&backend, "refused-letter-dlq", 2_000).await;
    let payload = vec![b'p'; 10_000];
    backend.publish(&queue, &[&payload]).await.unwrap();
    let source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .build()
        .await
        .unwrap();
    let sink = source
        .dead_letter_sink()
        .exchange("")
        .routing_key(dead_letters.as_str())
        .build()
        .await
        .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let handler = {
        let calls = calls.clone();
        tower::service_fn(move |_message: Message| {
            calls.fetch_add(1, Ordering::Relaxed);
            async { Err::<(), _>(HandlerError::permanent("not an order")) }
        })
    };
    let policy = FailurePolicy::dead_letter(sink)
        .write_backoff(Constant::new(Duration::from_millis(10)).max_retries(1));
    let handler = tower::ServiceBuilder::new()
        .layer(DeadLetterLayer::with_policy(policy))
        .service(handler);
    let acker = source.acker();
    let consumer = intake_core::Consumer::builder()
        .max_in_flight(1)
        .backoff(Constant::new(Duration::from_millis(50)).retry_forever())
        .build(source, acker, handler)
        .expect("valid consumer settings");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(consumer.run(shutdown.clone()));
    // Either the message comes back (it was not acknowledged) or a letter
    // lands in the dead-letter queue.
    let settled = tokio::time::timeout(PATIENCE, async {
        loop {
            let letters = backend.messages_in(&dead_letters).await.unwrap_or(0);
            if calls.load(Ordering::Relaxed) >= 2 || letters > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    shutdown.cancel();
    let report = running.await.unwrap().unwrap();
    assert!(settled.is_ok(), "neither redelivered nor dead-lettered");
    let letters = backend.peek_dead_letters(&dead_letters).await.unwrap();
    assert!(
        letters.is_empty(),
        "a letter without the payload was written and the original acknowledged \
         ({report:?}): {letters:?}"
    );
    assert_eq!(report.dead_lettered, 0, "{report:?}");
    let left = backend.peek(&queue).await.unwrap();
    assert_eq!(left.len(), 1, "the original is still in its queue");
    assert_eq!(left[0].0.len(), payload.len());
    backend.cleanup().await;
}

#[tokio::test]
async fn a_reference_is_written_only_for_a_message_whose_original_outlives_the_ack() {
    let Some(backend) = AmqpBackend::connect_or_skip("dead_letter_reference_origin").await else {
        return;
    };
    let dead_letters = small_queue(&backend, "reference-origin-dlq", 100_000).await;
    let sink = AmqpDeadLetterSink::builder(backend.url())
        .exchange("")
        .routing_key(dead_letters.as_str())
        .build()
        .await
        .unwrap();
    let letter = |position: Position| {
        let message = Message::new(
            Bytes::from_static(b"payload"),
            Metadata::new("orders".into(), 0, position),
        );
        DeadLetter::new(message, "too large", 1).to_reference()
    };
    // From an AMQP queue (a delivery tag): the ack deletes the original.
    let refused = sink
        .write(&letter(Position::Tag(7)))
        .await
        .expect_err("no reference of a message of an AMQP queue");
    let chain = ErrorChain::new(&refused).to_string();
    assert!(chain.contains("lose its payload"), "{chain}");
    // From a log (an offset): the original stays there after the ack.
    sink.write(&letter(Position::Offset(7))).await.unwrap();
    let letters = backend.peek_dead_letters(&dead_letters).await.unwrap();
    let [Ok(written)] = letters.as_slice() else {
        panic!("expected one letter, got {letters:?}");
    };
    assert!(written.reference.is_some());
    assert_eq!(written.message.metadata().position(), Position::Offset(7));
    backend.cleanup().await;
}

/// A dead-letter queue of its own (fed by the default exchange), a sink
/// writing to it and a store reading it, taking at most `max_letters` per
/// pass.
async fn store_over(
    backend: &AmqpBackend,
    prefix: &str,
    max_letters: usize,
) -> (String, AmqpDeadLetterSink, AmqpDeadLetterStore) {
    let dead_letters = backend.classic_queue(prefix).await.unwrap();
    let sink = AmqpDeadLetterSink::builder(backend.url())
        .exchange("")
        .routing_key(dead_letters.as_str())
        .build()
        .await
        .unwrap();
    let publisher = AmqpPublisher::builder(backend.url()).build().await.unwrap();
    let store = AmqpDeadLetterStore::builder(backend.url())
        .queue(dead_letters.as_str())
        .max_letters(max_letters)
        .build(publisher)
        .await
        .unwrap();
    (dead_letters, sink, store)
}

/// The letter of message `tag` of `origin`, with `payload`.
fn letter_of(origin: &str, tag: u64, payload: Bytes) -> DeadLetter {
    let message = Message::new(payload, Metadata::new(origin.into(), 1, Position::Tag(tag)))
        .with_key(Bytes::from(format!("k{tag}")));
    DeadLetter::new(message, "not an order", 1)
}

#[tokio::test]
async fn a_purge_or_replay_of_every_letter_takes_more_than_one_pass_holds_or_says_so() {
    let Some(backend) = AmqpBackend::connect_or_skip("dead_letter_store_cap").await else {
        return;
    };
    // Review R19: a pass takes at most 5 letters; the queue holds 8.
    let origin = backend.classic_queue("store-cap-origin").await.unwrap();
    let (dead_letters, sink, store) = store_over(&backend, "store-cap", 5).await;
    for tag in 1..=8 {
        sink.write(&letter_of(&origin, tag, Bytes::from(tag.to_string())))
            .await
            .unwrap();
    }
    assert_eq!(store.count(&Filter::all()).await.unwrap(), 8);
    // Counting what a filter selects needs every letter looked at: 5 of 8
    // is no answer.
    let counted = store
        .count(&Filter::all().with_class(ErrorClass::Permanent))
        .await;
    assert!(
        counted.as_ref().is_err_and(is_pass_limit),
        "a count of 8 letters with a pass of 5: {counted:?}"
    );
    // Listing page by page reaches every letter or says it cannot.
    let mut listed = 0;
    let mut after = None;
    let listing = loop {
        match store.list(&Filter::all(), 2, after.as_ref()).await {
            Ok(page) => {
                listed += page.letters.len();
                match page.next {
                    Some(next) => after = Some(next),
                    None => break Ok(listed),
                }
            }
            Err(error) => break Err(error),
        }
    };
    assert!(
        listing.as_ref().is_err_and(is_pass_limit),
        "listed {listed} of 8 letters with a pass of 5: {listing:?}"
    );
    assert_eq!(listed, 4, "two pages of two, then the pass is full");
    // The 7th letter is behind 5 that a pass leaves in the queue: a replay
    // by filter says it could not look at it, and moves nothing.
    let replayed = store
        .replay(
            &Selection::Matching(Filter::all().with_key(Bytes::from_static(b"k7"))),
            &Replay::to_origin(),
        )
        .await;
    assert!(
        replayed.as_ref().is_err_and(is_pass_limit),
        "a replay of letter 7 of 8 with a pass of 5: {replayed:?}"
    );
    assert_eq!(backend.messages_in(&dead_letters).await.unwrap(), 8);
    assert_eq!(backend.messages_in(&origin).await.unwrap(), 0);
    // A purge of all removes what it takes as it goes: the pass never
    // fills, and every letter goes.
    let purged = store.purge(&Selection::Matching(Filter::all())).await;
    let left = backend.messages_in(&dead_letters).await.unwrap();
    assert_eq!(
        (purged.ok(), left),
        (Some(8), 0),
        "a purge of every letter left some"
    );
    backend.cleanup().await;
}

/// Whether `error` is the store's refusal to answer for letters its pass
/// could not look at.
fn is_pass_limit(error: &StoreError) -> bool {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<intake_amqp::Error>())
        .is_some_and(|error| matches!(error, intake_amqp::Error::PassLimit { .. }))
}

#[tokio::test]
async fn letters_of_two_processes_with_the_same_origin_tag_and_time_have_distinct_ids() {
    let Some(backend) = AmqpBackend::connect_or_skip("dead_letter_store_ids").await else {
        return;
    };
    // Review R28: two consumers (two processes: two sinks) give up tag 7 of
    // channel 1 of the same queue in the same millisecond.
    let origin = backend.classic_queue("store-ids-origin").await.unwrap();
    let (_dead_letters, first, store) = store_over(&backend, "store-ids", 100).await;
    let second = AmqpDeadLetterSink::builder(backend.url())
        .exchange("")
        .routing_key(store.destination())
        .build()
        .await
        .unwrap();
    let at = std::time::SystemTime::now();
    for (sink, payload) in [(&first, "first"), (&second, "second")] {
        let mut letter = letter_of(&origin, 7, Bytes::from(payload));
        letter.failed_at = at;
        letter.first_failed_at = at;
        sink.write(&letter).await.unwrap();
    }
    let page = store.list(&Filter::all(), 10, None).await.unwrap();
    let ids: Vec<LetterId> = page
        .letters
        .iter()
        .map(|stored| stored.id.clone())
        .collect();
    assert_eq!(ids.len(), 2);
    assert_ne!(ids[0], ids[1], "one id for two letters: {ids:?}");
    let purged = store
        .purge(&Selection::Ids(vec![ids[1].clone()]))
        .await
        .unwrap();
    assert_eq!(purged, 1, "a purge by one id removed {purged} letters");
    let left = store.list(&Filter::all(), 10, None).await.unwrap();
    let payloads: Vec<_> = left
        .letters
        .iter()
        .map(|stored| stored.id.clone())
        .collect();
    assert_eq!(payloads, [ids[0].clone()]);
    let kept = store.read(&ids[0]).await.unwrap();
    assert_eq!(
        kept.letter.unwrap().message.payload().as_ref(),
        b"first",
        "the other letter is the one left"
    );
    backend.cleanup().await;
}

#[tokio::test]
async fn letters_written_before_sinks_gave_ids_are_told_apart_by_their_place() {
    let Some(backend) = AmqpBackend::connect_or_skip("dead_letter_store_legacy_ids").await else {
        return;
    };
    let origin = backend.classic_queue("store-legacy-origin").await.unwrap();
    let (dead_letters, sink, store) = store_over(&backend, "store-legacy", 100).await;
    sink.write(&letter_of(&origin, 7, Bytes::from_static(b"old")))
        .await
        .unwrap();
    // The letter as an older sink wrote it, twice: without the sink's id.
    let delivery = backend
        .peek_deliveries(&dead_letters)
        .await
        .unwrap()
        .pop()
        .expect("the letter written");
    let mut headers = FieldTable::default();
    for (name, value) in delivery
        .properties
        .headers()
        .clone()
        .unwrap_or_default()
        .inner()
    {
        if name.as_str() != intake_amqp::headers::LETTER_ID {
            headers.insert(name.clone(), value.clone());
        }
    }
    let properties = delivery.properties.clone().with_headers(headers);
    store
        .purge(&Selection::Matching(Filter::all()))
        .await
        .unwrap();
    for _ in 0..2 {
        let confirm = backend
            .channel()
            .basic_publish(
                "".into(),
                dead_letters.as_str().into(),
                Default::default(),
                &delivery.data,
                properties.clone(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack());
    }
    let page = store.list(&Filter::all(), 10, None).await.unwrap();
    let ids: Vec<String> = page
        .letters
        .iter()
        .map(|stored| stored.id.as_str().to_owned())
        .collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_eq!(ids[1], format!("{}~2", ids[0]));
    let purged = store
        .purge(&Selection::Ids(vec![page.letters[1].id.clone()]))
        .await
        .unwrap();
    assert_eq!(purged, 1);
    assert_eq!(backend.messages_in(&dead_letters).await.unwrap(), 1);
    backend.cleanup().await;
}

#[tokio::test]
async fn with_partial_answers_a_store_answers_for_what_one_pass_looked_at() {
    let Some(backend) = AmqpBackend::connect_or_skip("dead_letter_store_partial").await else {
        return;
    };
    let origin = backend.classic_queue("store-partial-origin").await.unwrap();
    let dead_letters = backend.classic_queue("store-partial").await.unwrap();
    let sink = AmqpDeadLetterSink::builder(backend.url())
        .exchange("")
        .routing_key(dead_letters.as_str())
        .build()
        .await
        .unwrap();
    for tag in 1..=8 {
        sink.write(&letter_of(&origin, tag, Bytes::from(tag.to_string())))
            .await
            .unwrap();
    }
    let publisher = AmqpPublisher::builder(backend.url()).build().await.unwrap();
    let store = AmqpDeadLetterStore::builder(backend.url())
        .queue(dead_letters.as_str())
        .max_letters(5)
        .partial_answers()
        .build(publisher)
        .await
        .unwrap();
    // The caller's own way to say more remain: the exact unfiltered count.
    assert_eq!(store.count(&Filter::all()).await.unwrap(), 8);
    let counted = store
        .count(&Filter::all().with_class(ErrorClass::Permanent))
        .await
        .unwrap();
    assert_eq!(counted, 5);
    let page = store.list(&Filter::all(), 100, None).await.unwrap();
    assert_eq!(page.letters.len(), 5);
    assert_eq!(page.next, None);
    let ids = page
        .letters
        .iter()
        .map(|stored| stored.id.clone())
        .collect();
    assert_eq!(store.purge(&Selection::Ids(ids)).await.unwrap(), 5);
    assert_eq!(backend.messages_in(&dead_letters).await.unwrap(), 3);
    backend.cleanup().await;
}
