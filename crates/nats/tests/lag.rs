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
