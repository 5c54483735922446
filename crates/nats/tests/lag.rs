//! Broker-side lag of a JetStream consumer: what the probe reports equals
//! the consumer info the server keeps.
//!
//! Each test skips with a printed reason when no nats-server listens on
//! 127.0.0.1:4222, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use std::time::Duration;

use intake_core::backend::testkit::assert_unreachable_lag_probe;
use intake_core::backend::{AckBatch, Acker, PartitionAck, Source};
use intake_core::lag::{LagError, LagProbe};
use intake_core::{Message, PartitionKey};
use intake_nats::NatsLagProbe;
use support::NatsBackend;

async fn pull(source: &mut intake_nats::NatsSource, count: usize) -> Vec<Message> {
    let mut delivered = Vec::with_capacity(count);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while delivered.len() < count {
        let wanted = count - delivered.len();
        tokio::time::timeout_at(deadline, source.next(&mut delivered, wanted))
            .await
            .expect("the deliveries within 30 s")
            .expect("pull");
    }
    delivered
}

async fn ack(acker: &mut intake_nats::NatsAcker, messages: &[Message]) {
    let mut ack = PartitionAck::new(messages[0].metadata().partition_key());
    ack.completed = messages
        .iter()
        .map(|message| message.metadata().position())
        .collect();
    acker
        .ack(&AckBatch {
            partitions: vec![ack],
            sync: true,
        })
        .await
        .expect("ack");
}

#[tokio::test]
async fn the_lag_is_what_the_consumer_has_not_acknowledged() {
    let Some(backend) = NatsBackend::new("nats lag").await else {
        return;
    };
    let stream = support::unique("lag");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    support::produce(backend.client(), &stream, support::numbered("m", 10))
        .await
        .expect("produce");
    let mut source = backend
        .source(&stream, "lag")
        .ack_wait(Duration::from_secs(120))
        .build()
        .await
        .expect("source");
    let probe = source.lag_probe();
    let before = probe.lag().await.unwrap();
    assert_eq!(before.len(), 1);
    assert_eq!(before[0].partition, PartitionKey::new(stream.as_str(), 0));
    assert_eq!(before[0].messages, Some(10));

    let mut acker = source.acker();
    let delivered = pull(&mut source, 4).await;
    ack(&mut acker, &delivered[..3]).await;
    let after = probe.lag().await.unwrap();
    assert_eq!(after[0].messages, Some(7));
    let server = support::unacknowledged(backend.client(), &stream, "lag")
        .await
        .unwrap();
    assert_eq!(after[0].messages, Some(server));

    // A probe on a client of one's own agrees.
    let own = NatsLagProbe::new(backend.client().clone(), "test", &stream, "lag");
    assert_eq!(own.lag().await.unwrap()[0].messages, Some(7));
    source.close().await.expect("close");
}

#[tokio::test]
async fn an_unknown_consumer_is_refused() {
    let Some(backend) = NatsBackend::new("nats lag unknown").await else {
        return;
    };
    let stream = support::unique("lag");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    let probe = NatsLagProbe::new(backend.client().clone(), "test", &stream, "nobody");
    let error = probe.lag().await.unwrap_err();
    assert!(matches!(error, LagError::Refused(_)), "{error:?}");
    assert!(!error.is_transient());
}

#[tokio::test]
async fn an_unreachable_server_is_a_transient_error_within_the_timeout() {
    // The client is made without a server (it keeps trying to connect):
    // the query cannot be answered.
    let port = intake_core::backend::testkit::closed_port().expect("a free local port");
    let url = format!("nats://127.0.0.1:{port}");
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect(url.as_str())
        .await
        .expect("a client that connects later");
    let probe =
        NatsLagProbe::new(client, &url, "orders", "billing").timeout(Duration::from_secs(2));
    assert_unreachable_lag_probe(&probe, None).await;
}

/// Why a NATS probe's `parked` is `None` (the broker suite's lag scenario
/// assumes parked originals are acknowledged, which they are not here):
/// five messages of a route derived from a `NatsBroker`, each parked for
/// two minutes, stay delivered and unacknowledged in the consumer, so the
/// derived probe's `lag` counts all five, and there is no other backlog
/// to count beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_messages_are_in_the_lag_of_a_derived_probe_not_beside_it() {
    use intake_core::backend::{Broker, RouteAddress, RouteOptions};
    use intake_core::parking::ParkingLayer;
    use intake_core::{Consumer, DeliveryOrder, HandlerError};

    let Some(backend) = NatsBackend::new("parked messages in the lag").await else {
        return;
    };
    let stream = support::unique("parked_lag");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    // A key each: a second message of a parked key would wait behind it
    // without reaching the handler.
    let messages = (0..5)
        .map(|n| intake_core::backend::testkit::TestMessage::new(format!("k{n}"), format!("p{n}")))
        .collect();
    support::produce(backend.client(), &stream, messages)
        .await
        .expect("produce");
    let broker = intake_nats::NatsBroker::new(support::nats_url());
    let address = RouteAddress::new(stream.as_str(), "g");
    let later = Duration::from_secs(120);
    let parts = broker
        .route(&address, &RouteOptions::new().parking())
        .await
        .expect("derive the route");
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handler = {
        let calls = calls.clone();
        tower::ServiceBuilder::new()
            .layer(ParkingLayer::new(parts.parking.expect("asked for")))
            .service_fn(move |_: Message| {
                calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                async move { Err::<(), _>(HandlerError::retry_later("not yet", later)) }
            })
    };
    let running = support::Running::start(
        Consumer::builder().ordering(DeliveryOrder::Unordered),
        parts.source,
        parts.acker,
        handler,
    );
    support::wait_until("five parked", Duration::from_secs(20), || {
        calls.load(std::sync::atomic::Ordering::Relaxed) >= 5
    })
    .await;
    let probe = broker.lag_probe(&address).await.expect("derive the probe");
    // Settled a moment after the handler's last call: the parks are held,
    // and nothing else is pending.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let lag = probe.lag().await.expect("lag");
        if lag[0].messages == Some(5) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lag is {lag:?}, not the 5 parked messages"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(probe.parked().await.expect("parked"), None);
    assert_eq!(
        support::unacknowledged(backend.client(), &stream, "g")
            .await
            .expect("consumer info"),
        5,
        "parked originals stay unacknowledged"
    );
    let report = running.stop().await;
    assert_eq!(report.parked, 5, "{report:?}");
    broker
        .shutdown(Duration::from_secs(10))
        .await
        .expect("shutdown");
}
