//! Rebalancing: revocations released before the new owner fetches, timeouts,
//! members leaving, independent groups.

use super::support::*;
use crate::acker::AckError;
use crate::acker::Acker;
use crate::memory::*;
use crate::source::Source;
use crate::source::{RevocationOutcome, SourceEvent};
use std::time::Duration;

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
