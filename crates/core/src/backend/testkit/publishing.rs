//! The publisher scenarios every backend's [`Publisher`] passes unchanged:
//! outputs confirmed and delivered with their keys and headers, order per
//! key, and a relay that acknowledges each input only after its output.
//!
//! A backend crate implements [`PublishingBackend`] on its conformance
//! fixture and lets [`publisher_suite!`](crate::publisher_suite) write the
//! tests:
//!
//! ```ignore
//! intake_core::publisher_suite!(backend());
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::harness::{Ledger, PATIENCE, Running, id_of, unique_group, wait_until_acknowledged};
use super::{Backend, TestMessage};
use crate::consumer::{Consumer, DeliveryOrder};
use crate::error::{BoxError, HandlerError};
use crate::handler::handler_fn;
use crate::message::Message;
use crate::publish::{Output, PublishLayer, Publisher};
use crate::trace::TRACEPARENT;

/// A backend whose publisher the suite checks, by publishing into its
/// sources and consuming them back with the backend's own consumer.
#[async_trait::async_trait]
pub trait PublishingBackend: Backend {
    /// The backend's publisher.
    type Publisher: Publisher;

    /// A publisher connected to the broker under test.
    async fn publisher(&self) -> Result<Self::Publisher, BoxError>;

    /// What an [`Output`] names as its destination to land in `source` (a
    /// source made by [`Backend::create_source`]): the topic or stream
    /// itself, the queue's routing key, a subject of the stream.
    fn destination(&self, source: &str) -> String;

    /// The key a consumer of `source` reads back for an output sent to
    /// `destination` with `key`: the key itself (the default), or what the
    /// backend's documented mapping makes of it (NATS: the subject, of which
    /// the key is the last token).
    fn key_read_back(&self, destination: &str, key: &str) -> String {
        let _ = destination;
        key.to_owned()
    }
}

/// Writes one `#[tokio::test]` per publisher scenario, like
/// [`conformance_suite!`](crate::conformance_suite).
#[macro_export]
macro_rules! publisher_suite {
    ($backend:expr) => {
        $crate::publisher_suite!(@scenarios $backend;
            published_outputs_are_confirmed_and_delivered,
            outputs_keep_their_order_per_key,
            a_relay_acknowledges_inputs_after_their_outputs,
        );
    };
    (@scenarios $backend:expr; $($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                let Some(backend) = $backend.await else {
                    return;
                };
                $crate::backend::testkit::publishing::$scenario(&backend).await;
            }
        )*
    };
}

const KEYS: u64 = 16;

fn numbered_output(destination: &Arc<str>, id: u64) -> Output {
    Output::new(Arc::clone(destination), id.to_string())
        .with_key(format!("k{}", id % KEYS))
        .with_header("scenario-id", id.to_string())
}

/// Sends `count` numbered outputs one after another without waiting, then
/// waits for every confirmation.
async fn publish_numbered<P: Publisher>(publisher: &P, destination: &str, count: u64) {
    let destination: Arc<str> = destination.into();
    let mut receipts = Vec::new();
    for id in 0..count {
        let receipt = publisher
            .send(numbered_output(&destination, id))
            .await
            .unwrap_or_else(|error| panic!("send output {id}: {error}"));
        receipts.push(receipt);
    }
    for (id, receipt) in receipts.into_iter().enumerate() {
        tokio::time::timeout(PATIENCE, receipt)
            .await
            .unwrap_or_else(|_| panic!("output {id} was not confirmed within {PATIENCE:?}"))
            .unwrap_or_else(|error| panic!("output {id} was not confirmed: {error}"));
    }
}

fn partitions_of<B: Backend>(backend: &B) -> u32 {
    if backend.capabilities().partitions {
        4
    } else {
        1
    }
}

/// Outputs sent without waiting are each confirmed, and a consumer of the
/// destination receives every one with its key and headers.
pub async fn published_outputs_are_confirmed_and_delivered<B: PublishingBackend>(backend: &B) {
    let source = backend
        .create_source(partitions_of(backend))
        .await
        .expect("create the source");
    let publisher = backend.publisher().await.expect("connect the publisher");
    let destination = backend.destination(&source);
    publish_numbered(&publisher, &destination, 300).await;
    let keys: Arc<Vec<String>> = Arc::new(
        (0..KEYS)
            .map(|key| backend.key_read_back(&destination, &format!("k{key}")))
            .collect(),
    );

    let ledger = Ledger::default();
    let mismatches = Arc::new(Mutex::new(Vec::<String>::new()));
    let handler = {
        let ledger = ledger.clone();
        let mismatches = Arc::clone(&mismatches);
        tower::service_fn(move |message: Message| {
            let ledger = ledger.clone();
            let mismatches = Arc::clone(&mismatches);
            let keys = Arc::clone(&keys);
            async move {
                let id = id_of(&message)?;
                let key = &keys[(id % KEYS) as usize];
                let header = message.headers().get_str("scenario-id").map(str::to_owned);
                let intact = message.key().map(Bytes::as_ref) == Some(key.as_bytes())
                    && header.as_deref() == Some(id.to_string().as_str());
                if !intact && let Ok(mut mismatches) = mismatches.lock() {
                    mismatches.push(format!(
                        "output {id}: key {:?}, header {header:?}",
                        message.key()
                    ));
                }
                ledger.record(id);
                Ok::<(), HandlerError>(())
            }
        })
    };
    let group = unique_group("published");
    let consumer = Running::start(backend, &source, &group, Consumer::builder(), 64, handler)
        .await
        .expect("connect a consumer of the destination");
    ledger.wait_for_all(300, "all 300 published outputs").await;
    consumer.stop().await;
    let mismatches = mismatches.lock().map(|m| m.clone()).unwrap_or_default();
    assert!(
        mismatches.is_empty(),
        "{}: outputs lost their key or headers: {mismatches:?}",
        backend.name()
    );
}

