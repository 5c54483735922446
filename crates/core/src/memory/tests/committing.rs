//! Committing: watermarks, and commits refused from former owners, past the
//! end, or after leaving.

use super::support::*;
use crate::acker::AckError;
use crate::acker::Acker;
use crate::memory::*;
use crate::source::Source;
use crate::source::{RevocationOutcome, SourceEvent};
use std::time::Duration;

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
