use std::sync::Mutex;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceBuilder, ServiceExt};

use super::*;
use crate::backoff::{Constant, Disabled, Exponential};
use crate::error::ErrorClass;
use crate::error::HandlerError;
use crate::layer_testing::{Scripted, Step, UnderConsumer, message};
use crate::message::Message;

fn quick(retries: u32) -> Constant {
    Constant::new(Duration::from_millis(10)).max_retries(retries)
}

#[tokio::test(start_paused = true)]
async fn retryable_failures_are_retried_and_each_attempt_is_visible_to_the_handler() {
    let handler = Scripted::new([Step::Retryable("db down"), Step::Retryable("db down")]);
    let result = Retry::new(handler.clone(), quick(5))
        .oneshot(message("order"))
        .await;
    assert!(result.is_ok());
    assert_eq!(handler.attempts_seen(), vec![1, 2, 3]);
}

#[tokio::test(start_paused = true)]
async fn a_permanent_failure_is_never_retried() {
    let handler = Scripted::new([Step::Permanent("bad order")]);
    let error = Retry::new(handler.clone(), quick(5))
        .oneshot(message("order"))
        .await
        .expect_err("permanent failures pass through");
    assert_eq!(error.class(), ErrorClass::Permanent);
    assert_eq!(error.attempts(), 1);
    assert_eq!(handler.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn retries_stop_at_the_policy_cap_and_the_error_counts_the_attempts() {
    let handler = Scripted::new(std::iter::repeat_n(Step::Retryable("db down"), 10));
    let error = Retry::new(handler.clone(), quick(3))
        .oneshot(message("order"))
        .await
        .expect_err("the cap is reached");
    assert!(error.is_retryable());
    assert_eq!(error.attempts(), 4);
    assert_eq!(handler.calls(), 4);
    assert!(error.to_string().contains("after 4 attempt(s)"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn the_default_policy_is_capped() {
    let handler = Scripted::new(std::iter::repeat_n(Step::Retryable("db down"), 100));
    let error = Retry::new(handler.clone(), Exponential::default())
        .oneshot(message("order"))
        .await
        .expect_err("no silent infinite retry");
    assert_eq!(handler.calls() as u32, Exponential::DEFAULT_MAX_RETRIES + 1);
    assert_eq!(error.attempts(), Exponential::DEFAULT_MAX_RETRIES + 1);
}

#[tokio::test(start_paused = true)]
async fn retrying_forever_is_possible_when_asked_for() {
    let handler = Scripted::new(std::iter::repeat_n(Step::Retryable("db down"), 60));
    let policy = Constant::new(Duration::from_millis(1)).retry_forever();
    Retry::new(handler.clone(), policy)
        .oneshot(message("order"))
        .await
        .expect("succeeds after 60 failures");
    assert_eq!(handler.calls(), 61);
}

#[tokio::test(start_paused = true)]
async fn a_disabled_policy_never_retries() {
    let handler = Scripted::new([Step::Retryable("db down")]);
    let error = Retry::new(handler.clone(), Disabled)
        .oneshot(message("order"))
        .await
        .expect_err("no retry");
    assert!(error.is_retryable());
    assert_eq!(handler.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn attempts_continue_from_the_brokers_delivery_count() {
    let handler = Scripted::new([Step::Retryable("db down")]);
    let mut redelivered = message("order");
    redelivered.metadata_mut().set_attempt(3);
    Retry::new(handler.clone(), quick(5))
        .oneshot(redelivered)
        .await
        .expect("second attempt succeeds");
    assert_eq!(handler.attempts_seen(), vec![3, 4]);
}

#[tokio::test(start_paused = true)]
async fn an_ignored_outcome_passes_through_untouched() {
    let handler = Scripted::new([Step::Ignore]);
    let error = Retry::new(handler.clone(), quick(5))
        .oneshot(message("order"))
        .await
        .expect_err("ignore is an error outcome");
    assert_eq!(error.class(), ErrorClass::Ignore);
    assert_eq!(handler.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_sleeping_retry_ends_at_once_when_the_consumer_shuts_down() {
    let handler = Scripted::new([Step::Retryable("db down")]);
    let policy = Constant::new(Duration::from_secs(3600));
    let token = CancellationToken::new();
    let future = UnderConsumer::new(
        &token,
        Retry::new(handler.clone(), policy).oneshot(message("order")),
    );
    let task = tokio::spawn(future);
    // Let the first attempt fail and the retry start sleeping.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(handler.calls(), 1);
    token.cancel();
    let error = tokio::time::timeout(Duration::from_secs(1), task)
        .await
        .expect("the sleep ends with the shutdown, not after an hour")
        .expect("no panic")
        .expect_err("interrupted");
    assert_eq!(error.class(), ErrorClass::Interrupted);
    assert_eq!(error.attempts(), 1);
    assert_eq!(handler.calls(), 1, "the handler is not run again");
}

#[tokio::test(start_paused = true)]
async fn no_retry_starts_once_the_consumer_is_shutting_down() {
    let handler = Scripted::new([Step::Retryable("db down")]);
    let token = CancellationToken::new();
    token.cancel();
    let error = UnderConsumer::new(
        &token,
        Retry::new(handler.clone(), Constant::new(Duration::ZERO)).oneshot(message("order")),
    )
    .await
    .expect_err("interrupted");
    assert_eq!(error.class(), ErrorClass::Interrupted);
    assert_eq!(handler.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_timeout_inside_retry_makes_the_slow_attempt_retryable() {
    let handler = Scripted::new([Step::Slow(Duration::from_secs(60))]);
    let mut service = ServiceBuilder::new()
        .layer(RetryLayer::new(quick(3)))
        .timeout(Duration::from_secs(1))
        .service(handler.clone());
    service
        .ready()
        .await
        .expect("ready")
        .call(message("order"))
        .await
        .expect("the second attempt is fast");
    assert_eq!(handler.attempts_seen(), vec![1, 2]);
}

#[derive(Clone, Default)]
struct Retries(std::sync::Arc<Mutex<Vec<(u32, Duration)>>>);

impl RetryObserver for Retries {
    fn on_retry(&self, message: &Message, error: &HandlerError, delay: Duration) {
        assert!(error.is_retryable());
        if let Ok(mut seen) = self.0.lock() {
            seen.push((message.metadata().attempt(), delay));
        }
    }
}

#[tokio::test(start_paused = true)]
async fn the_observer_hears_of_every_retry_with_the_failed_attempt_and_delay() {
    let handler = Scripted::new([Step::Retryable("a"), Step::Retryable("b")]);
    let retries = Retries::default();
    ServiceBuilder::new()
        .layer(RetryLayer::new(quick(5)).observe(retries.clone()))
        .service(handler)
        .oneshot(message("order"))
        .await
        .expect("third attempt succeeds");
    let seen = retries
        .0
        .lock()
        .map(|seen| seen.clone())
        .unwrap_or_default();
    assert_eq!(
        seen,
        vec![
            (1, Duration::from_millis(10)),
            (2, Duration::from_millis(10))
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_timeout_around_retry_bounds_all_attempts_together() {
    let handler = Scripted::new(std::iter::repeat_n(Step::Retryable("db down"), 100));
    let error: HandlerError = ServiceBuilder::new()
        .timeout(Duration::from_millis(4500))
        .layer(RetryLayer::new(
            Constant::new(Duration::from_secs(1)).retry_forever(),
        ))
        .service(handler.clone())
        .oneshot(message("order"))
        .await
        .expect_err("the time budget runs out")
        .into();
    assert!(error.is_retryable(), "an elapsed timeout is retryable");
    assert_eq!(handler.calls(), 5, "attempts at 0, 1, 2, 3 and 4 s");
}
