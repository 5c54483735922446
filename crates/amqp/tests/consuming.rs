//! A source and its acker driven by hand against a real RabbitMQ: typed
//! errors at build, what a delivery carries (the channel as partition, the
//! tag as position, the attempt), prefetch, acknowledgements and requeues as
//! the broker sees them, the hand-back at shutdown, consumers sharing a
//! queue, and broadcast sources.
//!
//! Each test skips with a printed reason when no broker listens on
//! 127.0.0.1:5672, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use std::time::Duration;

use intake_amqp::{AmqpSource, Error, Queue, Topology};
use intake_core::consumer::DEFAULT_MAX_IN_FLIGHT_BYTES;
use intake_core::{
    PartitionKey, Position,
    backend::{Source, SourceError, SourceEvent},
};
use support::steps::{
    ack_through, arriving_within, limits, publish_direct, receive, requeue, settle_at, tags,
};
use support::{AmqpBackend, unique};

#[tokio::test]
async fn an_unreachable_broker_is_a_typed_error_without_the_password() {
    let error = AmqpSource::builder(
        intake_amqp::AmqpSettings::new("amqp://guest:hunter2@127.0.0.1:1/%2f")
            .connect_timeout(Duration::from_secs(5)),
    )
    .queue("orders")
    .build()
    .await
    .expect_err("nothing listens on port 1");
    assert!(matches!(error, Error::Unreachable { .. }), "{error:?}");
    assert!(error.is_transient());
    let text = format!("{error} {error:?}");
    assert!(text.contains("amqp://guest@127.0.0.1:1/%2f"), "{text}");
    assert!(!text.contains("hunter2"));
}

#[tokio::test]
async fn wrong_credentials_give_a_typed_error_that_retrying_will_not_fix() {
    let Some(_backend) = AmqpBackend::connect_or_skip("wrong_credentials").await else {
        return;
    };
    let error = AmqpSource::builder("amqp://guest:not-the-password@127.0.0.1:5672/%2f")
        .queue("orders")
        .build()
        .await
        .expect_err("the password is wrong");
    assert!(matches!(error, Error::Unauthorized { .. }), "{error:?}");
    assert!(!error.is_transient());
    assert!(!format!("{error} {error:?}").contains("not-the-password"));
    assert!(matches!(
        SourceError::from(error),
        SourceError::Unauthorized { .. }
    ));
}

#[tokio::test]
async fn a_missing_queue_is_reported_when_the_source_does_not_declare_it() {
    let Some(backend) = AmqpBackend::connect_or_skip("missing_queue").await else {
        return;
    };
    let queue = unique("missing");
    let error = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .build()
        .await
        .expect_err("the queue does not exist");
    match &error {
        Error::QueueNotFound { queue: named, .. } => assert_eq!(named, &queue),
        other => panic!("expected QueueNotFound, got {other:?}"),
    }
    assert!(matches!(
        SourceError::from(error),
        SourceError::NotFound { kind: "queue", .. }
    ));
}

#[tokio::test]
async fn deliveries_carry_the_channel_as_partition_and_the_tag_as_position() {
    let Some(backend) = AmqpBackend::connect_or_skip("partition_and_position").await else {
        return;
    };
    let queue = backend.classic_queue("position").await.unwrap();
    backend.publish(&queue, &[b"a", b"b", b"c"]).await.unwrap();
    let mut source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .build()
        .await
        .unwrap();
    let mut acker = source.acker();

    let received = receive(&mut source, 3, 10).await;
    assert_eq!(
        received.assigned,
        vec![PartitionKey::new(queue.as_str(), 1)]
    );
    assert_eq!(received.payloads(), ["a", "b", "c"]);
    assert_eq!(tags(&received), [1, 2, 3]);
    for message in &received.messages {
        assert_eq!(
            message.metadata().partition_key(),
            PartitionKey::new(queue.as_str(), 1)
        );
        assert_eq!(message.metadata().attempt(), 1);
    }

    ack_through(&mut acker, &received.messages[2])
        .await
        .unwrap();
    settle_at(&backend, &queue, 0).await;
    source.close().await.unwrap();
    backend.cleanup().await;
}

