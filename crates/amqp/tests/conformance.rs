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

intake_core::control_suite!(backend());

/// The group's control logs are stream queues on the fixture's broker,
/// deleted with the fixture.
#[async_trait::async_trait]
impl intake_core::backend::testkit::control_channel::ControlBackend for support::AmqpBackend {
    type Channel = intake_amqp::AmqpControlChannel;

    async fn control_channel(
        &self,
        group: &str,
        log: intake_core::group_control::ControlLog,
    ) -> Result<Self::Channel, intake_core::BoxError> {
        self.track_queue(&intake_amqp::AmqpControlChannel::queue_name(group, log));
        let broker = intake_amqp::AmqpBroker::new(
            intake_amqp::AmqpSettings::new(self.url()).connection_name("conformance control"),
        );
        Ok(broker.control_channel(group, log).await?)
    }
}

/// A control channel whose broker does not listen: the append fails as
/// transient within its bound (the connect timeout, twice at most), and
/// neither the error nor `Debug` shows the URL's password.
#[tokio::test]
async fn a_control_channel_at_a_closed_port_fails_an_append_as_transient_without_its_password() {
    use intake_core::group_control::{ControlChannel, ControlLog};
    use std::time::{Duration, Instant};

    let port = intake_core::backend::testkit::closed_port().expect("a free local port");
    let settings =
        intake_amqp::AmqpSettings::new(format!("amqp://app:hunter2@127.0.0.1:{port}/%2f"))
            .connect_timeout(Duration::from_secs(1));
    let broker = intake_amqp::AmqpBroker::new(settings);
    let channel = broker
        .control_channel("billing", ControlLog::Commands)
        .await
        .expect("an unreachable broker is no error until a call");
    let shown = format!("{channel:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("billing.intake-control"), "{shown}");

    let started = Instant::now();
    let appended = tokio::time::timeout(
        Duration::from_secs(10),
        channel.append(bytes::Bytes::from_static(b"pause")),
    )
    .await
    .expect("the append gives up within its bound");
    let error = appended.expect_err("nothing listens");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert!(error.is_transient(), "{error:?}");
    let chain = intake_core::error::ErrorChain::new(&error).to_string();
    let shown = format!("{error} {error:?} {chain}");
    assert!(!shown.contains("hunter2"), "{shown}");

    let followed = tokio::time::timeout(Duration::from_secs(10), channel.follow())
        .await
        .expect("the follow gives up within its bound");
    let error = followed.err().expect("nothing listens");
    assert!(error.is_transient(), "{error:?}");
    assert!(!format!("{error} {error:?}").contains("hunter2"));
}

/// A feed whose connection the broker closes ends with a transient error,
/// promptly; the next follow connects again and replays the log.
#[tokio::test]
async fn a_control_feed_ends_with_an_error_when_its_connection_closes() {
    use futures_util::StreamExt;
    use intake_core::group_control::{ControlChannel, ControlLog};
    use std::time::Duration;

    let Some(backend) = backend().await else {
        return;
    };
    let name = support::unique("control-feed");
    let group = support::unique("control-group");
    backend.track_queue(&intake_amqp::AmqpControlChannel::queue_name(
        &group,
        ControlLog::Commands,
    ));
    let broker = intake_amqp::AmqpBroker::new(
        intake_amqp::AmqpSettings::new(backend.url()).connection_name(name.as_str()),
    );
    let channel = broker
        .control_channel(&group, ControlLog::Commands)
        .await
        .expect("open the commands log");
    channel
        .append(bytes::Bytes::from_static(b"first"))
        .await
        .expect("append");
    let mut feed = channel.follow().await.expect("follow");
    let first = tokio::time::timeout(Duration::from_secs(10), feed.next()).await;
    assert!(
        matches!(&first, Ok(Some(Ok(record))) if record.as_ref() == b"first"),
        "{first:?}"
    );

    if let Err(why) =
        support::close_connection_named(&format!("{name}/{group} (group control feed)")).await
    {
        intake_core::backend::testkit::skip_or_fail("control feed closed", &why);
        return;
    }
    let ended = tokio::time::timeout(Duration::from_secs(10), feed.next())
        .await
        .expect("the feed ends within 10 s of its connection's close");
    match ended {
        Some(Err(error)) => assert!(error.is_transient(), "{error:?}"),
        other => panic!("the feed should end with an error: {other:?}"),
    }

    let mut again = channel.follow().await.expect("follow again");
    let first = tokio::time::timeout(Duration::from_secs(10), again.next()).await;
    assert!(
        matches!(&first, Ok(Some(Ok(record))) if record.as_ref() == b"first"),
        "{first:?}"
    );
    backend.cleanup().await;
}
