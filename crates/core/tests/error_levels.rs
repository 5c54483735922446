//! hyper's rule for every error type of core: `Display` describes its own
//! level only, and the cause is reached through `source()`, so a report that
//! prints the chain (anyhow's `{:#}`, tracing's error fields,
//! `intake_core::error::ErrorChain`) prints each cause once. Each case
//! builds the error as a backend, a handler or the runtime does, walks its
//! whole chain, and checks that no level repeats its source's text and that
//! the cause is still somewhere in the chain.

use std::error::Error;
use std::fmt;
use std::time::Duration;

use intake_core::backend::RevocationError;
use intake_core::batch::{BatchError, BatchLayer, BatchSettings};
use intake_core::catch_panic::Panicked;
use intake_core::consumer::RunError;
use intake_core::dead_letter::{
    DeadLetterLayer, DeadLetterWriteFailed, DeadLettered, Discarded, FailurePolicy,
};
use intake_core::error::ErrorChain;
use intake_core::memory::{InjectedFault, MemoryBroker, MemoryError, Record, dead_letter_topic};
use intake_core::{
    BoxError, ConfigError, DeadLetter, DecodeError, HandlerError, Headers, Message, Metadata,
    PartitionKey, Position, RunReport,
    backend::{AckError, DeadLetterError, DeadLetterSink, SourceError},
};
use tower::{Layer, ServiceExt, service_fn};

/// The text of the innermost cause: no error of core writes it.
const ROOT: &str = "errno 122 (root)";
/// The text of the cause a backend or handler hands to core.
const CAUSE: &str = "disk quota exceeded (cause)";

/// An outside error with a cause of its own, as an I/O or driver error has.
#[derive(Debug)]
struct Outside {
    text: &'static str,
    source: Option<Box<Outside>>,
}

impl fmt::Display for Outside {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text)
    }
}

impl Error for Outside {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn Error + 'static))
    }
}

fn cause() -> BoxError {
    Box::new(Outside {
        text: CAUSE,
        source: Some(Box::new(Outside {
            text: ROOT,
            source: None,
        })),
    })
}

