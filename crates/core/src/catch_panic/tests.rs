use std::future::Ready;
use std::time::Duration;

use tower::{Service, ServiceBuilder, ServiceExt};

use super::*;
use crate::backoff::Constant;
use crate::error::HandlerError;
use crate::layer_testing::{Scripted, Step, message};
use crate::message::Message;
use crate::retry::RetryLayer;
use std::task::{Context, Poll};

fn panic_of(error: &HandlerError) -> Option<&Panicked> {
    error.cause().downcast_ref::<Panicked>()
}

#[tokio::test]
async fn a_panic_in_the_handler_becomes_a_retryable_error_carrying_its_message() {
    let handler = Scripted::new([Step::Panic("index out of bounds")]);
    let error = CatchPanic::new(handler)
        .oneshot(message("order"))
        .await
        .expect_err("the panic is an error");
    assert!(error.is_retryable());
    assert_eq!(
        panic_of(&error).map(Panicked::message),
        Some("index out of bounds")
    );
    assert!(
        error
            .to_string()
            .contains("the handler panicked: index out of bounds")
    );
}

/// A handler that does its work, and panics, in `call`.
#[derive(Clone)]
struct PanicsInCall;

impl Service<Message> for PanicsInCall {
    type Response = ();
    type Error = HandlerError;
    type Future = Ready<Result<(), HandlerError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), HandlerError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _message: Message) -> Self::Future {
        std::panic::panic_any(42_u32)
    }
}

#[tokio::test]
async fn a_panic_while_calling_the_handler_is_caught_too() {
    let error = CatchPanic::new(PanicsInCall)
        .oneshot(message("order"))
        .await
        .expect_err("the panic is an error");
    assert_eq!(
        panic_of(&error).map(Panicked::message),
        Some("a panic with a payload that is not a string")
    );
}

#[tokio::test]
async fn the_handler_keeps_serving_after_a_panic() {
    let handler = Scripted::new([Step::Panic("boom")]);
    let mut service = CatchPanic::new(handler.clone());
    let first = service
        .ready()
        .await
        .expect("ready")
        .call(message("a"))
        .await;
    let second = service
        .ready()
        .await
        .expect("ready")
        .call(message("b"))
        .await;
    assert!(first.is_err());
    assert!(second.is_ok());
    assert_eq!(handler.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_panic_inside_retry_is_retried_like_a_transient_failure() {
    let handler = Scripted::new([Step::Panic("flaky"), Step::Panic("flaky")]);
    ServiceBuilder::new()
        .layer(RetryLayer::new(
            Constant::new(Duration::from_millis(5)).max_retries(3),
        ))
        .layer(CatchPanicLayer::new())
        .service(handler.clone())
        .oneshot(message("order"))
        .await
        .expect("the third attempt succeeds");
    assert_eq!(handler.attempts_seen(), vec![1, 2, 3]);
}
