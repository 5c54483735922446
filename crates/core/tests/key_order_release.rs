//! Key-order relays release a key once its input's outputs are *sent*
//! (issue 27): the key's next input runs while the outputs of the one
//! before wait for their confirmations, every input is still acknowledged
//! only after its outputs and every earlier output of its key are
//! confirmed, and after a failure the key's outputs are sent again in input
//! order, so the last copy of each key's outputs is in input order.
//!
//! The publisher here confirms, fails or refuses each output only when the
//! test says so, and keeps a log in send order of what the broker stored
//! (an output that failed may or may not be stored, as with a real broker
//! that did not answer).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use intake_core::backend::testkit::{dead_letters, wait_until_committed};
use intake_core::dead_letter::DeadLetterLayer;
use intake_core::memory::{MemoryBroker, Record};
use intake_core::publish::{
    Confirmation, KeyOrderError, Output, PublishError, PublishErrorKind, PublishLayer, Publisher,
};
use intake_core::retry::RetryLayer;
use intake_core::{
    Constant, Consumer, ConsumerBuilder, DeliveryOrder, HandlerError, Key, Message, Payload,
    RunReport, handler_fn,
};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;

const PATIENCE: Duration = Duration::from_secs(20);

/// What the broker does with one output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Confirm,
    /// Unavailable: no confirmation; `stored` says whether the broker
    /// wrote it all the same.
    Fail {
        stored: bool,
    },
    Reject,
}

struct Sent {
    payload: String,
    answer: Option<Answer>,
    reply: Option<oneshot::Sender<Result<Confirmation, PublishError>>>,
}

/// Answers each output only when told (see the module docs).
#[derive(Clone, Default)]
struct Scripted {
    sends: Arc<Mutex<Vec<Sent>>>,
}

impl Scripted {
    fn sent(&self) -> Vec<String> {
        let sends = self.sends.lock().unwrap();
        sends.iter().map(|send| send.payload.clone()).collect()
    }

    fn answer(&self, index: usize, answer: Answer) {
        let mut sends = self.sends.lock().unwrap();
        let send = &mut sends[index];
        assert!(send.answer.is_none(), "send {index} answered twice");
        send.answer = Some(answer);
        let result = match answer {
            Answer::Confirm => Ok(Confirmation::default()),
            Answer::Fail { .. } => Err(PublishError::new(
                PublishErrorKind::Unavailable,
                "out",
                "no confirmation (scripted)",
            )),
            Answer::Reject => Err(PublishError::new(
                PublishErrorKind::Rejected,
                "out",
                "refused (scripted)",
            )),
        };
        if let Some(reply) = send.reply.take() {
            let _ = reply.send(result);
        }
    }

    /// Unanswered sends, oldest first.
    fn unanswered(&self) -> Vec<usize> {
        let sends = self.sends.lock().unwrap();
        (0..sends.len())
            .filter(|&index| sends[index].answer.is_none())
            .collect()
    }

    /// What the broker holds, in send order: confirmed outputs, and failed
    /// ones it stored all the same.
    fn stored(&self) -> Vec<String> {
        let sends = self.sends.lock().unwrap();
        sends
            .iter()
            .filter(|send| {
                matches!(
                    send.answer,
                    Some(Answer::Confirm | Answer::Fail { stored: true })
                )
            })
            .map(|send| send.payload.clone())
            .collect()
    }

    /// Whether the last send of `payload` was confirmed.
    fn last_confirmed(&self, payload: &str) -> bool {
        let sends = self.sends.lock().unwrap();
        sends
            .iter()
            .rev()
            .find(|send| send.payload == payload)
            .is_some_and(|send| send.answer == Some(Answer::Confirm))
    }
}

impl Publisher for Scripted {
    type Receipt = Pin<Box<dyn Future<Output = Result<Confirmation, PublishError>> + Send>>;

    async fn send(&self, output: Output) -> Result<Self::Receipt, PublishError> {
        let (reply, receipt) = oneshot::channel();
        self.sends.lock().unwrap().push(Sent {
            payload: String::from_utf8_lossy(output.payload()).into_owned(),
            answer: None,
            reply: Some(reply),
        });
        Ok(Box::pin(async move {
            receipt.await.unwrap_or_else(|_| {
                Err(PublishError::new(
                    PublishErrorKind::Closed,
                    "out",
                    "the test dropped the reply",
                ))
            })
        }))
    }
}

