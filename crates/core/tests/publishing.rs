//! Publishing from handlers on the memory broker: an input is committed only
//! after its outputs are confirmed, a failed output fails its input by class,
//! and outputs keep their inputs' order per key even when confirmations
//! come back out of order.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use intake_core::backend::testkit::{dead_letters, wait_until_committed};
use intake_core::dead_letter::DeadLetterLayer;
use intake_core::memory::{MemoryBroker, MemoryPublisher, Record};
use intake_core::publish::{
    Confirmation, Output, Outputs, Publish, PublishError, PublishLayer, Publisher,
};
use intake_core::retry::RetryLayer;
use intake_core::{
    Constant, Consumer, DeliveryOrder, HandlerError, Key, Payload, handler_fn,
    handler_fn_with_state,
};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;

const PATIENCE: Duration = Duration::from_secs(20);

/// A broker whose confirmations come only when the test lets them: an
/// output is stored when its receipt is released, as a broker's write
/// becomes durable only when it confirms.
#[derive(Clone)]
struct GatedPublisher {
    inner: MemoryPublisher,
    releases: Arc<Semaphore>,
    sent: Arc<AtomicU32>,
}

impl GatedPublisher {
    fn new(broker: &MemoryBroker) -> Self {
        Self {
            inner: broker.memory_publisher(),
            releases: Arc::new(Semaphore::new(0)),
            sent: Arc::new(AtomicU32::new(0)),
        }
    }

    fn release(&self, confirmations: usize) {
        self.releases.add_permits(confirmations);
    }
}

impl Publisher for GatedPublisher {
    type Receipt =
        std::pin::Pin<Box<dyn Future<Output = Result<Confirmation, PublishError>> + Send>>;

    async fn send(&self, output: Output) -> Result<Self::Receipt, PublishError> {
        self.sent.fetch_add(1, Ordering::SeqCst);
        let inner = self.inner.clone();
        let releases = Arc::clone(&self.releases);
        Ok(Box::pin(async move {
            if let Ok(permit) = releases.acquire().await {
                permit.forget();
            }
            inner.publish(output).await
        }))
    }
}

/// Stores each output when it is sent, in send order (as every publisher
/// must: see `Publisher::send`), and confirms it after a pseudo-random
/// delay, so confirmations of outputs sent one after another come back out
/// of order.
#[derive(Clone)]
struct JitteryPublisher {
    inner: MemoryPublisher,
    next: Arc<AtomicU32>,
}

impl Publisher for JitteryPublisher {
    type Receipt =
        std::pin::Pin<Box<dyn Future<Output = Result<Confirmation, PublishError>> + Send>>;

    async fn send(&self, output: Output) -> Result<Self::Receipt, PublishError> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let delay = Duration::from_micros(u64::from(n.wrapping_mul(2_654_435_761) % 3_000));
        let stored = self.inner.publish(output).await;
        Ok(Box::pin(async move {
            tokio::time::sleep(delay).await;
            stored
        }))
    }
}

async fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn relay_of<P: Publisher>(
    publisher: P,
) -> impl tower::Service<
    intake_core::Message,
    Response = (),
    Error = HandlerError,
    Future = impl Future<Output = Result<(), HandlerError>> + Send,
> + Send
+ 'static {
    ServiceBuilder::new()
        .layer(PublishLayer::new(publisher))
        .service(handler_fn(
            |Key(key): Key, Payload(body): Payload| async move {
                let output = Output::new("out", body);
                match key {
                    Some(key) => output.with_key(key),
                    None => output,
                }
            },
        ))
}

/// Runs a consumer of `in` in group `relay` with `handler` until
/// everything is committed, stops it, and returns its report.
async fn relay_until_committed<H>(
    broker: &MemoryBroker,
    builder: intake_core::ConsumerBuilder,
    handler: H,
) -> intake_core::RunReport
where
    H: tower::Service<intake_core::Message, Response = (), Error = HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    let (source, acker) = broker.consumer("in", "relay").unwrap();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(
        builder
            .build(source, acker, handler)
            .unwrap()
            .run(shutdown.clone()),
    );
    wait_until_committed(broker, "in", "relay", PATIENCE)
        .await
        .unwrap();
    shutdown.cancel();
    run.await.unwrap().unwrap()
}

