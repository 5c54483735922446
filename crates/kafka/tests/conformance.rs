//! intake's backend conformance suite, unchanged, on Apache Kafka at
//! 127.0.0.1:9092 (`.ci/services/kafka.sh`). Skipped with a printed reason
//! when no broker listens, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use intake_core::BoxError;
use intake_core::backend::testkit::PublishingBackend;
use intake_kafka::{KafkaPublisher, KafkaSettings};

async fn backend() -> Option<support::KafkaBackend> {
    support::init_tracing();
    support::KafkaBackend::real("the conformance suite on Apache Kafka")
}

#[async_trait::async_trait]
impl PublishingBackend for support::KafkaBackend {
    type Publisher = KafkaPublisher;

    async fn publisher(&self) -> Result<KafkaPublisher, BoxError> {
        Ok(KafkaPublisher::builder(KafkaSettings::new(self.brokers())).build()?)
    }

    fn destination(&self, source: &str) -> String {
        source.to_owned()
    }
}

intake_core::conformance_suite!(backend());
intake_core::publisher_suite!(backend());
