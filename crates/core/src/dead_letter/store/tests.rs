use std::time::UNIX_EPOCH;

use bytes::Bytes;

use super::*;
use crate::dead_letter::envelope::{FAILED_FIRST, REPLAYS};
use crate::dead_letter::{DeadLetter, DeadLetterSink};
use crate::error::ErrorClass;
use crate::memory::{MemoryBroker, MemoryDeadLetters, Record, dead_letter_topic};
use crate::message::Message;
use crate::message::{Metadata, Position};
use crate::publish::{Output, PublishError, Publisher};

/// A broker with `count` letters of `orders` for `billing` (keys `k0`,
/// `k1`, …, payloads `0`, `1`, …) and a store replaying through
/// `publisher`.
async fn letters(
    count: i64,
) -> (
    MemoryBroker,
    crate::memory::MemoryPublisher,
    LogStore<MemoryDeadLetters, crate::memory::MemoryPublisher>,
) {
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 1).expect("topic");
    let sink = broker.dead_letter_sink("orders", "billing").expect("sink");
    for offset in 0..count {
        let metadata = Metadata::new("orders".into(), 0, Position::Offset(offset));
        let message = Message::new(offset.to_string(), metadata).with_key(format!("k{offset}"));
        sink.write(&DeadLetter::new(message, "bad", 1))
            .await
            .expect("write");
    }
    let topic = broker
        .topic(&dead_letter_topic("orders", "billing"))
        .expect("dead-letter topic");
    let publisher = broker.memory_publisher();
    let store = LogStore::new(MemoryDeadLetters::new(topic), publisher.clone());
    (broker, publisher, store)
}

/// The memory publisher, except that its send number `fail_at` (from
/// 0) is unavailable.
struct FailingAt {
    inner: crate::memory::MemoryPublisher,
    sends: std::sync::atomic::AtomicU32,
    fail_at: u32,
}

impl Publisher for FailingAt {
    type Receipt = <crate::memory::MemoryPublisher as Publisher>::Receipt;

    async fn send(&self, output: Output) -> Result<Self::Receipt, PublishError> {
        let send = self
            .sends
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if send == self.fail_at {
            self.inner.fail_next(1);
        }
        self.inner.send(output).await
    }
}

#[tokio::test]
async fn a_letter_whose_publish_fails_stays_and_the_ones_confirmed_are_removed() {
    let (broker, publisher, store) = letters(3).await;
    let store = LogStore::new(
        store.log,
        FailingAt {
            inner: publisher,
            sends: Default::default(),
            fail_at: 1,
        },
    );
    let outcome = store
        .replay(&Selection::Matching(Filter::all()), &Replay::to_origin())
        .await;
    let Err(StoreError::Replay { id, report, source }) = outcome else {
        panic!("the second publish failed, yet the replay says {outcome:?}");
    };
    assert_eq!(id.as_str(), "1");
    // The page was sent whole before its receipts were awaited: the
    // third letter went out and was confirmed, the second was not.
    assert_eq!(report.replayed, 2);
    assert_eq!(source.kind(), crate::publish::PublishErrorKind::Unavailable);
    let left = store.list(&Filter::all(), 10, None).await.expect("list");
    let left: Vec<&str> = left
        .letters
        .iter()
        .map(|stored| stored.id.as_str())
        .collect();
    assert_eq!(left, ["1"], "only the confirmed letters are removed");
    let published: Vec<Bytes> = broker
        .messages("orders", 0, 0)
        .expect("messages")
        .iter()
        .map(|message| message.payload().clone())
        .collect();
    assert_eq!(published, ["0", "2"]);
}

#[tokio::test]
async fn an_entry_that_is_no_letter_is_counted_unreadable_and_never_replayed() {
    let (broker, _, store) = letters(1).await;
    broker
        .send(
            &dead_letter_topic("orders", "billing"),
            Record::new("stray").to_partition(0),
        )
        .expect("a stray record");
    assert_eq!(store.count(&Filter::all()).await.expect("count"), 2);
    let permanent = Filter::all().with_class(ErrorClass::Permanent);
    assert_eq!(store.count(&permanent).await.expect("count"), 1);
    let summary = store.summary(&Filter::all()).await.expect("summary");
    assert_eq!((summary.total, summary.unreadable), (2, 1));
    let report = store
        .replay(
            &Selection::Ids(vec!["1".into(), "7".into()]),
            &Replay::to_origin(),
        )
        .await
        .expect("replay");
    assert_eq!(report.replayed, 0);
    let reasons: Vec<&SkipReason> = report.skipped.iter().map(|s| &s.reason).collect();
    assert_eq!(reasons, [&SkipReason::Unreadable, &SkipReason::NotFound]);
}

#[tokio::test]
async fn an_id_named_twice_is_replayed_once() {
    let (broker, _, store) = letters(2).await;
    let report = store
        .replay(
            &Selection::Ids(vec!["1".into(), "1".into()]),
            &Replay::to_origin(),
        )
        .await
        .expect("replay");
    assert_eq!(report.replayed, 1);
    assert_eq!(broker.messages("orders", 0, 0).expect("messages").len(), 1);
}

#[tokio::test]
async fn an_id_of_another_form_is_a_typed_error() {
    let (_, _, store) = letters(1).await;
    for id in ["1700000000000-0", "-1", ""] {
        match store.read(&LetterId::new(id)).await {
            Err(StoreError::InvalidId { id: given, .. }) => assert_eq!(given, id),
            other => panic!("{id:?} read as {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_replay_elsewhere_keeps_key_headers_and_the_first_failure() {
    let (broker, _, store) = letters(2).await;
    broker.create_topic("orders.retry", 1).expect("topic");
    let stored = store.read(&"1".into()).await.expect("read");
    let first = letter_of(&stored).first_failed_at;
    store
        .replay(
            &Selection::Matching(Filter::all().with_key("k1")),
            &Replay::to("orders.retry"),
        )
        .await
        .expect("replay");
    let moved = broker.messages("orders.retry", 0, 0).expect("messages");
    let [moved] = &moved[..] else {
        panic!("one message moved, not {moved:?}");
    };
    assert_eq!(&moved.payload()[..], b"1");
    assert_eq!(moved.key().map(|key| &key[..]), Some(&b"k1"[..]));
    assert_eq!(moved.headers().get_str(REPLAYS), Some("1"));
    let millis = first
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis()
        .to_string();
    assert_eq!(moved.headers().get_str(FAILED_FIRST), Some(millis.as_str()));
    assert_eq!(store.count(&Filter::all()).await.expect("count"), 1);
}

fn letter_of(stored: &StoredLetter) -> &DeadLetter {
    stored.letter.as_ref().expect("a readable letter")
}