fn stored(broker: &MemoryBroker, topic: &str) -> Vec<String> {
    let partitions = broker.partitions(topic).expect("the topic exists");
    (0..partitions)
        .flat_map(|partition| {
            broker
                .messages(topic, partition, 0)
                .expect("read the topic")
        })
        .map(|message| String::from_utf8_lossy(message.payload()).into_owned())
        .collect()
}

/// Killed while its output waits for confirmation, a relay has committed
/// nothing: the next relay gets the input again and publishes it. Killed
/// after the confirmation, the output is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_is_committed_only_after_its_output_is_confirmed() {
    let broker = MemoryBroker::new();
    broker.create_topic("in", 1).unwrap();
    broker.create_topic("out", 1).unwrap();
    broker.send("in", Record::new("m0").with_key("k")).unwrap();

    let gated = GatedPublisher::new(&broker);
    let (source, acker) = broker.consumer("in", "relay").unwrap();
    let consumer = Consumer::builder()
        .build(source, acker, relay_of(gated.clone()))
        .unwrap();
    let shutdown = CancellationToken::new();
    let first = tokio::spawn(consumer.run(shutdown.clone()));
    wait_until("the output to be sent", || {
        gated.sent.load(Ordering::SeqCst) == 1
    })
    .await;
    // The handler has returned its output; the commit interval passes
    // several times while the confirmation is held back.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        broker.committed("in", "relay").unwrap(),
        vec![None],
        "the input was committed before its output was confirmed"
    );
    first.abort();
    let _ = first.await;
    assert!(stored(&broker, "out").is_empty(), "nothing was confirmed");

    // The next relay of the group receives the input again.
    let gated = GatedPublisher::new(&broker);
    gated.release(1);
    let (source, acker) = broker.consumer("in", "relay").unwrap();
    let consumer = Consumer::builder()
        .build(source, acker, relay_of(gated.clone()))
        .unwrap();
    let shutdown = CancellationToken::new();
    let second = tokio::spawn(consumer.run(shutdown.clone()));
    wait_until_committed(&broker, "in", "relay", PATIENCE)
        .await
        .expect("the redelivered input is committed once its output is confirmed");
    assert_eq!(stored(&broker, "out"), ["m0"]);
    shutdown.cancel();
    let report = second.await.unwrap().unwrap();
    assert_eq!(report.succeeded, 1);
}

/// A failed output makes its input retryable: the retry layer calls the
/// handler again, and the output lands once the broker is back.
#[tokio::test]
async fn a_failed_output_is_retried_with_its_input() {
    let broker = MemoryBroker::new();
    broker.create_topic("in", 1).unwrap();
    broker.create_topic("out", 1).unwrap();
    broker.send("in", Record::new("m0")).unwrap();
    let publisher = broker.memory_publisher();
    publisher.fail_next(2);
    let calls = Arc::new(AtomicU32::new(0));
    let handler = ServiceBuilder::new()
        .layer(RetryLayer::new(
            Constant::new(Duration::from_millis(1)).max_retries(5),
        ))
        .layer(PublishLayer::new(publisher))
        .service(handler_fn({
            let calls = Arc::clone(&calls);
            move |Payload(body): Payload| {
                calls.fetch_add(1, Ordering::SeqCst);
                async move { Output::new("out", body) }
            }
        }));
    let report = relay_until_committed(&broker, Consumer::builder(), handler).await;
    assert_eq!(report.succeeded, 1);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "two failed publishes, then one that landed"
    );
    assert_eq!(stored(&broker, "out"), ["m0"]);
}

