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

// A group's control logs, each a stream (`INTAKE_CONTROL_{group}`,
// `INTAKE_STATUS_{group}`) opened through the broker. The source has one
// partition, so the pause holds the whole stream on every instance: each
// holds what it fetched of it until the resume.
intake_core::control_suite!(support::NatsBackend::new("the control suite on NATS"));

#[async_trait::async_trait]
impl intake_core::backend::testkit::control_channel::ControlBackend for support::NatsBackend {
    type Channel = intake_nats::NatsControlChannel;

    async fn control_channel(
        &self,
        group: &str,
        log: intake_core::group_control::ControlLog,
    ) -> Result<Self::Channel, intake_core::BoxError> {
        use intake_core::backend::testkit::BrokerBackend;
        Ok(self.broker().control_channel(group, log).await?)
    }
}

/// A control channel pointed at a closed port, with a password in the URL
/// and a token given to the settings: it fails within the connect timeout,
/// transiently, and neither the error (with its causes) nor its `Debug`
/// shows a secret.
#[tokio::test]
async fn a_control_channel_at_a_closed_port_fails_transiently_without_secrets() {
    use intake_core::group_control::ControlLog;

    let port = intake_core::backend::testkit::closed_port().expect("a free port");
    for settings in [
        intake_nats::NatsSettings::new(format!("nats://app:pa55word@127.0.0.1:{port}")),
        intake_nats::NatsSettings::new(format!("nats://127.0.0.1:{port}")).token("t0kenvalue"),
        intake_nats::NatsSettings::new(format!("nats://s3cr3ttoken@127.0.0.1:{port}")),
    ] {
        let broker = intake_nats::NatsBroker::new(
            settings.connect_timeout(std::time::Duration::from_secs(2)),
        )
        .ack_timeout(std::time::Duration::from_secs(2));
        let started = std::time::Instant::now();
        let opened = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            broker.control_channel("billing", ControlLog::Commands),
        )
        .await
        .expect("the open ends within its bound");
        let error = opened.expect_err("nothing listens on the port");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "failed after {:?}",
            started.elapsed()
        );
        assert!(error.is_transient(), "{error:?}");
        let mut shown = format!("{error} {error:?} {broker:?}");
        let mut cause: Option<&dyn std::error::Error> = std::error::Error::source(&error);
        while let Some(error) = cause {
            shown.push_str(&format!(" {error}"));
            cause = error.source();
        }
        for secret in ["pa55word", "t0kenvalue", "s3cr3ttoken"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(
            shown.contains(&port.to_string()),
            "the endpoint is named: {shown}"
        );
    }
}

/// A channel's names, its `Debug` (no secret) and an empty group refused.
#[tokio::test]
async fn a_control_channel_names_its_stream_from_the_group() {
    use intake_core::group_control::{ControlChannel, ControlLog};

    let Some(_backend) = support::NatsBackend::new("the control channel's names").await else {
        return;
    };
    let broker = intake_nats::NatsBroker::new(support::nats_url());
    let group = support::unique("names.eu/1");
    let channel = broker
        .control_channel(&group, ControlLog::Status)
        .await
        .expect("open the status log");
    assert_eq!(channel.log(), ControlLog::Status);
    assert_eq!(channel.group(), group);
    let token = group.replace(['.', '/'], "_");
    assert!(
        channel
            .stream()
            .starts_with(&format!("INTAKE_STATUS_{token}_")),
        "{}",
        channel.stream()
    );
    assert_eq!(
        channel.subject(),
        format!(
            "intake.status.{}",
            &channel.stream()["INTAKE_STATUS_".len()..]
        )
    );
    let shown = format!("{channel:?}");
    assert!(shown.contains(channel.stream()), "{shown}");
    let error = broker
        .control_channel("", ControlLog::Commands)
        .await
        .expect_err("an empty group");
    assert!(!error.is_transient(), "{error:?}");
}

/// A feed whose server is SIGKILLed ends with a transient error within
/// the broker's timeout (plus a check's interval), rather than waiting on
/// async-nats's ordered consumer, which would retry without end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_feed_ends_with_an_error_once_its_server_is_gone() {
    use futures_util::StreamExt;
    use intake_core::group_control::{ControlChannel, ControlLog};
    use support::own_server::OwnServer;

    /// This test's own server (never the shared one).
    const PORT: u16 = 14_251;
    support::init_tracing();
    let server = match OwnServer::start(PORT) {
        Ok(server) => server,
        Err(error) => {
            intake_core::backend::testkit::skip_or_fail(
                "a control feed whose server is gone",
                &format!("cannot start nats-server: {error}"),
            );
            return;
        }
    };
    let timeout = std::time::Duration::from_secs(2);
    let broker = intake_nats::NatsBroker::new(server.url()).ack_timeout(timeout);
    let channel = broker
        .control_channel("outage", ControlLog::Commands)
        .await
        .expect("open the commands log");
    channel
        .append(bytes::Bytes::from_static(b"pause"))
        .await
        .expect("append");
    let mut feed = channel.follow().await.expect("follow");
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), feed.next())
        .await
        .expect("the record within 10 s");
    assert_eq!(
        first.expect("a record").expect("no error"),
        bytes::Bytes::from_static(b"pause")
    );

    server.kill().expect("kill the server");
    let killed = std::time::Instant::now();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(15), feed.next())
        .await
        .expect("the feed ends within 15 s of the kill");
    let error = match ended {
        Some(Err(error)) => error,
        other => panic!("the feed gave {other:?} instead of an error"),
    };
    assert!(error.is_transient(), "{error:?}");
    assert!(
        killed.elapsed() < timeout * 3,
        "ended {:?} after the kill",
        killed.elapsed()
    );
    assert!(
        tokio::time::timeout(std::time::Duration::from_secs(1), feed.next())
            .await
            .expect("the ended feed answers")
            .is_none(),
        "the feed ends after its error"
    );
    let appended = tokio::time::timeout(
        timeout * 3,
        channel.append(bytes::Bytes::from_static(b"resume")),
    )
    .await
    .expect("the append gives up within its bound");
    assert!(
        appended.as_ref().is_err_and(|error| error.is_transient()),
        "{appended:?}"
    );
}

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
