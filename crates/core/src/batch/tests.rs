use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
use tower::{ServiceBuilder, ServiceExt, service_fn};

use super::*;
use crate::catch_panic::Panicked;
use crate::dead_letter::DeadLetterLayer;
use crate::error::ErrorClass;
use crate::error::HandlerError;
use crate::layer_testing::{RecordingSink, message};
use crate::message::Message;
use std::task::{Context, Poll};
use tower::Service;

type Outcomes = Vec<Result<(), HandlerError>>;

/// A batch handler that records each batch's payloads and fails the
/// messages whose payload starts with `bad`.
#[derive(Clone, Default)]
struct Rows {
    batches: Arc<Mutex<Vec<Vec<String>>>>,
}

impl Rows {
    fn handler(&self) -> Self {
        self.clone()
    }

    fn sizes(&self) -> Vec<usize> {
        self.batches
            .lock()
            .map(|batches| batches.iter().map(Vec::len).collect())
            .unwrap_or_default()
    }
}

impl Service<Vec<Message>> for Rows {
    type Response = Outcomes;
    type Error = HandlerError;
    type Future = Pin<Box<dyn Future<Output = Result<Outcomes, HandlerError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), HandlerError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, batch: Vec<Message>) -> Self::Future {
        let payloads: Vec<String> = batch
            .iter()
            .map(|m| String::from_utf8_lossy(m.payload()).into_owned())
            .collect();
        let outcomes = payloads
            .iter()
            .map(|payload| match payload.starts_with("bad") {
                true => Err(HandlerError::permanent(format!("cannot insert {payload}"))),
                false => Ok(()),
            })
            .collect();
        if let Ok(mut batches) = self.batches.lock() {
            batches.push(payloads);
        }
        Box::pin(async move { Ok(outcomes) })
    }
}

fn settings(max_size: usize, max_wait_ms: u64) -> BatchSettings {
    BatchSettings {
        max_size,
        max_wait: Duration::from_millis(max_wait_ms),
        parallelism: 1,
    }
}

fn payload(index: usize) -> &'static str {
    ["m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "m9"][index]
}

#[tokio::test(start_paused = true)]
async fn messages_are_handed_over_in_batches_of_at_most_max_size() {
    let rows = Rows::default();
    let service = Batch::new(rows.handler(), settings(2, 50)).expect("valid");
    let outcomes = join_all((0..5).map(|i| service.clone().oneshot(message(payload(i))))).await;
    assert!(outcomes.iter().all(Result::is_ok));
    assert_eq!(rows.sizes(), vec![2, 2, 1]);
}

#[tokio::test(start_paused = true)]
async fn a_batch_that_does_not_fill_is_handed_over_after_max_wait() {
    let rows = Rows::default();
    let service = Batch::new(rows.handler(), settings(100, 50)).expect("valid");
    let started = tokio::time::Instant::now();
    let outcomes = join_all((0..3).map(|i| service.clone().oneshot(message(payload(i))))).await;
    assert!(outcomes.iter().all(Result::is_ok));
    assert_eq!(rows.sizes(), vec![3]);
    assert!(started.elapsed() >= Duration::from_millis(50));
}

#[tokio::test(start_paused = true)]
async fn a_max_wait_of_duration_max_waits_for_a_full_batch_without_panicking() {
    // `opened_at + max_wait` overflowed and panicked in the worker task,
    // which left every message of the batch waiting forever.
    let rows = Rows::default();
    let mut settings = settings(2, 0);
    settings.max_wait = Duration::MAX;
    let service = Batch::new(rows.handler(), settings).expect("valid");
    let outcomes = tokio::time::timeout(
        Duration::from_secs(60),
        join_all((0..2).map(|i| service.clone().oneshot(message(payload(i))))),
    )
    .await
    .expect("the full batch was handed over");
    assert!(outcomes.iter().all(Result::is_ok));
    assert_eq!(rows.sizes(), vec![2]);
}

