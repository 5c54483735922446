//! Retries handed back to the server: `-NAK` with the redelivery backoff's
//! delay (no tight redelivery loop), the delivery count as the attempt, and
//! the retry cap (`max_deliveries`), past which the source dead-letters the
//! message itself.

mod support;

use std::time::Duration;

use intake_core::{Constant, Consumer, DeliveryOrder, HandlerError, Message};
use support::{NatsBackend, Running, Seen, wait_until};

fn always_failing(
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
            Err::<(), _>(HandlerError::retryable("always fails"))
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_comes_back_after_the_redelivery_backoffs_delay_not_at_once() {
    let Some(backend) = NatsBackend::new("nak delay").await else {
        return;
    };
    let stream = support::unique("nakdelay");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    support::produce(backend.client(), &stream, support::numbered("m", 1))
        .await
        .expect("produce");
    let source = backend
        .source(&stream, "nak")
        .redelivery_backoff(Constant::new(Duration::from_secs(1)).retry_forever())
        .unlimited_deliveries()
        .build()
        .await
        .expect("source");
    let counters = source.counters();
    let acker = source.acker();
    let seen = Seen::default();
    let running = Running::start(
        Consumer::builder()
            .ordering(DeliveryOrder::Unordered)
            // The consumer-level backoff would space the attempts out too:
            // off, so only the nak's delay does.
            .backoff(intake_core::Disabled),
        source,
        acker,
        always_failing(seen.clone()),
    );
    wait_until("the first delivery", Duration::from_secs(30), || {
        seen.total() >= 1
    })
    .await;
    // 2.5 s with a 1 s delay: three deliveries at most. Without a delay the
    // server redelivers at once, hundreds of times.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    running.stop().await;
    let attempts = seen.attempts(b"m0");
    assert!(
        (2..=4).contains(&attempts.len()),
        "deliveries in 2.5 s with a 1 s nak delay: {attempts:?}"
    );
    assert_eq!(
        attempts,
        (1..=attempts.len() as u32).collect::<Vec<_>>(),
        "each delivery carries the server's count as its attempt"
    );
    assert!(counters.naks() >= 2, "{} naks", counters.naks());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_delivered_more_often_than_max_deliveries_is_dead_lettered_by_the_source() {
    let Some(backend) = NatsBackend::new("max deliveries").await else {
        return;
    };
    let stream = support::unique("maxdeliver");
    support::create_stream(backend.client(), &stream)
        .await
        .expect("stream");
    support::produce(backend.client(), &stream, support::numbered("m", 2))
        .await
        .expect("produce");
    let source = backend
        .source(&stream, "capped")
        .max_deliveries(3)
        .build()
        .await
        .expect("source");
    let counters = source.counters();
    let acker = source.acker();
    let seen = Seen::default();
    let handler = {
        let seen = seen.clone();
        tower::service_fn(move |message: Message| {
            let seen = seen.clone();
            async move {
                seen.record(&message);
                match &message.payload()[..] {
                    b"m0" => Err(HandlerError::retryable("m0 always fails")),
                    _ => Ok(()),
                }
            }
        })
    };
    let running = Running::start(
        Consumer::builder()
            .ordering(DeliveryOrder::Unordered)
            .backoff(intake_core::Disabled),
        source,
        acker,
        handler,
    );
    wait_until("the source's dead letter", Duration::from_secs(30), || {
        counters.source_dead_letters() >= 1
    })
    .await;
    wait_until("everything settled", Duration::from_secs(30), || {
        support::block_on_unacknowledged(backend.client(), &stream, "capped") == 0
    })
    .await;
    running.stop().await;
    assert_eq!(
        seen.attempts(b"m0"),
        [1, 2, 3],
        "three deliveries handled, the fourth dead-lettered"
    );
    assert_eq!(seen.count(b"m1"), 1);
    let letters = intake_core::backend::testkit::Backend::dead_letters(&backend, &stream, "capped")
        .await
        .expect("read the dead letters");
    assert_eq!(letters.len(), 1, "{letters:?}");
    let letter = &letters[0];
    assert_eq!(&letter.message.payload()[..], b"m0");
    assert_eq!(letter.class, intake_core::ErrorClass::Retryable);
    assert_eq!(letter.attempts, 3);
    assert!(
        letter.error.contains("max_deliveries = 3"),
        "{}",
        letter.error
    );
    assert_eq!(counters.terms(), 1, "the original is terminated");
}