#[tokio::test]
async fn prefetch_keeps_the_broker_from_pushing_past_the_in_flight_budget() {
    let Some(backend) = AmqpBackend::connect_or_skip("prefetch").await else {
        return;
    };
    let queue = backend.classic_queue("prefetch").await.unwrap();
    backend.publish_numbered(&queue, 10).await.unwrap();
    let mut source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .build()
        .await
        .unwrap();
    // What the consumer runtime tells the source before the first `next`.
    source.set_limits(limits(3, DEFAULT_MAX_IN_FLIGHT_BYTES));
    let mut acker = source.acker();

    let first = receive(&mut source, 3, 100).await;
    // Nothing acknowledged: the broker holds the other 7 back.
    let more = arriving_within(&mut source, Duration::from_millis(300)).await;
    assert!(
        more.is_empty(),
        "the broker pushed {} past the prefetch",
        more.len()
    );

    ack_through(&mut acker, &first.messages[2]).await.unwrap();
    let rest = receive(&mut source, 3, 100).await;
    assert_eq!(rest.payloads(), ["3", "4", "5"]);
    source.close().await.unwrap();
    backend.cleanup().await;
}

#[tokio::test]
async fn an_ack_whose_watermark_stops_on_a_requeued_tag_keeps_the_channel_open() {
    let Some(backend) = AmqpBackend::connect_or_skip("requeued_watermark").await else {
        return;
    };
    let queue = backend.classic_queue("requeue").await.unwrap();
    backend.publish(&queue, &[b"a", b"b", b"c"]).await.unwrap();
    let mut source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .build()
        .await
        .unwrap();
    let mut acker = source.acker();
    let received = receive(&mut source, 3, 10).await;

    // "c" (tag 3) is retried; the watermark passes over it. RabbitMQ would
    // close the channel on `ack(3, multiple)`: tag 3 is no longer out.
    requeue(&mut acker, &received.messages[2], Some(Position::Tag(3)))
        .await
        .unwrap();
    let again = receive(&mut source, 1, 10).await;
    assert_eq!(again.payloads(), ["c"]);
    assert_eq!(tags(&again), [4], "same channel, next tag");
    assert_eq!(again.messages[0].metadata().attempt(), 2);
    assert!(again.revoked.is_empty(), "the channel stayed open");

    ack_through(&mut acker, &again.messages[0]).await.unwrap();
    settle_at(&backend, &queue, 0).await;
    source.close().await.unwrap();
    backend.cleanup().await;
}

#[tokio::test]
async fn a_quorum_queue_counts_retries_in_the_attempt() {
    let Some(backend) = AmqpBackend::connect_or_skip("quorum_attempts").await else {
        return;
    };
    let queue = unique("quorum-attempts");
    let mut source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .declare(Topology::new().queue(Queue::quorum(queue.as_str())))
        .build()
        .await
        .unwrap();
    backend.track_queue(&queue);
    let mut acker = source.acker();
    publish_direct(&backend, &queue, b"flaky").await;

    for expected_attempt in 1..=3 {
        let received = receive(&mut source, 1, 10).await;
        assert_eq!(received.messages[0].metadata().attempt(), expected_attempt);
        if expected_attempt < 3 {
            requeue(&mut acker, &received.messages[0], None)
                .await
                .unwrap();
        } else {
            ack_through(&mut acker, &received.messages[0])
                .await
                .unwrap();
        }
    }
    settle_at(&backend, &queue, 0).await;
    source.close().await.unwrap();
    backend.cleanup().await;
}

#[tokio::test]
async fn two_consumers_on_one_queue_share_the_work() {
    let Some(backend) = AmqpBackend::connect_or_skip("shared_queue").await else {
        return;
    };
    let queue = backend.classic_queue("shared").await.unwrap();
    let connect = || {
        AmqpSource::builder(backend.url())
            .queue(queue.as_str())
            .build()
    };
    let (mut left, mut right) = (connect().await.unwrap(), connect().await.unwrap());
    left.set_limits(limits(5, DEFAULT_MAX_IN_FLIGHT_BYTES));
    right.set_limits(limits(5, DEFAULT_MAX_IN_FLIGHT_BYTES));
    backend.publish_numbered(&queue, 40).await.unwrap();

    /// Takes and acknowledges until the queue is drained.
    async fn work(source: &mut AmqpSource) -> Vec<String> {
        let mut acker = source.acker();
        let mut done = Vec::new();
        let mut buffer = Vec::new();
        while let Ok(event) =
            tokio::time::timeout(Duration::from_millis(1500), source.next(&mut buffer, 5)).await
        {
            if let Ok(SourceEvent::Delivered) = event {
                if let Some(last) = buffer.last() {
                    ack_through(&mut acker, last).await.unwrap();
                }
                done.extend(
                    buffer
                        .drain(..)
                        .map(|message| String::from_utf8_lossy(message.payload()).into_owned()),
                );
            }
        }
        done
    }
    let (from_left, from_right) = tokio::join!(work(&mut left), work(&mut right));
    assert!(
        !from_left.is_empty() && !from_right.is_empty(),
        "both took a share"
    );
    let mut all: Vec<String> = from_left.into_iter().chain(from_right).collect();
    all.sort_by_key(|payload| payload.parse::<u32>().unwrap_or(u32::MAX));
    let expected: Vec<String> = (0..40).map(|index| index.to_string()).collect();
    assert_eq!(all, expected, "each message went to exactly one consumer");
    settle_at(&backend, &queue, 0).await;
    left.close().await.unwrap();
    right.close().await.unwrap();
    backend.cleanup().await;
}

