//! The AMQP adapter against a real RabbitMQ: what the broker sees when the
//! source, the acker and the dead-letter sinks do their work.
//!
//! Each test skips with a printed reason when no broker listens on
//! 127.0.0.1:5672, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use intake_amqp::lapin::types::AMQPValue;
use intake_amqp::{AmqpDeadLetterSink, AmqpError, AmqpSource, Exchange, Queue, Topology};
use intake_core::dead_letter::{EnvelopeError, envelope};
use intake_core::testkit::skip_or_fail;
use intake_core::{
    AckBatch, AckError, Acker, DeadLetter, DeadLetterSink, Message, PartitionAck, PartitionKey,
    Position, Source, SourceError, SourceEvent,
};
use support::{AmqpBackend, close_connection_named, dead_letter_queue, expiring, unique};

const PATIENCE: Duration = Duration::from_secs(20);

/// What a source reported while a test read from it.
#[derive(Default)]
struct Received {
    messages: Vec<Message>,
    assigned: Vec<PartitionKey>,
    revoked: Vec<PartitionKey>,
}

impl Received {
    fn payloads(&self) -> Vec<String> {
        self.messages
            .iter()
            .map(|message| String::from_utf8_lossy(message.payload()).into_owned())
            .collect()
    }
}

/// Reads events until `count` messages arrived (asking for at most `max`
/// per call). Fails the test if they do not come.
async fn receive(source: &mut AmqpSource, count: usize, max: usize) -> Received {
    let mut received = Received::default();
    let mut buffer = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while received.messages.len() < count {
            let room = max.min(count - received.messages.len());
            match source.next(&mut buffer, room).await {
                Ok(SourceEvent::Delivered) => received.messages.append(&mut buffer),
                Ok(SourceEvent::Assigned(partitions)) => received.assigned.extend(partitions),
                Ok(SourceEvent::Revoked(revocation)) => {
                    received.revoked.extend_from_slice(revocation.partitions());
                }
                Ok(SourceEvent::Exhausted) => panic!("the source ended"),
                Ok(other) => panic!("unexpected source event: {other:?}"),
                Err(error) => panic!("source error: {error}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "only {} of {count} messages arrived",
            received.messages.len()
        )
    });
    received
}

/// Acknowledges everything up to and including `message` on its channel.
async fn ack_through(acker: &mut impl Acker, message: &Message) -> Result<(), AckError> {
    let mut ack = PartitionAck::new(message.metadata().partition_key());
    ack.watermark = Some(message.metadata().position());
    acker
        .ack(&AckBatch {
            partitions: vec![ack],
            sync: true,
        })
        .await
}

/// Hands `message` back for redelivery, and acknowledges up to `watermark`.
async fn requeue(
    acker: &mut impl Acker,
    message: &Message,
    watermark: Option<Position>,
) -> Result<(), AckError> {
    let mut ack = PartitionAck::new(message.metadata().partition_key());
    ack.requeue.push(message.metadata().position());
    ack.watermark = watermark;
    acker
        .ack(&AckBatch {
            partitions: vec![ack],
            sync: true,
        })
        .await
}

