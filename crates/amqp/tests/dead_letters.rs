//! Dead letters against a real RabbitMQ: the publishing sink
//! (`AmqpDeadLetterSink`, with publisher confirms and the envelope), the
//! broker's own dead-lettering (`BrokerDeadLetterSink`, a quorum queue's
//! delivery limit), and the destinations that must be refused.
//!
//! Each test skips with a printed reason when no broker listens on
//! 127.0.0.1:5672, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use std::time::Duration;

use intake_amqp::lapin::types::AMQPValue;
use intake_amqp::{AmqpDeadLetterSink, AmqpSource, Error, Exchange, Queue, Topology};
use intake_core::dead_letter::{EnvelopeError, envelope};
use intake_core::{
    DeadLetter, Message, Position,
    backend::{DeadLetterSink, Source, SourceEvent},
};
use support::steps::{PATIENCE, ack_through, publish_direct, receive, requeue, settle_at};
use support::{AmqpBackend, dead_letter_queue, expiring, unique};

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
        .build()
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
        .build()
        .await
        .unwrap();
    let mut acker = source.acker();
    let sink = AmqpDeadLetterSink::builder(backend.url())
        .exchange("")
        .routing_key(dead_letter_queue(&queue))
        .build()
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
        .build()
        .await
        .unwrap();
    let sink = AmqpDeadLetterSink::builder(backend.url())
        .exchange("")
        .routing_key(unique("nobody-listens"))
        .build()
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
        .build()
        .await
        .unwrap();
    let mut acker = source.acker();
    let sink = source.broker_dead_letter_sink();

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
        .build()
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
        .build()
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

#[tokio::test]
async fn the_sink_from_a_source_writes_to_its_broker_without_repeating_the_url() {
    let Some(backend) = AmqpBackend::connect_or_skip("sink_from_source").await else {
        return;
    };
    let queue = backend.classic_queue("sink-from-source").await.unwrap();
    backend.publish(&queue, &[b"poison"]).await.unwrap();
    let mut source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .build()
        .await
        .unwrap();
    let received = receive(&mut source, 1, 10).await;
    let sink = source
        .dead_letter_sink()
        .exchange("")
        .routing_key(dead_letter_queue(&queue))
        .build()
        .await
        .expect("the sink connects with the source's URL");
    sink.write(&DeadLetter::new(received.messages[0].clone(), "bad", 1))
        .await
        .unwrap();
    ack_through(&mut source.acker(), &received.messages[0])
        .await
        .unwrap();
    settle_at(&backend, &queue, 0).await;
    let letters = backend
        .peek_dead_letters(&dead_letter_queue(&queue))
        .await
        .unwrap();
    let [Ok(letter)] = letters.as_slice() else {
        panic!("expected one dead letter, got {letters:?}");
    };
    assert_eq!(letter.message.metadata().source().as_ref(), queue.as_str());
    assert_eq!(&letter.message.payload()[..], b"poison");
    source.close().await.unwrap();
    backend.cleanup().await;
}

#[tokio::test]
async fn the_sink_from_a_source_refuses_a_destination_that_routes_back_into_what_it_consumes() {
    let Some(backend) = AmqpBackend::connect_or_skip("sink_from_source_refusals").await else {
        return;
    };
    let queue = backend.classic_queue("sink-refusals").await.unwrap();
    let direct = format!("{queue}.direct");
    backend.track_exchange(&direct);
    // The source declares an exchange that routes the queue's name into it:
    // the sink must know that without being told again.
    let source = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .declare(
            Topology::new()
                .exchange(Exchange::direct(direct.as_str()))
                .bind(queue.as_str(), direct.as_str(), queue.as_str()),
        )
        .build()
        .await
        .unwrap();
    let refused = |result: Result<AmqpDeadLetterSink, Error>| match result {
        Err(Error::Config(error)) => error,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let into_the_queue = refused(
        source
            .dead_letter_sink()
            .exchange("")
            .routing_key(queue.as_str())
            .build()
            .await,
    );
    assert!(into_the_queue.problem.contains(&queue), "{into_the_queue}");
    let through_its_binding = refused(
        source
            .dead_letter_sink()
            .exchange(direct.as_str())
            .build()
            .await,
    );
    assert!(
        through_its_binding.problem.contains("consumed again"),
        "{through_its_binding}"
    );
    // Another routing key on that exchange reaches no consumed queue.
    source
        .dead_letter_sink()
        .exchange(direct.as_str())
        .routing_key(dead_letter_queue(&queue))
        .build()
        .await
        .expect("a routing key the binding does not match is accepted");

    let fanout = unique("broadcast");
    backend.track_exchange(&fanout);
    let broadcast = AmqpSource::builder(backend.url())
        .broadcast(fanout.as_str())
        .build()
        .await
        .unwrap();
    let back_to_every_consumer = refused(
        broadcast
            .dead_letter_sink()
            .exchange(fanout.as_str())
            .build()
            .await,
    );
    assert!(
        back_to_every_consumer.problem.contains(&fanout),
        "{back_to_every_consumer}"
    );
    drop((source, broadcast));
    backend.cleanup().await;
}
