//! The memory broker's behaviour, driven directly through the `Source`,
//! `Acker` and `DeadLetterSink` traits.

use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;

use super::*;
use crate::acker::{AckBatch, AckError, Acker, PartitionAck};
use crate::dead_letter::{DeadLetter, DeadLetterSink, envelope};
use crate::message::{Headers, Message, PartitionKey, Position};
use crate::source::{RevocationOutcome, Source, SourceError, SourceEvent};

const TOPIC: &str = "orders";
const GROUP: &str = "billing";

fn broker_with_topic(partitions: u32) -> MemoryBroker {
    let broker = MemoryBroker::new();
    broker
        .create_topic(TOPIC, partitions)
        .expect("create topic");
    broker
}

fn produce_to(broker: &MemoryBroker, partition: u32, count: usize) {
    for n in 0..count {
        broker
            .send(
                TOPIC,
                Record::new(format!("p{partition}-{n}")).to_partition(partition),
            )
            .expect("send");
    }
}

/// The next event, failing the test instead of hanging if none comes.
async fn next_event(source: &mut MemorySource, buf: &mut Vec<Message>, max: usize) -> SourceEvent {
    tokio::time::timeout(Duration::from_secs(30), source.next(buf, max))
        .await
        .expect("an event within the guard time")
        .expect("no source error")
}

/// Waits for the next event, which must be a batch of deliveries.
async fn delivered(source: &mut MemorySource, buf: &mut Vec<Message>, max: usize) {
    let event = next_event(source, buf, max).await;
    assert!(
        matches!(event, SourceEvent::Delivered),
        "expected deliveries, got {event:?}"
    );
}

/// The next event if one is ready without waiting.
fn ready_event(
    source: &mut MemorySource,
    buf: &mut Vec<Message>,
    max: usize,
) -> Option<SourceEvent> {
    source
        .next(buf, max)
        .now_or_never()
        .map(|result| result.expect("no source error"))
}

fn partitions_of(event: &SourceEvent) -> Vec<u32> {
    let keys = match event {
        SourceEvent::Assigned(keys) => keys.as_slice(),
        SourceEvent::Revoked(revocation) => revocation.partitions(),
        other => panic!("expected an assignment change, got {other:?}"),
    };
    let mut partitions: Vec<u32> = keys.iter().map(|key| key.partition).collect();
    partitions.sort_unstable();
    partitions
}

async fn assigned(source: &mut MemorySource) -> Vec<u32> {
    let event = next_event(source, &mut Vec::new(), 1).await;
    assert!(
        matches!(event, SourceEvent::Assigned(_)),
        "expected Assigned, got {event:?}"
    );
    partitions_of(&event)
}

