//! Handlers slower than the consumer's `ack_wait`: the source reports every
//! delivery it holds in progress (`+WPI`), so the server does not deliver a
//! second copy while the first still runs, or still waits for its turn.

mod support;

use std::time::Duration;

use intake_core::{Consumer, DeliveryOrder, HandlerError, Message};
use support::{NatsBackend, Running, Seen, wait_until};

const ACK_WAIT: Duration = Duration::from_secs(1);
/// Three and a half `ack_wait`s: without progress reports the server would
/// deliver the message again three times meanwhile.
const SLOW: Duration = Duration::from_millis(3_500);

fn slow_on(
    payload: &'static str,
    seen: Seen,
) -> impl tower::Service<
    Message,
    Response = (),
    Error = HandlerError,
    Future = impl Future<Output = Result<(), HandlerError>> + Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |message: Message| {
        let seen = seen.clone();
        async move {
            seen.record(&message);
            if &message.payload()[..] == payload.as_bytes() {
                tokio::time::sleep(SLOW).await;
            }
            Ok::<_, HandlerError>(())
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_slower_than_ack_wait_is_not_delivered_again_while_it_runs() {
    let Some(backend) = NatsBackend::new("slow handler").await else {
        return;
    };
    let stream = support::unique("slow");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    support::produce(backend.client(), &stream, support::numbered("m", 3))
        .await
        .expect("produce");
    let source = backend
        .source(&stream, "slow")
        .ack_wait(ACK_WAIT)
        .build()
        .await
        .expect("source");
    let counters = source.counters();
    let acker = source.acker();
    let seen = Seen::default();
    let running = Running::start(
        Consumer::builder()
            .ordering(DeliveryOrder::Unordered)
            .max_in_flight(8),
        source,
        acker,
        slow_on("m1", seen.clone()),
    );
    wait_until("the three messages", Duration::from_secs(30), || {
        seen.total() >= 3
    })
    .await;
    // The slow one runs 3.5 s: finished and acknowledged once it is back
    // to zero held.
    wait_until(
        "the slow handler to finish",
        Duration::from_secs(30),
        || support::block_on_unacknowledged(backend.client(), &stream, "slow") == 0,
    )
    .await;
    running.stop().await;
    assert_eq!(
        seen.count(b"m1"),
        1,
        "delivered once while it ran: {:?}",
        seen.attempts(b"m1")
    );
    assert!(
        counters.progress_reports() >= 2,
        "{} reports",
        counters.progress_reports()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_waiting_behind_a_slow_handler_is_not_delivered_again() {
    let Some(backend) = NatsBackend::new("queued behind a slow handler").await else {
        return;
    };
    let stream = support::unique("queued");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    support::produce(backend.client(), &stream, support::numbered("m", 3))
        .await
        .expect("produce");
    let source = backend
        .source(&stream, "queued")
        .ack_wait(ACK_WAIT)
        .build()
        .await
        .expect("source");
    let acker = source.acker();
    let seen = Seen::default();
    // One partition, one at a time: m1 and m2 wait behind m0 for 3.5 s.
    let running = Running::start(
        Consumer::builder()
            .ordering(DeliveryOrder::Partition)
            .max_in_flight(8),
        source,
        acker,
        slow_on("m0", seen.clone()),
    );
    wait_until("the three messages", Duration::from_secs(30), || {
        seen.total() >= 3
    })
    .await;
    wait_until("everything acknowledged", Duration::from_secs(30), || {
        support::block_on_unacknowledged(backend.client(), &stream, "queued") == 0
    })
    .await;
    running.stop().await;
    for payload in [&b"m0"[..], b"m1", b"m2"] {
        assert_eq!(
            seen.count(payload),
            1,
            "{payload:?}: {:?}",
            seen.attempts(payload)
        );
    }
}
