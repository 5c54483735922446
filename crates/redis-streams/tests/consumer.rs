//! The Redis Streams source and acker under the consumer runtime.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::time::Duration;

use intake_core::{Consumer, DeliveryOrder, HandlerError, Message};
use tokio_util::sync::CancellationToken;

use support::*;

/// Cancels `shutdown` once `count` calls of the returned closure were made.
fn stop_after(count: usize, shutdown: &CancellationToken) -> impl Fn() + Clone + use<> {
    let seen = Arc::new(AtomicUsize::new(0));
    let shutdown = shutdown.clone();
    move || {
        if seen.fetch_add(1, AtomicOrdering::SeqCst) + 1 == count {
            shutdown.cancel();
        }
    }
}

#[tokio::test]
async fn the_runtime_handles_and_acknowledges_every_entry() {
    let Some(mut redis) = redis_or_skip("the_runtime_handles_and_acknowledges_every_entry").await
    else {
        return;
    };
    let stream = unique("runtime");
    let group = unique("group");
    produce(&mut redis, &stream, "m", 1000).await;
    let source = group_builder(&stream, &group, "c1")
        .build()
        .await
        .expect("connect");
    let acker = source.acker();
    let shutdown = CancellationToken::new();
    let done = stop_after(1000, &shutdown);
    let handler = tower::service_fn(move |_message: Message| {
        done();
        std::future::ready(Ok::<_, HandlerError>(()))
    });
    let report = Consumer::builder()
        .max_in_flight(100)
        .ordering(DeliveryOrder::Unordered)
        .build(source, acker, handler)
        .expect("consumer")
        .run(shutdown)
        .await
        .expect("run");
    assert_eq!(report.succeeded, 1000);
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

#[tokio::test]
async fn a_retryable_failure_is_left_pending_and_comes_back_with_the_next_attempt() {
    let Some(mut redis) = redis_or_skip("a_retryable_failure_is_left_pending").await else {
        return;
    };
    let stream = unique("runtime-retry");
    let group = unique("group");
    produce(&mut redis, &stream, "m", 20).await;
    let source = group_builder(&stream, &group, "c1")
        .build()
        .await
        .expect("connect");
    let acker = source.acker();
    let shutdown = CancellationToken::new();
    let done = stop_after(20, &shutdown);
    let handler = tower::service_fn(move |message: Message| {
        let outcome = if message.metadata().attempt() == 1 {
            Err(HandlerError::retryable("downstream busy").without_backoff())
        } else {
            done();
            Ok(())
        };
        std::future::ready(outcome)
    });
    let report = tokio::time::timeout(
        Duration::from_secs(20),
        Consumer::builder()
            .max_in_flight(50)
            .ordering(DeliveryOrder::Key)
            .build(source, acker, handler)
            .expect("consumer")
            .run(shutdown),
    )
    .await
    .expect("every entry came back within the claim time")
    .expect("run");
    assert_eq!(report.requeued, 20, "each first attempt was left pending");
    assert_eq!(
        report.succeeded, 20,
        "and succeeded when it was claimed again"
    );
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}

#[tokio::test]
async fn shutdown_leaves_unfinished_entries_pending_for_the_next_run() {
    let Some(mut redis) =
        redis_or_skip("shutdown_leaves_unfinished_entries_pending_for_the_next_run").await
    else {
        return;
    };
    let stream = unique("runtime-stop");
    let group = unique("group");
    produce(&mut redis, &stream, "m", 10).await;
    let config =
        || group_builder(&stream, &group, "stable").claim_min_idle(Duration::from_secs(600));
    let source = config().build().await.expect("connect");
    let acker = source.acker();
    let shutdown = CancellationToken::new();
    let stop = stop_after(5, &shutdown);
    // Handles five, then stops while the other five wait behind a handler
    // that never finishes in time.
    let handler = tower::service_fn(move |message: Message| {
        let stop = stop.clone();
        async move {
            let n: usize = String::from_utf8_lossy(message.payload())
                .trim_start_matches('m')
                .parse()
                .unwrap_or(0);
            if n >= 5 {
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            stop();
            Ok::<_, HandlerError>(())
        }
    });
    let report = Consumer::builder()
        .max_in_flight(10)
        .ordering(DeliveryOrder::Unordered)
        .shutdown_deadline(Duration::from_millis(200))
        .build(source, acker, handler)
        .expect("consumer")
        .run(shutdown)
        .await
        .expect("run");
    assert_eq!(report.succeeded, 5);
    assert_eq!(
        unacknowledged(&mut redis, &stream, &group).await.ok(),
        Some(5)
    );

    // The next run of the same consumer takes them up at once.
    let mut source = config().build().await.expect("connect");
    let mut acker = source.acker();
    let again = receive(&mut source, 5, 10, Duration::from_secs(5)).await;
    let mut names = payloads(&again);
    names.sort();
    assert_eq!(names, vec!["m5", "m6", "m7", "m8", "m9"]);
    ack(&mut acker, &again).await;
    assert_all_acknowledged(&mut redis, &stream, &group).await;
}