/// An output the broker refuses is the input's permanent failure: it goes
/// to the dead-letter destination, without retries.
#[tokio::test]
async fn a_rejected_output_dead_letters_its_input() {
    let broker = MemoryBroker::new();
    broker.create_topic("in", 1).unwrap();
    broker.send("in", Record::new("m0")).unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let handler = ServiceBuilder::new()
        .layer(DeadLetterLayer::new(
            broker.dead_letter_sink("in", "relay").unwrap(),
        ))
        .layer(RetryLayer::new(
            Constant::new(Duration::from_millis(1)).max_retries(5),
        ))
        .layer(PublishLayer::new(broker.memory_publisher()))
        .service(handler_fn({
            let calls = Arc::clone(&calls);
            move |Payload(body): Payload| {
                calls.fetch_add(1, Ordering::SeqCst);
                async move { Output::new("no-such-topic", body) }
            }
        }));
    relay_until_committed(&broker, Consumer::builder(), handler).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "a rejected output is not retried"
    );
    let letters = dead_letters(&broker, "in", "relay");
    assert_eq!(letters.len(), 1);
    assert!(
        letters[0].error.contains("no-such-topic"),
        "the letter says which output was refused: {}",
        letters[0].error
    );
}

/// With confirmations coming back out of order, each key's outputs still
/// land in its inputs' order: the next input of a key runs only after the
/// outputs of the one before are sent (`tests/key_order_release.rs` has
/// the failures).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_keep_their_inputs_order_per_key() {
    const COUNT: u32 = 600;
    const KEYS: u32 = 8;
    let broker = MemoryBroker::new();
    broker.create_topic("in", 2).unwrap();
    broker.create_topic("out", 1).unwrap();
    for n in 0..COUNT {
        broker
            .send(
                "in",
                Record::new(format!("k{}:{n}", n % KEYS)).with_key(format!("k{}", n % KEYS)),
            )
            .unwrap();
    }
    let publisher = JitteryPublisher {
        inner: broker.memory_publisher(),
        next: Arc::new(AtomicU32::new(0)),
    };
    relay_until_committed(
        &broker,
        Consumer::builder()
            .ordering(DeliveryOrder::Key)
            .max_in_flight(64),
        relay_of(publisher),
    )
    .await;

    let mut per_key: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for output in stored(&broker, "out") {
        let (key, n) = output.split_once(':').expect("key:n");
        per_key
            .entry(key.to_owned())
            .or_default()
            .push(n.parse().expect("n"));
    }
    assert_eq!(
        per_key.values().map(Vec::len).sum::<usize>(),
        COUNT as usize
    );
    for (key, ns) in per_key {
        assert!(
            ns.windows(2).all(|pair| pair[0] < pair[1]),
            "outputs of {key} out of order: {ns:?}"
        );
    }
}

/// The extractor publishes within the handler, with the input's trace
/// context, and several outputs of one input land in the order given.
#[tokio::test]
async fn a_handler_publishes_through_the_extractor() {
    const TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let broker = MemoryBroker::new();
    broker.create_topic("in", 1).unwrap();
    broker.create_topic("out", 1).unwrap();
    broker
        .send("in", Record::new("m0").with_header("traceparent", TRACE))
        .unwrap();
    let handler = handler_fn_with_state(
        broker.memory_publisher(),
        |publish: Publish<MemoryPublisher>, Payload(body): Payload| async move {
            let outputs: Outputs = (0..3)
                .map(|n| Output::new("out", format!("{}-{n}", String::from_utf8_lossy(&body))))
                .collect();
            publish.publish_all(outputs).await?;
            Ok::<(), HandlerError>(())
        },
    );
    relay_until_committed(&broker, Consumer::builder(), handler).await;
    let outputs = broker.messages("out", 0, 0).unwrap();
    let bodies: Vec<_> = outputs
        .iter()
        .map(|m| String::from_utf8_lossy(m.payload()).into_owned())
        .collect();
    assert_eq!(bodies, ["m0-0", "m0-1", "m0-2"]);
    assert!(
        outputs
            .iter()
            .all(|m| m.headers().get_str("traceparent") == Some(TRACE)),
        "every output carries the input's trace context"
    );
}

/// A handler with no output completes as a plain one.
#[tokio::test]
async fn no_output_completes_the_input() {
    let broker = MemoryBroker::new();
    broker.create_topic("in", 1).unwrap();
    broker.send("in", Record::new("m0")).unwrap();
    let handler = ServiceBuilder::new()
        .layer(PublishLayer::new(broker.memory_publisher()))
        .service(handler_fn(|Payload(_): Payload| async { Outputs::none() }));
    let report = relay_until_committed(&broker, Consumer::builder(), handler).await;
    assert_eq!(report.succeeded, 1);
}
