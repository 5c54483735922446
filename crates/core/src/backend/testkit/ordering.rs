//! The order per key every backend keeps (docs/CONTRACT.md §11): in steady
//! state, and through a crash where the backend promises it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::harness::{PATIENCE, Running, id_of, numbered, unique_group};
use super::{Backend, TestMessage};
use crate::consumer::{Consumer, DeliveryOrder};
use crate::error::HandlerError;
use crate::message::Message;

/// How many keys [`numbered`] spreads ids over.
const KEYS: u64 = 16;

/// Ids in the order they were first handled, and how often each was.
#[derive(Default)]
struct Handlings {
    order: Vec<u64>,
    counts: BTreeMap<u64, u32>,
}

/// What the handlers of a scenario saw, shared with it.
#[derive(Clone, Default)]
struct HandlingOrder {
    first: Arc<Mutex<Handlings>>,
}

impl HandlingOrder {
    fn record(&self, id: u64) {
        if let Ok(mut first) = self.first.lock() {
            let Handlings { order, counts } = &mut *first;
            let count = counts.entry(id).or_default();
            *count += 1;
            if *count == 1 {
                order.push(id);
            }
        }
    }

    fn distinct(&self) -> usize {
        self.first
            .lock()
            .map(|first| first.order.len())
            .unwrap_or(0)
    }

    async fn wait_for(&self, count: usize, what: &str) {
        let waited = tokio::time::timeout(PATIENCE, async {
            while self.distinct() < count {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(
            waited.is_ok(),
            "{what}: {} of {count} handled within {PATIENCE:?}",
            self.distinct()
        );
    }

    /// Per key, ids first handled after a later id of the same key:
    /// (key, the later id handled first, the earlier id after it).
    fn breaks(&self) -> Vec<(u64, u64, u64)> {
        let order = self
            .first
            .lock()
            .map(|first| first.order.clone())
            .unwrap_or_default();
        let mut highest: BTreeMap<u64, u64> = BTreeMap::new();
        let mut breaks = Vec::new();
        for id in order {
            let key = id % KEYS;
            match highest.get(&key) {
                Some(&later) if later > id => breaks.push((key, later, id)),
                _ => {
                    highest.insert(key, id);
                }
            }
        }
        breaks
    }
}

/// A handler that records each first handling, after a pause that differs
/// per message (so that messages of different keys overtake each other),
/// and hangs on the ids `hang` picks (so that a crash finds them in
/// flight).
fn recording(
    order: &HandlingOrder,
    hang: fn(u64) -> bool,
) -> impl tower::Service<
    Message,
    Response = (),
    Error = HandlerError,
    Future = impl Future<Output = Result<(), HandlerError>> + Send + use<>,
> + Clone
+ Send
+ use<> {
    let order = order.clone();
    tower::service_fn(move |message: Message| {
        let order = order.clone();
        async move {
            let id = id_of(&message)?;
            if hang(id) {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_micros((id * 7919) % 3000)).await;
            order.record(id);
            Ok(())
        }
    })
}

/// With [`DeliveryOrder::Key`], each key's messages are handled in the order
/// they were produced, while keys run side by side.
pub async fn keeps_each_keys_order<B: Backend>(backend: &B) {
    let partitions = if backend.capabilities().partitions {
        4
    } else {
        1
    };
    let source = backend
        .create_source(partitions)
        .await
        .expect("create the source");
    let group = unique_group("key-order");
    backend
        .produce(&source, numbered(0, 400))
        .await
        .expect("produce");
    let order = HandlingOrder::default();
    let consumer = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder().ordering(DeliveryOrder::Key),
        64,
        recording(&order, |_| false),
    )
    .await
    .expect("connect");
    order.wait_for(400, "every message").await;
    consumer.stop().await;
    let breaks = order.breaks();
    assert!(
        breaks.is_empty(),
        "{}: messages of a key ran out of their order (key, later id, earlier id): {breaks:?}",
        backend.name()
    );
}

/// A consumer crashes with messages of every key in flight; more messages
/// of those keys arrive; a new consumer takes over. Where the backend
/// promises it ([`Capabilities::key_order_through_crashes`]), each key's
/// messages are first handled in their order: the crashed consumer's
/// unfinished ones before the ones that arrived after. Everywhere, nothing
/// is lost.
///
/// [`Capabilities::key_order_through_crashes`]: super::Capabilities::key_order_through_crashes
pub async fn keeps_each_keys_order_through_a_crash<B: Backend>(backend: &B) {
    let source = backend.create_source(1).await.expect("create the source");
    let group = unique_group("key-order-crash");
    backend
        .produce(&source, numbered(0, 160))
        .await
        .expect("produce");
    let order = HandlingOrder::default();
    let first = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder().ordering(DeliveryOrder::Key),
        64,
        // From id 100 on, every key's next message hangs: each key has one
        // in flight and the rest waiting behind it.
        recording(&order, |id| id >= 100),
    )
    .await
    .expect("connect");
    order.wait_for(100, "the first 100 messages").await;
    first.crash().await;
    // Newer messages of the same keys arrive while the crashed consumer's
    // are unfinished.
    let later: Vec<TestMessage> = numbered(160, 80);
    backend.produce(&source, later).await.expect("produce");
    tokio::time::sleep(backend.capabilities().crash_redelivery_after).await;
    let second = Running::start(
        backend,
        &source,
        &group,
        Consumer::builder().ordering(DeliveryOrder::Key),
        64,
        recording(&order, |_| false),
    )
    .await
    .expect("connect");
    order.wait_for(240, "every message after the crash").await;
    second.stop().await;
    let breaks = order.breaks();
    if backend.capabilities().key_order_through_crashes {
        assert!(
            breaks.is_empty(),
            "{}: after a crash, messages of a key ran before the crashed consumer's earlier \
             ones (key, later id, earlier id): {breaks:?}",
            backend.name()
        );
    } else {
        eprintln!(
            "{}: no order per key promised through a crash (docs/CONTRACT.md §11); {} keys \
             broke it here",
            backend.name(),
            breaks
                .iter()
                .map(|(key, _, _)| key)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        );
    }
}
