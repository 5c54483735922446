//! Crashes: what a crashed member had not committed reaches the next one, as
//! another attempt.

use super::support::*;
use crate::acker::Acker;

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
