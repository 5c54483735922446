//! Channels and connections lost under a source driven by hand, against a
//! real RabbitMQ: the lost channel's partition is revoked, its tags are
//! refused, the next channel opens only after the revocation completed, with
//! the prefetch the consumer's limits give, and nothing is lost.
//!
//! Each test skips with a printed reason when no broker listens on
//! 127.0.0.1:5672, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use intake_amqp::AmqpSource;
use intake_core::backend::testkit::skip_or_fail;
use intake_core::consumer::DEFAULT_MAX_IN_FLIGHT_BYTES;
use intake_core::{
    Message, PartitionKey,
    backend::{AckError, Source, SourceEvent},
};
use support::steps::{PATIENCE, ack_through, arriving_within, limits, receive, settle_at};
use support::{AmqpBackend, close_connection_named, unique};

#[tokio::test]
async fn a_consumer_dropped_mid_run_leaves_its_messages_to_another_and_none_is_lost() {
    let Some(backend) = AmqpBackend::connect_or_skip("dropped_consumer").await else {
        return;
    };
    let queue = backend.classic_queue("dropped").await.unwrap();
    backend.publish_numbered(&queue, 20).await.unwrap();

    let mut first = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .build()
        .await
        .unwrap();
    first.set_limits(limits(10, DEFAULT_MAX_IN_FLIGHT_BYTES));
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
        .build()
        .await
        .unwrap();
    second.set_limits(limits(20, DEFAULT_MAX_IN_FLIGHT_BYTES));
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
    let mut source = AmqpSource::builder(
        intake_amqp::AmqpSettings::new(backend.url()).connection_name(name.as_str()),
    )
    .queue(queue.as_str())
    .build()
    .await
    .unwrap();
    source.set_limits(limits(5, DEFAULT_MAX_IN_FLIGHT_BYTES));
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
async fn a_full_budget_takes_no_delivery_but_still_notices_a_lost_channel() {
    let Some(backend) = AmqpBackend::connect_or_skip("full_budget").await else {
        return;
    };
    let queue = backend.classic_queue("full-budget").await.unwrap();
    backend.publish(&queue, &[b"a", b"b", b"c"]).await.unwrap();
    let name = unique("full-budget-conn");
    let mut source = AmqpSource::builder(
        intake_amqp::AmqpSettings::new(backend.url()).connection_name(name.as_str()),
    )
    .queue(queue.as_str())
    .build()
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
    let mut source = AmqpSource::builder(
        intake_amqp::AmqpSettings::new(backend.url()).connection_name(name.as_str()),
    )
    .queue(queue.as_str())
    .build()
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
    revocation.complete(intake_core::backend::RevocationOutcome::default());
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

/// The deliveries of channel `epoch` until at least `count` arrived (all
/// that came with them, too), other events left aside.
async fn deliveries_on(source: &mut AmqpSource, epoch: u32, count: usize) -> Vec<Message> {
    let partition = PartitionKey::new(source.source_name(), epoch);
    let mut on_it = Vec::new();
    let mut buffer = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while on_it.len() < count {
            if let SourceEvent::Delivered = source.next(&mut buffer, 1000).await.unwrap() {
                on_it.extend(
                    buffer
                        .drain(..)
                        .filter(|message| message.metadata().partition_key() == partition),
                );
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("only {} of {count} arrived on channel {epoch}", on_it.len()));
    on_it
}

#[tokio::test]
async fn a_reopened_channel_gets_its_prefetch_from_the_consumers_limits() {
    let Some(backend) = AmqpBackend::connect_or_skip("reopened_prefetch").await else {
        return;
    };
    let queue = backend.classic_queue("reopened-prefetch").await.unwrap();
    backend.publish_numbered(&queue, 10).await.unwrap();
    let name = unique("conn");
    let mut source = AmqpSource::builder(
        intake_amqp::AmqpSettings::new(backend.url()).connection_name(name.as_str()),
    )
    .queue(queue.as_str())
    .build()
    .await
    .unwrap();
    source.set_limits(limits(3, DEFAULT_MAX_IN_FLIGHT_BYTES));
    deliveries_on(&mut source, 1, 3).await;

    if let Err(why) = close_connection_named(&name).await {
        skip_or_fail(
            "reopened_prefetch",
            &format!("cannot close the connection: {why}"),
        );
        backend.cleanup().await;
        return;
    }

    // Nothing is acknowledged on the new channel either: it holds three.
    let on_new = deliveries_on(&mut source, 2, 3).await;
    assert_eq!(
        on_new.len(),
        3,
        "the new channel took more than its prefetch"
    );
    let more = arriving_within(&mut source, Duration::from_millis(300)).await;
    assert!(
        more.is_empty(),
        "the new channel took {} past the prefetch",
        more.len()
    );
    source.close().await.unwrap();
    backend.cleanup().await;
}

/// RabbitMQ bounds a prefetch by count only, and sets it as a consumer
/// starts: the first channel knows no message size and takes the count; a
/// reopened one keeps what the recent sizes let fit in half the bytes.
#[tokio::test]
async fn a_reopened_channel_prefetches_within_half_the_byte_budget_at_the_recent_size() {
    let Some(backend) = AmqpBackend::connect_or_skip("reopened_prefetch_bytes").await else {
        return;
    };
    let queue = backend
        .classic_queue("reopened-prefetch-bytes")
        .await
        .unwrap();
    let payload = vec![b'x'; 100_000];
    let payloads: Vec<&[u8]> = (0..20).map(|_| payload.as_slice()).collect();
    backend.publish(&queue, &payloads).await.unwrap();
    let name = unique("conn");
    let mut source = AmqpSource::builder(
        intake_amqp::AmqpSettings::new(backend.url()).connection_name(name.as_str()),
    )
    .queue(queue.as_str())
    .build()
    .await
    .unwrap();
    // 256 deliveries of these would be 25 MB; half of 1 MiB holds five.
    source.set_limits(limits(256, 1 << 20));
    deliveries_on(&mut source, 1, 20).await;

    if let Err(why) = close_connection_named(&name).await {
        skip_or_fail(
            "reopened_prefetch_bytes",
            &format!("cannot close the connection: {why}"),
        );
        backend.cleanup().await;
        return;
    }

    let first = deliveries_on(&mut source, 2, 5).await;
    assert_eq!(first.len(), 5, "the new channel took more than five");
    let more = arriving_within(&mut source, Duration::from_millis(300)).await;
    assert!(
        more.is_empty(),
        "the new channel took {} past five 100 kB messages",
        more.len()
    );

    // Acknowledged, they make room for as many again.
    let mut acker = source.acker();
    ack_through(&mut acker, first.last().unwrap())
        .await
        .unwrap();
    assert_eq!(deliveries_on(&mut source, 2, 5).await.len(), 5);
    let more = arriving_within(&mut source, Duration::from_millis(300)).await;
    assert!(more.is_empty(), "{} past the prefetch", more.len());
    source.close().await.unwrap();
    backend.cleanup().await;
}
