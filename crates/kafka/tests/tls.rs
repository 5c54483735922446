//! TLS and SASL_SSL/SCRAM-SHA-512 end to end, against the test broker's own
//! listeners (`.ci/services/kafka.sh`: 9093 TLS, 9094 SASL_SSL, a CA of its
//! own). Certificate verification stays on throughout. Skipped with a
//! printed reason when no broker listens, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use intake_core::backend::testkit::Backend;
use intake_core::backend::testkit::harness::{Ledger, numbered};
use intake_core::{DeadLetter, backend::DeadLetterSink};
use intake_kafka::{Error, KafkaSettings, KafkaSource};
use support::consumer::TestConsumer;
use support::{KafkaBackend, unique};

/// What `kafka.sh env` prints: listener addresses, CA files, the SCRAM user.
struct TestBroker {
    values: HashMap<String, String>,
}

impl TestBroker {
    fn find(test: &str) -> Option<(Self, KafkaBackend)> {
        let kafka = KafkaBackend::real(test)?;
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.ci/services/kafka.sh");
        let output = Command::new("bash")
            .arg(script)
            .arg("env")
            .output()
            .expect("kafka.sh env runs");
        assert!(output.status.success(), "kafka.sh env failed");
        let values = String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(key, value)| (key.to_owned(), value.to_owned()))
            .collect();
        Some((Self { values }, kafka))
    }

    fn get(&self, key: &str) -> &str {
        self.values
            .get(key)
            .unwrap_or_else(|| panic!("kafka.sh env prints {key}"))
    }

    /// TLS to the broker's TLS listener, trusting `ca`.
    fn tls(&self, ca: &str) -> KafkaSettings {
        KafkaSettings::new(self.get("INTAKE_KAFKA_TLS_BROKERS"))
            .set("security.protocol", "SSL")
            .set("ssl.ca.location", ca)
    }

    /// SASL_SSL with SCRAM-SHA-512 as `user`/`password`, trusting the CA.
    fn scram(&self, user: &str, password: &str) -> KafkaSettings {
        KafkaSettings::new(self.get("INTAKE_KAFKA_SASL_BROKERS"))
            .set("security.protocol", "SASL_SSL")
            .set("ssl.ca.location", self.get("INTAKE_KAFKA_CA"))
            .set("sasl.mechanisms", "SCRAM-SHA-512")
            .set("sasl.username", user)
            .set("sasl.password", password)
    }
}

fn test_timings(settings: KafkaSettings) -> KafkaSettings {
    settings
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
}

/// Consumes and dead-letters over `settings`: messages flow, offsets are
/// committed, the dead-letter sink's producer gets its delivery reports.
async fn consume_and_dead_letter(kafka: &KafkaBackend, settings: KafkaSettings) {
    let topic = kafka.create_source(2).await.expect("topic");
    let group = unique("g");
    kafka
        .produce(&topic, numbered(0, 50))
        .await
        .expect("produce over plaintext");
    let source = KafkaSource::builder(test_timings(settings.clone()))
        .group(&group)
        .topic(&topic)
        .connect_timeout(Duration::from_secs(15))
        .build()
        .await
        .expect("a source over the secured listener");
    // The source's own sink: its TLS and SASL settings are the source's.
    let dead_letters = source.dead_letter_sink();
    let ledger = Ledger::default();
    let consumer = TestConsumer::recording(source, &ledger);
    ledger.wait_for_all(50, "every message over TLS").await;
    consumer.stop().await;
    assert_eq!(kafka.unacknowledged(&topic, &group).await.expect("lag"), 0);

    let sink = dead_letters
        .build()
        .await
        .expect("a sink over the secured listener");
    let original = intake_core::Message::new(
        "poison",
        intake_core::Metadata::new(topic.as_str().into(), 0, intake_core::Position::Offset(0)),
    );
    sink.write(&DeadLetter::new(original, "bad", 1))
        .await
        .expect("the broker confirmed the dead letter over TLS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_the_brokers_ca_consumes_commits_and_dead_letters() {
    support::init_tracing();
    let test = "tls_with_the_brokers_ca_consumes_commits_and_dead_letters";
    let Some((broker, kafka)) = TestBroker::find(test) else {
        return;
    };
    consume_and_dead_letter(&kafka, broker.tls(broker.get("INTAKE_KAFKA_CA"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_ssl_with_scram_sha_512_consumes_commits_and_dead_letters() {
    support::init_tracing();
    let test = "sasl_ssl_with_scram_sha_512_consumes_commits_and_dead_letters";
    let Some((broker, kafka)) = TestBroker::find(test) else {
        return;
    };
    let settings = broker.scram(
        broker.get("INTAKE_KAFKA_SCRAM_USER"),
        broker.get("INTAKE_KAFKA_SCRAM_PASSWORD"),
    );
    consume_and_dead_letter(&kafka, settings).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_certificate_from_another_ca_is_refused_with_a_tls_error() {
    support::init_tracing();
    let test = "a_broker_certificate_from_another_ca_is_refused_with_a_tls_error";
    let Some((broker, kafka)) = TestBroker::find(test) else {
        return;
    };
    let topic = kafka.create_source(1).await.expect("topic");
    let built = tokio::time::timeout(
        Duration::from_secs(60),
        KafkaSource::builder(broker.tls(broker.get("INTAKE_KAFKA_OTHER_CA")))
            .group(unique("g"))
            .topic(&topic)
            .connect_timeout(Duration::from_secs(5))
            .build(),
    )
    .await
    .expect("build returns within its connect timeout");
    match built {
        Err(error @ Error::Tls { .. }) => {
            let shown = support::error_chain(&error);
            assert!(
                shown.contains("certificate verify failed"),
                "the error says why: {shown}"
            );
            assert!(
                shown.contains("ssl.ca.location"),
                "and what to check: {shown}"
            );
        }
        Err(other) => panic!("expected a TLS error, got {other:?}: {other}"),
        Ok(_) => panic!("a broker signed by another CA was trusted"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_scram_credentials_are_a_typed_error_without_the_password() {
    support::init_tracing();
    let test = "wrong_scram_credentials_are_a_typed_error_without_the_password";
    let Some((broker, kafka)) = TestBroker::find(test) else {
        return;
    };
    let topic = kafka.create_source(1).await.expect("topic");
    let password = "not-the-Secret-7f3a";
    let built = tokio::time::timeout(
        Duration::from_secs(60),
        KafkaSource::builder(broker.scram(broker.get("INTAKE_KAFKA_SCRAM_USER"), password))
            .group(unique("g"))
            .topic(&topic)
            .connect_timeout(Duration::from_secs(5))
            .build(),
    )
    .await
    .expect("build returns within its connect timeout");
    match built {
        Err(error @ Error::Unauthorized { .. }) => {
            let shown = format!("{} {error:?}", support::error_chain(&error));
            assert!(
                shown.contains("SCRAM-SHA-512") || shown.contains("Authentication"),
                "the error says what failed: {shown}"
            );
            assert!(!shown.contains(password), "the password leaked: {shown}");
        }
        Err(other) => panic!("expected Unauthorized, got {other:?}: {other}"),
        Ok(_) => panic!("wrong credentials were accepted"),
    }
}