/// Forwards each payload with its key.
macro_rules! forward {
    () => {
        handler_fn(|Key(key): Key, Payload(body): Payload| async move {
            let output = Output::new("out", body);
            match key {
                Some(key) => output.with_key(key),
                None => output,
            }
        })
    };
}

/// A handler the consumer runs.
trait Handler:
    tower::Service<
        Message,
        Response = (),
        Error = HandlerError,
        Future: Future<Output = Result<(), HandlerError>> + Send + 'static,
    > + Send
    + 'static
{
}

impl<H> Handler for H where
    H: tower::Service<
            Message,
            Response = (),
            Error = HandlerError,
            Future: Future<Output = Result<(), HandlerError>> + Send + 'static,
        > + Send
        + 'static
{
}

/// A relay retrying a failed output in process (1 ms apart, up to 1,000
/// times), dead-lettering a refused one.
fn retrying_relay(broker: &MemoryBroker, publisher: Scripted) -> impl Handler {
    ServiceBuilder::new()
        .layer(DeadLetterLayer::new(
            broker.dead_letter_sink("in", "relay").unwrap(),
        ))
        .layer(RetryLayer::new(
            Constant::new(Duration::from_millis(1)).max_retries(1_000),
        ))
        .layer(PublishLayer::new(publisher))
        .service(forward!())
}

/// A relay without a retry layer: the runtime dispatches a failed input
/// again itself (the memory broker takes nothing back).
fn bare_relay(publisher: Scripted) -> impl Handler {
    ServiceBuilder::new()
        .layer(PublishLayer::new(publisher))
        .service(forward!())
}

fn broker_with(inputs: &[(&str, &str)]) -> MemoryBroker {
    let broker = MemoryBroker::new();
    broker.create_topic("in", 1).unwrap();
    for (key, payload) in inputs {
        broker
            .send(
                "in",
                Record::new(payload.to_string()).with_key(key.to_string()),
            )
            .unwrap();
    }
    broker
}

struct Running {
    shutdown: CancellationToken,
    run: tokio::task::JoinHandle<Result<RunReport, intake_core::RunError>>,
}

impl Running {
    async fn stop(self) -> RunReport {
        self.shutdown.cancel();
        tokio::time::timeout(PATIENCE, self.run)
            .await
            .expect("the run ends")
            .unwrap()
            .unwrap()
    }
}

fn start(broker: &MemoryBroker, builder: ConsumerBuilder, handler: impl Handler) -> Running {
    let (source, acker) = broker.consumer("in", "relay").unwrap();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        builder
            .build(source, acker, handler)
            .unwrap()
            .run(shutdown.clone()),
    );
    Running { shutdown, run }
}

fn key_order() -> ConsumerBuilder {
    Consumer::builder()
        .ordering(DeliveryOrder::Key)
        .commit_interval(Duration::from_millis(10))
}

async fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn wait_for_sends(publisher: &Scripted, count: usize) {
    wait_until(&format!("{count} sends"), || {
        publisher.sent().len() >= count
    })
    .await;
}

/// The last copy of each output, in the broker's order.
fn last_copies(stored: &[String]) -> Vec<String> {
    let mut last: BTreeMap<&str, usize> = BTreeMap::new();
    for (index, payload) in stored.iter().enumerate() {
        last.insert(payload, index);
    }
    let mut order: Vec<(usize, &str)> = last.into_iter().map(|(p, i)| (i, p)).collect();
    order.sort();
    order.into_iter().map(|(_, p)| p.to_owned()).collect()
}

/// (1) and (2): the key's second input is sent while the first output waits
/// for its confirmation, and nothing is committed until both are confirmed
/// (whatever order the confirmations come in). Before the key was released
/// on send, the second input ran only after the first confirmation: one
/// send, never two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_next_input_runs_while_the_output_before_is_unconfirmed() {
    let broker = broker_with(&[("k", "a"), ("k", "b"), ("k", "c")]);
    let publisher = Scripted::default();
    let running = start(&broker, key_order(), bare_relay(publisher.clone()));
    wait_for_sends(&publisher, 3).await;
    assert_eq!(publisher.sent(), ["a", "b", "c"], "sent in input order");
    // The commit interval passes many times while every output waits.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(broker.committed("in", "relay").unwrap(), vec![None]);
    // The last one confirmed first acknowledges nothing.
    publisher.answer(2, Answer::Confirm);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(broker.committed("in", "relay").unwrap(), vec![None]);
    publisher.answer(1, Answer::Confirm);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        broker.committed("in", "relay").unwrap(),
        vec![None],
        "b and c are confirmed, a is not: nothing is acknowledged"
    );
    publisher.answer(0, Answer::Confirm);
    wait_until_committed(&broker, "in", "relay", PATIENCE)
        .await
        .unwrap();
    let report = running.stop().await;
    assert_eq!(report.succeeded, 3);
    assert_eq!(publisher.sent(), ["a", "b", "c"], "nothing sent twice");
}

