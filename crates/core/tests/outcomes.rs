//! Outcomes as a type: a layer intake does not know settles a message, and
//! the runtime's report and the metrics count it by the [`Outcome`] it gave,
//! not by the layer's own error type.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use intake_core::consumer::{Consumer, RunReport};
use intake_core::memory::{MemoryBroker, MemorySource, Record};
#[cfg(feature = "metrics")]
use intake_core::metrics::Metrics;
use intake_core::{BoxError, Constant, HandlerError, Message, Outcome};
use tokio_util::sync::CancellationToken;
use tower::{Layer, Service, ServiceBuilder, service_fn};

#[cfg(feature = "metrics")]
#[path = "support/prometheus_sample.rs"]
mod prometheus_sample;

const GROUP: &str = "billing";

/// The user's own record of a message it archived: no intake type.
#[derive(Debug, thiserror::Error)]
#[error("archived by the user's layer")]
struct Archived(#[source] HandlerError);

/// A user-written layer that settles failures itself: a permanent failure
/// is written to its archive and dead-lettered, `drop` is discarded, and
/// `later` is parked (the layer keeps it to hand in again itself).
#[derive(Clone)]
struct ArchiveLayer {
    archive: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl<S> Layer<S> for ArchiveLayer {
    type Service = Archive<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Archive {
            inner,
            archive: Arc::clone(&self.archive),
        }
    }
}

#[derive(Clone)]
struct Archive<S> {
    inner: S,
    archive: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl<S> Service<Message> for Archive<S>
where
    S: Service<Message, Response = (), Error = HandlerError> + Send,
    S::Future: Send + 'static,
{
    type Response = ();
    type Error = HandlerError;
    type Future = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), HandlerError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, message: Message) -> Self::Future {
        let archive = Arc::clone(&self.archive);
        let payload = message.payload().to_vec();
        let handled = self.inner.call(message);
        Box::pin(async move {
            let failure = match handled.await {
                Ok(()) => return Ok(()),
                Err(failure) => failure,
            };
            let outcome = match &payload[..] {
                b"drop" => Outcome::Discarded,
                b"later" => Outcome::Parked,
                _ => {
                    if let Ok(mut archive) = archive.lock() {
                        archive.push(payload);
                    }
                    Outcome::DeadLettered
                }
            };
            Err(HandlerError::settled(outcome, Archived(failure)))
        })
    }
}

fn handler() -> impl Service<Message, Response = (), Error = HandlerError, Future: Send> + Clone {
    service_fn(|message: Message| {
        let result = match &message.payload()[..] {
            b"ok" => Ok(()),
            _ => Err(HandlerError::permanent("rejected by the handler")),
        };
        async move { result }
    })
}

/// Runs `stack` over `payloads` on one partition until all are committed
/// (bounded: ten seconds), and returns the report.
async fn run<H>(topic: &str, payloads: &[&'static str], stack: H) -> RunReport
where
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    let broker = MemoryBroker::new();
    broker.create_topic(topic, 1).expect("topic");
    for payload in payloads {
        broker.send(topic, Record::new(*payload)).expect("send");
    }
    let (source, acker): (MemorySource, _) = broker.consumer(topic, GROUP).expect("consumer");
    let consumer = Consumer::builder()
        .backoff(Constant::new(Duration::from_millis(2)).retry_forever())
        .commit_interval(Duration::from_millis(5))
        .build(source, acker, stack)
        .expect("valid settings");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(consumer.run(shutdown.clone()));
    let all = i64::try_from(payloads.len()).expect("few");
    let mut waited = Duration::ZERO;
    while broker.committed(topic, GROUP).expect("group")[0] != Some(all) {
        assert!(waited < Duration::from_secs(10), "not all were committed");
        tokio::time::sleep(Duration::from_millis(5)).await;
        waited += Duration::from_millis(5);
    }
    shutdown.cancel();
    running.await.expect("no panic").expect("clean run")
}

const PAYLOADS: &[&str] = &["ok", "bad", "drop", "later", "ok"];

#[tokio::test]
async fn a_users_own_layer_is_counted_by_the_outcome_it_settles_with() {
    let archive = Arc::new(Mutex::new(Vec::new()));
    let stack = ServiceBuilder::new()
        .layer(ArchiveLayer {
            archive: Arc::clone(&archive),
        })
        .service(handler());
    let report = run("archived", PAYLOADS, stack).await;

    assert_eq!(
        archive.lock().map(|a| a.clone()).unwrap_or_default(),
        [b"bad".to_vec()]
    );
    assert_eq!(report.succeeded, 2, "{report:?}");
    assert_eq!(report.dead_lettered, 1, "{report:?}");
    assert_eq!(report.discarded, 1, "{report:?}");
    assert_eq!(report.parked, 1, "{report:?}");
    assert_eq!(report.ignored, 0, "{report:?}");
}

#[cfg(feature = "metrics")]
#[tokio::test]
async fn the_metrics_count_a_users_own_layer_by_the_outcome_it_settles_with() {
    use prometheus_sample::sample;

    let registry = prometheus::Registry::new();
    let metrics = Metrics::register(&registry).expect("fresh registry");
    let stack = ServiceBuilder::new()
        .layer(metrics.layer("billing"))
        .layer(ArchiveLayer {
            archive: Arc::default(),
        })
        .service(handler());
    let topic = "archived-metered";
    run(topic, PAYLOADS, stack).await;

    let labels = [("source", topic), ("handler", "billing")];
    let value = |name| sample(&registry, name, &labels);
    assert_eq!(value("intake_messages_succeeded_total"), Some(2.0));
    assert_eq!(value("intake_messages_dead_lettered_total"), Some(1.0));
    assert_eq!(value("intake_messages_discarded_total"), Some(1.0));
    assert_eq!(value("intake_messages_parked_total"), Some(1.0));
    // The failures behind the dead letter and the discard, by their own
    // class: the archive kept each as its cause's source.
    let failed = |class| {
        sample(
            &registry,
            "intake_messages_failed_total",
            &[("source", topic), ("handler", "billing"), ("class", class)],
        )
    };
    assert_eq!(failed("permanent"), Some(2.0));
    assert_eq!(failed("ignore"), Some(0.0));
}

#[test]
fn a_settled_error_is_acknowledged_and_keeps_the_failure_behind_it() {
    let failure = HandlerError::permanent("no such customer").with_attempts(3);
    let settled = HandlerError::settled(Outcome::DeadLettered, Archived(failure));
    assert_eq!(settled.class(), intake_core::ErrorClass::Ignore);
    assert_eq!(settled.outcome(), Some(Outcome::DeadLettered));
    assert_eq!(settled.failure_class(), intake_core::ErrorClass::Permanent);
    assert_eq!(Outcome::of(&Err(settled)), Some(Outcome::DeadLettered));
    assert_eq!(Outcome::of(&Ok(())), Some(Outcome::Succeeded));
    assert_eq!(
        HandlerError::ignore("not for us").outcome(),
        Some(Outcome::Ignored)
    );
    assert_eq!(HandlerError::retryable("timeout").outcome(), None);
    // A cause of the user's own with no failure behind it.
    let plain: BoxError = "written elsewhere".into();
    let settled = HandlerError::settled(Outcome::Discarded, plain);
    assert_eq!(settled.failure_class(), intake_core::ErrorClass::Ignore);
    // Reclassified, it is settled no more.
    let again = settled.reclassify(intake_core::ErrorClass::Retryable);
    assert_eq!(again.outcome(), None);
}