#[tokio::test(start_paused = true)]
async fn each_message_of_a_partly_failed_batch_gets_its_own_outcome() {
    let rows = Rows::default();
    let service = Batch::new(rows.handler(), settings(3, 50)).expect("valid");
    let outcomes =
        join_all(["ok-1", "bad-2", "ok-3"].map(|p| service.clone().oneshot(message(p)))).await;
    assert!(outcomes[0].is_ok());
    let failure = outcomes[1].as_ref().expect_err("its own failure");
    assert!(failure.is_permanent());
    assert!(failure.to_string().contains("cannot insert bad-2"));
    assert!(outcomes[2].is_ok());
    assert_eq!(rows.sizes(), vec![3]);
}

#[tokio::test(start_paused = true)]
async fn the_failures_of_a_batch_are_routed_one_by_one_and_the_successes_pass() {
    let rows = Rows::default();
    let sink = RecordingSink::default();
    let service = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(sink.clone()))
        .layer(BatchLayer::new(settings(4, 50)).expect("valid"))
        .service(rows.handler());
    let outcomes =
        join_all(["ok-1", "bad-2", "ok-3", "bad-4"].map(|p| service.clone().oneshot(message(p))))
            .await;
    let classes: Vec<Option<ErrorClass>> = outcomes
        .iter()
        .map(|o| o.as_ref().err().map(HandlerError::class))
        .collect();
    assert_eq!(
        classes,
        vec![
            None,
            Some(ErrorClass::Ignore),
            None,
            Some(ErrorClass::Ignore)
        ]
    );
    let letters: Vec<_> = sink
        .letters()
        .iter()
        .map(|letter| String::from_utf8_lossy(letter.message.payload()).into_owned())
        .collect();
    assert_eq!(letters, vec!["bad-2", "bad-4"]);
}

#[tokio::test(start_paused = true)]
async fn a_batch_that_fails_as_a_whole_fails_every_message_with_its_class() {
    let failing = service_fn(|_batch: Vec<Message>| async {
        Err::<Outcomes, _>(HandlerError::retryable("database unavailable"))
    });
    let service = Batch::new(failing, settings(2, 50)).expect("valid");
    let outcomes = join_all((0..2).map(|i| service.clone().oneshot(message(payload(i))))).await;
    for outcome in outcomes {
        let error = outcome.expect_err("whole batch failed");
        assert!(error.is_retryable());
        // The handler's failure is the batch error's source.
        let chain = crate::error::ErrorChain::new(&error).to_string();
        assert!(chain.contains("database unavailable"), "{chain}");
    }
}

#[tokio::test(start_paused = true)]
async fn messages_without_an_outcome_are_retried() {
    let short =
        service_fn(|_batch: Vec<Message>| async { Ok::<Outcomes, HandlerError>(vec![Ok(())]) });
    let service = Batch::new(short, settings(3, 50)).expect("valid");
    let outcomes = join_all((0..3).map(|i| service.clone().oneshot(message(payload(i))))).await;
    assert!(outcomes[0].is_ok());
    for outcome in &outcomes[1..] {
        let error = outcome.as_ref().expect_err("no outcome");
        assert!(error.is_retryable());
        assert!(matches!(
            error.cause().downcast_ref::<BatchError>(),
            Some(BatchError::MissingOutcome {
                size: 3,
                returned: 1,
                ..
            })
        ));
    }
}