/// Each level's text, outermost first, after checking that none contains
/// the text of its source.
fn levels(error: &(dyn Error + 'static)) -> Vec<String> {
    let mut levels = Vec::new();
    let mut level = Some(error);
    while let Some(current) = level {
        let text = current.to_string();
        if let Some(source) = current.source() {
            let source_text = source.to_string();
            assert!(
                !text.contains(&source_text),
                "`{text}` prints its source `{source_text}`, which `source()` returns too"
            );
        }
        assert!(
            levels.len() < 16,
            "a chain of more than 16 levels: {levels:?}"
        );
        levels.push(text);
        level = current.source();
    }
    levels
}

/// Checks hyper's rule on `error` and that the chain still holds the cause
/// and its root, each once.
fn assert_cause_once(error: &(dyn Error + 'static)) {
    let levels = levels(error);
    for text in [CAUSE, ROOT] {
        let holding = levels.iter().filter(|level| level.contains(text)).count();
        assert_eq!(holding, 1, "`{text}` in {holding} levels of {levels:?}");
    }
}

/// An error that has no cause: it says everything itself.
fn assert_no_source(error: &(dyn Error + 'static)) {
    assert!(
        error.source().is_none(),
        "`{error}` has a source: {:?}",
        error.source()
    );
}

fn message() -> Message {
    Message::new(
        "payload",
        Metadata::new("orders".into(), 0, Position::Offset(7)),
    )
}

#[test]
fn source_errors_leave_the_broker_error_to_source() {
    let errors = [
        SourceError::Unreachable {
            endpoint: "broker:9092".into(),
            source: cause(),
        },
        SourceError::Unauthorized {
            endpoint: "broker:9092".into(),
            source: cause(),
        },
        SourceError::Transient(cause()),
        SourceError::Fatal(cause()),
    ];
    for error in &errors {
        assert_cause_once(error);
        assert!(error.to_string().contains("broker"), "{error}");
    }
    assert!(
        SourceError::Unreachable {
            endpoint: "broker:9092".into(),
            source: cause()
        }
        .to_string()
        .contains("broker:9092")
    );
    assert_no_source(&SourceError::Config("no topic".into()));
    assert_no_source(&SourceError::NotFound {
        kind: "topic",
        name: "orders".into(),
        hint: "create it".into(),
    });
}

#[test]
fn ack_errors_leave_the_broker_error_to_source() {
    assert_cause_once(&AckError::Broker(cause()));
    assert_cause_once(&AckError::Disconnected(cause()));
    assert_no_source(&AckError::NotAssigned(PartitionKey::new("orders", 0)));
}

#[test]
fn run_errors_leave_the_failure_to_source() {
    let source = RunError::Source {
        error: SourceError::Fatal(cause()),
        report: Box::new(RunReport::default()),
    };
    assert_cause_once(&source);
    let handler = RunError::HandlerUnavailable {
        error: HandlerError::retryable(cause()),
        report: Box::new(RunReport::default()),
    };
    assert_cause_once(&handler);
}

#[test]
fn a_handler_error_made_from_a_message_has_no_source() {
    let error = HandlerError::retryable("timeout").with_attempts(2);
    assert_eq!(
        error.to_string(),
        "retryable error after 2 attempt(s): timeout"
    );
    assert_no_source(&error);
}

#[test]
fn a_handler_error_shows_its_cause_as_its_own_level_and_the_rest_through_source() {
    let error = HandlerError::permanent(cause());
    assert_cause_once(&error);
    assert_eq!(error.to_string(), format!("permanent error: {CAUSE}"));
    assert_eq!(error.cause().to_string(), CAUSE);
}

#[test]
fn errors_without_a_cause_say_everything_themselves() {
    assert_no_source(&ConfigError::new("max_in_flight", "is 0; use at least 1"));
    let decode = DecodeError::new::<u64>("JSON", b"not json", cause());
    assert_no_source(&decode);
    assert!(decode.to_string().contains(CAUSE), "{decode}");
    let envelope = DeadLetter::read(None, "x".into(), &Headers::new())
        .expect_err("no envelope in an empty carrier");
    assert_no_source(&envelope);
    assert_no_source(&Panicked::new("boom"));
    assert_no_source(&RevocationError::Abandoned);
    assert_no_source(&RevocationError::TimedOut(Duration::from_secs(1)));
    assert_no_source(&InjectedFault::Fetch);
    assert_no_source(&intake_core::redact::AmbiguousUserInfo);
    let unknown = MemoryBroker::new()
        .dead_letters("orders", "billing")
        .expect_err("no such topic");
    assert_no_source(&unknown);
}

#[test]
fn dead_letter_errors_leave_the_sink_error_to_source() {
    assert_cause_once(&DeadLetterError(cause()));
    let rejected = DeadLetterError::rejected(cause());
    assert!(rejected.is_rejected());
    assert_cause_once(&rejected);
}

/// A dead-letter destination that takes nothing.
struct Refusing;

#[async_trait::async_trait]
impl DeadLetterSink for Refusing {
    async fn write(&self, _letter: &DeadLetter) -> Result<(), DeadLetterError> {
        Err(DeadLetterError(cause()))
    }
}

/// What the dead-letter layer over a handler failing with [`cause`] returns.
async fn dead_letter_outcome(layer: DeadLetterLayer) -> HandlerError {
    let failing =
        service_fn(|_message: Message| async { Err::<(), _>(HandlerError::permanent(cause())) });
    layer
        .layer(failing)
        .oneshot(message())
        .await
        .expect_err("the handler failed")
}

// The paused clock skips the write backoff before the reference.
#[tokio::test(start_paused = true)]
async fn the_dead_letter_layers_outcomes_leave_the_handler_failure_to_source() {
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 1).expect("topic");
    let sink = broker.dead_letter_sink("orders", "billing").expect("sink");

    let lettered = dead_letter_outcome(DeadLetterLayer::new(sink)).await;
    let dead_lettered = lettered
        .cause()
        .downcast_ref::<DeadLettered>()
        .expect("dead-lettered");
    assert_cause_once(dead_lettered);
    assert_cause_once(&lettered);

    let discarded =
        dead_letter_outcome(DeadLetterLayer::with_policy(FailurePolicy::discard())).await;
    let inner = discarded
        .cause()
        .downcast_ref::<Discarded>()
        .expect("discarded");
    assert_cause_once(inner);
    assert_cause_once(&discarded);

    let unwritten = dead_letter_outcome(DeadLetterLayer::new(Refusing)).await;
    let failed = unwritten
        .cause()
        .downcast_ref::<DeadLetterWriteFailed>()
        .expect("the write failed");
    // Two causes: the handler's failure (told in the text) and the write's
    // (through `source()`), each once.
    let chain = levels(failed);
    for text in [CAUSE, ROOT] {
        let holding = chain.iter().filter(|level| level.contains(text)).count();
        assert_eq!(holding, 2, "`{text}` in {holding} levels of {chain:?}");
    }
    levels(&unwritten);
}

#[test]
fn a_malformed_dead_letter_leaves_the_envelope_error_to_source() {
    let broker = MemoryBroker::new();
    broker.create_topic("orders", 1).expect("topic");
    let letters = dead_letter_topic("orders", "billing");
    broker.create_topic(&letters, 1).expect("dead-letter topic");
    broker
        .send(&letters, Record::new("not a letter"))
        .expect("sent");
    let error = broker
        .dead_letters("orders", "billing")
        .expect_err("not a dead letter");
    assert!(matches!(error, MemoryError::MalformedDeadLetter { .. }));
    let chain = levels(&error);
    assert_eq!(chain.len(), 2, "{chain:?}");
}

#[tokio::test]
async fn a_failed_batch_leaves_the_handler_failure_to_source() {
    let layer = BatchLayer::new(BatchSettings {
        max_size: 1,
        max_wait: Duration::from_millis(1),
        parallelism: 1,
    })
    .expect("valid settings");
    let failing = service_fn(|_batch: Vec<Message>| async {
        Err::<Vec<Result<(), HandlerError>>, _>(HandlerError::permanent(cause()))
    });
    let error = layer
        .layer(failing)
        .oneshot(message())
        .await
        .expect_err("the batch failed");
    let batch = error
        .cause()
        .downcast_ref::<BatchError>()
        .expect("a batch error");
    assert!(matches!(batch, BatchError::Failed { .. }));
    assert_cause_once(batch);
    assert_cause_once(&error);
}

#[cfg(feature = "metrics")]
#[test]
fn a_registration_error_leaves_the_registry_error_to_source() {
    let registry = prometheus::Registry::new();
    intake_core::metrics::Metrics::register(&registry).expect("first registration");
    let error =
        intake_core::metrics::Metrics::register(&registry).expect_err("the names are taken");
    let chain = levels(&error);
    assert!(chain.len() >= 2, "{chain:?}");
}

#[test]
fn an_error_chain_prints_every_level_once() {
    let error = SourceError::Transient(cause());
    let shown = ErrorChain::new(&error).to_string();
    assert_eq!(shown, format!("{error}: {CAUSE}: {ROOT}"));
}
