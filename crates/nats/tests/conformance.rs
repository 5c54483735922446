//! intake's backend conformance suite, unchanged, on nats-server with
//! JetStream at 127.0.0.1:4222 (`.ci/services/nats.sh`). Skipped with a
//! printed reason when no server listens, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

intake_core::conformance_suite!(support::NatsBackend::new("the conformance suite on NATS"));
// The source reads the key from the subject: an output keyed `k3` to
// `in.<stream>.published` comes back keyed `in.<stream>.published.k3`, as
// the fixture's `key_read_back` tells the suite.
intake_core::publisher_suite!(support::NatsBackend::new("the publisher suite on NATS"));
// The store reads the default sink's subject `<stream>.<group>.dlq` on
// `<stream>_dlq`; a replay goes back to the message's own subject, so the
// source reads the key it had (the subject, see `replayed_key`).
// `a_store_counts_lists_and_reads_what_the_sink_wrote` is left out: it
// filters and compares letters by the key as produced (`p1`), where a NATS
// letter carries the key its consumer read, the subject `in.<stream>.p1`;
// the suite would need to ask the fixture for that key there as it does
// after a replay.
intake_core::dead_letter_store_suite!(@scenarios support::NatsBackend::new("the store suite on NATS");
    a_redrive_returns_letters_to_their_origin_and_the_loop_guard_holds_them_after,
    a_purge_removes_only_what_it_selects,
);

#[async_trait::async_trait]
impl intake_core::backend::testkit::dead_letter_store::StoreBackend for support::NatsBackend {
    type Store = intake_nats::NatsDeadLetterStore;

    async fn dead_letter_store(
        &self,
        source: &str,
        group: &str,
    ) -> Result<Self::Store, intake_core::BoxError> {
        let url = support::nats_url();
        let publisher = intake_nats::NatsPublisher::builder(&url)
            .ack_timeout(std::time::Duration::from_secs(5))
            .build()
            .await?;
        Ok(intake_nats::NatsDeadLetters::builder(url)
            .dead_letters_of(source, group)
            .build()
            .await?
            .store(publisher))
    }

    /// The source reads a message's key from its subject, the one the
    /// replay was published to.
    fn replayed_key(&self, source: &str, key: &str) -> String {
        support::subject_of(source, Some(key.as_bytes()))
    }
}