/// Another key is not held back by a key whose output waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_do_not_wait_for_each_other() {
    let broker = broker_with(&[("k", "a"), ("j", "x"), ("k", "b")]);
    let publisher = Scripted::default();
    let running = start(&broker, key_order(), bare_relay(publisher.clone()));
    wait_for_sends(&publisher, 3).await;
    for index in 0..3 {
        publisher.answer(index, Answer::Confirm);
    }
    wait_until_committed(&broker, "in", "relay", PATIENCE)
        .await
        .unwrap();
    assert_eq!(running.stop().await.succeeded, 3);
}

/// (3) with a retry layer: the first output fails after the second was
/// sent. The second input is failed too (its error says why: an earlier
/// output of its key failed) and sent again only after the first one's
/// retry, so the broker's last copies are in input order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_failure_sends_the_later_outputs_again_after_it() {
    let broker = broker_with(&[("k", "a"), ("k", "b")]);
    let publisher = Scripted::default();
    let running = start(
        &broker,
        key_order(),
        retrying_relay(&broker, publisher.clone()),
    );
    wait_for_sends(&publisher, 2).await;
    publisher.answer(0, Answer::Fail { stored: true });
    wait_for_sends(&publisher, 4).await;
    assert_eq!(
        publisher.sent(),
        ["a", "b", "a", "b"],
        "b is sent again, after a's retry"
    );
    // b's first copy is confirmed late: too late to count.
    publisher.answer(1, Answer::Confirm);
    publisher.answer(3, Answer::Confirm);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        broker.committed("in", "relay").unwrap(),
        vec![None],
        "a's retry is not confirmed yet"
    );
    publisher.answer(2, Answer::Confirm);
    wait_until_committed(&broker, "in", "relay", PATIENCE)
        .await
        .unwrap();
    let report = running.stop().await;
    assert_eq!(report.succeeded, 2);
    assert_eq!(publisher.stored(), ["a", "b", "a", "b"]);
    assert_eq!(last_copies(&publisher.stored()), ["a", "b"]);
    assert!(dead_letters(&broker, "in", "relay").is_empty());
}

/// (3) without a retry layer: the runtime dispatches both inputs again,
/// the earlier first, and the later one's attempt waits for the earlier
/// one's send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_dispatches_a_keys_failed_inputs_again_in_order() {
    let broker = broker_with(&[("k", "a"), ("k", "b"), ("k", "c")]);
    let publisher = Scripted::default();
    let running = start(
        &broker,
        key_order().backoff(Constant::new(Duration::from_millis(5))),
        bare_relay(publisher.clone()),
    );
    wait_for_sends(&publisher, 3).await;
    publisher.answer(1, Answer::Confirm);
    publisher.answer(0, Answer::Fail { stored: false });
    // After a failure the consumer's backoff gate lets one delivery probe:
    // a, first in its key's order.
    wait_for_sends(&publisher, 4).await;
    assert_eq!(publisher.sent()[3], "a");
    publisher.answer(3, Answer::Confirm);
    wait_for_sends(&publisher, 6).await;
    assert_eq!(publisher.sent(), ["a", "b", "c", "a", "b", "c"]);
    for index in publisher.unanswered() {
        publisher.answer(index, Answer::Confirm);
    }
    wait_until_committed(&broker, "in", "relay", PATIENCE)
        .await
        .unwrap();
    running.stop().await;
    assert_eq!(publisher.stored(), ["b", "c", "a", "b", "c"]);
    assert_eq!(last_copies(&publisher.stored()), ["a", "b", "c"]);
}

