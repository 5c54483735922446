use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tower::{Layer, ServiceBuilder, ServiceExt};

use super::*;
use crate::backoff::{Constant, Disabled};
use crate::error::{ErrorClass, HandlerError};
use crate::layer_testing::{RecordingSink, Scripted, Step, UnderConsumer, message};
use crate::message::Position;
use crate::retry::RetryLayer;

fn quick(retries: u32) -> Constant {
    Constant::new(Duration::from_millis(10)).max_retries(retries)
}

fn dead_lettered(error: &HandlerError) -> Option<&DeadLettered> {
    error.cause().downcast_ref::<DeadLettered>()
}

#[tokio::test(start_paused = true)]
async fn a_permanent_failure_is_written_with_its_origin_error_and_attempts_then_acknowledged() {
    let sink = RecordingSink::default();
    let handler = Scripted::new([Step::Permanent("unknown customer")]);
    let outcome = DeadLetterLayer::new(sink.clone())
        .layer(handler.clone())
        .oneshot(message("order-1"))
        .await
        .expect_err("a dead-lettered message is an ignored failure");

    assert_eq!(
        outcome.class(),
        ErrorClass::Ignore,
        "the runtime acknowledges it"
    );
    let original = dead_lettered(&outcome).map(|d| d.error().class());
    assert_eq!(original, Some(ErrorClass::Permanent));

    let letters = sink.letters();
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    let metadata = letter.message.metadata();
    assert_eq!(&**metadata.source(), "orders");
    assert_eq!(metadata.partition(), 0);
    assert_eq!(metadata.position(), Position::Offset(7));
    assert_eq!(letter.message.key().map(|k| &k[..]), Some(&b"k1"[..]));
    assert_eq!(letter.message.headers().get_str("origin"), Some("test"));
    assert_eq!(&letter.message.payload()[..], b"order-1");
    assert!(
        letter.error.contains("unknown customer"),
        "{}",
        letter.error
    );
    assert_eq!(letter.attempts, 1);
    assert_eq!(letter.class, ErrorClass::Permanent);
    assert_eq!(
        letter.first_failed_at, letter.failed_at,
        "its first failure"
    );
    assert_eq!(handler.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn retry_inside_dead_letter_writes_the_message_once_its_retries_are_used_up() {
    let sink = RecordingSink::default();
    let handler = Scripted::new(std::iter::repeat_n(Step::Retryable("db down"), 10));
    let outcome = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(sink.clone()))
        .layer(RetryLayer::new(quick(3)))
        .service(handler.clone())
        .oneshot(message("order"))
        .await
        .expect_err("dead-lettered");
    assert_eq!(outcome.class(), ErrorClass::Ignore);
    assert_eq!(outcome.attempts(), 4);
    assert_eq!(handler.calls(), 4);
    let letters = sink.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].attempts, 4);
    assert_eq!(
        letters[0].class,
        ErrorClass::Retryable,
        "a retryable failure whose retries are used up"
    );
    assert!(letters[0].error.contains("db down"));
    assert_eq!(
        letters[0].message.metadata().attempt(),
        1,
        "the letter holds the message as delivered"
    );
}

