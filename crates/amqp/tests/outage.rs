//! Outages between the consumer and RabbitMQ, made with a TCP proxy of the
//! test's own that the test cuts (the shared broker is never stopped): a
//! network partition that keeps connections open but silent, connections
//! that end, and a broker that answers the handshake and then stalls.
//!
//! The URLs turn heartbeats off, so that nothing but intake's own bounds can
//! end a wait: a wait without one would hang for good, and the test's guard
//! (`HANG`) would fail it.
//!
//! Each test skips with a printed reason when no broker listens on
//! 127.0.0.1:5672, unless `INTAKE_REQUIRE_BROKERS=1`.

mod support;

use std::time::Duration;

use intake_amqp::AmqpSource;
use intake_core::{
    Exponential, Message,
    backend::{AckBatch, AckError, Acker, PartitionAck, Source, SourceEvent},
};
use support::proxy::{Mode, Proxy};
use support::{AmqpBackend, broker_address, url_at};

/// Far above every bound in play: reaching it means a hang.
const HANG: Duration = Duration::from_secs(60);

/// Reads until `count` messages arrived, ignoring assignment changes.
async fn take(source: &mut AmqpSource, count: usize) -> Vec<Message> {
    let mut taken = Vec::new();
    let mut buffer = Vec::new();
    tokio::time::timeout(HANG, async {
        while taken.len() < count {
            if let SourceEvent::Delivered = source.next(&mut buffer, count).await.unwrap() {
                taken.append(&mut buffer);
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("only {} of {count} messages arrived", taken.len()));
    taken
}

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

#[tokio::test]
async fn closing_the_source_during_a_network_partition_ends_within_the_close_timeout() {
    let Some(backend) = AmqpBackend::connect_or_skip("close_during_partition").await else {
        return;
    };
    let queue = backend.classic_queue("close-partition").await.unwrap();
    backend.publish(&queue, &[b"a", b"b", b"c"]).await.unwrap();
    let proxy = Proxy::start(broker_address()).await.unwrap();
    let mut source = AmqpSource::builder(url_at(proxy.address(), "heartbeat=0"))
        .queue(queue.as_str())
        .build()
        .await
        .unwrap();
    take(&mut source, 3).await;

    proxy.set(Mode::Blackhole);
    let closed = tokio::time::timeout(HANG, source.close())
        .await
        .expect("closing hangs while the broker cannot answer");
    let error = closed.expect_err("the broker never answered the close");
    assert!(error.is_transient(), "{error:?}");
    // The broker's failure is the source error's cause, not its own text.
    let chain = intake_core::error::ErrorChain::new(&error).to_string();
    assert!(chain.contains("close"), "{chain}");

    // Once the connection is really gone, the broker hands the three back.
    proxy.drop_connections();
    let mut again = AmqpSource::builder(backend.url())
        .queue(queue.as_str())
        .build()
        .await
        .unwrap();
    let back = take(&mut again, 3).await;
    assert!(back.iter().all(|message| message.metadata().attempt() == 2));
    again.close().await.unwrap();
    backend.cleanup().await;
}

#[tokio::test]
async fn acknowledging_during_a_network_partition_or_after_the_loss_returns_at_once() {
    let Some(backend) = AmqpBackend::connect_or_skip("ack_during_partition").await else {
        return;
    };
    let queue = backend.classic_queue("ack-partition").await.unwrap();
    backend.publish(&queue, &[b"a", b"b"]).await.unwrap();
    let proxy = Proxy::start(broker_address()).await.unwrap();
    let mut source = AmqpSource::builder(url_at(proxy.address(), "heartbeat=0"))
        .queue(queue.as_str())
        .build()
        .await
        .unwrap();
    let mut acker = source.acker();
    let taken = take(&mut source, 2).await;

    // `basic.ack` has no answer: the frame goes into the socket, and nothing
    // waits on the broker.
    proxy.set(Mode::Blackhole);
    let acked = tokio::time::timeout(HANG, ack_through(&mut acker, &taken[0]))
        .await
        .expect("acknowledging hangs while the broker cannot answer");
    assert!(acked.is_ok(), "{acked:?}");

    // Once the source saw the channel go, its tags are refused at once.
    proxy.drop_connections();
    let mut buffer = Vec::new();
    let lost = tokio::time::timeout(HANG, source.next(&mut buffer, 10))
        .await
        .expect("the loss is noticed")
        .unwrap();
    assert!(matches!(lost, SourceEvent::Revoked(_)), "{lost:?}");
    let refused = tokio::time::timeout(HANG, ack_through(&mut acker, &taken[1]))
        .await
        .expect("acknowledging a lost channel hangs");
    assert!(
        matches!(refused, Err(AckError::NotAssigned(_))),
        "{refused:?}"
    );
    backend.cleanup().await;
}

#[tokio::test]
async fn a_reconnect_to_a_broker_that_stalls_after_the_handshake_fails_within_the_connect_timeout()
{
    let Some(backend) = AmqpBackend::connect_or_skip("stalled_reconnect").await else {
        return;
    };
    let queue = backend.classic_queue("stalled-reconnect").await.unwrap();
    let proxy = Proxy::start(broker_address()).await.unwrap();
    let mut source = AmqpSource::builder(
        intake_amqp::AmqpSettings::new(url_at(proxy.address(), "heartbeat=0"))
            .connect_timeout(Duration::from_secs(1)),
    )
    .queue(queue.as_str())
    .reconnect_backoff(
        Exponential::new(Duration::from_millis(1), Duration::from_millis(1)).max_retries(2),
    )
    .build()
    .await
    .unwrap();
    let counters = source.counters();
    let mut buffer = Vec::new();
    let assigned = source.next(&mut buffer, 10).await.unwrap();
    assert!(matches!(assigned, SourceEvent::Assigned(_)), "{assigned:?}");

    // New connections get `start`, `tune` and `open-ok`, then silence: the
    // channel is never opened.
    proxy.set(Mode::StallAfterFrames(3));
    proxy.drop_connections();
    let error = tokio::time::timeout(HANG, async {
        loop {
            match source.next(&mut buffer, 10).await {
                Ok(SourceEvent::Delivered) => panic!("nothing was published"),
                Ok(_) => {}
                Err(error) => return error,
            }
        }
    })
    .await
    .expect("a reconnect to a stalled broker hangs");
    assert!(error.is_transient(), "{error:?}");
    // Retry 1 follows the loss of the young session (it had delivered
    // nothing), retry 2 the first stalled attempt; the second stalled
    // attempt uses the retries up.
    assert_eq!(counters.failed_reconnects(), 2);
    backend.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_stopped_during_a_network_partition_returns_its_report() {
    let Some(backend) = AmqpBackend::connect_or_skip("stop_during_partition").await else {
        return;
    };
    let queue = backend.classic_queue("stop-partition").await.unwrap();
    backend.publish_numbered(&queue, 5).await.unwrap();
    let proxy = Proxy::start(broker_address()).await.unwrap();
    let source = AmqpSource::builder(url_at(proxy.address(), "heartbeat=0"))
        .queue(queue.as_str())
        .close_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let acker = source.acker();
    let handled = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handler = {
        let handled = handled.clone();
        tower::service_fn(move |_message: Message| {
            let handled = handled.clone();
            async move {
                handled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok::<_, intake_core::HandlerError>(())
            }
        })
    };
    let consumer = intake_core::Consumer::builder()
        .max_in_flight(8)
        .build(source, acker, handler)
        .expect("valid consumer settings");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(consumer.run(shutdown.clone()));
    tokio::time::timeout(HANG, async {
        while handled.load(std::sync::atomic::Ordering::SeqCst) < 5 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the five messages are handled");

    proxy.set(Mode::Blackhole);
    shutdown.cancel();
    let report = tokio::time::timeout(HANG, run)
        .await
        .expect("a consumer stopped during a partition never returns")
        .unwrap()
        .expect("the run itself did not fail");
    assert_eq!(report.succeeded, 5);
    proxy.drop_connections();
    backend.cleanup().await;
}

#[tokio::test]
async fn a_broker_that_drops_every_new_consumer_at_once_is_reconnected_to_with_backoff() {
    let Some(backend) = AmqpBackend::connect_or_skip("dropped_at_once").await else {
        return;
    };
    let queue = backend.classic_queue("dropped-at-once").await.unwrap();
    let proxy = Proxy::start(broker_address()).await.unwrap();
    let policy = support::RecordingBackoff::default();
    let mut source = AmqpSource::builder(url_at(proxy.address(), "heartbeat=0"))
        .queue(queue.as_str())
        .reconnect_backoff(policy.clone())
        .build()
        .await
        .unwrap();
    let mut buffer = Vec::new();
    let assigned = source.next(&mut buffer, 10).await.unwrap();
    assert!(matches!(assigned, SourceEvent::Assigned(_)), "{assigned:?}");

    // Each new connection gets through the handshake, the channel, the
    // queue check, `basic.qos` and `basic.consume` (seven frames), and is
    // closed right after: every reconnect "succeeds".
    proxy.set(Mode::CloseAfterFrames(7));
    proxy.drop_connections();
    let mut losses = 0;
    tokio::time::timeout(HANG, async {
        while losses < 5 {
            match source.next(&mut buffer, 10).await {
                Ok(SourceEvent::Revoked(_)) => losses += 1,
                Ok(_) => {}
                Err(error) => panic!("the source gave up: {error}"),
            }
        }
    })
    .await
    .expect("the connections keep being dropped");
    let asked = policy.asked();
    assert!(
        asked.starts_with(&[1, 2, 3]),
        "a session dropped before it delivered anything is a failed attempt: {asked:?}"
    );
    drop(proxy);
    backend.cleanup().await;
}

#[tokio::test]
async fn reachability_follows_a_broker_that_refuses_and_then_returns() {
    let Some(backend) = AmqpBackend::connect_or_skip("reachability").await else {
        return;
    };
    let queue = backend.classic_queue("reachability").await.unwrap();
    let proxy = Proxy::start(broker_address()).await.unwrap();
    let mut source = AmqpSource::builder(
        intake_amqp::AmqpSettings::new(url_at(proxy.address(), "heartbeat=0"))
            .connect_timeout(Duration::from_millis(300)),
    )
    .queue(queue.as_str())
    .reconnect_backoff(intake_core::Constant::new(Duration::from_millis(50)))
    .build()
    .await
    .unwrap();
    let reachability = source.reachability().expect("the source marks it");
    let mut buffer = Vec::new();
    let assigned = source.next(&mut buffer, 10).await.unwrap();
    assert!(matches!(assigned, SourceEvent::Assigned(_)), "{assigned:?}");
    assert_eq!(reachability.unreachable_for(), None);

    // Every new connection is closed before its handshake: the broker is
    // gone, and the source keeps reconnecting on its own.
    proxy.set(Mode::CloseAfterFrames(0));
    proxy.drop_connections();
    let mut polls = 0;
    tokio::time::timeout(HANG, async {
        while reachability.unreachable_for().is_none() {
            polls += 1;
            let _ =
                tokio::time::timeout(Duration::from_secs(1), source.next(&mut buffer, 10)).await;
        }
    })
    .await
    .expect("unreachable once a reconnect failed");

    proxy.set(Mode::Relay);
    tokio::time::timeout(HANG, async {
        while reachability.unreachable_for().is_some() {
            let _ =
                tokio::time::timeout(Duration::from_secs(1), source.next(&mut buffer, 10)).await;
        }
    })
    .await
    .expect("reachable again once a reconnect succeeded");
    assert!(polls > 0);
    drop(proxy);
    backend.cleanup().await;
}
