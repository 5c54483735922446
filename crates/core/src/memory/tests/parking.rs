//! Parking on a topic that several groups read: a parked copy comes back to
//! the group that parked it, and to no other.

use std::time::Duration;

use super::support::*;
use crate::acker::Acker;
use crate::backend::broker::{Broker, RouteAddress, RouteOptions};
use crate::memory::*;
use crate::message::Message;
use crate::parking::Parking;
use crate::source::{Source, SourceEvent};

const PARKER: &str = "billing";
const BYSTANDER: &str = "audit";

/// Every delivery `source` has for now: waits for the next event until none
/// comes within a short quiet time (everything here was produced before).
async fn drain(source: &mut MemorySource) -> Vec<Message> {
    let mut all = Vec::new();
    loop {
        let mut buf = Vec::new();
        match tokio::time::timeout(Duration::from_millis(200), source.next(&mut buf, 100)).await {
            Err(_quiet) => return all,
            Ok(event) => match event.expect("no source error") {
                SourceEvent::Delivered => all.append(&mut buf),
                SourceEvent::Assigned(_) => {}
                other => panic!("unexpected event {other:?}"),
            },
        }
    }
}

fn payloads(messages: &[Message]) -> Vec<String> {
    messages
        .iter()
        .map(|message| String::from_utf8_lossy(message.payload()).into_owned())
        .collect()
}

#[tokio::test]
async fn a_parked_copy_comes_back_to_the_parking_group_alone() {
    let broker = broker_with_topic(1);
    broker
        .send(TOPIC, Record::new("m1").with_key("k1"))
        .expect("send");
    broker
        .send(TOPIC, Record::new("m2").with_key("k2"))
        .expect("send");
    let (mut bystander, mut bystander_acker) = broker.consumer(TOPIC, BYSTANDER).expect("consumer");
    let parts = Broker::route(
        &broker,
        &RouteAddress::new(TOPIC, PARKER),
        &RouteOptions::new().parking(),
    )
    .await
    .expect("route");
    let (mut parker, parking) = (parts.source, parts.parking.expect("asked for parking"));

    let first = drain(&mut parker).await;
    assert_eq!(payloads(&first), ["m1", "m2"]);
    parking
        .park(&first[0], Duration::from_millis(10))
        .await
        .expect("park");
    tokio::time::timeout(Duration::from_secs(10), async {
        while broker.high_watermarks(TOPIC).expect("topic") != [3] {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the parked copy is back within 10 s");

    let returned = drain(&mut parker).await;
    assert_eq!(
        payloads(&returned),
        ["m1"],
        "the parking group gets its copy back"
    );
    assert!(parking.is_returned_copy(&returned[0]));

    let seen = drain(&mut bystander).await;
    assert_eq!(
        payloads(&seen),
        ["m1", "m2"],
        "another group sees each produced message once and never the parked copy"
    );
    let last = seen.last().expect("deliveries");
    let crate::message::Position::Offset(offset) = last.metadata().position() else {
        panic!("memory positions are offsets");
    };
    bystander_acker
        .ack(&commit_batch(0, offset))
        .await
        .expect("commit");
    assert_eq!(
        broker.lag(TOPIC, BYSTANDER).expect("lag"),
        0,
        "the other group has nothing left to consume"
    );

    // A group that joins after the park never sees the copy either.
    assert_eq!(broker.lag(TOPIC, "late").expect("lag"), 2);
    let (mut late, _acker) = broker.consumer(TOPIC, "late").expect("consumer");
    assert_eq!(payloads(&drain(&mut late).await), ["m1", "m2"]);
}