/// A new member of `GROUP` that has received its assignment.
async fn joined(broker: &MemoryBroker) -> (MemorySource, MemoryAcker) {
    let (mut source, acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    assigned(&mut source).await;
    (source, acker)
}

fn commit_batch(partition: u32, last_done: i64) -> AckBatch {
    let mut ack = PartitionAck::new(PartitionKey::new(TOPIC, partition));
    ack.watermark = Some(Position::Offset(last_done));
    AckBatch {
        partitions: vec![ack],
        sync: true,
    }
}

fn offsets(buf: &[Message]) -> Vec<(u32, i64)> {
    buf.iter()
        .map(|message| {
            let Position::Offset(offset) = message.metadata().position() else {
                panic!("memory positions are offsets");
            };
            (message.metadata().partition(), offset)
        })
        .collect()
}

// --- producing -------------------------------------------------------------

#[test]
fn a_key_always_goes_to_the_same_partition() {
    let broker = broker_with_topic(8);
    let first = broker
        .send(TOPIC, Record::new("a").with_key("customer-7"))
        .expect("send");
    for n in 1..20 {
        let produced = broker
            .send(TOPIC, Record::new(format!("{n}")).with_key("customer-7"))
            .expect("send");
        assert_eq!(produced.partition, first.partition);
        assert_eq!(produced.offset, n);
    }
}

#[test]
fn records_without_key_go_to_each_partition_in_turn() {
    let broker = broker_with_topic(3);
    let partitions: Vec<u32> = (0..6)
        .map(|_| {
            broker
                .send(TOPIC, Record::new("x"))
                .expect("send")
                .partition
        })
        .collect();
    assert_eq!(partitions, [0, 1, 2, 0, 1, 2]);
}

#[test]
fn an_explicit_partition_wins_over_the_key_and_must_exist() {
    let broker = broker_with_topic(2);
    let produced = broker
        .send(TOPIC, Record::new("x").with_key("k").to_partition(1))
        .expect("send");
    assert_eq!(
        produced,
        Produced {
            partition: 1,
            offset: 0
        }
    );
    let refused = broker.send(TOPIC, Record::new("x").to_partition(2));
    assert!(matches!(
        refused,
        Err(MemoryError::UnknownPartition {
            partition: 2,
            partitions: 2,
            ..
        })
    ));
}

#[test]
fn a_batch_is_stored_whole_or_not_at_all() {
    let broker = broker_with_topic(2);
    let refused = broker.send_batch(
        TOPIC,
        [
            Record::new("ok").to_partition(0),
            Record::new("bad").to_partition(9),
        ],
    );
    assert!(refused.is_err());
    assert_eq!(broker.high_watermarks(TOPIC).expect("topic"), [0, 0]);
    let stored = broker
        .send_batch(
            TOPIC,
            [
                Record::new("a").to_partition(1),
                Record::new("b").to_partition(1),
            ],
        )
        .expect("batch");
    assert_eq!(stored.iter().map(|p| p.offset).collect::<Vec<_>>(), [0, 1]);
}

#[test]
fn bad_topics_and_groups_are_refused_with_a_reason() {
    let broker = broker_with_topic(1);
    assert!(matches!(
        broker.create_topic(TOPIC, 1),
        Err(MemoryError::TopicExists { partitions: 1, .. })
    ));
    assert!(matches!(
        broker.create_topic("empty", 0),
        Err(MemoryError::InvalidPartitionCount { partitions: 0, .. })
    ));
    assert!(matches!(
        broker.create_topic("", 1),
        Err(MemoryError::EmptyName { what: "topic" })
    ));
    let unknown = broker.consumer("missing", GROUP).map(|_| ());
    assert_eq!(
        unknown.expect_err("unknown topic").to_string(),
        "topic `missing` does not exist: create it first with `MemoryBroker::create_topic`"
    );
    assert!(matches!(
        broker.consumer(TOPIC, "").map(|_| ()),
        Err(MemoryError::EmptyName { what: "group" })
    ));
}

// --- consuming -------------------------------------------------------------

#[tokio::test]
async fn a_new_member_learns_its_partitions_before_it_receives_messages() {
    let broker = broker_with_topic(2);
    produce_to(&broker, 0, 1);
    let (mut source, _acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    let mut buf = Vec::new();
    let first = next_event(&mut source, &mut buf, 10).await;
    assert_eq!(partitions_of(&first), [0, 1]);
    assert!(buf.is_empty());
    delivered(&mut source, &mut buf, 10).await;
    assert_eq!(offsets(&buf), [(0, 0)]);
}

#[tokio::test]
async fn messages_arrive_as_produced_with_their_origin() {
    let broker = broker_with_topic(1);
    let headers: Headers = [("trace", "abc")].into_iter().collect();
    broker
        .send(
            TOPIC,
            Record::new("first").with_key("k").with_headers(headers),
        )
        .expect("send");
    broker.send(TOPIC, Record::new("second")).expect("send");
    let (mut source, _acker) = joined(&broker).await;
    let mut buf = Vec::new();
    delivered(&mut source, &mut buf, 10).await;
    assert_eq!(offsets(&buf), [(0, 0), (0, 1)]);
    let first = &buf[0];
    assert_eq!(first.payload(), "first");
    assert_eq!(first.key().map(Bytes::as_ref), Some(&b"k"[..]));
    assert_eq!(first.headers().get_str("trace"), Some("abc"));
    assert_eq!(&**first.metadata().source(), TOPIC);
    assert_eq!(first.metadata().attempt(), 1);
    assert!(first.metadata().timestamp().is_some());
}

#[tokio::test]
async fn a_fetch_returns_at_most_max_messages() {
    let broker = broker_with_topic(1);
    produce_to(&broker, 0, 10);
    let (mut source, _acker) = joined(&broker).await;
    let mut buf = Vec::new();
    delivered(&mut source, &mut buf, 4).await;
    assert_eq!(buf.len(), 4);
    delivered(&mut source, &mut buf, 100).await;
    assert_eq!(buf.len(), 10, "the second fetch appends the remaining six");
}

#[tokio::test]
async fn a_zero_budget_returns_assignment_changes_but_no_messages() {
    let broker = broker_with_topic(1);
    produce_to(&broker, 0, 3);
    let (mut source, _acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    let mut buf = Vec::new();
    let event = ready_event(&mut source, &mut buf, 0).expect("the assignment is ready");
    assert_eq!(partitions_of(&event), [0]);
    assert!(ready_event(&mut source, &mut buf, 0).is_none());
    assert!(buf.is_empty());
}

#[tokio::test]
async fn next_waits_until_a_message_is_produced() {
    let broker = broker_with_topic(1);
    let (mut source, _acker) = joined(&broker).await;
    let mut buf = Vec::new();
    assert!(
        ready_event(&mut source, &mut buf, 10).is_none(),
        "nothing to fetch yet"
    );
    let producer = broker.clone();
    let send = tokio::spawn(async move {
        tokio::task::yield_now().await;
        producer.send(TOPIC, Record::new("late")).expect("send");
    });
    delivered(&mut source, &mut buf, 10).await;
    assert_eq!(buf[0].payload(), "late");
    send.await.expect("producer task");
}

#[tokio::test]
async fn a_dropped_next_loses_nothing() {
    let broker = broker_with_topic(1);
    let (mut source, _acker) = joined(&broker).await;
    let mut buf = Vec::new();
    {
        // Pending on an empty partition, then cancelled.
        let mut pending = Box::pin(source.next(&mut buf, 10));
        assert!((&mut pending).now_or_never().is_none());
        broker
            .send(TOPIC, Record::new("during the wait"))
            .expect("send");
    }
    assert!(buf.is_empty());
    delivered(&mut source, &mut buf, 10).await;
    assert_eq!(offsets(&buf), [(0, 0)]);
}

#[tokio::test]
async fn a_fetch_shares_the_batch_evenly_across_partitions() {
    let broker = broker_with_topic(4);
    for partition in 0..4 {
        produce_to(&broker, partition, 100);
    }
    let (mut source, _acker) = joined(&broker).await;
    let mut buf = Vec::new();
    delivered(&mut source, &mut buf, 8).await;
    let mut per_partition = [0; 4];
    for (partition, _) in offsets(&buf) {
        per_partition[partition as usize] += 1;
    }
    assert_eq!(per_partition, [2, 2, 2, 2]);
}

#[tokio::test]
async fn a_backlogged_partition_does_not_starve_the_others() {
    let broker = broker_with_topic(3);
    produce_to(&broker, 0, 10_000);
    let (mut source, _acker) = joined(&broker).await;
    let mut buf = Vec::new();
    // While partition 0 has a huge backlog, each message arriving on the
    // other partitions is in the very next batch.
    for round in 0..6 {
        let quiet = 1 + round % 2;
        broker
            .send(TOPIC, Record::new("quiet").to_partition(quiet))
            .expect("send");
        buf.clear();
        delivered(&mut source, &mut buf, 2).await;
        assert!(
            offsets(&buf)
                .iter()
                .any(|&(partition, _)| partition == quiet),
            "round {round}: batch {:?} skipped partition {quiet}",
            offsets(&buf)
        );
    }
}

#[tokio::test]
async fn with_a_single_message_per_call_partitions_take_turns() {
    let broker = broker_with_topic(3);
    for partition in 0..3 {
        produce_to(&broker, partition, 3);
    }
    let (mut source, _acker) = joined(&broker).await;
    let mut buf = Vec::new();
    for _ in 0..9 {
        delivered(&mut source, &mut buf, 1).await;
    }
    let order: Vec<u32> = offsets(&buf)
        .iter()
        .map(|&(partition, _)| partition)
        .collect();
    assert_eq!(order, [0, 1, 2, 0, 1, 2, 0, 1, 2]);
}

#[tokio::test]
async fn latest_offset_reset_skips_what_was_there_before_assignment() {
    let broker = broker_with_topic(1);
    produce_to(&broker, 0, 5);
    let (mut source, _acker) = broker
        .consumer_builder(TOPIC, GROUP)
        .offset_reset(OffsetReset::Latest)
        .build()
        .expect("consumer");
    assigned(&mut source).await;
    broker.send(TOPIC, Record::new("new")).expect("send");
    let mut buf = Vec::new();
    delivered(&mut source, &mut buf, 10).await;
    assert_eq!(offsets(&buf), [(0, 5)]);
}

// --- committing ------------------------------------------------------------

#[tokio::test]
async fn an_ack_commits_the_offset_after_the_watermark() {
    let broker = broker_with_topic(2);
    produce_to(&broker, 0, 5);
    produce_to(&broker, 1, 3);
    let (mut source, mut acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    assigned(&mut source).await;
    assert_eq!(broker.lag(TOPIC, GROUP).expect("lag"), 8);
    acker.ack(&commit_batch(0, 2)).await.expect("commit");
    assert_eq!(
        broker.committed(TOPIC, GROUP).expect("committed"),
        [Some(3), None]
    );
    let group = broker.group(TOPIC, GROUP).expect("group");
    assert_eq!(group.partitions[0].lag, 2);
    assert_eq!(group.partitions[1].lag, 3);
    assert_eq!(group.lag(), 5);
}

#[tokio::test]
async fn a_commit_past_the_end_of_the_partition_is_refused() {
    let broker = broker_with_topic(1);
    produce_to(&broker, 0, 2);
    let (mut source, mut acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    assigned(&mut source).await;
    let refused = acker.ack(&commit_batch(0, 2)).await;
    assert!(matches!(refused, Err(AckError::Broker(_))), "{refused:?}");
    assert_eq!(broker.committed(TOPIC, GROUP).expect("committed"), [None]);
}

#[tokio::test]
async fn commit_from_a_former_owner_is_refused() {
    let broker = broker_with_topic(2);
    produce_to(&broker, 1, 4);
    let (mut first, mut first_acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    assert_eq!(assigned(&mut first).await, [0, 1]);
    let (mut second, _second_acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    let revoked = next_event(&mut first, &mut Vec::new(), 10).await;
    assert_eq!(partitions_of(&revoked), [1]);
    let SourceEvent::Revoked(revocation) = revoked else {
        unreachable!()
    };
    revocation.complete(RevocationOutcome::default());
    assert_eq!(assigned(&mut second).await, [1]);

    let refused = first_acker.ack(&commit_batch(1, 3)).await;
    assert!(
        matches!(&refused, Err(AckError::NotAssigned(key)) if key.partition == 1),
        "{refused:?}"
    );
    assert_eq!(
        broker.committed(TOPIC, GROUP).expect("committed"),
        [None, None]
    );
    // What it still owns, it may commit.
    produce_to(&broker, 0, 1);
    first_acker
        .ack(&commit_batch(0, 0))
        .await
        .expect("own partition");
}

#[tokio::test(start_paused = true)]
async fn a_commit_sent_under_an_earlier_assignment_is_refused_after_the_partition_came_back() {
    let broker = MemoryBroker::builder()
        .rebalance_timeout(Duration::from_millis(10))
        .build();
    broker.create_topic(TOPIC, 2).expect("topic");
    produce_to(&broker, 1, 5);
    let (mut first, mut first_acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    assert_eq!(assigned(&mut first).await, [0, 1]);
    // A commit of the first assignment, slow on its way to the broker.
    let faults = broker.faults(TOPIC, GROUP).expect("faults");
    faults.delay_commits(Duration::from_millis(100));
    let old_commit = tokio::spawn(async move {
        let result = first_acker.ack(&commit_batch(1, 4)).await;
        (result, first_acker)
    });
    tokio::task::yield_now().await;
    // Meanwhile partition 1 goes to a second member (the first one never
    // releases it, so the rebalance timeout hands it over), which crashes:
    // the partition comes back to the first member.
    let (mut second, _second_acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    assert_eq!(assigned(&mut second).await, [1]);
    drop(second);
    let revoked = next_event(&mut first, &mut Vec::new(), 10).await;
    assert_eq!(partitions_of(&revoked), [1]);
    assert_eq!(assigned(&mut first).await, [1]);

    let (refused, mut first_acker) = old_commit.await.expect("no panic");
    assert!(
        matches!(&refused, Err(AckError::NotAssigned(key)) if key.partition == 1),
        "{refused:?}"
    );
    assert_eq!(
        broker.committed(TOPIC, GROUP).expect("committed"),
        [None, None]
    );
    // A commit sent under the new assignment is accepted.
    faults.clear();
    first_acker
        .ack(&commit_batch(1, 4))
        .await
        .expect("the current assignment commits");
    assert_eq!(
        broker.committed(TOPIC, GROUP).expect("committed"),
        [None, Some(5)]
    );
}

#[tokio::test]
async fn a_closed_or_dropped_member_can_no_longer_commit() {
    let broker = broker_with_topic(1);
    produce_to(&broker, 0, 1);
    let (mut source, mut acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    assigned(&mut source).await;
    source.close().await.expect("close");
    assert!(matches!(
        acker.ack(&commit_batch(0, 0)).await,
        Err(AckError::NotAssigned(_))
    ));
}

// --- rebalancing -----------------------------------------------------------

#[tokio::test]
async fn revoked_partition_is_not_fetched_by_the_new_owner_before_release() {
    let broker = broker_with_topic(2);
    produce_to(&broker, 0, 5);
    produce_to(&broker, 1, 5);
    let (mut old, mut old_acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    assigned(&mut old).await;
    let mut old_buf = Vec::new();
    delivered(&mut old, &mut old_buf, 100).await;
    assert_eq!(old_buf.len(), 10);

    let (mut new, _new_acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    let mut new_buf = Vec::new();
    assert!(
        ready_event(&mut new, &mut new_buf, 100).is_none(),
        "partition 1 is not released yet"
    );

    let SourceEvent::Revoked(revocation) = next_event(&mut old, &mut old_buf, 100).await else {
        panic!("the old owner is told first");
    };
    assert_eq!(
        broker.group(TOPIC, GROUP).expect("group").partitions[1].owner,
        PartitionOwner::Releasing {
            from: old.member_id(),
            to: Some(new.member_id())
        }
    );
    assert!(
        ready_event(&mut new, &mut new_buf, 100).is_none(),
        "still draining"
    );

    // The old owner drains, commits what it finished (0..=2) and releases.
    old_acker
        .ack(&commit_batch(1, 2))
        .await
        .expect("commit while releasing");
    revocation.complete(RevocationOutcome::default());

    assert_eq!(assigned(&mut new).await, [1]);
    delivered(&mut new, &mut new_buf, 100).await;
    assert_eq!(
        offsets(&new_buf),
        [(1, 3), (1, 4)],
        "resumes from the committed offset"
    );
    assert!(
        new_buf
            .iter()
            .all(|message| message.metadata().attempt() == 2)
    );
}

#[tokio::test]
async fn a_waiting_new_owner_is_woken_by_the_release() {
    let broker = broker_with_topic(2);
    produce_to(&broker, 1, 1);
    let (mut old, _old_acker) = joined(&broker).await;
    let (mut new, _new_acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    let SourceEvent::Revoked(revocation) = next_event(&mut old, &mut Vec::new(), 1).await else {
        panic!("revocation expected");
    };
    let waiting = tokio::spawn(async move {
        let event = next_event(&mut new, &mut Vec::new(), 10).await;
        partitions_of(&event)
    });
    tokio::task::yield_now().await;
    revocation.complete(RevocationOutcome::default());
    assert_eq!(waiting.await.expect("new owner task"), [1]);
}

#[tokio::test(start_paused = true)]
async fn a_revocation_not_completed_in_time_is_handed_over_anyway() {
    let broker = MemoryBroker::builder()
        .rebalance_timeout(Duration::from_secs(5))
        .build();
    broker.create_topic(TOPIC, 2).expect("topic");
    produce_to(&broker, 1, 2);
    let (mut old, mut old_acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    assigned(&mut old).await;
    let (mut new, _new_acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    let SourceEvent::Revoked(stuck) = next_event(&mut old, &mut Vec::new(), 1).await else {
        panic!("revocation expected");
    };
    // The new owner waits out the rebalance timeout (paused time advances
    // by itself while every task waits) and takes the partition.
    assert_eq!(assigned(&mut new).await, [1]);
    let refused = old_acker.ack(&commit_batch(1, 0)).await;
    assert!(
        matches!(refused, Err(AckError::NotAssigned(_))),
        "{refused:?}"
    );
    drop(stuck);
}

#[tokio::test(start_paused = true)]
async fn a_rebalance_timeout_of_duration_max_waits_for_the_release_without_panicking() {
    let broker = MemoryBroker::builder()
        .rebalance_timeout(Duration::MAX)
        .build();
    broker.create_topic(TOPIC, 2).expect("topic");
    let (mut old, _old_acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    assigned(&mut old).await;
    let (mut new, _new_acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    let SourceEvent::Revoked(revocation) = next_event(&mut old, &mut Vec::new(), 1).await else {
        panic!("revocation expected");
    };
    revocation.complete(RevocationOutcome::default());
    assert_eq!(assigned(&mut new).await, [1]);
}

#[tokio::test]
async fn a_partition_never_announced_moves_without_a_revocation() {
    let broker = broker_with_topic(2);
    let (mut first, _a) = broker.consumer(TOPIC, GROUP).expect("consumer");
    let (mut second, _b) = broker.consumer(TOPIC, GROUP).expect("consumer");
    // The first member never returned its Assigned event before the second
    // joined, so partition 1 goes straight to the second.
    assert_eq!(assigned(&mut first).await, [0]);
    assert_eq!(assigned(&mut second).await, [1]);
    assert!(ready_event(&mut first, &mut Vec::new(), 1).is_none());
}

#[tokio::test]
async fn a_member_leaving_hands_its_partitions_to_the_others() {
    let broker = broker_with_topic(4);
    let (mut first, _a) = broker.consumer(TOPIC, GROUP).expect("consumer");
    let (mut second, _b) = broker.consumer(TOPIC, GROUP).expect("consumer");
    assert_eq!(assigned(&mut first).await, [0, 1]);
    assert_eq!(assigned(&mut second).await, [2, 3]);
    second.close().await.expect("close");
    assert_eq!(assigned(&mut first).await, [2, 3]);
    let group = broker.group(TOPIC, GROUP).expect("group");
    assert_eq!(group.members.len(), 1);
    assert_eq!(group.partitions_of(first.member_id()), [0, 1, 2, 3]);
}

#[tokio::test]
async fn a_revocation_comes_before_a_later_assignment() {
    let broker = broker_with_topic(2);
    let (mut first, _a) = joined(&broker).await;
    let (second, _b) = broker.consumer(TOPIC, GROUP).expect("consumer");
    // Partition 1 is being revoked from `first` when `second` leaves, so it
    // comes back to `first`: first the revocation, then the new assignment.
    drop(second);
    let revoked = next_event(&mut first, &mut Vec::new(), 1).await;
    assert!(matches!(revoked, SourceEvent::Revoked(_)));
    assert_eq!(partitions_of(&revoked), [1]);
    drop(revoked);
    assert_eq!(assigned(&mut first).await, [1]);
}

#[tokio::test]
async fn round_robin_assignment_deals_partitions_in_turn() {
    let broker = MemoryBroker::builder()
        .assignment(AssignmentStrategy::RoundRobin)
        .build();
    broker.create_topic(TOPIC, 4).expect("topic");
    let (mut first, _a) = broker.consumer(TOPIC, GROUP).expect("consumer");
    let (mut second, _b) = broker.consumer(TOPIC, GROUP).expect("consumer");
    assert_eq!(assigned(&mut first).await, [0, 2]);
    assert_eq!(assigned(&mut second).await, [1, 3]);
}

#[tokio::test]
async fn groups_consume_independently() {
    let broker = broker_with_topic(1);
    produce_to(&broker, 0, 3);
    let (mut billing, mut billing_acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    let (mut audit, _audit_acker) = broker.consumer(TOPIC, "audit").expect("consumer");
    assigned(&mut billing).await;
    assigned(&mut audit).await;
    billing_acker
        .ack(&commit_batch(0, 2))
        .await
        .expect("commit");
    let mut buf = Vec::new();
    delivered(&mut audit, &mut buf, 10).await;
    assert_eq!(buf.len(), 3);
    assert_eq!(broker.lag(TOPIC, GROUP).expect("lag"), 0);
    assert_eq!(broker.lag(TOPIC, "audit").expect("lag"), 3);
}

// --- crashes -----------------------------------------------------------------

#[tokio::test]
async fn crashed_consumers_uncommitted_messages_reach_the_next_consumer() {
    let broker = broker_with_topic(1);
    produce_to(&broker, 0, 10);
    let (mut crashed, mut acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    assigned(&mut crashed).await;
    let mut buf = Vec::new();
    delivered(&mut crashed, &mut buf, 100).await;
    acker.ack(&commit_batch(0, 4)).await.expect("commit");
    drop(crashed);
    drop(acker);
    assert!(
        broker
            .group(TOPIC, GROUP)
            .expect("group")
            .members
            .is_empty()
    );

    let (mut next, _acker) = joined(&broker).await;
    buf.clear();
    delivered(&mut next, &mut buf, 100).await;
    assert_eq!(
        offsets(&buf),
        (5..10).map(|offset| (0, offset)).collect::<Vec<_>>()
    );
    assert!(buf.iter().all(|message| message.metadata().attempt() == 2));
}

#[tokio::test]
async fn every_redelivery_counts_as_another_attempt() {
    let broker = broker_with_topic(1);
    produce_to(&broker, 0, 2);
    for attempt in 1..=3 {
        let (mut source, _acker) = joined(&broker).await;
        let mut buf = Vec::new();
        delivered(&mut source, &mut buf, 1).await;
        assert_eq!(buf[0].metadata().attempt(), attempt);
    }
    // Offset 1 was never delivered: its first delivery is attempt 1.
    let (mut source, _acker) = joined(&broker).await;
    let mut buf = Vec::new();
    delivered(&mut source, &mut buf, 10).await;
    let attempts: Vec<u32> = buf
        .iter()
        .map(|message| message.metadata().attempt())
        .collect();
    assert_eq!(attempts, [4, 1]);
}

#[tokio::test]
async fn an_old_owner_crashing_during_the_handoff_releases_at_once() {
    let broker = broker_with_topic(2);
    produce_to(&broker, 1, 3);
    let (mut old, _old_acker) = joined(&broker).await;
    delivered(&mut old, &mut Vec::new(), 100).await;
    let (mut new, _new_acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    assert!(ready_event(&mut new, &mut Vec::new(), 10).is_none());
    drop(old);
    let event = ready_event(&mut new, &mut Vec::new(), 10).expect("released by the crash");
    assert_eq!(partitions_of(&event), [0, 1]);
}

// --- faults ----------------------------------------------------------------

#[tokio::test]
async fn injected_fetch_failures_are_transient_errors() {
    let broker = broker_with_topic(1);
    produce_to(&broker, 0, 1);
    let (mut source, _acker) = joined(&broker).await;
    broker
        .faults(TOPIC, GROUP)
        .expect("faults")
        .fail_next_fetches(2);
    let mut buf = Vec::new();
    for _ in 0..2 {
        let error = source
            .next(&mut buf, 10)
            .await
            .expect_err("injected failure");
        assert!(matches!(error, SourceError::Transient(_)));
        assert!(error.is_transient());
    }
    assert!(buf.is_empty(), "a failed fetch takes nothing");
    delivered(&mut source, &mut buf, 10).await;
    assert_eq!(offsets(&buf), [(0, 0)]);
}

#[tokio::test]
async fn injected_commit_failures_commit_nothing() {
    let broker = broker_with_topic(1);
    produce_to(&broker, 0, 3);
    let (mut source, mut acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    assigned(&mut source).await;
    broker
        .faults(TOPIC, GROUP)
        .expect("faults")
        .fail_next_commits(1);
    let failed = acker.ack(&commit_batch(0, 1)).await;
    assert!(matches!(failed, Err(AckError::Broker(_))), "{failed:?}");
    assert_eq!(broker.committed(TOPIC, GROUP).expect("committed"), [None]);
    acker.ack(&commit_batch(0, 1)).await.expect("next commit");
    assert_eq!(
        broker.committed(TOPIC, GROUP).expect("committed"),
        [Some(2)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_delayed_commit_dropped_while_waiting_commits_nothing() {
    let broker = broker_with_topic(1);
    produce_to(&broker, 0, 3);
    let (mut source, mut acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    assigned(&mut source).await;
    broker
        .faults(TOPIC, GROUP)
        .expect("faults")
        .delay_commits(Duration::from_secs(1));
    let batch = commit_batch(0, 0);
    let cut_short = tokio::time::timeout(Duration::from_millis(500), acker.ack(&batch)).await;
    assert!(cut_short.is_err(), "the commit is still waiting");
    assert_eq!(broker.committed(TOPIC, GROUP).expect("committed"), [None]);
    acker.ack(&batch).await.expect("delayed commit");
    assert_eq!(
        broker.committed(TOPIC, GROUP).expect("committed"),
        [Some(1)]
    );
}

// --- dead letters ----------------------------------------------------------

#[tokio::test]
async fn a_dead_letter_keeps_its_origin_error_and_attempts() {
    let broker = broker_with_topic(2);
    broker
        .send(TOPIC, Record::new("poison").with_key("k").to_partition(1))
        .expect("send");
    let (mut source, _acker) = joined(&broker).await;
    let mut buf = Vec::new();
    delivered(&mut source, &mut buf, 10).await;
    let sink = broker.dead_letter_sink(TOPIC, GROUP).expect("sink");
    assert_eq!(sink.topic(), "orders.billing.dlq");
    sink.write(&DeadLetter::new(buf[0].clone(), "bad json", 3))
        .await
        .expect("write");

    let letters = broker.dead_letters(TOPIC, GROUP).expect("dead letters");
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].message.payload(), "poison");
    assert_eq!(letters[0].message.metadata().partition(), 1);
    assert_eq!(letters[0].error, "bad json");
    assert_eq!(letters[0].attempts, 3);

    // The dead-letter topic is an ordinary topic a consumer can read: the
    // record key is the original key, the envelope's fields are headers.
    let stored = broker
        .messages("orders.billing.dlq", 0, 0)
        .expect("dlq topic");
    let headers = stored[0].headers();
    assert_eq!(stored[0].payload(), "poison");
    assert_eq!(stored[0].key().map(Bytes::as_ref), Some(&b"k"[..]));
    assert_eq!(headers.get_str(envelope::ORIGIN_BROKER), Some("memory"));
    assert_eq!(headers.get_str(envelope::ORIGIN_SOURCE), Some(TOPIC));
    assert_eq!(headers.get_str(envelope::ORIGIN_PARTITION), Some("1"));
    assert_eq!(headers.get_str(envelope::ORIGIN_POSITION), Some("0"));
    assert_eq!(headers.get_str(envelope::ORIGIN_GROUP), Some(GROUP));
    assert_eq!(
        headers.get_str(envelope::ORIGIN_KEY),
        None,
        "the key is the record key"
    );
    assert_eq!(headers.get_str(envelope::ERROR_MESSAGE), Some("bad json"));
    assert_eq!(headers.get_str(envelope::ERROR_CLASS), Some("permanent"));
    assert_eq!(headers.get_str(envelope::ATTEMPTS), Some("3"));
    assert!(headers.get_str(envelope::FAILED_LAST).is_some());
    assert!(
        broker
            .dead_letters(TOPIC, "other")
            .expect("none")
            .is_empty()
    );
}

#[tokio::test]
async fn a_producer_header_named_like_an_origin_field_does_not_change_the_origin() {
    let broker = broker_with_topic(1);
    broker
        .send(
            TOPIC,
            Record::new("poison")
                .with_header(envelope::ORIGIN_SOURCE, "spoofed")
                .with_header(envelope::ERROR_MESSAGE, "spoofed"),
        )
        .expect("send");
    let (mut source, _acker) = joined(&broker).await;
    let mut buf = Vec::new();
    delivered(&mut source, &mut buf, 10).await;
    let sink = broker.dead_letter_sink(TOPIC, GROUP).expect("sink");
    sink.write(&DeadLetter::new(buf[0].clone(), "bad json", 1))
        .await
        .expect("write");

    let stored = broker
        .messages("orders.billing.dlq", 0, 0)
        .expect("dlq topic");
    let headers = stored[0].headers();
    assert_eq!(headers.get_str(envelope::ORIGIN_SOURCE), Some(TOPIC));
    let kept = format!("{}{}", envelope::PRODUCER_PREFIX, envelope::ORIGIN_SOURCE);
    assert_eq!(headers.get_str(&kept), Some("spoofed"));
    let letters = broker.dead_letters(TOPIC, GROUP).expect("dead letters");
    assert_eq!(&**letters[0].message.metadata().source(), TOPIC);
    assert_eq!(letters[0].error, "bad json");
    assert_eq!(
        letters[0].message.headers(),
        buf[0].headers(),
        "the producer's headers come back under their own names"
    );
}

#[tokio::test]
async fn a_record_in_the_dead_letter_topic_that_is_not_a_letter_is_a_typed_error() {
    let broker = broker_with_topic(1);
    broker.dead_letter_sink(TOPIC, GROUP).expect("sink");
    broker
        .send("orders.billing.dlq", Record::new("written by hand"))
        .expect("send");
    assert_eq!(
        broker
            .dead_letters(TOPIC, GROUP)
            .map(|letters| letters.len()),
        Err(MemoryError::MalformedDeadLetter {
            topic: "orders.billing.dlq".into(),
            offset: 0,
            source: envelope::EnvelopeError::Missing {
                field: envelope::VERSION
            },
        })
    );
}

#[tokio::test]
async fn a_failed_dead_letter_write_stores_nothing() {
    let broker = broker_with_topic(1);
    let sink = broker.dead_letter_sink(TOPIC, GROUP).expect("sink");
    broker
        .faults(TOPIC, GROUP)
        .expect("faults")
        .fail_next_dead_letter_writes(1);
    let message = Message::new(
        "poison",
        crate::Metadata::new(TOPIC.into(), 0, Position::Offset(0)),
    );
    let letter = DeadLetter::new(message, "boom", 1);
    assert!(sink.write(&letter).await.is_err());
    assert!(
        broker
            .dead_letters(TOPIC, GROUP)
            .expect("dead letters")
            .is_empty()
    );
    sink.write(&letter).await.expect("second write");
    assert_eq!(
        broker
            .dead_letters(TOPIC, GROUP)
            .expect("dead letters")
            .len(),
        1
    );
}

// --- inspection ------------------------------------------------------------

#[test]
fn a_group_that_never_consumed_owes_everything() {
    let broker = broker_with_topic(2);
    produce_to(&broker, 0, 2);
    let group = broker.group(TOPIC, "nobody").expect("group");
    assert!(group.members.is_empty());
    assert_eq!(group.committed(), [None, None]);
    assert_eq!(group.lag(), 2);
    assert_eq!(group.partitions[0].owner, PartitionOwner::Unassigned);
}

// --- concurrency -----------------------------------------------------------

/// Which member holds each partition, as the members themselves report it:
/// set on `Assigned`, cleared when the member released the partition.
type Holders = std::sync::Arc<std::sync::Mutex<std::collections::HashMap<u32, MemberId>>>;
type Seen = std::sync::Arc<std::sync::Mutex<std::collections::HashSet<(u32, i64)>>>;

/// A member that consumes like the runtime would: commits each batch,
/// releases revoked partitions after committing, and checks that it never
/// receives a partition someone else still holds. Leaves after `rounds`
/// events (by crashing if `crash`), or once the group's lag is zero if
/// `drain`.
async fn run_member(
    broker: MemoryBroker,
    holders: Holders,
    seen: Seen,
    rounds: usize,
    crash: bool,
    drain: bool,
) {
    let (mut source, mut acker) = broker.consumer(TOPIC, GROUP).expect("consumer");
    let me = source.member_id();
    let mut buf = Vec::new();
    let mut round = 0;
    while if drain {
        broker.lag(TOPIC, GROUP).expect("lag") > 0
    } else {
        round < rounds
    } {
        round += 1;
        buf.clear();
        // The timeout only keeps the loop turning when nothing arrives.
        let Ok(event) =
            tokio::time::timeout(Duration::from_millis(5), source.next(&mut buf, 16)).await
        else {
            continue;
        };
        match event.expect("no source error") {
            SourceEvent::Assigned(keys) => {
                let mut holders = holders.lock().expect("holders");
                for key in keys {
                    let previous = holders.insert(key.partition, me);
                    assert_eq!(
                        previous, None,
                        "{me} got partition {} while it was still held",
                        key.partition
                    );
                }
            }
            SourceEvent::Revoked(revocation) => {
                let mut holders = holders.lock().expect("holders");
                for key in revocation.partitions() {
                    assert_eq!(holders.remove(&key.partition), Some(me));
                }
                drop(holders);
                revocation.complete(RevocationOutcome::default());
            }
            SourceEvent::Delivered => {
                let mut last = std::collections::BTreeMap::new();
                {
                    let holders = holders.lock().expect("holders");
                    let mut seen = seen.lock().expect("seen");
                    for (partition, offset) in offsets(&buf) {
                        assert_eq!(
                            holders.get(&partition),
                            Some(&me),
                            "{me} fetched partition {partition} it does not hold"
                        );
                        seen.insert((partition, offset));
                        last.insert(partition, offset);
                    }
                }
                let partitions = last
                    .into_iter()
                    .map(|(partition, offset)| {
                        let mut ack = PartitionAck::new(PartitionKey::new(TOPIC, partition));
                        ack.watermark = Some(Position::Offset(offset));
                        ack
                    })
                    .collect();
                acker
                    .ack(&AckBatch {
                        partitions,
                        sync: false,
                    })
                    .await
                    .expect("a holder's commit is accepted");
            }
            SourceEvent::Exhausted => unreachable!("a broker topic never ends"),
        }
    }
    // Stop consuming first, then leave: from here on others may hold them.
    holders
        .lock()
        .expect("holders")
        .retain(|_, holder| *holder != me);
    if crash {
        drop(source);
    } else {
        source.close().await.expect("close");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_coming_and_going_never_share_a_partition_and_lose_nothing() {
    const MESSAGES: usize = 2_000;
    let broker = broker_with_topic(6);
    let holders = Holders::default();
    let seen = Seen::default();
    let producer = {
        let broker = broker.clone();
        tokio::spawn(async move {
            for n in 0..MESSAGES {
                broker
                    .send(
                        TOPIC,
                        Record::new(format!("{n}")).with_key(format!("key-{}", n % 31)),
                    )
                    .expect("send");
                if n % 100 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        })
    };
    let members: Vec<_> = (0..6)
        .map(|index| {
            tokio::spawn(run_member(
                broker.clone(),
                holders.clone(),
                seen.clone(),
                20 + index * 15,
                index % 2 == 1,
                false,
            ))
        })
        .collect();
    producer.await.expect("producer");
    for member in members {
        member.await.expect("member");
    }
    run_member(
        broker.clone(),
        holders.clone(),
        seen.clone(),
        0,
        false,
        true,
    )
    .await;

    assert_eq!(broker.lag(TOPIC, GROUP).expect("lag"), 0);
    assert_eq!(
        seen.lock().expect("seen").len(),
        MESSAGES,
        "every message was delivered"
    );
    assert!(
        broker
            .group(TOPIC, GROUP)
            .expect("group")
            .members
            .is_empty()
    );
}
