//! `KafkaPublisher` on Apache Kafka at 127.0.0.1:9092 beyond the shared
//! publisher scenarios (those run in `conformance.rs`): a tiny buffer,
//! outputs the broker refuses, an unreachable broker.

mod support;

use std::sync::Arc;
use std::time::Duration;

use intake_core::Position;
use intake_core::backend::testkit::closed_port;
use intake_core::publish::{Output, PublishErrorKind, Publisher};
use intake_kafka::{KafkaPublisher, KafkaSettings};

use support::{KafkaBackend, error_chain, unique};

fn backend(test: &str) -> Option<KafkaBackend> {
    support::init_tracing();
    KafkaBackend::real(test)
}

/// With room for 8 outputs, three callers sending 150 each without waiting
/// for confirmations all get them; the publisher never holds more than 8
/// unconfirmed, and each caller's outputs are stored in the order it sent
/// them (senders waiting for room keep their order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_buffer_makes_sends_wait_and_never_grows_past_its_bound() {
    const BOUND: usize = 8;
    const CALLERS: usize = 3;
    const EACH: usize = 150;
    let Some(backend) = backend("backpressure of the Kafka publisher") else {
        return;
    };
    let topic: Arc<str> = unique("intake-publish-bounded").into();
    backend.create_topic(&topic, 1).await.expect("create topic");
    let publisher = KafkaPublisher::builder(KafkaSettings::new(backend.brokers()))
        .max_buffered(BOUND as u32)
        .build()
        .expect("valid settings");

    let callers = (0..CALLERS).map(|caller| {
        let publisher = publisher.clone();
        let topic = Arc::clone(&topic);
        tokio::spawn(async move {
            let mut receipts = Vec::with_capacity(EACH);
            let mut most = 0;
            for n in 0..EACH {
                let output = Output::new(Arc::clone(&topic), format!("{caller}-{n}"));
                receipts.push(publisher.send(output).await.expect("room within 10 s"));
                most = most.max(publisher.awaiting_confirmation());
            }
            let mut offsets = Vec::with_capacity(EACH);
            for receipt in receipts {
                let confirmation = receipt.await.expect("confirmed");
                assert_eq!(confirmation.partition, Some(0));
                match confirmation.position {
                    Some(Position::Offset(offset)) => offsets.push(offset),
                    other => panic!("confirmed without an offset: {other:?}"),
                }
            }
            (most, offsets)
        })
    });
    let mut stored = 0;
    for caller in futures_util::future::join_all(callers).await {
        let (most, offsets) = caller.expect("caller finished");
        assert!(
            most <= BOUND,
            "{most} outputs awaiting confirmation, bound {BOUND}"
        );
        assert!(
            offsets.windows(2).all(|pair| pair[0] < pair[1]),
            "a caller's outputs were stored out of order: {offsets:?}"
        );
        stored += offsets.len();
    }
    assert_eq!(stored, CALLERS * EACH);
    assert_eq!(publisher.awaiting_confirmation(), 0);
    assert_eq!(
        backend.read_all(&topic).await.expect("read back").len(),
        CALLERS * EACH
    );
}

/// An output over the topic's `max.message.bytes` is refused by the
/// broker, one over the producer's `message.max.bytes` by the client:
/// both rejected, and the publisher goes on publishing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_too_large_are_rejected_and_the_publisher_goes_on() {
    let Some(backend) = backend("rejections by the Kafka publisher") else {
        return;
    };
    let topic = unique("intake-publish-small");
    backend
        .create_topic_with(&topic, 1, &[("max.message.bytes", "1024")])
        .await
        .expect("create topic");
    let publisher = KafkaPublisher::builder(KafkaSettings::new(backend.brokers()))
        .build()
        .expect("valid settings");

    let refused = publisher
        .publish(Output::new(topic.as_str(), vec![7u8; 4096]))
        .await
        .expect_err("over the topic's max.message.bytes");
    assert_eq!(refused.kind(), PublishErrorKind::Rejected, "{refused}");
    assert_eq!(refused.destination(), topic);
    assert!(std::error::Error::source(&refused).is_some(), "{refused:?}");

    let refused = match publisher
        .send(Output::new(topic.as_str(), vec![7u8; 2_000_000]))
        .await
    {
        Ok(receipt) => receipt.await.expect_err("over message.max.bytes"),
        Err(refused) => refused,
    };
    assert_eq!(refused.kind(), PublishErrorKind::Rejected, "{refused}");

    publisher
        .publish(Output::new(topic.as_str(), "small").with_key("k"))
        .await
        .expect("a small output after the refused ones is confirmed");
}

/// With nothing listening, an output is not confirmed within the delivery
/// timeout: unavailable, without a hang and without the password in the
/// error. Closing then refuses new outputs, and dropping the publisher
/// ends the receipts still waiting as closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_broker_is_unavailable_in_time_and_shows_no_password() {
    const PASSWORD: &str = "hunter2-publisher-secret";
    support::init_tracing();
    let settings = KafkaSettings::new(format!(
        "127.0.0.1:{}",
        closed_port().expect("a free local port")
    ))
    .set("security.protocol", "SASL_PLAINTEXT")
    .set("sasl.mechanism", "PLAIN")
    .set("sasl.username", "intake")
    .set("sasl.password", PASSWORD);
    let publisher = KafkaPublisher::builder(settings)
        .delivery_timeout(Duration::from_millis(1500))
        .build()
        .expect("a producer needs no broker to be built");

    let unavailable = tokio::time::timeout(
        Duration::from_secs(20),
        publisher.publish(Output::new("orders.out", "lost").with_key("k")),
    )
    .await
    .expect("the receipt resolves within the delivery timeout")
    .expect_err("nothing listens");
    assert_eq!(unavailable.kind(), PublishErrorKind::Unavailable);
    assert_eq!(unavailable.destination(), "orders.out");
    let shown = format!(
        "{} {unavailable:?} {publisher:?}",
        error_chain(&unavailable)
    );
    assert!(!shown.contains(PASSWORD), "{shown}");

    let waiting = publisher
        .send(Output::new("orders.out", "queued"))
        .await
        .expect("queued while unreachable");
    let closing = publisher.close(Duration::from_millis(100)).await;
    assert_eq!(
        closing.map_err(|error| error.kind()),
        Err(PublishErrorKind::Unavailable),
        "one output left unconfirmed"
    );
    let after = publisher
        .send(Output::new("orders.out", "late"))
        .await
        .expect_err("closed");
    assert_eq!(after.kind(), PublishErrorKind::Closed);
    // Dropping librdkafka's producer waits for its polling thread.
    tokio::task::spawn_blocking(move || drop(publisher))
        .await
        .expect("dropped");
    let purged = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("resolved when the publisher was dropped")
        .expect_err("never confirmed");
    assert_eq!(purged.kind(), PublishErrorKind::Closed, "{purged}");
}
