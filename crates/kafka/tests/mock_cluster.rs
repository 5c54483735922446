//! The Kafka source, acker and dead-letter sink against rdkafka's
//! in-process mock cluster (the fast tier: no broker to install): the
//! source alone where its contract is the point, the intake runtime on top
//! where a whole consumer is.

mod support;

use std::time::Duration;

use bytes::Bytes;
use intake_core::backend::testkit::harness::{Ledger, numbered};
use intake_core::backend::testkit::{Backend, TestMessage};
use intake_core::dead_letter::envelope;
use intake_core::{
    Consumer, DeadLetter, DeliveryOrder, Headers, PartitionKey, Position,
    backend::{
        AckBatch, AckError, Acker, DeadLetterSink, Limits, PartitionAck, Source, SourceError,
        SourceEvent,
    },
};
use intake_kafka::{Error, KafkaDeadLetterSink, KafkaSettings, KafkaSource};
use support::consumer::{TestConsumer, eventually, settled};
use support::{KafkaBackend, take, unique};

const PATIENCE: Duration = Duration::from_secs(60);

fn offsets(messages: &[intake_core::Message]) -> Vec<Position> {
    messages
        .iter()
        .map(|message| message.metadata().position())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivers_every_message_with_its_offset_key_headers_and_timestamp() {
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(1).await.expect("topic");
    let mut headers = Headers::new();
    headers.insert("trace-id", Bytes::from_static(b"abc"));
    let mut first = TestMessage::new("k", "hello");
    first.headers = headers;
    kafka
        .produce(&topic, vec![first, TestMessage::new("k", "world")])
        .await
        .expect("produce");

    let mut source = kafka
        .source(&topic, &unique("g"))
        .build()
        .await
        .expect("source");
    let taken = take(&mut source, 2, 64, PATIENCE).await;
    assert_eq!(taken.messages.len(), 2);

    let first = &taken.messages[0];
    assert_eq!(first.payload().as_ref(), b"hello");
    assert_eq!(first.key().map(|k| k.as_ref()), Some(&b"k"[..]));
    assert_eq!(first.headers().get_str("trace-id"), Some("abc"));
    assert_eq!(&**first.metadata().source(), topic.as_str());
    assert_eq!(first.metadata().position(), Position::Offset(0));
    assert!(first.metadata().timestamp().is_some());
    assert_eq!(first.metadata().attempt(), 1);
    assert_eq!(taken.messages[1].metadata().position(), Position::Offset(1));
    assert_eq!(taken.assigned, vec![PartitionKey::new(topic.as_str(), 0)]);
    source.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_committed_offset_is_the_acked_watermark_plus_one() {
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(1).await.expect("topic");
    let group = unique("g");
    kafka
        .produce(&topic, numbered(0, 10))
        .await
        .expect("produce");
    let mut source = kafka.source(&topic, &group).build().await.expect("source");
    assert_eq!(take(&mut source, 10, 64, PATIENCE).await.messages.len(), 10);

    let mut ack = PartitionAck::new(PartitionKey::new(topic.as_str(), 0));
    ack.watermark = Some(Position::Offset(3));
    let batch = AckBatch {
        partitions: vec![ack],
        sync: false,
    };
    source.acker().ack(&batch).await.expect("commit");

    let offsets = kafka.offsets(&topic, &group).await.expect("offsets");
    assert_eq!(offsets, vec![(0, Some(4), 10)]);
    assert_eq!(kafka.unacknowledged(&topic, &group).await.expect("lag"), 6);
    source.close().await.expect("close");
}

#[tokio::test(flavor = "current_thread")]
async fn commits_during_the_run_are_spaced_by_the_minimum_interval_and_sync_ones_are_not() {
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(1).await.expect("topic");
    let group = unique("g");
    kafka
        .produce(&topic, numbered(0, 10))
        .await
        .expect("produce");
    let mut source = kafka
        .source(&topic, &group)
        .min_commit_interval(Duration::from_secs(5))
        .build()
        .await
        .expect("source");
    assert_eq!(take(&mut source, 10, 64, PATIENCE).await.messages.len(), 10);
    let mut acker = source.acker();
    let batch = |watermark: i64, sync: bool| {
        let mut ack = PartitionAck::new(PartitionKey::new(topic.as_str(), 0));
        ack.watermark = Some(Position::Offset(watermark));
        AckBatch {
            partitions: vec![ack],
            sync,
        }
    };

    // Virtual time from here: only the acker's own wait moves it.
    tokio::time::pause();
    let started = tokio::time::Instant::now();
    acker.ack(&batch(2, false)).await.expect("first commit");
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "the first commit waits for nothing"
    );
    acker.ack(&batch(5, false)).await.expect("second commit");
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "the second commit waited out the interval"
    );
    let waited = started.elapsed();
    acker.ack(&batch(8, true)).await.expect("sync commit");
    assert_eq!(started.elapsed(), waited, "a sync commit is not held back");
    tokio::time::resume();

    assert_eq!(
        kafka.offsets(&topic, &group).await.expect("offsets"),
        vec![(0, Some(9), 10)]
    );
    source.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_buffer_pauses_fetching_and_loses_nothing() {
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(1).await.expect("topic");
    kafka
        .produce(&topic, numbered(0, 300))
        .await
        .expect("produce");
    let mut source = kafka
        .source(&topic, &unique("g"))
        .build()
        .await
        .expect("source");
    // A consumer with a budget of 8 (the source is used on its own here).
    source.set_limits(Limits::new(8, 64 << 20, Duration::from_secs(10)));
    // Take a few, then leave the source alone long enough for its thread to
    // fill the buffer and pause.
    let mut taken = take(&mut source, 3, 64, PATIENCE).await.messages;
    tokio::time::sleep(Duration::from_millis(800)).await;
    taken.extend(take(&mut source, 297, 64, PATIENCE).await.messages);
    let expected: Vec<Position> = (0..300).map(Position::Offset).collect();
    assert_eq!(offsets(&taken), expected, "every offset once, in order");
    source.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_takes_no_more_than_asked() {
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(1).await.expect("topic");
    kafka
        .produce(&topic, numbered(0, 20))
        .await
        .expect("produce");
    let mut source = kafka
        .source(&topic, &unique("g"))
        .build()
        .await
        .expect("source");
    let mut buffer = Vec::new();
    let mut taken = 0;
    while taken < 20 {
        buffer.clear();
        tokio::time::timeout(PATIENCE, source.next(&mut buffer, 3))
            .await
            .expect("an event in time")
            .expect("no error");
        assert!(buffer.len() <= 3);
        taken += buffer.len();
    }
    assert_eq!(taken, 20);
    source.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_full_budget_the_source_reports_assignments_and_delivers_nothing() {
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(2).await.expect("topic");
    let group = unique("g");
    kafka
        .produce(&topic, numbered(0, 50))
        .await
        .expect("produce");
    let mut first = kafka.source(&topic, &group).build().await.expect("first");
    let mut buffer = Vec::new();

    // Asked with max 0, the source hands out the assignment only.
    let event = tokio::time::timeout(PATIENCE, first.next(&mut buffer, 0))
        .await
        .expect("the assignment in time")
        .expect("no error");
    assert!(matches!(event, SourceEvent::Assigned(_)), "{event:?}");
    assert!(buffer.is_empty());

    // A second consumer joins: the revocation reaches a source that is
    // asked for nothing else.
    let mut second = kafka.source(&topic, &group).build().await.expect("second");
    let joining = tokio::spawn(async move {
        let taken = take(&mut second, 1, 64, PATIENCE).await;
        (second, taken)
    });
    let revoked = tokio::time::timeout(PATIENCE, async {
        loop {
            match first.next(&mut buffer, 0).await {
                Ok(SourceEvent::Revoked(revocation)) => {
                    let partitions = revocation.partitions().to_vec();
                    revocation.complete(Default::default());
                    return partitions;
                }
                Ok(SourceEvent::Assigned(_)) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    })
    .await
    .expect("the revocation in time");
    assert!(!revoked.is_empty());
    assert!(buffer.is_empty(), "nothing delivered with max 0");

    // Keep serving `first` (as the runtime would) while `second` settles.
    let serving = tokio::spawn(async move {
        take(&mut first, usize::MAX, 64, Duration::from_secs(5)).await;
        first
    });
    let (mut second, taken) = joining.await.expect("second");
    assert_eq!(taken.messages.len(), 1, "the new owner consumes");
    let mut first = serving.await.expect("first");
    second.close().await.expect("close");
    first.close().await.expect("close");
}

async fn two_consumers_share_partitions_without_loss(strategy: &str) {
    support::init_tracing();
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(4).await.expect("topic");
    let group = unique("g");
    kafka
        .produce(&topic, numbered(0, 200))
        .await
        .expect("produce");
    let source = || {
        KafkaSource::builder(
            kafka
                .settings()
                .set("partition.assignment.strategy", strategy),
        )
        .group(&group)
        .topic(&topic)
        .build()
    };
    let ledger = Ledger::default();
    let start = |source| {
        TestConsumer::working(
            source,
            &ledger,
            Duration::from_millis(1),
            DeliveryOrder::Partition,
            8,
        )
    };
    let first = start(source().await.expect("first"));
    eventually("some progress", PATIENCE, || async {
        ledger.distinct() >= 20
    })
    .await;
    let second = start(source().await.expect("second"));
    settled(&[&first, &second], 4, PATIENCE).await;
    kafka
        .produce(&topic, numbered(200, 200))
        .await
        .expect("produce more");
    ledger.wait_for_all(400, "all 400 messages").await;
    assert!(
        first.revocations() >= 1,
        "the first consumer gave partitions up"
    );
    // The first leaves: the second takes everything over and, before it
    // stops, commits what the group had left uncommitted (a commit refused
    // during the rebalance means those messages are processed again).
    first.stop().await;
    eventually(
        "the second consumer to commit everything",
        PATIENCE,
        || async {
            second.assigned() == 4 && kafka.unacknowledged(&topic, &group).await.expect("lag") == 0
        },
    )
    .await;
    second.stop().await;
    assert_eq!(kafka.unacknowledged(&topic, &group).await.expect("lag"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eager_rebalance_hands_partitions_over_without_loss() {
    two_consumers_share_partitions_without_loss("range").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooperative_rebalance_hands_partitions_over_without_loss() {
    two_consumers_share_partitions_without_loss("cooperative-sticky").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalance_gets_through_while_every_slot_is_taken() {
    support::init_tracing();
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(2).await.expect("topic");
    let group = unique("g");
    kafka
        .produce(&topic, numbered(0, 100))
        .await
        .expect("produce");
    let stuck_ledger = Ledger::default();
    // Its handlers never finish: every slot stays taken.
    let stuck = TestConsumer::start(
        kafka.source(&topic, &group).build().await.expect("stuck"),
        &stuck_ledger,
        Duration::from_secs(3600),
        Consumer::builder()
            .ordering(DeliveryOrder::Unordered)
            .max_in_flight(4)
            .revoke_timeout(Duration::from_millis(500))
            .shutdown_deadline(Duration::from_millis(100)),
    );
    eventually(
        "the stuck consumer to own both partitions",
        PATIENCE,
        || async { stuck.assigned() == 2 },
    )
    .await;
    let ledger = Ledger::default();
    let joining = TestConsumer::recording(
        kafka.source(&topic, &group).build().await.expect("joining"),
        &ledger,
    );
    settled(&[&stuck, &joining], 2, PATIENCE).await;
    assert!(stuck.revocations() >= 1);
    eventually("the joining consumer to process", PATIENCE, || async {
        ledger.distinct() > 0
    })
    .await;
    joining.stop().await;
    stuck.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_revoked_while_paused_fetches_again_when_it_comes_back() {
    support::init_tracing();
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(2).await.expect("topic");
    let group = unique("g");
    for partition in 0..2 {
        kafka
            .produce_to_partition(
                &topic,
                partition,
                (0..100).map(|n| (partition * 100 + n).to_string()),
            )
            .await
            .expect("produce");
    }
    // A slow consumer with a small budget (2, which sizes the source's
    // hand-over queue): its fetching is paused most of the time, so the
    // rebalances below find its partitions paused. The
    // watchdog is off: it would hide a partition that never fetches again.
    // Eager: every partition is revoked, paused, and one comes straight back.
    let source = || {
        KafkaSource::builder(
            kafka
                .settings()
                .set("partition.assignment.strategy", "range"),
        )
        .group(&group)
        .topic(&topic)
        .watchdog_interval(Duration::ZERO)
        .build()
    };
    let ledger = Ledger::default();
    let slow = |source| {
        TestConsumer::working(
            source,
            &ledger,
            Duration::from_millis(20),
            DeliveryOrder::Partition,
            2,
        )
    };
    let first = slow(source().await.expect("first"));
    eventually("the first consumer to start", PATIENCE, || async {
        ledger.distinct() >= 10
    })
    .await;
    let second = slow(source().await.expect("second"));
    settled(&[&first, &second], 2, PATIENCE).await;
    second.stop().await;
    ledger
        .wait_for_all(200, "every message, the first consumer's partitions back")
        .await;
    first.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_dropped_without_shutdown_leaves_its_uncommitted_messages_to_the_group() {
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(2).await.expect("topic");
    let group = unique("g");
    kafka
        .produce(&topic, numbered(0, 40))
        .await
        .expect("produce");

    // Its handlers never finish: nothing it takes is ever committed.
    let crashed = TestConsumer::working(
        kafka.source(&topic, &group).build().await.expect("source"),
        &Ledger::default(),
        Duration::from_secs(3600),
        DeliveryOrder::Unordered,
        256,
    );
    eventually("the consumer to own the partitions", PATIENCE, || async {
        crashed.assigned() == 2
    })
    .await;
    crashed.crash().await;

    let ledger = Ledger::default();
    let survivor = TestConsumer::recording(
        kafka.source(&topic, &group).build().await.expect("source"),
        &ledger,
    );
    ledger.wait_for_all(40, "every message").await;
    survivor.stop().await;
    assert_eq!(kafka.unacknowledged(&topic, &group).await.expect("lag"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_source_commits_nothing_more_and_refuses_late_acks() {
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(1).await.expect("topic");
    let group = unique("g");
    kafka
        .produce(&topic, numbered(0, 5))
        .await
        .expect("produce");
    let mut source = kafka.source(&topic, &group).build().await.expect("source");
    assert_eq!(take(&mut source, 5, 64, PATIENCE).await.messages.len(), 5);
    let mut acker = source.acker();
    source.close().await.expect("close");

    let mut ack = PartitionAck::new(PartitionKey::new(topic.as_str(), 0));
    ack.watermark = Some(Position::Offset(4));
    let late = acker
        .ack(&AckBatch {
            partitions: vec![ack],
            sync: true,
        })
        .await;
    assert!(matches!(late, Err(AckError::NotAssigned(_))), "{late:?}");
    assert_eq!(
        kafka.offsets(&topic, &group).await.expect("offsets"),
        vec![(0, None, 5)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcast_consumers_each_get_every_message_from_the_end() {
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(1).await.expect("topic");
    kafka
        .produce(&topic, numbered(0, 5))
        .await
        .expect("history");
    let build = || {
        KafkaSource::builder(kafka.settings())
            .group("dashboard")
            .topic(&topic)
            .broadcast()
            .build()
    };
    let (first_source, second_source) = (
        build().await.expect("first"),
        build().await.expect("second"),
    );
    assert_ne!(first_source.group_id(), second_source.group_id());
    let (first_ledger, second_ledger) = (Ledger::default(), Ledger::default());
    let first = TestConsumer::recording(first_source, &first_ledger);
    let second = TestConsumer::recording(second_source, &second_ledger);
    // Broadcast starts at the end of each partition, wherever the end is
    // when the consumer first fetches: produce probes until both see one.
    let mut next_id = 5;
    eventually("both consumers to receive new messages", PATIENCE, || {
        let probe = numbered(next_id, 1);
        next_id += 1;
        let kafka = &kafka;
        let topic = &topic;
        let (first_ledger, second_ledger) = (&first_ledger, &second_ledger);
        async move {
            kafka.produce(topic, probe).await.expect("probe");
            tokio::time::sleep(Duration::from_millis(100)).await;
            first_ledger.distinct() > 0 && second_ledger.distinct() > 0
        }
    })
    .await;
    kafka
        .produce(&topic, numbered(1000, 10))
        .await
        .expect("produce");
    for ledger in [&first_ledger, &second_ledger] {
        ledger
            .wait_until("the 10 new messages", || {
                (1000..1010).all(|id| ledger.count(id) == 1)
            })
            .await;
        assert!(
            (0..5).all(|id| ledger.count(id) == 0),
            "history before the start is skipped"
        );
    }
    first.stop().await;
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_carries_its_origin_and_is_confirmed_by_the_broker() {
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(1).await.expect("topic");
    let group = unique("g");
    let mut headers = Headers::new();
    headers.insert("tenant", Bytes::from_static(b"acme"));
    let mut poison = TestMessage::new("order-7", "{not json");
    poison.headers = headers;
    kafka.produce(&topic, vec![poison]).await.expect("produce");
    let mut source = kafka.source(&topic, &group).build().await.expect("source");
    let original = support::next_message(&mut source, PATIENCE).await;

    let dlq = format!("{topic}.{group}.dlq");
    kafka.create_topic(&dlq, 1).await.expect("dlq topic");
    let sink = source.dead_letter_sink().build().await.expect("sink");
    let letter = DeadLetter::new(original, "expected value at line 1", 3);
    sink.write(&letter)
        .await
        .expect("the broker accepted the dead letter");

    let records = kafka.read_all(&dlq).await.expect("read dlq");
    assert_eq!(records.len(), 1);
    let record = &records[0];
    assert_eq!(record.payload.as_ref(), b"{not json");
    assert_eq!(record.key.as_deref(), Some(&b"order-7"[..]));
    assert_eq!(record.header("tenant"), Some("acme"));
    assert_eq!(record.header(envelope::ORIGIN_SOURCE), Some(topic.as_str()));
    assert_eq!(record.header(envelope::ORIGIN_PARTITION), Some("0"));
    assert_eq!(record.header(envelope::ORIGIN_POSITION), Some("0"));
    assert_eq!(
        record.header(envelope::ORIGIN_KEY),
        None,
        "the record key is the key"
    );
    assert_eq!(record.header(envelope::ORIGIN_GROUP), Some(group.as_str()));
    assert_eq!(
        record.header(envelope::ERROR_MESSAGE),
        Some("expected value at line 1")
    );
    assert_eq!(record.header(envelope::ATTEMPTS), Some("3"));
    assert!(
        record
            .header(envelope::FAILED_LAST)
            .is_some_and(|at| at.parse::<u64>().is_ok())
    );

    let read = record.dead_letter().expect("a dead letter");
    assert_eq!(read.message.metadata().position(), Position::Offset(0));
    assert_eq!(
        read.message.key().map(|key| &key[..]),
        Some(&b"order-7"[..])
    );
    assert_eq!(read.message.headers().get_str("tenant"), Some("acme"));
    assert_eq!(read.attempts, 3);
    source.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_dead_letter_topic_the_sink_may_not_create_is_a_typed_error() {
    let kafka = KafkaBackend::mock();
    let topic = kafka.create_source(1).await.expect("topic");
    let group = unique("g");
    kafka
        .produce(&topic, vec![TestMessage::new("k", "poison")])
        .await
        .expect("produce");
    let mut source = kafka.source(&topic, &group).build().await.expect("source");
    let original = support::next_message(&mut source, PATIENCE).await;
    // The mock cluster creates any topic a metadata request names, unless
    // the client says not to.
    let sink = KafkaDeadLetterSink::builder(
        kafka.settings().set("allow.auto.create.topics", "false"),
        &group,
    )
    .create_missing_topics(false)
    .build()
    .await
    .expect("sink");

    let error = sink
        .write(&DeadLetter::new(original, "bad", 1))
        .await
        .expect_err("the topic is missing");
    let cause = error.0.downcast_ref::<Error>().expect("the crate's error");
    assert!(
        matches!(cause, Error::DeadLetterTopicMissing { topic: missing, .. } if *missing == sink.topic_for(&topic)),
        "{cause}"
    );
    assert!(cause.to_string().contains("create"), "{cause}");
    source.close().await.expect("close");
}

/// The source's own dead-letter sink knows the topics it reads: a template
/// that sends one's dead letters to one of them is refused when the sink is
/// built, not at its first write (which checked only the message's own
/// topic).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sources_dead_letter_sink_refuses_a_topic_it_consumes_when_built() {
    let kafka = KafkaBackend::mock();
    let orders = kafka.create_source(1).await.expect("topic");
    let payments = kafka.create_source(1).await.expect("topic");
    let group = unique("g");
    let mut source = KafkaSource::builder(kafka.settings())
        .group(&group)
        .topics([&orders, &payments])
        .build()
        .await
        .expect("source");
    for template in [orders.as_str(), payments.as_str(), "{topic}"] {
        let built = source
            .dead_letter_sink()
            .topic_template(template)
            .build()
            .await;
        assert!(
            matches!(built, Err(Error::Config { ref setting, .. }) if setting == "topic_template"),
            "{template}: {built:?}"
        );
    }
    let sink = source.dead_letter_sink().build().await.expect("sink");
    assert_eq!(sink.topic_for(&orders), format!("{orders}.{group}.dlq"));
    source.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_topic_is_a_typed_error() {
    let kafka = KafkaBackend::mock();
    let missing = unique("missing");
    let built = tokio::time::timeout(
        PATIENCE,
        kafka
            .source(&missing, &unique("g"))
            .connect_timeout(Duration::from_secs(5))
            .build(),
    )
    .await
    .expect("build returns within its connect timeout");
    match built {
        Err(Error::UnknownTopic { topic, .. }) => assert_eq!(topic, missing),
        other => panic!("expected UnknownTopic, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_broker_is_a_typed_error_within_the_connect_timeout() {
    // Port 1 on loopback: nothing listens there.
    let built = tokio::time::timeout(
        PATIENCE,
        KafkaSource::builder(KafkaSettings::new("127.0.0.1:1"))
            .group("g")
            .topic("t")
            .connect_timeout(Duration::from_secs(2))
            .build(),
    )
    .await
    .expect("build returns within its connect timeout");
    let error = built.expect_err("nothing listens on port 1");
    assert!(matches!(error, Error::Unreachable { .. }), "{error:?}");
    assert!(error.to_string().contains("bootstrap.servers"));
    assert!(SourceError::from(error).is_transient());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_setting_is_a_typed_error_naming_it() {
    let error =
        KafkaSource::builder(KafkaSettings::new("127.0.0.1:1").set("fetch.wait.max.ms", "soon"))
            .group("g")
            .topic("t")
            .build()
            .await
            .expect_err("librdkafka refuses the value");
    match error {
        Error::Config { setting, .. } => assert_eq!(setting, "fetch.wait.max.ms"),
        other => panic!("expected Config, got {other:?}"),
    }
}