#[tokio::test]
async fn shutdown_hands_back_what_was_delivered_but_not_finished() {
    let Some(backend) = AmqpBackend::connect_or_skip("shutdown_nack").await else {
        return;
    };
    let queue = backend.classic_queue("shutdown").await.unwrap();
    backend.publish_numbered(&queue, 6).await.unwrap();
    let mut first = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .build()
        .await
        .unwrap();
    let mut acker = first.acker();
    let taken = receive(&mut first, 6, 10).await;
    ack_through(&mut acker, &taken.messages[1]).await.unwrap();
    first.close().await.unwrap();
    settle_at(&backend, &queue, 4).await;

    let mut second = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .build()
        .await
        .unwrap();
    let rest = receive(&mut second, 4, 10).await;
    assert_eq!(rest.payloads(), ["2", "3", "4", "5"]);
    assert!(
        rest.messages
            .iter()
            .all(|message| message.metadata().attempt() == 2)
    );
    ack_through(&mut second.acker(), rest.messages.last().unwrap())
        .await
        .unwrap();
    settle_at(&backend, &queue, 0).await;
    second.close().await.unwrap();
    backend.cleanup().await;
}

#[tokio::test]
async fn broadcast_sources_each_receive_every_message() {
    let Some(backend) = AmqpBackend::connect_or_skip("broadcast").await else {
        return;
    };
    let exchange = unique("fanout");
    let connect = || {
        AmqpSource::builder(backend.url())
            .broadcast(exchange.as_str())
            .build()
    };
    let (mut one, mut two) = (connect().await.unwrap(), connect().await.unwrap());
    backend.track_exchange(&exchange);
    for payload in ["x", "y", "z"] {
        let confirm = backend
            .channel()
            .basic_publish(
                exchange.as_str().into(),
                "".into(),
                Default::default(),
                payload.as_bytes(),
                Default::default(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack());
    }
    for source in [&mut one, &mut two] {
        let received = receive(source, 3, 10).await;
        assert_eq!(received.payloads(), ["x", "y", "z"]);
        assert_eq!(
            &**received.messages[0].metadata().source(),
            exchange.as_str()
        );
        assert!(
            source
                .current_queue()
                .is_some_and(|queue| queue.starts_with("amq.gen-"))
        );
    }
    one.close().await.unwrap();
    two.close().await.unwrap();
    backend.cleanup().await;
}

/// Why a new prefetch needs a new consumer: RabbitMQ applies `basic.qos`
/// (per consumer, `global = false`) to the consumers started after it,
/// never to one already consuming.
#[tokio::test]
async fn rabbitmq_gives_a_new_prefetch_only_to_consumers_started_after_it() {
    use futures_util::{FutureExt, StreamExt};
    use intake_amqp::lapin::options::{BasicConsumeOptions, BasicQosOptions};
    use intake_amqp::lapin::types::FieldTable;
    use intake_amqp::lapin::{Connection, ConnectionProperties};

    let Some(backend) = AmqpBackend::connect_or_skip("qos_after_consume").await else {
        return;
    };
    let queue = backend.classic_queue("qos-after-consume").await.unwrap();
    backend.publish_numbered(&queue, 10).await.unwrap();
    let connection = Connection::connect(backend.url(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    channel
        .basic_qos(1, BasicQosOptions { global: false })
        .await
        .unwrap();
    let consume = || {
        channel.basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
    };
    let arrived = |consumer: &mut intake_amqp::lapin::Consumer| {
        let mut count = 0;
        while let Some(Some(Ok(_))) = consumer.next().now_or_never() {
            count += 1;
        }
        count
    };
    let mut first = consume().await.unwrap();
    channel
        .basic_qos(4, BasicQosOptions { global: false })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        arrived(&mut first),
        1,
        "the running consumer kept prefetch 1"
    );

    let mut second = consume().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(arrived(&mut second), 4, "a consumer started after it has 4");
    connection.close(200, "done".into()).await.unwrap();
    backend.cleanup().await;
}
