//! The backend conformance suite, unchanged, against RabbitMQ.

mod support;

async fn backend() -> Option<support::AmqpBackend> {
    support::AmqpBackend::connect_or_skip("amqp conformance").await
}

intake_core::conformance_suite!(backend());
intake_core::publisher_suite!(backend());
intake_core::dead_letter_store_suite!(backend());
intake_core::broker_suite!(backend());

#[async_trait::async_trait]
impl intake_core::backend::testkit::dead_letter_store::StoreBackend for support::AmqpBackend {
    type Store = intake_amqp::AmqpDeadLetterStore;

    async fn dead_letter_store(
        &self,
        source: &str,
        _group: &str,
    ) -> Result<Self::Store, intake_core::BoxError> {
        // The default exchange: a letter's origin queue is its routing key.
        let publisher = intake_amqp::AmqpPublisher::builder(
            intake_amqp::AmqpSettings::new(self.url())
                .connection_name("conformance store publisher"),
        )
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

/// Every part derived from one [`intake_amqp::AmqpBroker`]: the route's
/// dead letters go to `{queue}.dlq`, which the fixture declared (the broker
/// uses an existing one as it is).
impl intake_core::backend::testkit::broker::BrokerBackend for support::AmqpBackend {
    type Broker = intake_amqp::AmqpBroker;

    fn broker(&self) -> Self::Broker {
        intake_amqp::AmqpBroker::new(
            intake_amqp::AmqpSettings::new(self.url()).connection_name("conformance broker"),
        )
    }

    /// The queue as it is; what a parking of it declares (for the tiers
    /// the suite parks at: 1 s and 2 min) is deleted with the fixture.
    fn route_address(&self, source: &str, group: &str) -> intake_core::backend::RouteAddress {
        for millis in [1_000, 120_000] {
            for wait in [
                format!("{source}.wait.{millis}ms"),
                format!("{source}.wait.hop.{millis}ms"),
            ] {
                self.track_queue(&wait);
                self.track_exchange(&wait);
            }
        }
        let relay = format!("{source}.wait.relay");
        self.track_queue(&relay);
        self.track_exchange(&relay);
        self.track_exchange(&format!("{source}.wait.return"));
        intake_core::backend::RouteAddress::new(source, group)
    }
}
