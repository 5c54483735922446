//! The broker restarted mid-run (tansu stopped and started again on the same
//! sqlite database): the consumer carries on and nothing is lost.
//!
//! A test binary of its own, so no other real-tier test runs while the
//! broker is down. Needs a broker started by `.ci/services/kafka.sh`.

mod support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use intake_core::Position;
use intake_core::testkit::{Backend, TestMessage};
use support::driver::Driver;
use support::{KafkaBackend, unique};

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.ci/services/kafka.sh")
}

fn batch(from: usize, count: usize) -> Vec<TestMessage> {
    (from..from + count)
        .map(|n| TestMessage::new(format!("key-{}", n % 5), format!("m{n}")))
        .collect()
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
        if std::env::var("INTAKE_REQUIRE_BROKERS").as_deref() == Ok("1") {
            panic!("{test}: {why}");
        }
        println!("skipped: {test}: {why}");
        return;
    }
    let topic = kafka.create_source(2).await.expect("topic");
    let group = unique("g");
    kafka.produce(&topic, batch(0, 100)).await.expect("produce");
    let mut driver = Driver::new(
        kafka.source(&topic, &group).build().await.expect("source"),
        true,
    );
    assert_eq!(
        driver.receive_until(100, Duration::from_secs(60)).await,
        100
    );

    let restart =
        tokio::task::spawn_blocking(|| Command::new("bash").arg(script()).arg("restart").status());
    // Keep polling through the outage, as the runtime would.
    driver.run_for(Duration::from_secs(3)).await;
    let status = restart.await.expect("join").expect("run kafka.sh");
    assert!(status.success(), "kafka.sh restart failed");

    kafka
        .produce(&topic, batch(100, 100))
        .await
        .expect("produce after the restart");
    driver.receive_until(200, Duration::from_secs(90)).await;
    let driver = driver.finish().await;

    let seen: BTreeSet<(u32, i64)> = driver
        .received
        .iter()
        .map(|message| {
            let Position::Offset(offset) = message.metadata().position() else {
                unreachable!("kafka positions are offsets")
            };
            (message.metadata().partition(), offset)
        })
        .collect();
    let offsets = kafka.offsets(&topic, &group).await.expect("offsets");
    let expected: BTreeSet<(u32, i64)> = offsets
        .iter()
        .flat_map(|(partition, _, high)| (0..*high).map(move |offset| (*partition as u32, offset)))
        .collect();
    assert_eq!(expected.len(), 200);
    let missing: Vec<_> = expected.difference(&seen).take(10).collect();
    assert!(missing.is_empty(), "never processed: {missing:?}");
    assert_eq!(kafka.unacknowledged(&topic, &group).await.expect("lag"), 0);
}
