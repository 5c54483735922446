//! Producing: partitioning by key or in turn, explicit partitions, batches,
//! names.

use super::support::*;
use crate::memory::*;

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