/// The error of an input failed for an earlier output's sake is typed and
/// says so at its own level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_later_inputs_error_names_the_earlier_failure() {
    let broker = broker_with(&[("k", "a"), ("k", "b")]);
    let publisher = Scripted::default();
    let errors: Arc<Mutex<Vec<HandlerError>>> = Arc::default();
    let recorded = Arc::clone(&errors);
    let inner = bare_relay(publisher.clone());
    let handler = tower::ServiceExt::map_err(inner, move |error: HandlerError| {
        let copy = HandlerError::retryable(error.to_string());
        recorded.lock().unwrap().push(error);
        copy
    });
    let running = start(
        &broker,
        key_order().backoff(Constant::new(Duration::from_millis(5))),
        handler,
    );
    wait_for_sends(&publisher, 2).await;
    publisher.answer(0, Answer::Fail { stored: false });
    wait_for_sends(&publisher, 3).await;
    publisher.answer(2, Answer::Confirm);
    wait_for_sends(&publisher, 4).await;
    publisher.answer(3, Answer::Confirm);
    wait_until_committed(&broker, "in", "relay", PATIENCE)
        .await
        .unwrap();
    running.stop().await;
    let errors = errors.lock().unwrap();
    let held_back = errors
        .iter()
        .filter_map(|error| error.cause().downcast_ref::<PublishError>())
        .find(|error| {
            std::error::Error::source(*error)
                .and_then(|source| source.downcast_ref::<KeyOrderError>())
                == Some(&KeyOrderError::EarlierOutputFailed)
        })
        .expect("b failed with a PublishError caused by KeyOrderError::EarlierOutputFailed");
    assert_eq!(held_back.kind(), PublishErrorKind::Unavailable);
    assert_eq!(
        held_back.to_string(),
        "unavailable publish to \"out\": held back for its key's order; publish again"
    );
}

/// (4) A refused output dead-letters its own input only: the later output
/// of its key stands, and is not sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_earlier_output_dead_letters_only_its_input() {
    let broker = broker_with(&[("k", "a"), ("k", "b")]);
    let publisher = Scripted::default();
    let running = start(
        &broker,
        key_order(),
        retrying_relay(&broker, publisher.clone()),
    );
    wait_for_sends(&publisher, 2).await;
    publisher.answer(0, Answer::Reject);
    publisher.answer(1, Answer::Confirm);
    wait_until_committed(&broker, "in", "relay", PATIENCE)
        .await
        .unwrap();
    let report = running.stop().await;
    assert_eq!(report.succeeded, 1);
    assert_eq!(report.dead_lettered, 1);
    assert_eq!(publisher.sent(), ["a", "b"], "b is not sent again");
    let letters = dead_letters(&broker, "in", "relay");
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].message.payload().as_ref(), b"a");
}

/// (5) A shutdown while a released key's outputs wait ends at its deadline
/// and commits nothing unconfirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_while_outputs_wait_commits_nothing() {
    let broker = broker_with(&[("k", "a"), ("k", "b")]);
    let publisher = Scripted::default();
    let running = start(
        &broker,
        key_order().shutdown_deadline(Duration::from_millis(300)),
        bare_relay(publisher.clone()),
    );
    wait_for_sends(&publisher, 2).await;
    publisher.answer(1, Answer::Confirm);
    let report = running.stop().await;
    assert_eq!(report.succeeded, 0, "b's output is confirmed, a's is not");
    assert_eq!(report.unfinished.len(), 2);
    assert_eq!(broker.committed("in", "relay").unwrap(), vec![None]);
}

/// (5) An earlier input that waits to be dispatched again when the
/// consumer stops does not hold the drain until its deadline: the later
/// input of its key, confirmed, fails as interrupted (it must not be
/// acknowledged ahead of the earlier one) and the run ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_with_an_earlier_input_waiting_to_retry_ends_without_waiting() {
    let broker = broker_with(&[("k", "a"), ("k", "b")]);
    let publisher = Scripted::default();
    let running = start(
        &broker,
        key_order()
            // The failed input waits for this backoff, not dispatched again.
            .backoff(Constant::new(Duration::from_secs(600)))
            // The run must end long before this (the test's patience).
            .shutdown_deadline(Duration::from_secs(600)),
        bare_relay(publisher.clone()),
    );
    wait_for_sends(&publisher, 2).await;
    publisher.answer(1, Answer::Confirm);
    publisher.answer(0, Answer::Fail { stored: false });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let report = running.stop().await;
    assert_eq!(report.succeeded, 0, "b is not acknowledged ahead of a");
    assert_eq!(broker.committed("in", "relay").unwrap(), vec![None]);
    assert_eq!(publisher.sent(), ["a", "b"]);
}

