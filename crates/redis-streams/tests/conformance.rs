//! The backend, publisher, dead-letter store and broker conformance suites,
//! unchanged, against a real Redis.

mod support;

intake_core::conformance_suite!(support::RedisBackend::new("redis conformance"));
intake_core::publisher_suite!(support::RedisBackend::new("redis publisher conformance"));
intake_core::dead_letter_store_suite!(support::RedisBackend::new("redis store conformance"));
intake_core::broker_suite!(support::RedisBackend::new("redis broker conformance"));

/// Every part derived from one `RedisBroker` on the server under test. Its
/// key field is `key`, where the fixture produces each message's key.
impl intake_core::backend::testkit::broker::BrokerBackend for support::RedisBackend {
    type Broker = intake_redis_streams::RedisBroker;

    fn broker(&self) -> Self::Broker {
        intake_redis_streams::RedisBroker::new(support::redis_url())
    }
}

#[async_trait::async_trait]
impl intake_core::backend::testkit::dead_letter_store::StoreBackend for support::RedisBackend {
    type Store = intake_redis_streams::RedisDeadLetterStore;

    async fn dead_letter_store(
        &self,
        source: &str,
        group: &str,
    ) -> Result<Self::Store, intake_core::BoxError> {
        let url = support::redis_url();
        let publisher = intake_redis_streams::RedisStreamsPublisher::builder(&url)
            .build()
            .await?;
        Ok(intake_redis_streams::RedisDeadLetters::builder(url)
            .dead_letters_of(source)
            // Scoped as `intake dlq … --group` opens it: every group of a
            // stream writes to the same dead-letter stream.
            .group(group)
            .build()
            .await?
            .store(publisher))
    }
}

intake_core::control_suite!(support::RedisBackend::new("redis control conformance"));

/// Each call a new channel from a new broker, as another instance would
/// open it.
#[async_trait::async_trait]
impl intake_core::backend::testkit::control_channel::ControlBackend for support::RedisBackend {
    type Channel = intake_redis_streams::RedisControlChannel;

    async fn control_channel(
        &self,
        group: &str,
        log: intake_core::group_control::ControlLog,
    ) -> Result<Self::Channel, intake_core::BoxError> {
        Ok(intake_redis_streams::RedisBroker::new(support::redis_url())
            .control_channel(group, log)
            .await?)
    }
}
