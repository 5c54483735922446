//! The backend conformance suite, unchanged, against RabbitMQ.

mod support;

async fn backend() -> Option<support::AmqpBackend> {
    support::AmqpBackend::connect_or_skip("amqp conformance").await
}

intake_core::conformance_suite!(backend());
intake_core::publisher_suite!(backend());
intake_core::dead_letter_store_suite!(backend());

#[async_trait::async_trait]
impl intake_core::backend::testkit::dead_letter_store::StoreBackend for support::AmqpBackend {
    type Store = intake_amqp::AmqpDeadLetterStore;

    async fn dead_letter_store(
        &self,
        source: &str,
        _group: &str,
    ) -> Result<Self::Store, intake_core::BoxError> {
        // The default exchange: a letter's origin queue is its routing key.
        let publisher = intake_amqp::AmqpPublisher::builder(self.url())
            .connection_name("conformance store publisher")
            .build()
            .await?;
        Ok(intake_amqp::AmqpDeadLetterStore::builder(self.url())
            .queue(support::dead_letter_queue(source))
            .build(publisher)
            .await?)
    }

    fn replayed_key(&self, source: &str, _key: &str) -> String {
        // Through the default exchange the routing key, which the source
        // reads as the key, is the queue; the key rides in `intake.key`.
        source.to_owned()
    }
}
