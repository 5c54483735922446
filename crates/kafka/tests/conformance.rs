//! intake's backend conformance suite, unchanged, on Apache Kafka at
//! 127.0.0.1:9092 (`.ci/services/kafka.sh`). Skipped with a printed reason
//! when no broker listens, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

async fn backend() -> Option<support::KafkaBackend> {
    support::init_tracing();
    support::KafkaBackend::real("the conformance suite on Apache Kafka")
}

intake_core::conformance_suite!(backend());
