//! The backend and publisher conformance suites, unchanged, against a real
//! Redis.

mod support;

intake_core::conformance_suite!(support::RedisBackend::new("redis conformance"));
intake_core::publisher_suite!(support::RedisBackend::new("redis publisher conformance"));
intake_core::dead_letter_store_suite!(support::RedisBackend::new("redis store conformance"));

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