/// Waits until `queue` holds `expected` messages (acks are asynchronous).
async fn settle_at(backend: &AmqpBackend, queue: &str, expected: u64) {
    let mut last = None;
    let reached = tokio::time::timeout(PATIENCE, async {
        loop {
            let count = backend.messages_in(queue).await.ok();
            if count == Some(expected) {
                return;
            }
            last = count;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        reached.is_ok(),
        "{queue} holds {last:?} messages, expected {expected}"
    );
}

fn tags(received: &Received) -> Vec<u64> {
    received
        .messages
        .iter()
        .map(|message| match message.metadata().position() {
            Position::Tag(tag) => tag,
            other => panic!("not a tag: {other}"),
        })
        .collect()
}

#[tokio::test]
async fn an_unreachable_broker_is_a_typed_error_without_the_password() {
    let error = AmqpSource::builder("amqp://guest:hunter2@127.0.0.1:1/%2f")
        .queue("orders")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect_err("nothing listens on port 1");
    assert!(matches!(error, AmqpError::Unreachable { .. }), "{error:?}");
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
        .connect()
        .await
        .expect_err("the password is wrong");
    assert!(matches!(error, AmqpError::Unauthorized { .. }), "{error:?}");
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
        .connect()
        .await
        .expect_err("the queue does not exist");
    match &error {
        AmqpError::QueueNotFound { queue: named, .. } => assert_eq!(named, &queue),
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
        .connect()
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
        .max_in_flight(3)
        .connect()
        .await
        .unwrap();
    let mut acker = source.acker();

    let first = receive(&mut source, 3, 100).await;
    // Nothing acknowledged: the broker holds the other 7 back.
    let mut buffer = Vec::new();
    let more = tokio::time::timeout(Duration::from_millis(300), async {
        loop {
            if let Ok(SourceEvent::Delivered) = source.next(&mut buffer, 100).await {
                return buffer.len();
            }
        }
    })
    .await;
    assert!(more.is_err(), "the broker pushed past the prefetch");

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
        .connect()
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
        .connect()
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

/// Publishes straight to `queue` through the default exchange.
async fn publish_direct(backend: &AmqpBackend, queue: &str, payload: &[u8]) {
    let confirm = backend
        .channel()
        .basic_publish(
            "".into(),
            queue.into(),
            Default::default(),
            payload,
            Default::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(confirm.is_ack());
}

#[tokio::test]
async fn a_quorum_delivery_limit_dead_letters_a_message_that_keeps_failing() {
    let Some(backend) = AmqpBackend::connect_or_skip("delivery_limit").await else {
        return;
    };
    let queue = unique("limited");
    let dlx = format!("{queue}.dlx");
    let dlq = dead_letter_queue(&queue);
    let topology = Topology::new()
        .exchange(Exchange::direct(dlx.as_str()))
        .queue(Queue::classic(dlq.as_str()))
        .bind(dlq.as_str(), dlx.as_str(), queue.as_str())
        .queue(
            Queue::quorum(queue.as_str())
                .dead_letter_exchange(dlx.as_str())
                .delivery_limit(2),
        );
    let mut source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .declare(topology)
        .connect()
        .await
        .unwrap();
    backend.track_queue(&queue);
    backend.track_queue(&dlq);
    backend.track_exchange(&dlx);
    let mut acker = source.acker();
    publish_direct(&backend, &queue, b"poison").await;

    // Every delivery fails and is retried (`basic.reject(requeue)`), until
    // the broker stops redelivering it.
    let mut deliveries = 0;
    let mut buffer = Vec::new();
    while let Ok(event) =
        tokio::time::timeout(Duration::from_secs(2), source.next(&mut buffer, 10)).await
    {
        if let Ok(SourceEvent::Delivered) = event {
            for message in buffer.drain(..) {
                deliveries += 1;
                requeue(&mut acker, &message, None).await.unwrap();
            }
        }
        assert!(deliveries <= 10, "the delivery limit never took effect");
    }
    assert_eq!(deliveries, 3, "limit 2: the third failure dead-letters it");
    settle_at(&backend, &queue, 0).await;
    let dead = backend.peek(&dlq).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(&dead[0].0[..], b"poison");
    assert!(dead[0].1.contains_key("x-death"), "the broker records why");
    source.close().await.unwrap();
    backend.cleanup().await;
}

#[tokio::test]
async fn a_poison_message_reaches_the_dead_letter_queue_with_its_origin() {
    let Some(backend) = AmqpBackend::connect_or_skip("poison").await else {
        return;
    };
    let queue = backend.classic_queue("poison").await.unwrap();
    backend.publish(&queue, &[b"{not json"]).await.unwrap();
    let mut source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .connect()
        .await
        .unwrap();
    let mut acker = source.acker();
    let sink = AmqpDeadLetterSink::builder(backend.url())
        .exchange("")
        .routing_key(dead_letter_queue(&queue))
        .connect()
        .await
        .unwrap();

    let received = receive(&mut source, 1, 10).await;
    let poison = received.messages[0].clone();
    sink.write(&DeadLetter::new(
        poison.clone(),
        "expected value at line 1",
        3,
    ))
    .await
    .unwrap();
    ack_through(&mut acker, &poison).await.unwrap();

    settle_at(&backend, &queue, 0).await;
    let dead = backend
        .peek_dead_letters(&dead_letter_queue(&queue))
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    let letter = dead[0].as_ref().expect("a dead letter");
    assert_eq!(&letter.message.payload()[..], b"{not json");
    let origin = letter.message.metadata();
    assert_eq!(
        (&**origin.source(), origin.partition(), origin.position()),
        (queue.as_str(), 1, Position::Tag(1))
    );
    assert_eq!(letter.message.key(), poison.key());
    assert_eq!(letter.error, "expected value at line 1");
    assert_eq!(letter.attempts, 3);
    assert!(letter.failed_at <= std::time::SystemTime::now());
    source.close().await.unwrap();
    backend.cleanup().await;
}

#[tokio::test]
async fn a_dead_letter_no_queue_would_receive_is_an_error_not_a_loss() {
    let Some(backend) = AmqpBackend::connect_or_skip("unroutable_dead_letter").await else {
        return;
    };
    let queue = backend.classic_queue("unroutable").await.unwrap();
    backend.publish(&queue, &[b"x"]).await.unwrap();
    let mut source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .connect()
        .await
        .unwrap();
    let sink = AmqpDeadLetterSink::builder(backend.url())
        .exchange("")
        .routing_key(unique("nobody-listens"))
        .connect()
        .await
        .unwrap();
    let received = receive(&mut source, 1, 10).await;
    let error = sink
        .write(&DeadLetter::new(received.messages[0].clone(), "bad", 1))
        .await
        .expect_err("no queue is bound");
    let chain = intake_core::error::ErrorChain::new(&error).to_string();
    assert!(chain.contains("no queue is bound"), "{chain}");
    // Not acknowledged: still in the queue (unacknowledged, then ready).
    source.close().await.unwrap();
    settle_at(&backend, &queue, 1).await;
    backend.cleanup().await;
}

#[tokio::test]
async fn the_broker_dead_letter_sink_rejects_into_the_queues_dead_letter_exchange() {
    let Some(backend) = AmqpBackend::connect_or_skip("broker_dead_letter").await else {
        return;
    };
    let queue = unique("broker-dlx");
    let dlq = dead_letter_queue(&queue);
    let mut arguments = expiring();
    arguments.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    arguments.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(dlq.as_str().into()),
    );
    backend.declare_queue(&queue, arguments).await.unwrap();
    backend
        .publish(&queue, &[b"ok-1", b"poison", b"ok-2"])
        .await
        .unwrap();
    let mut source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .connect()
        .await
        .unwrap();
    let mut acker = source.acker();
    let sink = source.broker_dead_letter();

    let received = receive(&mut source, 3, 10).await;
    sink.write(&DeadLetter::new(received.messages[1].clone(), "bad", 1))
        .await
        .unwrap();
    // The watermark passes over the rejected tag without naming it.
    ack_through(&mut acker, &received.messages[2])
        .await
        .unwrap();
    settle_at(&backend, &queue, 0).await;
    let dead = backend.peek(&dlq).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(&dead[0].0[..], b"poison");
    assert!(dead[0].1.contains_key("x-death"));
    // The broker moves the message as it was: RabbitMQ's `x-death`, no
    // envelope, so it is no dead letter `DeadLetter::read` can read.
    let read = backend.peek_dead_letters(&dlq).await.unwrap();
    assert!(
        matches!(
            read[..],
            [Err(EnvelopeError::Missing {
                field: envelope::VERSION
            })]
        ),
        "{read:?}"
    );
    source.close().await.unwrap();
    backend.cleanup().await;
}

#[tokio::test]
async fn a_consumer_dropped_mid_run_leaves_its_messages_to_another_and_none_is_lost() {
    let Some(backend) = AmqpBackend::connect_or_skip("dropped_consumer").await else {
        return;
    };
    let queue = backend.classic_queue("dropped").await.unwrap();
    backend.publish_numbered(&queue, 20).await.unwrap();

    let mut first = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .max_in_flight(10)
        .connect()
        .await
        .unwrap();
    let mut first_acker = first.acker();
    let taken = receive(&mut first, 10, 10).await;
    ack_through(&mut first_acker, &taken.messages[3])
        .await
        .unwrap();
    let done: BTreeSet<String> = taken.payloads()[..4].iter().cloned().collect();
    // A crash: no close, no nack.
    drop(first_acker);
    drop(first);

    let mut second = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .max_in_flight(20)
        .connect()
        .await
        .unwrap();
    let mut second_acker = second.acker();
    let rest = receive(&mut second, 16, 20).await;
    let rest_payloads: BTreeSet<String> = rest.payloads().into_iter().collect();
    assert!(
        done.is_disjoint(&rest_payloads),
        "acknowledged work came back"
    );
    let all: BTreeSet<String> = done.union(&rest_payloads).cloned().collect();
    let expected: BTreeSet<String> = (0..20).map(|index| index.to_string()).collect();
    assert_eq!(all, expected);
    let redelivered = rest
        .messages
        .iter()
        .filter(|message| message.metadata().attempt() == 2)
        .count();
    // At least the six it held unacknowledged; the broker may also have
    // pushed more into its prefetch after the ack, and those come back too.
    assert!(redelivered >= 6, "only {redelivered} redelivered");

    ack_through(&mut second_acker, rest.messages.last().unwrap())
        .await
        .unwrap();
    settle_at(&backend, &queue, 0).await;
    second.close().await.unwrap();
    backend.cleanup().await;
}

#[tokio::test]
async fn the_broker_closing_the_connection_mid_run_leads_to_a_reconnect_and_nothing_lost() {
    let Some(backend) = AmqpBackend::connect_or_skip("connection_closed").await else {
        return;
    };
    let queue = backend.classic_queue("closed").await.unwrap();
    backend.publish_numbered(&queue, 10).await.unwrap();
    let name = unique("conn");
    let mut source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .max_in_flight(5)
        .connection_name(name.as_str())
        .connect()
        .await
        .unwrap();
    let mut acker = source.acker();
    let before = receive(&mut source, 5, 5).await;
    ack_through(&mut acker, &before.messages[1]).await.unwrap();
    settle_at(&backend, &queue, 8).await;

    if let Err(why) = close_connection_named(&name).await {
        skip_or_fail(
            "connection_closed",
            &format!("cannot close the connection: {why}"),
        );
        backend.cleanup().await;
        return;
    }

    // The unacknowledged deliveries of the lost channel and those never
    // delivered all arrive on the new channel, which is a new partition.
    let old = PartitionKey::new(queue.as_str(), 1);
    let new = PartitionKey::new(queue.as_str(), 2);
    let mut revoked = Vec::new();
    let mut assigned = Vec::new();
    let mut seen: Vec<String> = before.payloads()[..2].to_vec();
    let mut buffer = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while seen.len() < 10 {
            match source.next(&mut buffer, 5).await.unwrap() {
                SourceEvent::Delivered => {
                    for message in buffer.drain(..) {
                        // Deliveries read from the old channel before its
                        // loss was noticed may not be acknowledged; the
                        // broker delivers them again on the new one.
                        if message.metadata().partition_key() == new {
                            ack_through(&mut acker, &message).await.unwrap();
                            seen.push(String::from_utf8_lossy(message.payload()).into_owned());
                        }
                    }
                }
                SourceEvent::Revoked(revocation) => {
                    revoked.extend_from_slice(revocation.partitions())
                }
                SourceEvent::Assigned(partitions) => assigned.extend(partitions),
                SourceEvent::Exhausted => panic!("the source ended"),
                other => panic!("unexpected source event: {other:?}"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("after the reconnect only {seen:?} arrived"));
    assert_eq!(revoked, vec![old.clone()]);
    assert_eq!(assigned, vec![new.clone()]);
    seen.sort_by_key(|payload| payload.parse::<u32>().unwrap_or(u32::MAX));
    let expected: Vec<String> = (0..10).map(|index| index.to_string()).collect();
    assert_eq!(seen, expected, "every message once after the reconnect");

    // Tags of the lost channel are fenced; the new channel's are taken.
    let stale = ack_through(&mut acker, &before.messages[4]).await;
    assert!(matches!(stale, Err(AckError::NotAssigned(partition)) if partition == old));
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
            .max_in_flight(5)
            .connect()
    };
    let (mut left, mut right) = (connect().await.unwrap(), connect().await.unwrap());
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
        .connect()
        .await
        .unwrap();
    let mut acker = first.acker();
    let taken = receive(&mut first, 6, 10).await;
    ack_through(&mut acker, &taken.messages[1]).await.unwrap();
    first.close().await.unwrap();
    settle_at(&backend, &queue, 4).await;

    let mut second = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .connect()
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
            .connect()
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

/// Runs a consumer over `source` until `shutdown` fires.
fn spawn_consumer<H>(
    source: AmqpSource,
    handler: H,
    shutdown: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<Result<intake_core::RunReport, intake_core::RunError>>
where
    H: tower::Service<Message, Response = (), Error = intake_core::HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    let acker = source.acker();
    let consumer = intake_core::Consumer::builder()
        .max_in_flight(8)
        .ordering(intake_core::DeliveryOrder::Unordered)
        .backoff(intake_core::Disabled)
        .build(source, acker, handler)
        .expect("valid consumer settings");
    tokio::spawn(consumer.run(shutdown))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_carries_on_after_the_broker_closes_the_connection_and_loses_nothing() {
    let Some(backend) = AmqpBackend::connect_or_skip("runtime_reconnect").await else {
        return;
    };
    let queue = backend.classic_queue("runtime-reconnect").await.unwrap();
    backend.publish_numbered(&queue, 200).await.unwrap();
    let name = unique("runtime-conn");
    let source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .max_in_flight(8)
        .connection_name(name.as_str())
        .connect()
        .await
        .unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    let handler = {
        let seen = seen.clone();
        tower::service_fn(move |message: Message| {
            let seen = seen.clone();
            async move {
                // Slow enough that the connection is closed mid-run.
                tokio::time::sleep(Duration::from_millis(5)).await;
                let id = String::from_utf8_lossy(message.payload()).into_owned();
                seen.lock().map(|mut seen| seen.insert(id)).ok();
                Ok::<_, intake_core::HandlerError>(())
            }
        })
    };
    let count = |seen: &std::sync::Mutex<BTreeSet<String>>| seen.lock().map_or(0, |s| s.len());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = spawn_consumer(source, handler, shutdown.clone());
    while count(&seen) < 20 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if let Err(why) = close_connection_named(&name).await {
        skip_or_fail(
            "runtime_reconnect",
            &format!("cannot close the connection: {why}"),
        );
        shutdown.cancel();
        let _ = running.await;
        return;
    }
    tokio::time::timeout(PATIENCE, async {
        while count(&seen) < 200 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("only {} of 200 handled after the reconnect", count(&seen)));
    shutdown.cancel();
    let report = running.await.unwrap().unwrap();
    assert!(report.succeeded >= 200);
    settle_at(&backend, &queue, 0).await;
    backend.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_keeps_failing_through_the_retry_path_reaches_the_quorum_delivery_limit() {
    let Some(backend) = AmqpBackend::connect_or_skip("runtime_delivery_limit").await else {
        return;
    };
    let queue = unique("runtime-limited");
    let dlx = format!("{queue}.dlx");
    let dlq = dead_letter_queue(&queue);
    let topology = Topology::new()
        .exchange(Exchange::direct(dlx.as_str()))
        .queue(Queue::classic(dlq.as_str()))
        .bind(dlq.as_str(), dlx.as_str(), queue.as_str())
        .queue(
            Queue::quorum(queue.as_str())
                .dead_letter_exchange(dlx.as_str())
                .delivery_limit(3),
        );
    let source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .declare(topology)
        .max_in_flight(8)
        .connect()
        .await
        .unwrap();
    backend.track_queue(&queue);
    backend.track_queue(&dlq);
    backend.track_exchange(&dlx);
    publish_direct(&backend, &queue, b"poison").await;
    publish_direct(&backend, &queue, b"fine").await;

    let attempts = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let handler = {
        let attempts = attempts.clone();
        tower::service_fn(move |message: Message| {
            let attempts = attempts.clone();
            async move {
                if &message.payload()[..] == b"poison" {
                    attempts
                        .lock()
                        .map(|mut seen| seen.push(message.metadata().attempt()))
                        .ok();
                    return Err(intake_core::HandlerError::retryable(
                        "downstream refuses it",
                    ));
                }
                Ok(())
            }
        })
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = spawn_consumer(source, handler, shutdown.clone());
    let dead = tokio::time::timeout(PATIENCE, async {
        loop {
            let dead = backend.peek(&dlq).await.unwrap();
            if !dead.is_empty() {
                return dead;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the poison message reaches the dead-letter queue");
    shutdown.cancel();
    let report = running.await.unwrap().unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(&dead[0].0[..], b"poison");
    assert_eq!(report.succeeded, 1, "the good message was handled");
    let attempts = attempts.lock().map(|seen| seen.clone()).unwrap_or_default();
    assert_eq!(
        attempts,
        [1, 2, 3, 4],
        "limit 3: the fourth failure dead-letters it"
    );
    settle_at(&backend, &queue, 0).await;
    backend.cleanup().await;
}

#[tokio::test]
async fn a_full_budget_takes_no_delivery_but_still_notices_a_lost_channel() {
    let Some(backend) = AmqpBackend::connect_or_skip("full_budget").await else {
        return;
    };
    let queue = backend.classic_queue("full-budget").await.unwrap();
    backend.publish(&queue, &[b"a", b"b", b"c"]).await.unwrap();
    let name = unique("full-budget-conn");
    let mut source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .connection_name(name.as_str())
        .connect()
        .await
        .unwrap();
    let mut buffer = Vec::new();
    let first = source.next(&mut buffer, 0).await.unwrap();
    assert!(matches!(first, SourceEvent::Assigned(_)), "{first:?}");

    // `max == 0`: assignment changes only.
    let waited =
        tokio::time::timeout(Duration::from_millis(300), source.next(&mut buffer, 0)).await;
    assert!(waited.is_err(), "nothing changed, so nothing is returned");
    assert!(buffer.is_empty());

    if let Err(why) = close_connection_named(&name).await {
        skip_or_fail(
            "full_budget",
            &format!("cannot close the connection: {why}"),
        );
        backend.cleanup().await;
        return;
    }
    let revoked = tokio::time::timeout(PATIENCE, source.next(&mut buffer, 0))
        .await
        .expect("the loss is noticed")
        .unwrap();
    match revoked {
        SourceEvent::Revoked(revocation) => {
            assert_eq!(
                revocation.partitions(),
                [PartitionKey::new(queue.as_str(), 1)]
            );
        }
        other => panic!("expected the revocation, got {other:?}"),
    }
    let assigned = tokio::time::timeout(PATIENCE, source.next(&mut buffer, 0))
        .await
        .expect("the source reconnects")
        .unwrap();
    assert!(
        matches!(&assigned, SourceEvent::Assigned(partitions) if partitions == &[PartitionKey::new(queue.as_str(), 2)]),
        "{assigned:?}"
    );
    assert!(buffer.is_empty(), "no delivery while the budget was full");

    let received = receive(&mut source, 3, 10).await;
    assert_eq!(received.payloads(), ["a", "b", "c"]);
    ack_through(&mut source.acker(), &received.messages[2])
        .await
        .unwrap();
    settle_at(&backend, &queue, 0).await;
    source.close().await.unwrap();
    backend.cleanup().await;
}

#[tokio::test]
async fn a_lost_channel_is_reopened_only_after_its_revocation_completed() {
    let Some(backend) = AmqpBackend::connect_or_skip("reopen_after_revocation").await else {
        return;
    };
    let queue = backend
        .classic_queue("reopen-after-revocation")
        .await
        .unwrap();
    backend.publish(&queue, &[b"a"]).await.unwrap();
    let name = unique("reopen-conn");
    let mut source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .connection_name(name.as_str())
        .connect()
        .await
        .unwrap();
    receive(&mut source, 1, 10).await;
    if let Err(why) = close_connection_named(&name).await {
        skip_or_fail(
            "reopen_after_revocation",
            &format!("cannot close the connection: {why}"),
        );
        backend.cleanup().await;
        return;
    }
    let mut buffer = Vec::new();
    let revocation = match tokio::time::timeout(PATIENCE, source.next(&mut buffer, 10))
        .await
        .expect("the loss is noticed")
        .unwrap()
    {
        SourceEvent::Revoked(revocation) => revocation,
        other => panic!("expected the revocation, got {other:?}"),
    };
    // The runtime still runs handlers of the lost channel until it completes
    // the revocation: a new channel now would hand the same messages out
    // again beside them.
    let early = tokio::time::timeout(Duration::from_secs(1), source.next(&mut buffer, 10)).await;
    assert!(
        early.is_err(),
        "the source reconnected while the revocation was pending: {early:?}"
    );
    revocation.complete(intake_core::source::RevocationOutcome::default());
    let assigned = tokio::time::timeout(PATIENCE, source.next(&mut buffer, 10))
        .await
        .expect("the source reconnects once the revocation completed")
        .unwrap();
    assert!(
        matches!(&assigned, SourceEvent::Assigned(partitions) if partitions == &[PartitionKey::new(queue.as_str(), 2)]),
        "{assigned:?}"
    );
    let again = receive(&mut source, 1, 10).await;
    assert_eq!(again.payloads(), ["a"]);
    source.close().await.unwrap();
    backend.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_of_a_lost_channel_never_runs_twice_at_once_in_one_consumer() {
    let Some(backend) = AmqpBackend::connect_or_skip("no_concurrent_copies").await else {
        return;
    };
    let queue = backend.classic_queue("no-concurrent-copies").await.unwrap();
    backend.publish(&queue, &[b"slow"]).await.unwrap();
    let name = unique("copies-conn");
    let source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .max_in_flight(8)
        .connection_name(name.as_str())
        .connect()
        .await
        .unwrap();

    /// Copies of the message running now, and the most seen at once.
    #[derive(Default)]
    struct Running {
        now: usize,
        most: usize,
        finished: usize,
    }
    struct Leaving(std::sync::Arc<std::sync::Mutex<Running>>);
    impl Drop for Leaving {
        fn drop(&mut self) {
            if let Ok(mut running) = self.0.lock() {
                running.now -= 1;
            }
        }
    }
    let running = std::sync::Arc::new(std::sync::Mutex::new(Running::default()));
    let started = std::sync::Arc::new(tokio::sync::Notify::new());
    let handler = {
        let (running, started) = (running.clone(), started.clone());
        tower::service_fn(move |message: Message| {
            let (running, started) = (running.clone(), started.clone());
            async move {
                {
                    let mut now = running.lock().unwrap();
                    now.now += 1;
                    now.most = now.most.max(now.now);
                }
                // Leaves when it returns or when the runtime cancels it.
                let _leaving = Leaving(running.clone());
                if message.metadata().attempt() == 1 {
                    started.notify_one();
                    // The first copy hangs until the runtime cancels it.
                    std::future::pending::<()>().await;
                }
                if let Ok(mut running) = running.lock() {
                    running.finished += 1;
                }
                Ok::<_, intake_core::HandlerError>(())
            }
        })
    };
    let acker = source.acker();
    let consumer = intake_core::Consumer::builder()
        .max_in_flight(8)
        .ordering(intake_core::DeliveryOrder::Unordered)
        .backoff(intake_core::Disabled)
        .revoke_timeout(Duration::from_secs(2))
        .build(source, acker, handler)
        .expect("valid consumer settings");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(consumer.run(shutdown.clone()));
    tokio::time::timeout(PATIENCE, started.notified())
        .await
        .expect("the first copy starts");
    if let Err(why) = close_connection_named(&name).await {
        skip_or_fail(
            "no_concurrent_copies",
            &format!("cannot close the connection: {why}"),
        );
        shutdown.cancel();
        let _ = run.await;
        backend.cleanup().await;
        return;
    }
    let finished = || running.lock().map_or(0, |running| running.finished);
    tokio::time::timeout(PATIENCE, async {
        while finished() == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the redelivered copy is handled");
    shutdown.cancel();
    let report = run.await.unwrap().unwrap();
    assert_eq!(report.succeeded, 1);
    let most = running.lock().map_or(0, |running| running.most);
    assert_eq!(
        most, 1,
        "the broker's redelivery ran beside the lost channel's copy"
    );
    settle_at(&backend, &queue, 0).await;
    backend.cleanup().await;
}

#[tokio::test]
async fn a_dead_letter_whose_headers_exceed_the_frame_size_is_written_without_them() {
    let Some(backend) = AmqpBackend::connect_or_skip("dead_letter_frame_max").await else {
        return;
    };
    let queue = backend.classic_queue("frame-max").await.unwrap();
    // The smallest frame AMQP allows: the headers of one message travel in
    // one frame, and 6 KB of them (plus a long error) cannot.
    let url = format!("{}?frame_max=4096", backend.url());
    let sink = AmqpDeadLetterSink::builder(url.as_str())
        .exchange("")
        .routing_key(dead_letter_queue(&queue))
        .connect()
        .await
        .unwrap();
    let big = "x".repeat(2_000);
    let headers: intake_core::Headers = [
        ("a", big.clone()),
        ("b", big.clone()),
        ("c", big.clone()),
        (intake_amqp::headers::MESSAGE_ID, "m-1".to_owned()),
    ]
    .into_iter()
    .collect();
    let message = Message::new(
        bytes::Bytes::from_static(b"poison"),
        intake_core::Metadata::new(queue.as_str().into(), 1, Position::Tag(9)),
    )
    .with_key(bytes::Bytes::from_static(b"orders.eu"))
    .with_headers(headers);
    let letter = DeadLetter::new(message, "e".repeat(3_000), 2);
    tokio::time::timeout(PATIENCE, sink.write(&letter))
        .await
        .expect("the write ends")
        .expect("the dead letter is written, without what does not fit");
    assert_eq!(sink.reduced_dead_letters(), 1);

    let dead = backend
        .peek_dead_letters(&dead_letter_queue(&queue))
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    let read = dead[0].as_ref().expect("a dead letter");
    assert_eq!(&read.message.payload()[..], b"poison");
    assert_eq!(&**read.message.metadata().source(), queue);
    assert_eq!(read.message.metadata().position(), Position::Tag(9));
    assert_eq!(
        read.message.key().map(|key| &key[..]),
        Some(&b"orders.eu"[..])
    );
    assert_eq!(read.attempts, 2);
    assert!(
        read.error.starts_with("eee")
            && read.error.len() <= intake_amqp::headers::DEAD_LETTER_ERROR_REDUCED_BYTES
    );
    assert_eq!(
        read.message
            .headers()
            .get_str(intake_amqp::headers::MESSAGE_ID),
        Some("m-1"),
        "the properties stay"
    );
    assert_eq!(
        read.message.headers().get_str("a"),
        None,
        "the original headers are left out"
    );
    assert_eq!(read.headers_omitted, 3);
    backend.cleanup().await;
}

#[tokio::test]
async fn a_dead_letter_addressed_to_the_queue_it_came_from_is_refused_not_consumed_again() {
    let Some(backend) = AmqpBackend::connect_or_skip("dead_letter_into_itself").await else {
        return;
    };
    let queue = backend.classic_queue("into-itself").await.unwrap();
    // The default exchange routes by queue name: this sink would put every
    // dead letter of `queue` back into `queue`.
    let sink = AmqpDeadLetterSink::builder(backend.url())
        .exchange("")
        .routing_key(queue.as_str())
        .connect()
        .await
        .unwrap();
    let message = Message::new(
        bytes::Bytes::from_static(b"poison"),
        intake_core::Metadata::new(queue.as_str().into(), 1, Position::Tag(1)),
    );
    let error = sink
        .write(&DeadLetter::new(message, "bad", 1))
        .await
        .expect_err("a dead letter into its own queue is refused");
    let chain = intake_core::error::ErrorChain::new(&error).to_string();
    assert!(chain.contains("consumed again"), "{chain}");
    settle_at(&backend, &queue, 0).await;
    backend.cleanup().await;
}