/// A small deterministic generator for the schedules below.
struct Xorshift(u64);

impl Xorshift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }
}

/// Answers the sends in a random order, some of them failures (stored or
/// not), until told to stop; at most `failures` failures, so every input
/// gets through in the end.
async fn answer_randomly(
    publisher: Scripted,
    seed: u64,
    mut failures: u32,
    stop: CancellationToken,
) {
    let mut random = Xorshift(seed | 1);
    while !stop.is_cancelled() {
        let unanswered = publisher.unanswered();
        if unanswered.is_empty() {
            tokio::time::sleep(Duration::from_micros(200)).await;
            continue;
        }
        let index = unanswered[random.below(unanswered.len())];
        let answer = if failures > 0 && random.below(5) == 0 {
            failures -= 1;
            Answer::Fail {
                stored: random.below(2) == 0,
            }
        } else {
            Answer::Confirm
        };
        publisher.answer(index, answer);
        if random.below(3) == 0 {
            tokio::time::sleep(Duration::from_micros(random.below(500) as u64)).await;
        } else {
            tokio::task::yield_now().await;
        }
    }
}

/// The inputs of a schedule: `k{key}:{n}`, n counting all inputs.
fn inputs_of(keys: &[u8]) -> Vec<(String, String)> {
    keys.iter()
        .enumerate()
        .map(|(n, key)| (format!("k{key}"), format!("k{key}:{n}")))
        .collect()
}

/// Runs one schedule and returns what the rule says went wrong, if
/// anything: an input answered `Ok` (so acknowledged) before the last send
/// of its own output or of an earlier output of its key was confirmed; a
/// key whose last copies are not in input order; an input without an
/// output.
async fn run_schedule(keys: Vec<u8>, seed: u64, retry_layer: bool) -> Vec<String> {
    let inputs = inputs_of(&keys);
    let broker = MemoryBroker::new();
    broker.create_topic("in", 1).unwrap();
    for (key, payload) in &inputs {
        broker
            .send("in", Record::new(payload.clone()).with_key(key.clone()))
            .unwrap();
    }
    let publisher = Scripted::default();
    let violations: Arc<Mutex<Vec<String>>> = Arc::default();
    // Outermost: what the runtime acknowledges is what this sees answer Ok.
    let check = {
        let publisher = publisher.clone();
        let violations = Arc::clone(&violations);
        let inputs = inputs.clone();
        move |payload: &str| {
            let (key, _) = payload.split_once(':').unwrap_or_default();
            for (earlier_key, earlier) in &inputs {
                if earlier_key != key {
                    continue;
                }
                if !publisher.last_confirmed(earlier) {
                    violations.lock().unwrap().push(format!(
                        "{payload} answered Ok before {earlier}'s output was confirmed"
                    ));
                }
                if earlier == payload {
                    break;
                }
            }
        }
    };
    let stop = CancellationToken::new();
    let answers = tokio::spawn(answer_randomly(publisher.clone(), seed, 12, stop.clone()));
    let builder = key_order().backoff(Constant::new(Duration::from_millis(1)));
    let running = if retry_layer {
        start(
            &broker,
            builder,
            Checked::new(retrying_relay(&broker, publisher.clone()), check),
        )
    } else {
        start(
            &broker,
            builder,
            Checked::new(bare_relay(publisher.clone()), check),
        )
    };
    let committed = wait_until_committed(&broker, "in", "relay", PATIENCE).await;
    running.stop().await;
    stop.cancel();
    let _ = answers.await;
    let mut violations = std::mem::take(&mut *violations.lock().unwrap());
    if committed.is_err() {
        violations.push("not everything was committed".to_owned());
    }
    let last = last_copies(&publisher.stored());
    for key in 0..3u8 {
        let prefix = format!("k{key}:");
        let expected: Vec<&String> = inputs
            .iter()
            .map(|(_, payload)| payload)
            .filter(|payload| payload.starts_with(&prefix))
            .collect();
        let got: Vec<&String> = last.iter().filter(|p| p.starts_with(&prefix)).collect();
        if got != expected {
            violations.push(format!(
                "last copies of k{key}: {got:?}, inputs {expected:?}; stored {:?}",
                publisher.stored()
            ));
        }
    }
    violations
}