#[tokio::test(start_paused = true)]
async fn a_permanent_failure_inside_retry_and_dead_letter_is_tried_once() {
    let sink = RecordingSink::default();
    let handler = Scripted::new([Step::Permanent("cannot decode payload as Order")]);
    ServiceBuilder::new()
        .layer(DeadLetterLayer::new(sink.clone()))
        .layer(RetryLayer::new(quick(3)))
        .service(handler.clone())
        .oneshot(message("{not json"))
        .await
        .expect_err("dead-lettered");
    assert_eq!(handler.calls(), 1, "a decode failure is never retried");
    assert_eq!(sink.letters().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_successful_message_is_never_written() {
    let sink = RecordingSink::default();
    DeadLetterLayer::new(sink.clone())
        .layer(Scripted::default())
        .oneshot(message("order"))
        .await
        .expect("success");
    assert_eq!(sink.writes(), 0);
}

#[tokio::test(start_paused = true)]
async fn ignored_and_interrupted_outcomes_are_not_dead_lettered() {
    let sink = RecordingSink::default();
    let outcome = DeadLetterLayer::new(sink.clone())
        .layer(Scripted::new([Step::Ignore]))
        .oneshot(message("order"))
        .await
        .expect_err("ignored");
    assert_eq!(outcome.class(), ErrorClass::Ignore);
    assert!(dead_lettered(&outcome).is_none());

    let token = CancellationToken::new();
    let interrupted = UnderConsumer::new(
        &token,
        ServiceBuilder::new()
            .layer(DeadLetterLayer::new(sink.clone()))
            .layer(RetryLayer::new(Constant::new(Duration::from_secs(60))))
            .service(Scripted::new([Step::Retryable("db down")]))
            .oneshot(message("order")),
    );
    let task = tokio::spawn(interrupted);
    tokio::time::sleep(Duration::from_secs(1)).await;
    token.cancel();
    let outcome = task.await.expect("no panic").expect_err("interrupted");
    assert_eq!(outcome.class(), ErrorClass::Interrupted);
    assert_eq!(sink.writes(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_failing_sink_leaves_the_message_unacknowledged_until_the_sink_recovers() {
    let sink = RecordingSink::default();
    sink.fail_writes(usize::MAX);
    let policy = FailurePolicy::dead_letter(sink.clone()).write_backoff(Disabled);
    let handler = Scripted::new(std::iter::repeat_n(Step::Permanent("bad order"), 10));
    let service = DeadLetterLayer::with_policy(policy).layer(handler.clone());

    // Each redelivery of the message fails the same way while the sink is
    // down: retryable, so the runtime neither acknowledges nor drops it.
    for _ in 0..3 {
        let outcome = service
            .clone()
            .oneshot(message("order"))
            .await
            .expect_err("not acknowledged");
        assert_eq!(outcome.class(), ErrorClass::Retryable);
        let failed = outcome.cause().downcast_ref::<DeadLetterWriteFailed>();
        assert_eq!(
            failed.map(|f| f.error().class()),
            Some(ErrorClass::Permanent)
        );
    }
    assert!(sink.letters().is_empty());

    sink.fail_writes(0);
    let outcome = service
        .clone()
        .oneshot(message("order"))
        .await
        .expect_err("dead-lettered");
    assert_eq!(outcome.class(), ErrorClass::Ignore);
    assert_eq!(sink.letters().len(), 1);
    assert_eq!(
        sink.writes(),
        3 * 2 + 1,
        "each delivery tried the letter, then its reference"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_write_is_retried_in_place_before_giving_up() {
    let sink = RecordingSink::default();
    sink.fail_writes(2);
    let outcome = DeadLetterLayer::new(sink.clone())
        .layer(Scripted::new([Step::Permanent("bad order")]))
        .oneshot(message("order"))
        .await
        .expect_err("dead-lettered");
    assert_eq!(outcome.class(), ErrorClass::Ignore);
    assert_eq!(sink.writes(), 3);
    assert_eq!(sink.letters().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_during_a_write_retry_leaves_the_message_unacknowledged() {
    let sink = RecordingSink::default();
    sink.fail_writes(usize::MAX);
    let token = CancellationToken::new();
    let service = DeadLetterLayer::new(sink.clone()).layer(Scripted::new([Step::Permanent("bad")]));
    let task = tokio::spawn(UnderConsumer::new(
        &token,
        service.oneshot(message("order")),
    ));
    tokio::time::sleep(Duration::from_millis(50)).await;
    token.cancel();
    let outcome = task.await.expect("no panic").expect_err("interrupted");
    assert_eq!(outcome.class(), ErrorClass::Interrupted);
    assert!(sink.letters().is_empty());
}

#[tokio::test(start_paused = true)]
async fn discard_acknowledges_without_writing_and_keeps_the_failure() {
    let outcome = DeadLetterLayer::with_policy(FailurePolicy::discard())
        .layer(Scripted::new([Step::Permanent("stale sample")]))
        .oneshot(message("order"))
        .await
        .expect_err("discarded");
    assert_eq!(outcome.class(), ErrorClass::Ignore);
    let discarded = outcome.cause().downcast_ref::<Discarded>();
    assert_eq!(
        discarded.map(|d| d.error().class()),
        Some(ErrorClass::Permanent)
    );
}

#[tokio::test(start_paused = true)]
async fn block_calls_the_handler_again_until_it_succeeds_even_after_permanent_failures() {
    let handler = Scripted::new([
        Step::Retryable("db down"),
        Step::Permanent("constraint violated"),
        Step::Retryable("db down"),
    ]);
    let policy = FailurePolicy::block(Constant::new(Duration::from_secs(1)).max_retries(1))
        .expect("a waiting backoff");
    DeadLetterLayer::with_policy(policy)
        .layer(handler.clone())
        .oneshot(message("order"))
        .await
        .expect("the fourth call succeeds; past the cap the last delay repeats");
    assert_eq!(handler.attempts_seen(), vec![1, 2, 3, 4]);
}

#[tokio::test(start_paused = true)]
async fn block_with_retry_inside_keeps_counting_attempts() {
    let handler = Scripted::new(std::iter::repeat_n(Step::Retryable("db down"), 3));
    let policy = FailurePolicy::block(Constant::new(Duration::from_secs(1))).expect("valid");
    ServiceBuilder::new()
        .layer(DeadLetterLayer::with_policy(policy))
        .layer(RetryLayer::new(quick(1)))
        .service(handler.clone())
        .oneshot(message("order"))
        .await
        .expect("succeeds on the fourth attempt");
    assert_eq!(handler.attempts_seen(), vec![1, 2, 3, 4]);
}

#[tokio::test(start_paused = true)]
async fn a_blocked_message_is_released_unacknowledged_on_shutdown() {
    let handler = Scripted::new(std::iter::repeat_n(Step::Permanent("bad"), 1000));
    let policy = FailurePolicy::block(Constant::new(Duration::from_secs(10))).expect("valid");
    let token = CancellationToken::new();
    let service = DeadLetterLayer::with_policy(policy).layer(handler.clone());
    let task = tokio::spawn(UnderConsumer::new(
        &token,
        service.oneshot(message("order")),
    ));
    tokio::time::sleep(Duration::from_secs(25)).await;
    token.cancel();
    let outcome = task.await.expect("no panic").expect_err("interrupted");
    assert_eq!(outcome.class(), ErrorClass::Interrupted);
    assert_eq!(handler.calls(), 3);
}

#[test]
fn block_refuses_a_backoff_that_never_waits() {
    let error = FailurePolicy::block(Disabled).expect_err("a busy loop is refused");
    assert_eq!(error.setting, "failure_policy.block");
    assert!(FailurePolicy::block(Constant::new(Duration::ZERO).max_retries(0)).is_err());
}

#[test]
fn block_refuses_an_invalid_backoff() {
    let error = FailurePolicy::block(crate::backoff::Exponential::default().jitter(f64::NAN))
        .expect_err("a NaN jitter is refused when the policy is built");
    assert_eq!(error.setting, "failure_policy.block");
    assert!(error.problem.contains("backoff.jitter"), "{error}");
}

/// A destination that takes letters up to a size, like a Kafka topic's
/// `max.message.bytes`, and refuses larger ones for good.
#[derive(Clone, Default)]
struct SizeLimitedSink {
    inner: RecordingSink,
}

impl SizeLimitedSink {
    const LIMIT: usize = 1024;
}

#[async_trait::async_trait]
impl DeadLetterSink for SizeLimitedSink {
    async fn write(&self, letter: &DeadLetter) -> Result<(), DeadLetterError> {
        let size = letter.message.payload().len() + letter.error.len();
        if size > Self::LIMIT {
            return Err(DeadLetterError::rejected(format!(
                "a letter of {size} bytes is over the destination's {} bytes",
                Self::LIMIT
            )));
        }
        self.inner.write(letter).await
    }
}

fn large_message() -> crate::message::Message {
    let original = message("order");
    crate::message::Message::new(
        bytes::Bytes::from(vec![b'x'; 4096]),
        original.metadata().clone(),
    )
    .with_key(bytes::Bytes::from_static(b"k1"))
    .with_headers(original.headers().clone())
}

#[tokio::test(start_paused = true)]
async fn a_letter_the_destination_rejects_is_written_at_once_as_a_reference_to_its_payload() {
    let sink = SizeLimitedSink::default();
    let outcome = DeadLetterLayer::new(sink.clone())
        .layer(Scripted::new([Step::Permanent("unknown customer")]))
        .oneshot(large_message())
        .await
        .expect_err("dead-lettered");
    assert_eq!(outcome.class(), ErrorClass::Ignore, "acknowledged");
    let verdict = dead_lettered(&outcome).expect("dead-lettered");
    assert!(verdict.is_reference());
    assert_eq!(verdict.error().class(), ErrorClass::Permanent);
    assert_eq!(sink.inner.writes(), 1, "no retry of a rejected letter");
    let letters = sink.inner.letters();
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert_eq!(
        letter.reference,
        Some(PayloadReference {
            payload_bytes: 4096,
            key_bytes: 2,
            headers: 1,
            header_bytes: "origin".len() + "test".len(),
        })
    );
    assert!(letter.message.payload().is_empty(), "no payload");
    assert_eq!(letter.message.key(), None, "no key");
    let metadata = letter.message.metadata();
    assert_eq!(
        (
            &**metadata.source(),
            metadata.partition(),
            metadata.position()
        ),
        ("orders", 0, Position::Offset(7)),
        "the origin, to find the message in its source"
    );
    assert!(letter.message.headers().is_empty(), "none of its headers");
    let carrier = envelope::Carrier::keyed(Broker::Memory);
    let envelope = envelope::Envelope::new(letter, &carrier);
    assert!(
        envelope
            .fields()
            .any(|field| field == (envelope::REFERENCE_PAYLOAD_BYTES, &b"4096"[..])),
        "the sizes are fields of the envelope: {envelope:?}"
    );
    assert!(
        letter.error.contains("unknown customer"),
        "{}",
        letter.error
    );
}

#[tokio::test(start_paused = true)]
async fn a_letter_that_keeps_failing_falls_back_to_its_reference_after_the_capped_attempts() {
    let sink = RecordingSink::default();
    // The letter and its five retries fail; the reference goes through.
    sink.fail_writes(6);
    let outcome = DeadLetterLayer::new(sink.clone())
        .layer(Scripted::new([Step::Permanent("bad order")]))
        .oneshot(message("order"))
        .await
        .expect_err("dead-lettered");
    assert!(dead_lettered(&outcome).is_some_and(DeadLettered::is_reference));
    assert_eq!(sink.writes(), 7);
    let letters = sink.letters();
    assert_eq!(letters.len(), 1);
    assert!(letters[0].reference.is_some());
}

#[tokio::test(start_paused = true)]
async fn an_undeliverable_letter_goes_to_the_fallback_policy_once_its_reference_failed_too() {
    let sink = RecordingSink::default();
    sink.fail_writes(usize::MAX);
    let policy = FailurePolicy::dead_letter(sink.clone()).or_else(FailurePolicy::discard());
    let outcome = DeadLetterLayer::with_policy(policy)
        .layer(Scripted::new([Step::Permanent("bad order")]))
        .oneshot(message("order"))
        .await
        .expect_err("discarded");
    assert_eq!(outcome.class(), ErrorClass::Ignore, "acknowledged: no loop");
    let discarded = outcome
        .cause()
        .downcast_ref::<Discarded>()
        .expect("discarded");
    assert_eq!(discarded.error().class(), ErrorClass::Permanent);
    assert!(
        discarded.undeliverable().is_some(),
        "says why it was not dead-lettered"
    );
    assert_eq!(
        sink.writes(),
        6 + 1,
        "the capped attempts, then the reference"
    );
}

#[tokio::test(start_paused = true)]
async fn a_second_destination_takes_what_the_first_could_not() {
    let first = RecordingSink::default();
    first.fail_writes(usize::MAX);
    let second = RecordingSink::default();
    let policy = FailurePolicy::dead_letter(first.clone())
        .write_backoff(Disabled)
        .or_else(FailurePolicy::dead_letter(second.clone()));
    let outcome = DeadLetterLayer::with_policy(policy)
        .layer(Scripted::new([Step::Permanent("bad order")]))
        .oneshot(message("order"))
        .await
        .expect_err("dead-lettered");
    assert!(dead_lettered(&outcome).is_some_and(|verdict| !verdict.is_reference()));
    assert_eq!(first.writes(), 2);
    let letters = second.letters();
    assert_eq!(letters.len(), 1);
    assert_eq!(
        &letters[0].message.payload()[..],
        b"order",
        "the whole letter"
    );
}

#[test]
fn the_error_text_of_a_dead_letter_is_capped_at_a_char_boundary() {
    let huge = "é".repeat(1_000_000);
    let letter = DeadLetter::new(message("order"), huge, 1);
    assert!(
        letter.error.len() <= DeadLetter::ERROR_LIMIT + 64,
        "{} bytes",
        letter.error.len()
    );
    assert!(letter.error.starts_with("éé"));
    assert!(letter.error.contains("bytes cut"), "says it was cut");
    let short = DeadLetter::new(message("order"), "bad order", 1);
    assert_eq!(short.error, "bad order");
}

#[tokio::test(start_paused = true)]
async fn a_huge_handler_error_reaches_the_destination_capped() {
    let sink = RecordingSink::default();
    let text: &'static str = Box::leak("x".repeat(5_000_000).into_boxed_str());
    let _ = DeadLetterLayer::new(sink.clone())
        .layer(Scripted::new([Step::Permanent(text)]))
        .oneshot(message("order"))
        .await;
    let letters = sink.letters();
    assert_eq!(letters.len(), 1);
    assert!(letters[0].error.len() <= DeadLetter::ERROR_LIMIT + 64);
}

mod replay_outputs {
    use std::sync::Arc;

    use super::*;
    use crate::message::{Headers, Message, Metadata};
    use crate::parking::{ATTEMPTS, ORIGIN, ORIGIN_PARTITION, ORIGIN_POSITION, PARKS};

    /// A letter of a message first consumed at orders/3 @ 42, which was
    /// parked as often as allowed before it failed for good.
    fn parked_out_letter() -> DeadLetter {
        let headers: Headers = [
            ("tenant", "acme"),
            (PARKS, "10"),
            (ATTEMPTS, "31"),
            ("intake.park.due", "1"),
        ]
        .into_iter()
        .collect();
        let message = Message::new(
            "payload",
            Metadata::new("orders".into(), 3, Position::Offset(42)),
        )
        .with_key("k")
        .with_headers(headers);
        DeadLetter::new(message, "still failing", 31)
    }

    #[test]
    fn a_replay_starts_with_no_parks_and_lands_in_the_partition_it_came_from() {
        let output = Replay::to_origin()
            .output_of(&parked_out_letter(), None)
            .expect("an output to the origin");
        assert_eq!(output.destination(), "orders");
        assert_eq!(output.partition(), Some(3));
        assert_eq!(output.headers().get_str("tenant"), Some("acme"));
        for park_header in [PARKS, ATTEMPTS, "intake.park.due"] {
            assert!(
                output.headers().get(park_header).is_none(),
                "{park_header} kept: a replay of a letter parked out would fail on its first 'later'"
            );
        }
    }

    #[test]
    fn a_replay_to_the_group_goes_its_way_back_as_the_message_first_delivered() {
        let way_back: Arc<str> = "orders.billing.returned".into();
        let output = Replay::to_group()
            .output_of(&parked_out_letter(), Some(&way_back))
            .expect("an output to the group");
        assert_eq!(output.destination(), "orders.billing.returned");
        assert_eq!(output.partition(), Some(3));
        let header = |name| output.headers().get_str(name);
        assert_eq!(
            (
                header(ORIGIN),
                header(ORIGIN_PARTITION),
                header(ORIGIN_POSITION)
            ),
            (Some("orders"), Some("3"), Some("42"))
        );
    }

    #[test]
    fn a_replay_to_the_group_without_a_way_back_is_refused_not_sent_to_every_group() {
        let error = Replay::to_group()
            .output_of(&parked_out_letter(), None)
            .expect_err("no way back to the group alone");
        assert!(
            matches!(error, StoreError::NoWayBackToGroup { ref origin } if origin == "orders"),
            "{error}"
        );
        assert!(error.to_string().contains("every group"), "{error}");
    }

    #[tokio::test]
    async fn a_dry_run_to_the_group_says_what_the_real_run_refuses() {
        use crate::dead_letter::{DeadLetterSink, DeadLetterStore, Filter, Selection};
        let broker = crate::memory::MemoryBroker::new();
        broker.create_topic("orders", 1).expect("topic");
        let sink = broker.dead_letter_sink("orders", "billing").expect("sink");
        sink.write(&parked_out_letter()).await.expect("written");
        let store = broker
            .dead_letter_store("orders", "billing")
            .expect("store");
        // The memory broker's parked copies come back to the topic itself:
        // it knows no way back to one group alone.
        let dry_run = store
            .replay(
                &Selection::Matching(Filter::all()),
                &Replay::to_group().dry_run(true),
            )
            .await;
        assert!(
            matches!(dry_run, Err(StoreError::NoWayBackToGroup { .. })),
            "a dry run promised a replay the real run refuses: {dry_run:?}"
        );
    }

    #[test]
    fn a_reference_keeps_where_a_parked_copy_was_first_delivered_and_nothing_else() {
        let mut headers: Headers = [("tenant", "acme")].into_iter().collect();
        headers.insert(ORIGIN, "orders");
        headers.insert(ORIGIN_PARTITION, "3");
        headers.insert(ORIGIN_POSITION, "42");
        let copy = Message::new(
            "a payload too large for the destination",
            Metadata::new("orders.billing.returned".into(), 3, Position::Offset(7)),
        )
        .with_key("k")
        .with_headers(headers);
        let reference = DeadLetter::new(copy, "too large", 1).to_reference();
        let names: Vec<&str> = reference
            .message
            .headers()
            .iter()
            .map(|header| &*header.name)
            .collect();
        assert_eq!(names, [ORIGIN, ORIGIN_PARTITION, ORIGIN_POSITION]);
        assert!(reference.message.payload().is_empty());
        assert!(reference.message.key().is_none());
        assert_eq!(
            crate::parking::first_delivery_of(&reference.message).map(|first| first.position),
            Some(Position::Offset(42))
        );
    }
}
