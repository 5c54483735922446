//! What a Kafka parking holds that its group has not handled again
//! ([`KafkaParking::backlog`]), against Apache Kafka on 127.0.0.1:9092
//! (`.ci/services/kafka.sh`): issue 25 saw a drain run go idle and exit 0
//! with 3,498 ids still parked in a retry topic, since nothing counted the
//! parked backlog as unfinished work. Skipped with a printed reason when no
//! broker listens, unless `INTAKE_REQUIRE_BROKERS=1`.
//!
//! Every wait is on a condition, bounded; no test asserts how long anything
//! took.

mod support;

use std::time::Duration;

use intake_core::backend::testkit::Backend;
use intake_core::backend::testkit::harness::Ledger;
use intake_core::parking::Parking as _;
use intake_core::{DeliveryOrder, Message, Metadata, Position};
use intake_kafka::{KafkaParking, ParkedBacklog};
use support::consumer::{TestConsumer, eventually};
use support::{KafkaBackend, unique};

const PATIENCE: Duration = Duration::from_secs(60);

/// A message of `topic` as the source hands it out.
fn consumed(topic: &str, partition: u32, id: u64) -> Message {
    Message::new(
        id.to_string(),
        Metadata::new(topic.into(), partition, Position::Offset(id as i64)),
    )
    .with_key(format!("key-{id}"))
}

/// A parking of `group` for `topic`, which parks: a source of the group was
/// built to read its return topic.
async fn parking_for(kafka: &KafkaBackend, topic: &str, group: &str) -> KafkaParking {
    let parking = KafkaParking::builder(kafka.settings(), group)
        .topics([topic])
        .delivery_timeout(Duration::from_secs(10))
        .build()
        .await
        .expect("parking");
    support::read_returns(kafka, &parking, topic, group).await;
    parking
}

async fn backlog(parking: &KafkaParking) -> ParkedBacklog {
    parking
        .backlog()
        .await
        .expect("the brokers count the backlog")
}

/// Records parked while no mover runs are counted as parked; once a mover
/// moved them back they are counted as returned until the group commits
/// them; then nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_records_count_until_moved_back_and_handled() {
    support::init_tracing();
    let Some(kafka) = KafkaBackend::real("parked_records_count_until_moved_back_and_handled")
    else {
        return;
    };
    let topic = kafka.create_source(2).await.expect("topic");
    let group = unique("g");

    // A parking whose mover is stopped: what it parks stays where it is.
    let first = parking_for(&kafka, &topic, &group).await;
    first
        .shutdown(Duration::from_secs(15))
        .await
        .expect("the mover stops");
    assert_eq!(
        backlog(&first).await.total(),
        0,
        "nothing parked yet (no retry topic exists)"
    );
    for id in 0..6u64 {
        let partition = (id % 2) as u32;
        first
            .park(&consumed(&topic, partition, id), Duration::ZERO)
            .await
            .expect("parked");
    }
    let parked = backlog(&first).await;
    assert_eq!(
        (parked.parked, parked.returned),
        (6, 0),
        "six records due and not moved: {parked:?}"
    );

    // A mover of the group moves them back to the return topic.
    let second = parking_for(&kafka, &topic, &group).await;
    eventually("the six records are moved back", PATIENCE, || async {
        let now = backlog(&second).await;
        (now.parked, now.returned) == (0, 6)
    })
    .await;

    // The group handles and commits them.
    let source = kafka
        .source(&topic, &group)
        .parking(&second)
        .build()
        .await
        .expect("source");
    let ledger = Ledger::default();
    let consumer = TestConsumer::working(
        source,
        &ledger,
        Duration::ZERO,
        DeliveryOrder::Partition,
        64,
    );
    eventually("the group committed the six copies", PATIENCE, || async {
        backlog(&second).await.total() == 0
    })
    .await;
    consumer.stop().await;
    assert_eq!(ledger.distinct(), 6, "each copy handled");
    second
        .shutdown(Duration::from_secs(15))
        .await
        .expect("the mover stops");
}

/// A record parked for an hour stays counted while a running mover holds
/// it (its partition paused until the record is due, nothing committed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_parked_for_long_is_counted_while_the_mover_holds_it() {
    support::init_tracing();
    let Some(kafka) =
        KafkaBackend::real("a_record_parked_for_long_is_counted_while_the_mover_holds_it")
    else {
        return;
    };
    let topic = kafka.create_source(2).await.expect("topic");
    let group = unique("g");
    let parking = parking_for(&kafka, &topic, &group).await;
    for id in 0..3u64 {
        parking
            .park(&consumed(&topic, 1, id), Duration::from_secs(3600))
            .await
            .expect("parked");
    }
    // Until the mover has joined its group, fetched and paused the
    // partition, and after: the count is the same.
    eventually("the mover took the parked records", PATIENCE, || async {
        parking.mover_health().is_live()
    })
    .await;
    for _ in 0..3 {
        let now = backlog(&parking).await;
        assert_eq!((now.parked, now.returned), (3, 0), "{now:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(parking.moved(), 0);
    parking
        .shutdown(Duration::from_secs(15))
        .await
        .expect("the mover stops");
}

/// Unknown is never "nothing parked": brokers that do not answer make the
/// count an error, within its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_broker_is_an_error_not_zero() {
    let parking = KafkaParking::builder(intake_kafka::KafkaSettings::new("127.0.0.1:9"), "billing")
        .topics(["orders"])
        .return_topic_template("{topic}")
        .build()
        .await
        .expect("no broker needed to build");
    let counted = tokio::time::timeout(Duration::from_secs(30), parking.backlog())
        .await
        .expect("bounded");
    assert!(
        matches!(
            counted,
            Err(intake_kafka::parking::ParkingError::Backlog { .. }
                | intake_kafka::parking::ParkingError::BacklogTimedOut { .. })
        ),
        "{counted:?}"
    );
    parking
        .shutdown(Duration::from_secs(10))
        .await
        .expect("the mover stops");
}
