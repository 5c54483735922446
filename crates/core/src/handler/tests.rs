use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use tower::{Service, ServiceExt};

use super::*;
use crate::error::ErrorClass;
use crate::message::{Headers, Metadata, Position};

fn message() -> Message {
    Message::new(
        Bytes::from_static(b"payload"),
        Metadata::new("orders".into(), 2, Position::Offset(7)),
    )
    .with_key(Bytes::from_static(b"k"))
}

async fn run<S>(service: S) -> Result<(), HandlerError>
where
    S: Service<Message, Response = (), Error = HandlerError>,
{
    service.oneshot(message()).await
}

thread_local! {
    static EXTRACTED: RefCell<Vec<&'static str>> = const { RefCell::new(Vec::new()) };
}

fn record(name: &'static str) {
    EXTRACTED.with(|log| log.borrow_mut().push(name));
}

fn extracted() -> Vec<&'static str> {
    EXTRACTED.with(|log| log.borrow_mut().drain(..).collect())
}

/// Extractors that record when they run, to observe the extraction order.
macro_rules! recording_extractor {
    ($name:ident) => {
        struct $name;
        impl FromMessageParts for $name {
            fn from_message_parts(_: &Message) -> Result<Self, HandlerError> {
                record(stringify!($name));
                Ok($name)
            }
        }
    };
}
recording_extractor!(A);
recording_extractor!(B);
recording_extractor!(C);
recording_extractor!(D);
recording_extractor!(E);
recording_extractor!(F);
recording_extractor!(G);

struct RecordingPayload;
impl FromMessage for RecordingPayload {
    fn from_message(_: Message) -> Result<Self, HandlerError> {
        record("payload");
        Ok(RecordingPayload)
    }
}

