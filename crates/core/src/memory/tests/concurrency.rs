//! Concurrency: members coming and going never share a partition and lose
//! nothing.

use super::support::*;
use crate::acker::Acker;
use crate::acker::{AckBatch, PartitionAck};
use crate::memory::*;
use crate::message::{PartitionKey, Position};
use crate::source::Source;
use crate::source::{RevocationOutcome, SourceEvent};
use std::time::Duration;

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
