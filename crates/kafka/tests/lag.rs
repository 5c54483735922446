//! Broker-side lag of a consumer group: high watermark − committed offset
//! per partition, checked against the offsets the broker reports
//! (`KafkaBackend::offsets`, the admin view).
//!
//! The real-broker test skips with a printed reason when nothing listens on
//! 127.0.0.1:9092, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use std::time::Duration;

use intake_core::backend::testkit::assert_unreachable_lag_probe;
use intake_core::backend::{AckBatch, Acker, PartitionAck, Source};
use intake_core::lag::LagProbe;
use intake_core::{PartitionKey, Position};
use intake_kafka::{KafkaLagProbe, KafkaSettings};
use support::{KafkaBackend, take, unique};

const PATIENCE: Duration = Duration::from_secs(60);

async fn lag_after_committing_three_of_ten(kafka: KafkaBackend) {
    let topic = unique("lag");
    let group = unique("g");
    kafka.create_topic(&topic, 2).await.expect("topic");
    kafka
        .produce_to_partition(&topic, 0, (0..6).map(|n| format!("a{n}")))
        .await
        .expect("produce");
    kafka
        .produce_to_partition(&topic, 1, (0..4).map(|n| format!("b{n}")))
        .await
        .expect("produce");
    let probe = KafkaLagProbe::new(&kafka.settings(), &group, [topic.as_str()]).expect("probe");

    // Before the group ever committed: everything the partitions hold.
    let before = probe.lag().await.expect("lag");
    let counts: Vec<_> = before.iter().map(|lag| lag.messages).collect();
    assert_eq!(counts, [Some(6), Some(4)]);
    assert_eq!(before[0].partition, PartitionKey::new(topic.as_str(), 0));
    assert_eq!(before[1].partition, PartitionKey::new(topic.as_str(), 1));

    let mut source = kafka.source(&topic, &group).build().await.expect("source");
    assert_eq!(take(&mut source, 10, 64, PATIENCE).await.messages.len(), 10);
    // Commit offsets 0..=2 of partition 0 only.
    let mut ack = PartitionAck::new(PartitionKey::new(topic.as_str(), 0));
    ack.watermark = Some(Position::Offset(2));
    source
        .acker()
        .ack(&AckBatch {
            partitions: vec![ack],
            sync: true,
        })
        .await
        .expect("commit");

    let after = probe.lag().await.expect("lag");
    let counts: Vec<_> = after.iter().map(|lag| lag.messages).collect();
    assert_eq!(counts, [Some(3), Some(4)]);
    let total: u64 = after.iter().filter_map(|lag| lag.messages).sum();
    assert_eq!(total, 10 - 3);

    // The broker's own numbers: high watermark − committed (or everything).
    let offsets = kafka.offsets(&topic, &group).await.expect("offsets");
    let expected: Vec<_> = offsets
        .iter()
        .map(|(_, committed, high)| Some((high - committed.unwrap_or(0)) as u64))
        .collect();
    assert_eq!(counts, expected);

    // The source's own probe: the same group, topics and settings.
    let from_source = source.lag_probe().expect("the source's probe");
    let counts_from_source: Vec<_> = from_source
        .lag()
        .await
        .expect("lag")
        .iter()
        .map(|lag| lag.messages)
        .collect();
    assert_eq!(counts_from_source, expected);
    source.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_real_broker_the_lag_is_log_end_minus_committed() {
    let Some(kafka) = KafkaBackend::real("kafka lag") else {
        return;
    };
    lag_after_committing_three_of_ten(kafka).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_mock_cluster_the_lag_is_log_end_minus_committed() {
    lag_after_committing_three_of_ten(KafkaBackend::mock()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_broker_is_a_transient_error_within_the_timeout() {
    let port = intake_core::backend::testkit::closed_port().expect("a free local port");
    let settings = KafkaSettings::new(format!("127.0.0.1:{port}")).set("sasl.password", "hunter2");
    let probe = KafkaLagProbe::new(&settings, "g", ["orders"])
        .expect("probe")
        .timeout(Duration::from_secs(2));
    assert_unreachable_lag_probe(&probe, Some("hunter2")).await;
}
