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
// `<stream>_dlq`. A letter carries the key its consumer read, the subject
// (`consumed_key`), and a replay goes back to that subject, so the source
// reads the same key again (`replayed_key`).
intake_core::dead_letter_store_suite!(support::NatsBackend::new("the store suite on NATS"));

// Every part of a route derived from one `NatsBroker`: the stream is the
// route's source, the durable consumer its group.
intake_core::broker_suite!(support::NatsBackend::new("the broker suite on NATS"));

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
        self.consumed_key(source, key)
    }

    fn consumed_key(&self, source: &str, key: &str) -> String {
        support::subject_of(source, Some(key.as_bytes()))
    }
}

/// What the suite's read scenario checks, with NATS keys (the subject): a
/// store reads its consumer's subject only, filters by the key its consumer
/// read, walks with the cursor, reads a payload; another consumer's
/// sequence is no letter of it, and removing a sequence twice removes it
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_reads_its_consumers_subject_keyed_by_subject() {
    use intake_core::backend::DeadLetterSink;
    use intake_core::dead_letter::store::{
        DeadLetterLog, DeadLetterStore, Filter, LetterId, Selection, StoreError,
    };
    use intake_core::{DeadLetter, Message, Metadata, Position};

    let Some(backend) = support::NatsBackend::new("the NATS store by subject").await else {
        return;
    };
    let stream = support::unique("store_read");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    let write = |group: &'static str, keys: &'static [&'static str]| {
        let (backend, stream) = (&backend, stream.clone());
        async move {
            let sink = backend
                .source(&stream, group)
                .build()
                .await
                .expect("source")
                .dead_letter_sink()
                .build()
                .await
                .expect("sink");
            for (at, key) in keys.iter().enumerate() {
                let subject = support::subject_of(&stream, Some(key.as_bytes()));
                let metadata =
                    Metadata::new(stream.as_str().into(), 0, Position::Offset(at as i64));
                let message = Message::new(format!("payload-{key}"), metadata).with_key(subject);
                sink.write(&DeadLetter::new(message, "bad", 1))
                    .await
                    .expect("write");
            }
        }
    };
    write("a", &["k0", "k1", "k2"]).await;
    write("b", &["k9"]).await;
    let open = |group: &'static str| {
        let stream = stream.clone();
        async move {
            let url = support::nats_url();
            let publisher = intake_nats::NatsPublisher::builder(&url)
                .build()
                .await
                .expect("publisher");
            intake_nats::NatsDeadLetters::builder(url)
                .dead_letters_of(&stream, group)
                .build()
                .await
                .expect("store")
                .store(publisher)
        }
    };
    let (a, b) = (open("a").await, open("b").await);

    assert_eq!(a.count(&Filter::all()).await.expect("count"), 3);
    assert_eq!(b.count(&Filter::all()).await.expect("count"), 1);
    let k1 = Filter::all().with_key(support::subject_of(&stream, Some(b"k1")));
    assert_eq!(a.count(&k1).await.expect("count"), 1);
    let mut walked = Vec::new();
    let mut after: Option<LetterId> = None;
    loop {
        let page = a
            .list(&Filter::all(), 1, after.as_ref())
            .await
            .expect("list");
        walked.extend(page.letters.into_iter().map(|stored| stored.id));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
        assert!(walked.len() <= 4, "the cursor does not advance: {walked:?}");
    }
    assert_eq!(walked.len(), 3, "{walked:?}");
    let read = a.read(&walked[1]).await.expect("read");
    let letter = read.letter.expect("a readable letter");
    assert_eq!(&letter.message.payload()[..], b"payload-k1");

    let other = b
        .list(&Filter::all(), 10, None)
        .await
        .expect("list")
        .letters;
    let other = other[0].id.clone();
    assert!(matches!(
        a.read(&other).await,
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(
        a.purge(&Selection::Ids(vec![other])).await.expect("purge"),
        0
    );
    assert_eq!(b.count(&Filter::all()).await.expect("count"), 1);

    let removed = [walked[0].clone()];
    assert_eq!(a.log().remove(&removed).await.expect("remove"), 1);
    assert_eq!(a.log().remove(&removed).await.expect("remove again"), 0);
    assert_eq!(a.count(&Filter::all()).await.expect("count"), 2);
    let missing = intake_nats::NatsDeadLetters::builder(support::nats_url())
        .dead_letters_of(&support::unique("never"), "a")
        .build()
        .await
        .expect("store of a stream not created yet");
    assert_eq!(missing.entries().await.expect("count"), 0);
    assert_eq!(missing.last().await.expect("last"), None);
}