/// Outputs of one key, sent one after another without waiting, are
/// consumed in the order they were sent.
pub async fn outputs_keep_their_order_per_key<B: PublishingBackend>(backend: &B) {
    let source = backend
        .create_source(partitions_of(backend))
        .await
        .expect("create the source");
    let publisher = backend.publisher().await.expect("connect the publisher");
    publish_numbered(&publisher, &backend.destination(&source), 400).await;

    let ledger = Ledger::default();
    let order = Arc::new(Mutex::new(BTreeMap::<u64, Vec<u64>>::new()));
    let handler = {
        let ledger = ledger.clone();
        let order = Arc::clone(&order);
        tower::service_fn(move |message: Message| {
            let ledger = ledger.clone();
            let order = Arc::clone(&order);
            async move {
                let id = id_of(&message)?;
                if ledger.count(id) == 0
                    && let Ok(mut order) = order.lock()
                {
                    order.entry(id % KEYS).or_default().push(id);
                }
                ledger.record(id);
                Ok::<(), HandlerError>(())
            }
        })
    };
    let group = unique_group("ordered-outputs");
    let consumer = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder().ordering(DeliveryOrder::Key),
        64,
        handler,
    )
    .await
    .expect("connect a consumer of the destination");
    ledger.wait_for_all(400, "all 400 published outputs").await;
    consumer.stop().await;
    let order = order.lock().map(|order| order.clone()).unwrap_or_default();
    for (key, ids) in order {
        assert!(
            ids.windows(2).all(|pair| pair[0] < pair[1]),
            "{}: outputs of key k{key} arrived out of order: {ids:?}",
            backend.name()
        );
    }
}

/// A consumer that forwards each input to another source with
/// [`PublishLayer`] acknowledges every input, and the other source then
/// holds every output, unchanged, with the input's trace context.
pub async fn a_relay_acknowledges_inputs_after_their_outputs<B: PublishingBackend>(backend: &B) {
    const COUNT: u64 = 200;
    const TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let partitions = partitions_of(backend);
    let input = backend
        .create_source(partitions)
        .await
        .expect("create the input source");
    let output = backend
        .create_source(partitions)
        .await
        .expect("create the output source");
    let messages = (0..COUNT)
        .map(|id| {
            let mut message = TestMessage::new(format!("k{}", id % KEYS), id.to_string());
            message.headers.insert(TRACEPARENT, TRACE);
            message
        })
        .collect();
    backend.produce(&input, messages).await.expect("produce");

    let publisher = backend.publisher().await.expect("connect the publisher");
    let destination: Arc<str> = backend.destination(&output).into();
    let relay = tower::ServiceBuilder::new()
        .layer(PublishLayer::new(publisher))
        .service(handler_fn(move |message: Message| {
            let destination = Arc::clone(&destination);
            async move { Output::forward(&message, destination) }
        }));
    let relay_group = unique_group("relay");
    let relaying = Running::start(
        backend,
        &input,
        &relay_group,
        Consumer::builder().ordering(DeliveryOrder::Key),
        64,
        relay,
    )
    .await
    .expect("connect the relay");

    let ledger = Ledger::default();
    let untraced = Arc::new(Mutex::new(Vec::<u64>::new()));
    let handler = {
        let ledger = ledger.clone();
        let untraced = Arc::clone(&untraced);
        tower::service_fn(move |message: Message| {
            let ledger = ledger.clone();
            let untraced = Arc::clone(&untraced);
            async move {
                let id = id_of(&message)?;
                if message.headers().get_str(TRACEPARENT) != Some(TRACE)
                    && let Ok(mut untraced) = untraced.lock()
                {
                    untraced.push(id);
                }
                ledger.record(id);
                Ok::<(), HandlerError>(())
            }
        })
    };
    let reader_group = unique_group("relayed");
    let reading = Running::start(
        backend,
        &output,
        &reader_group,
        Consumer::builder(),
        64,
        handler,
    )
    .await
    .expect("connect a consumer of the output");
    ledger.wait_for_all(COUNT, "every relayed output").await;
    let report = relaying.stop().await;
    reading.stop().await;
    assert!(report.succeeded >= COUNT, "{} relayed", report.succeeded);
    wait_until_acknowledged(backend, &input, &relay_group, "relayed inputs").await;
    let untraced = untraced.lock().map(|u| u.clone()).unwrap_or_default();
    assert!(
        untraced.is_empty(),
        "{}: outputs without their input's traceparent: {untraced:?}",
        backend.name()
    );
}