/// Calls `check` with the payload of each input its inner service answers
/// `Ok`.
#[derive(Clone)]
struct Checked<S, C> {
    inner: S,
    check: C,
}

impl<S, C> Checked<S, C> {
    fn new(inner: S, check: C) -> Self {
        Self { inner, check }
    }
}

impl<S, C> tower::Service<Message> for Checked<S, C>
where
    S: tower::Service<Message, Response = (), Error = HandlerError>,
    S::Future: Send + 'static,
    C: Fn(&str) + Clone + Send + 'static,
{
    type Response = ();
    type Error = HandlerError;
    type Future = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), HandlerError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, message: Message) -> Self::Future {
        let payload = String::from_utf8_lossy(message.payload()).into_owned();
        let check = self.check.clone();
        let answered = self.inner.call(message);
        Box::pin(async move {
            answered.await?;
            check(&payload);
            Ok(())
        })
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..proptest::prelude::ProptestConfig::default()
    })]

    /// (6) Over random schedules of confirmations and failures (out of
    /// order, failed outputs stored or not), with the retry layer or the
    /// runtime trying again: no input is acknowledged before its output and
    /// every earlier output of its key are confirmed, and each key's last
    /// copies downstream are in input order.
    #[test]
    fn the_rule_holds_over_random_confirmation_schedules(
        keys in proptest::collection::vec(0u8..3, 1..30),
        seed in proptest::prelude::any::<u64>(),
        retry_layer in proptest::prelude::any::<bool>(),
    ) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let violations = runtime.block_on(run_schedule(keys, seed, retry_layer));
        proptest::prop_assert!(violations.is_empty(), "{violations:#?}");
    }
}

/// Drops the first attempt of the input `payload` when the test says so,
/// as a timeout layer gives up on an attempt.
#[derive(Clone)]
struct AbandonOnce<S> {
    inner: S,
    payload: &'static str,
    signal: Arc<tokio::sync::Notify>,
    done: Arc<std::sync::atomic::AtomicBool>,
}

impl<S> tower::Service<Message> for AbandonOnce<S>
where
    S: tower::Service<Message, Response = (), Error = HandlerError>,
    S::Future: Send + 'static,
{
    type Response = ();
    type Error = HandlerError;
    type Future = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), HandlerError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, message: Message) -> Self::Future {
        let abandon = message.payload().as_ref() == self.payload.as_bytes()
            && !self.done.swap(true, std::sync::atomic::Ordering::SeqCst);
        let answered = self.inner.call(message);
        if !abandon {
            return Box::pin(answered);
        }
        let signal = Arc::clone(&self.signal);
        Box::pin(async move {
            tokio::select! {
                answered = answered => answered,
                () = signal.notified() => Err(HandlerError::retryable("abandoned by the test")),
            }
        })
    }
}

/// An attempt dropped after it sent (a timeout layer gave up on it) counts
/// as a failed output: the later input of its key, confirmed and waiting
/// for it, fails and is sent again after the dropped one's next attempt.
/// (Without that, the later input was acknowledged on the strength of its
/// first copy, which the earlier one's retry then followed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_attempt_sends_the_later_outputs_again_after_it() {
    let broker = broker_with(&[("k", "a"), ("k", "b")]);
    let publisher = Scripted::default();
    let signal = Arc::new(tokio::sync::Notify::new());
    let handler = AbandonOnce {
        inner: bare_relay(publisher.clone()),
        payload: "a",
        signal: Arc::clone(&signal),
        done: Arc::default(),
    };
    let running = start(
        &broker,
        key_order().backoff(Constant::new(Duration::from_millis(5))),
        handler,
    );
    wait_for_sends(&publisher, 2).await;
    publisher.answer(1, Answer::Confirm);
    signal.notify_one();
    wait_for_sends(&publisher, 3).await;
    publisher.answer(2, Answer::Confirm);
    wait_for_sends(&publisher, 4).await;
    publisher.answer(3, Answer::Confirm);
    wait_until_committed(&broker, "in", "relay", PATIENCE)
        .await
        .unwrap();
    running.stop().await;
    assert_eq!(publisher.sent(), ["a", "b", "a", "b"]);
    assert_eq!(last_copies(&publisher.stored()), ["a", "b"]);
}

