//! Consuming: assignment first, order and origin, fetch limits, fairness
//! across partitions, offset reset.

use super::support::*;
use crate::memory::*;
use crate::message::Headers;
use crate::source::Source;
use bytes::Bytes;
use futures_util::FutureExt;

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
