//! The broker restarted mid-run (tansu stopped and started again on the same
//! sqlite database): the consumer carries on and nothing is lost.
//!
//! A test binary of its own, so no other real-tier test runs while the
//! broker is down. Needs a broker started by `.ci/services/kafka.sh`.

mod support;

use std::path::PathBuf;
use std::process::Command;

use intake_core::testkit::Backend;
use intake_core::testkit::harness::{Ledger, numbered};
use support::consumer::TestConsumer;
use support::{KafkaBackend, unique};

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.ci/services/kafka.sh")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_carries_on_after_a_broker_restart_and_loses_nothing() {
    support::init_tracing();
    let test = "the_consumer_carries_on_after_a_broker_restart_and_loses_nothing";
    let Some(kafka) = KafkaBackend::real(test) else {
        return;
    };
    let cache = std::env::var("INTAKE_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/intake")
        });
    if !cache.join("kafka-broker/tansu.pid").exists() {
        let why = "the broker on 127.0.0.1:9092 was not started by .ci/services/kafka.sh, so it cannot be restarted";
        intake_core::testkit::skip_or_fail(test, why);
        return;
    }
    let topic = kafka.create_source(2).await.expect("topic");
    let group = unique("g");
    kafka
        .produce(&topic, numbered(0, 100))
        .await
        .expect("produce");
    let ledger = Ledger::default();
    let consumer = TestConsumer::recording(
        kafka.source(&topic, &group).build().await.expect("source"),
        &ledger,
    );
    ledger
        .wait_for_all(100, "the messages before the restart")
        .await;

    // The consumer keeps running through the outage, as in production.
    let restart =
        tokio::task::spawn_blocking(|| Command::new("bash").arg(script()).arg("restart").status());
    let status = restart.await.expect("join").expect("run kafka.sh");
    assert!(status.success(), "kafka.sh restart failed");

    kafka
        .produce(&topic, numbered(100, 100))
        .await
        .expect("produce after the restart");
    ledger
        .wait_for_all(200, "the messages after the restart")
        .await;
    consumer.stop().await;
    assert_eq!(kafka.unacknowledged(&topic, &group).await.expect("lag"), 0);
}
