//! `AmqpPublisher` against RabbitMQ: the bound on unconfirmed outputs,
//! outputs the broker refuses, and a broker that cannot be reached.

mod support;

use std::error::Error as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use intake_amqp::AmqpPublisher;
use intake_amqp::lapin::types::AMQPValue;
use intake_core::publish::{Output, PublishErrorKind, Publisher};
use support::AmqpBackend;

/// Long enough for any wait here that is expected to end.
const PATIENCE: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_bound_still_confirms_every_output_and_is_never_exceeded() {
    let Some(backend) = AmqpBackend::connect_or_skip("publisher_backpressure").await else {
        return;
    };
    let queue = backend.classic_queue("backpressure").await.expect("queue");
    let publisher = AmqpPublisher::builder(backend.url())
        .max_unconfirmed(4)
        .build()
        .await
        .expect("publisher");
    let done = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicUsize::new(0));
    let watcher = tokio::spawn({
        let (publisher, done, most) = (publisher.clone(), Arc::clone(&done), Arc::clone(&most));
        async move {
            while !done.load(Ordering::Relaxed) {
                most.fetch_max(publisher.unconfirmed(), Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        }
    });
    let destination: Arc<str> = queue.as_str().into();
    let mut receipts = Vec::new();
    for id in 0..500u32 {
        let output = Output::new(Arc::clone(&destination), id.to_string())
            .with_key(format!("k{}", id % 4))
            .with_header("amqp.message-id", format!("m-{id}"));
        // Receipts are awaited only at the end: room comes back with the
        // broker's confirms, not with the receipts.
        receipts.push(
            publisher
                .send(output)
                .await
                .expect("room within the timeout"),
        );
        most.fetch_max(publisher.unconfirmed(), Ordering::Relaxed);
    }
    for (id, receipt) in receipts.into_iter().enumerate() {
        tokio::time::timeout(PATIENCE, receipt)
            .await
            .expect("bounded")
            .unwrap_or_else(|error| panic!("output {id}: {error}"));
    }
    done.store(true, Ordering::Relaxed);
    watcher.await.expect("watcher");
    let most = most.load(Ordering::Relaxed);
    assert!(most <= 4, "{most} outputs awaited their confirm at once");
    assert!(
        most > 1,
        "outputs were not pipelined: at most {most} in flight"
    );
    assert_eq!(publisher.unconfirmed(), 0);

    let delivered = backend.peek_deliveries(&queue).await.expect("peek");
    assert_eq!(delivered.len(), 500);
    let first = &delivered[0];
    assert_eq!(first.data, b"0");
    assert_eq!(
        first.properties.message_id().as_ref().map(|id| id.as_str()),
        Some("m-0")
    );
    let key = first
        .properties
        .headers()
        .as_ref()
        .and_then(|table| table.inner().get(AmqpPublisher::KEY_HEADER).cloned());
    assert!(
        matches!(&key, Some(AMQPValue::LongString(key)) if key.as_bytes() == b"k0"),
        "{key:?}"
    );
    assert_eq!(*first.properties.delivery_mode(), Some(2));
    publisher.close().await;
    backend.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_the_broker_refuses_are_rejected_and_the_others_go_on() {
    let Some(backend) = AmqpBackend::connect_or_skip("publisher_rejected").await else {
        return;
    };
    let queue = backend.classic_queue("rejected").await.expect("queue");
    let publisher = AmqpPublisher::builder(backend.url())
        .max_payload_bytes(1024)
        .build()
        .await
        .expect("publisher");
    let by_key = AmqpPublisher::builder(backend.url())
        .route_by_key()
        .build()
        .await
        .expect("publisher");
    let missing_queue = support::unique("no-such-queue");
    let missing_exchange = support::unique("no-such-exchange");
    let refused = [
        // Returned: no queue is bound for it (mandatory).
        publisher
            .send(Output::new(missing_queue.as_str(), "x"))
            .await,
        // Larger than the broker takes.
        publisher
            .send(Output::new(queue.as_str(), vec![0u8; 2048]))
            .await,
        // An exchange that does not exist.
        by_key
            .send(Output::new(missing_exchange.as_str(), "x").with_key("k"))
            .await,
    ];
    for (case, sent) in refused.into_iter().enumerate() {
        let outcome = match sent {
            Ok(receipt) => tokio::time::timeout(PATIENCE, receipt)
                .await
                .expect("bounded"),
            Err(error) => Err(error),
        };
        let error = outcome.expect_err("refused");
        assert_eq!(
            error.kind(),
            PublishErrorKind::Rejected,
            "case {case}: {error}"
        );
    }
    // The channel survived: the next outputs are confirmed.
    publisher
        .publish(Output::new(queue.as_str(), "fine"))
        .await
        .expect("confirmed after a rejection");
    by_key
        .publish(Output::new("", "fine").with_key(queue.clone()))
        .await
        .expect("confirmed after a rejection");
    assert_eq!(backend.messages_in(&queue).await.expect("count"), 2);
    publisher.close().await;
    by_key.close().await;
    backend.cleanup().await;
}

#[tokio::test]
async fn an_unreachable_broker_is_unavailable_within_the_send_timeout_without_the_password() {
    const PASSWORD: &str = "pub-s3cret-pw";
    let port = intake_core::backend::testkit::closed_port().expect("a free port");
    let publisher = AmqpPublisher::builder(format!("amqp://guest:{PASSWORD}@127.0.0.1:{port}/%2f"))
        .send_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("a broker that is down is not a build error");
    let error = tokio::time::timeout(PATIENCE, publisher.publish(Output::new("orders", "x")))
        .await
        .expect("the send timeout bounds the wait")
        .expect_err("nothing to publish to");
    assert_eq!(error.kind(), PublishErrorKind::Unavailable, "{error}");
    assert_eq!(error.destination(), "orders");
    let mut text = format!("{error:?} {publisher:?}");
    let mut cause: Option<&dyn std::error::Error> = Some(&error);
    while let Some(current) = cause {
        text.push_str(&format!(" / {current}"));
        cause = current.source();
    }
    assert!(text.contains("127.0.0.1"), "{text}");
    assert!(!text.contains(PASSWORD), "the password leaked: {text}");
    assert!(error.source().is_some(), "no cause: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_in_flight_on_a_lost_connection_are_unavailable_and_the_next_send_reconnects() {
    let Some(backend) = AmqpBackend::connect_or_skip("publisher_lost_connection").await else {
        return;
    };
    let queue = backend.classic_queue("lost").await.expect("queue");
    let proxy = support::proxy::Proxy::start(support::broker_address())
        .await
        .expect("proxy");
    let publisher = AmqpPublisher::builder(support::url_at(proxy.address(), ""))
        // Far beyond the test's patience: what ends the receipts below is
        // the lost connection, not the timeout.
        .confirm_timeout(Duration::from_secs(600))
        .build()
        .await
        .expect("publisher");
    publisher
        .publish(Output::new(queue.as_str(), "before"))
        .await
        .expect("confirmed");

    // Nothing reaches the broker, and no confirm comes back.
    proxy.set(support::proxy::Mode::Blackhole);
    let mut receipts = Vec::new();
    for id in 0..20 {
        let output = Output::new(queue.as_str(), format!("lost {id}"));
        receipts.push(publisher.send(output).await.expect("sent"));
    }
    proxy.drop_connections();
    proxy.set(support::proxy::Mode::Relay);
    for receipt in receipts {
        let error = tokio::time::timeout(PATIENCE, receipt)
            .await
            .expect("the lost connection ends the wait")
            .expect_err("never reached the broker");
        assert_eq!(error.kind(), PublishErrorKind::Unavailable, "{error}");
    }
    publisher
        .publish(Output::new(queue.as_str(), "after"))
        .await
        .expect("confirmed on a new connection");
    let payloads: Vec<_> = backend
        .peek(&queue)
        .await
        .expect("peek")
        .into_iter()
        .map(|(payload, _)| payload)
        .collect();
    assert_eq!(payloads, ["before", "after"]);
    publisher.close().await;
    backend.cleanup().await;
}