struct Rejecting;
impl FromMessageParts for Rejecting {
    fn from_message_parts(_: &Message) -> Result<Self, HandlerError> {
        record("rejecting");
        Err(HandlerError::permanent("tenant header missing"))
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_handler_without_arguments_runs() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let handler = handler_fn(move || {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    });
    run(handler).await.unwrap();
    assert_eq!(calls.load(Ordering::Relaxed), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn an_async_closure_taking_the_message_is_a_handler() {
    let handler = handler_fn(async |message: Message| {
        assert_eq!(message.payload().as_ref(), b"payload");
    });
    run(handler).await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn an_async_fn_item_is_a_handler() {
    async fn handle(Meta(meta): Meta, Key(key): Key, Payload(payload): Payload) {
        assert_eq!(meta.position(), Position::Offset(7));
        assert_eq!(key.as_deref(), Some(&b"k"[..]));
        assert_eq!(payload.as_ref(), b"payload");
    }
    run(handler_fn(handle)).await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn every_arity_up_to_eight_is_accepted() {
    run(handler_fn(async |_: A| {})).await.unwrap();
    run(handler_fn(async |_: A, _: B| {})).await.unwrap();
    run(handler_fn(async |_: A, _: B, _: C| {})).await.unwrap();
    run(handler_fn(async |_: A, _: B, _: C, _: D| {}))
        .await
        .unwrap();
    run(handler_fn(async |_: A, _: B, _: C, _: D, _: E| {}))
        .await
        .unwrap();
    run(handler_fn(async |_: A, _: B, _: C, _: D, _: E, _: F| {}))
        .await
        .unwrap();
    run(handler_fn(
        async |_: A, _: B, _: C, _: D, _: E, _: F, _: G| {},
    ))
    .await
    .unwrap();
    run(handler_fn(
        async |_: A, _: B, _: C, _: D, _: E, _: F, _: G, _: RecordingPayload| {},
    ))
    .await
    .unwrap();
    assert_eq!(extracted().len(), 1 + 2 + 3 + 4 + 5 + 6 + 7 + 8);
}

#[tokio::test(flavor = "current_thread")]
async fn extractors_run_in_argument_order_with_the_payload_last() {
    extracted();
    run(handler_fn(async |_: C, _: A, _: B, _: RecordingPayload| {}))
        .await
        .unwrap();
    assert_eq!(extracted(), ["C", "A", "B", "payload"]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_failed_extraction_skips_the_fn_and_the_later_extractors() {
    extracted();
    let ran = Arc::new(AtomicUsize::new(0));
    let ran_in_handler = ran.clone();
    let handler = handler_fn(move |_: A, _: Rejecting, _: RecordingPayload| {
        let ran = ran_in_handler.clone();
        async move {
            ran.fetch_add(1, Ordering::Relaxed);
        }
    });
    let error = run(handler).await.unwrap_err();
    assert_eq!(error.class(), ErrorClass::Permanent);
    assert_eq!(error.cause().to_string(), "tenant header missing");
    assert_eq!(ran.load(Ordering::Relaxed), 0);
    assert_eq!(extracted(), ["A", "rejecting"]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_metadata_extractor_may_be_the_last_argument() {
    let handler = handler_fn(async |Key(key): Key, Meta(meta): Meta| {
        assert_eq!(key.as_deref(), Some(&b"k"[..]));
        assert_eq!(meta.partition(), 2);
    });
    run(handler).await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn headers_are_an_extractor() {
    let handler = handler_fn(async |headers: Headers| {
        assert_eq!(headers.get_str("tenant"), Some("acme"));
    });
    let message = message().with_headers([("tenant", "acme")].into_iter().collect());
    handler.oneshot(message).await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_returned_handler_error_keeps_its_class() {
    let handler = handler_fn(async |_: Message| -> Result<(), HandlerError> {
        Err(HandlerError::ignore("message for another tenant"))
    });
    assert_eq!(run(handler).await.unwrap_err().class(), ErrorClass::Ignore);
}

#[tokio::test(flavor = "current_thread")]
async fn a_returned_error_of_another_type_is_retryable() {
    #[derive(Debug, thiserror::Error)]
    #[error("inventory service unavailable")]
    struct InventoryDown;

    let handler =
        handler_fn(async |_: Message| -> Result<(), InventoryDown> { Err(InventoryDown) });
    let error = run(handler).await.unwrap_err();
    assert!(error.is_retryable());
    assert_eq!(error.cause().to_string(), "inventory service unavailable");
}

#[tokio::test(flavor = "current_thread")]
async fn an_ok_result_acknowledges() {
    let handler = handler_fn(async |_: Message| -> Result<(), std::io::Error> { Ok(()) });
    run(handler).await.unwrap();
}

#[test]
fn the_service_is_always_ready_and_clones() {
    let mut handler = handler_fn(async |_: Payload| {});
    let mut cx = Context::from_waker(Waker::noop());
    assert!(matches!(handler.poll_ready(&mut cx), Poll::Ready(Ok(()))));
    let mut clone = handler.clone();
    assert!(matches!(clone.poll_ready(&mut cx), Poll::Ready(Ok(()))));
    let mut future = std::pin::pin!(clone.call(message()));
    assert!(matches!(future.as_mut().poll(&mut cx), Poll::Ready(Ok(()))));
}

#[test]
fn the_service_is_send_and_sync_whatever_the_extractors() {
    fn assert_send_sync<T: Send + Sync>(_: &T) {}
    // `Rc` is neither `Send` nor `Sync`; the service never holds one.
    struct NotSend(#[allow(dead_code)] std::rc::Rc<()>);
    impl FromMessageParts for NotSend {
        fn from_message_parts(_: &Message) -> Result<Self, HandlerError> {
            Ok(NotSend(std::rc::Rc::new(())))
        }
    }
    let handler = handler_fn(async |_: NotSend| {});
    assert_send_sync(&handler);
}

#[test]
fn debug_names_the_fn_type() {
    async fn reserve_stock(_: Message) {}
    let debug = format!("{:?}", handler_fn(reserve_stock));
    assert!(debug.contains("reserve_stock"), "{debug}");
}

mod with_state {
    use super::*;
    use crate::handler::{FromRef, State, handler_fn_with_state};

    #[derive(Clone)]
    struct Services {
        seen: Arc<AtomicUsize>,
        region: &'static str,
    }

    struct Region(&'static str);

    impl FromRef<Services> for Region {
        fn from_ref(services: &Services) -> Self {
            Region(services.region)
        }
    }

    fn services() -> Services {
        Services {
            seen: Arc::new(AtomicUsize::new(0)),
            region: "eu",
        }
    }

    #[tokio::test]
    async fn state_arguments_come_from_the_shared_state_in_any_position() {
        let state = services();
        let handler = handler_fn_with_state(
            state.clone(),
            async |State(services): State<Services>,
                   State(Region(region)): State<Region>,
                   Key(key): Key,
                   Payload(payload): Payload| {
                assert_eq!(region, "eu");
                assert_eq!(key.as_deref(), Some(&b"k"[..]));
                services.seen.fetch_add(payload.len(), Ordering::SeqCst);
            },
        );
        run(handler).await.unwrap();
        let last = handler_fn_with_state(
            state.clone(),
            async |Meta(_meta): Meta, State(services): State<Services>| {
                services.seen.fetch_add(1, Ordering::SeqCst);
            },
        );
        run(last).await.unwrap();
        assert_eq!(state.seen.load(Ordering::SeqCst), b"payload".len() + 1);
    }

    #[tokio::test]
    async fn every_message_shares_one_state() {
        let state = services();
        let mut handler =
            handler_fn_with_state(state.clone(), async |State(services): State<Services>| {
                services.seen.fetch_add(1, Ordering::SeqCst);
            });
        for _ in 0..3 {
            handler.call(message()).await.unwrap();
        }
        assert_eq!(state.seen.load(Ordering::SeqCst), 3, "the same counter");
        assert_eq!(handler.state().region, "eu");
    }
}