#[tokio::test(start_paused = true)]
async fn a_panicking_batch_handler_fails_each_message_retryably_and_batching_goes_on() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let panics_once = service_fn(move |batch: Vec<Message>| {
        let call = counted.fetch_add(1, Ordering::SeqCst);
        async move {
            if call == 0 {
                panic!("row mapper bug");
            }
            Ok::<Outcomes, HandlerError>(batch.iter().map(|_| Ok(())).collect())
        }
    });
    let service = Batch::new(panics_once, settings(2, 50)).expect("valid");
    let first = join_all((0..2).map(|i| service.clone().oneshot(message(payload(i))))).await;
    for outcome in first {
        let error = outcome.expect_err("panicked");
        assert!(error.is_retryable());
        let panic = error.cause().downcast_ref::<Panicked>();
        assert_eq!(panic.map(Panicked::message), Some("row mapper bug"));
    }
    let second = join_all((0..2).map(|i| service.clone().oneshot(message(payload(i))))).await;
    assert!(second.iter().all(Result::is_ok));
}

/// A batch handler that records how many batches run at once.
fn concurrency_probe(
    running: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
) -> impl Service<
    Vec<Message>,
    Response = Outcomes,
    Error = HandlerError,
    Future = impl Future<Output = Result<Outcomes, HandlerError>> + Send,
> + Send
+ 'static {
    service_fn(move |batch: Vec<Message>| {
        let running = Arc::clone(&running);
        let peak = Arc::clone(&peak);
        async move {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            running.fetch_sub(1, Ordering::SeqCst);
            Ok(batch.iter().map(|_| Ok(())).collect())
        }
    })
}

#[tokio::test(start_paused = true)]
async fn at_most_parallelism_batches_run_at_once() {
    for parallelism in [1, 3] {
        let peak = Arc::new(AtomicUsize::new(0));
        let handler = concurrency_probe(Arc::default(), Arc::clone(&peak));
        let service = Batch::new(
            handler,
            BatchSettings {
                max_size: 2,
                max_wait: Duration::from_millis(10),
                parallelism,
            },
        )
        .expect("valid");
        let outcomes =
            join_all((0..10).map(|i| service.clone().oneshot(message(payload(i))))).await;
        assert!(outcomes.iter().all(Result::is_ok));
        assert_eq!(peak.load(Ordering::SeqCst), parallelism);
    }
}

#[tokio::test(start_paused = true)]
async fn while_the_handler_is_busy_the_next_batch_keeps_filling() {
    let rows = Rows::default();
    let slow_first = {
        let inner = rows.handler();
        let first = Arc::new(AtomicUsize::new(0));
        service_fn(move |batch: Vec<Message>| {
            let mut inner = inner.clone();
            let first = first.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                if first {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                inner.ready().await?.call(batch).await
            }
        })
    };
    let service = Batch::new(slow_first, settings(100, 10)).expect("valid");
    let first = tokio::spawn(service.clone().oneshot(message("m0")));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let rest = join_all((1..6).map(|i| {
        let service = service.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(10 * i as u64)).await;
            service.oneshot(message(payload(i))).await
        }
    }))
    .await;
    assert!(first.await.expect("no panic").is_ok());
    assert!(rest.iter().all(Result::is_ok));
    assert_eq!(rows.sizes(), vec![1, 5]);
}

#[test]
fn settings_that_cannot_work_are_refused() {
    let zero_size = BatchLayer::new(settings(0, 10)).expect_err("max_size 0");
    assert_eq!(zero_size.setting, "batch.max_size");
    let no_parallelism = BatchLayer::new(BatchSettings {
        parallelism: 0,
        ..BatchSettings::default()
    })
    .expect_err("parallelism 0");
    assert_eq!(no_parallelism.setting, "batch.parallelism");
}

#[test]
fn a_batch_service_outside_a_runtime_fails_the_message_without_panicking() {
    let rows = Rows::default();
    let mut service = Batch::new(rows.handler(), settings(2, 10)).expect("valid");
    let future = service.call(message("m0"));
    let outcome = futures_util::FutureExt::now_or_never(future).expect("ready at once");
    let error = outcome.expect_err("no runtime");
    assert!(matches!(
        error.cause().downcast_ref::<BatchError>(),
        Some(BatchError::NoRuntime)
    ));
}