/// (5) A revocation while an earlier input of a released key waits to be
/// dispatched again ends without waiting for the revoke timeout: the
/// waiting input is released unacknowledged, the later one of its key
/// (its output confirmed) fails as interrupted instead of being
/// acknowledged ahead of it, and the partition's next owner receives both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_with_an_earlier_input_waiting_to_retry_hands_both_on() {
    let broker = MemoryBroker::new();
    broker.create_topic("in", 2).unwrap();
    for payload in ["a", "b"] {
        broker
            .send("in", Record::new(payload).with_key("k").to_partition(1))
            .unwrap();
    }
    let publisher = Scripted::default();
    let first = start(
        &broker,
        key_order()
            // The failed input waits for this backoff, not dispatched again.
            .backoff(Constant::new(Duration::from_secs(600)))
            // The revocation must end long before this (the test's patience).
            .revoke_timeout(Duration::from_secs(600)),
        bare_relay(publisher.clone()),
    );
    wait_for_sends(&publisher, 2).await;
    publisher.answer(1, Answer::Confirm);
    publisher.answer(0, Answer::Fail { stored: false });
    tokio::time::sleep(Duration::from_millis(50)).await;

    // A second member joins the group: partition 1 moves to it.
    let handled: Arc<Mutex<Vec<String>>> = Arc::default();
    let recording = {
        let handled = Arc::clone(&handled);
        handler_fn(move |Payload(body): Payload| {
            let handled = Arc::clone(&handled);
            async move {
                handled
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&body).into_owned());
                Ok::<(), HandlerError>(())
            }
        })
    };
    let second = start(&broker, key_order(), recording);
    wait_until("the next owner handled a and b", || {
        handled.lock().unwrap().len() >= 2
    })
    .await;
    assert_eq!(*handled.lock().unwrap(), ["a", "b"]);
    let report = first.stop().await;
    assert_eq!(report.succeeded, 0, "b is not acknowledged ahead of a");
    assert_eq!(publisher.sent(), ["a", "b"]);
    second.stop().await;
}

/// (5) An earlier input that will not run again (it waits for the
/// consumer's backoff when the consumer stops) poisons the later input of
/// its key: that one's next attempt, due within the drain, fails as
/// interrupted instead of sending and being acknowledged ahead of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_input_left_unfinished_keeps_the_later_one_unacknowledged() {
    let broker = broker_with(&[("k", "a"), ("k", "b")]);
    let publisher = Scripted::default();
    let calls_of_a = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let handler = {
        let calls_of_a = Arc::clone(&calls_of_a);
        ServiceBuilder::new()
            .layer(RetryLayer::new(
                Constant::new(Duration::from_millis(20)).max_retries(1_000),
            ))
            .layer(PublishLayer::new(publisher.clone()))
            .service(handler_fn(move |Payload(body): Payload| {
                let again = body.as_ref() == b"a"
                    && calls_of_a.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0;
                async move {
                    if again {
                        // Not retried in process: the runtime dispatches it
                        // again after the consumer's backoff.
                        return Err(HandlerError::retry_later(
                            "a dependency of a is down",
                            Duration::from_secs(600),
                        ));
                    }
                    Ok(Output::new("out", body).with_key("k"))
                }
            }))
    };
    let running = start(
        &broker,
        key_order()
            .backoff(Constant::new(Duration::from_secs(600)))
            .shutdown_deadline(Duration::from_secs(600)),
        handler,
    );
    wait_for_sends(&publisher, 2).await;
    publisher.answer(0, Answer::Fail { stored: false });
    wait_until("a's second attempt", || {
        calls_of_a.load(std::sync::atomic::Ordering::SeqCst) >= 2
    })
    .await;
    // b was failed with a and retries every 20 ms, waiting for a to send.
    running.shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(200)).await;
    for index in publisher.unanswered() {
        publisher.answer(index, Answer::Confirm);
    }
    let report = tokio::time::timeout(PATIENCE, running.run)
        .await
        .expect("the run ends")
        .unwrap()
        .unwrap();
    assert_eq!(report.succeeded, 0, "b is not acknowledged ahead of a");
    assert_eq!(publisher.sent(), ["a", "b"], "b is not sent again");
    assert_eq!(broker.committed("in", "relay").unwrap(), vec![None]);
}
