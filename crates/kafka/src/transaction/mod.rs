//! Exactly-once pipelines: consume, transform and produce with Kafka
//! transactions, so that a topic read with `isolation.level=read_committed`
//! holds each input's outputs exactly once, through crashes, restarts and
//! rebalances.
//!
//! Three parts share a [`KafkaTransactions`]:
//!
//! - its [`layer`](KafkaTransactions::layer) keeps each input's outputs by
//!   partition and offset and completes the input at once;
//! - the source built with
//!   [`exactly_once`](crate::KafkaSourceBuilder::exactly_once) reads with
//!   `read_committed` and owns one transactional producer;
//! - the source's [acker](crate::KafkaSource::acker), for each watermark
//!   batch of the commit engine, begins a transaction, produces the kept
//!   outputs of every input at or below the new watermarks (in offset order
//!   per partition), adds the offsets with the consumer's group metadata
//!   (`send_offsets_to_transaction`) and commits. Outputs leave the store
//!   only once the commit succeeded; an input completed beyond the
//!   watermark (an earlier one still running) waits for a later
//!   transaction.
//!
//! An output goes to the partition it names
//! ([`Output::partition`](intake_core::publish::Output::partition)), else to
//! its key's. One its destination would refuse (too large for the topic's
//! `max.message.bytes` or the producer's `message.max.bytes`, no key for a
//! compacted topic, a partition the topic does not have) fails its own
//! input in the layer, permanently, as
//! [`KafkaPublisher`](crate::KafkaPublisher) fails it: a dead-letter layer
//! outside takes the input, and no transaction ever carries the output.
//!
//! A failed transaction is aborted and comes back to the runtime as an
//! error, which sends the watermarks again: the next transaction carries
//! the same outputs, after a backoff. Offsets refused because the group's generation moved
//! on (KIP-447: every cooperative or KIP-848 rebalance moves it) abort the
//! transaction too; the next one carries the consumer's current group
//! metadata, and a member that lost the partitions is refused again. A
//! producer fenced (a newer one with the same `transactional.id`, or
//! another member with this consumer's `group.instance.id`) commits
//! nothing more, and the source ends the consumer with a fatal
//! [`TransactionError`]. Outputs of partitions this consumer gives up are
//! dropped: their next owner handles the inputs again from the committed
//! offset.

mod error;
mod layer;
mod limits;
mod producer;
mod service;
mod store;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub use self::error::TransactionError;
pub use self::layer::TransactionalLayer;
use self::limits::{DESCRIBE_TIMEOUT, Describer, ProducerLimits};
pub(crate) use self::producer::Transactor;
pub use self::service::{TransactionalFuture, TransactionalService};
pub(crate) use self::store::{OutputStore, reread};
use crate::error::Error;
use crate::settings::KafkaSettings;

/// The transactions of one exactly-once consumer instance: its
/// transactional producer's settings and `transactional.id`, and the
/// outputs its handler returned that wait for their transaction.
///
/// Give it to one source ([`KafkaSourceBuilder::exactly_once`](crate::KafkaSourceBuilder::exactly_once))
/// and wrap the handler in its [`layer`](Self::layer).
///
/// The `transactional.id` names this instance: keep it across restarts
/// (a restarted instance aborts what its predecessor left open, at once
/// rather than when `transaction.timeout.ms` ends, and fences it if it
/// still runs), and give every instance running at the same time its own
/// (two with one id fence each other). A group member that lost its
/// partitions is refused by the group's generation whatever its id
/// (KIP-447, brokers 2.5 and later): its transactions abort.
///
/// ```no_run
/// use intake_core::publish::Output;
/// use intake_core::{Consumer, Payload, handler_fn};
/// use intake_kafka::{KafkaSettings, KafkaSource, KafkaTransactions};
/// use tokio_util::sync::CancellationToken;
/// use tower::ServiceBuilder;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let settings = KafkaSettings::new("127.0.0.1:9092");
/// let transactions = KafkaTransactions::new(settings.clone(), "receipts-relay-0");
/// let source = KafkaSource::builder(settings)
///     .group("receipts")
///     .topic("orders")
///     .exactly_once(&transactions)
///     .build()
///     .await?;
/// let acker = source.acker();
/// let handler = ServiceBuilder::new()
///     .layer(transactions.layer())
///     .service(handler_fn(|Payload(order): Payload| async move {
///         Output::new("receipts", order)
///     }));
/// let shutdown = CancellationToken::new();
/// Consumer::builder()
///     .build(source, acker, handler)?
///     .run(shutdown)
///     .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct KafkaTransactions {
    settings: KafkaSettings,
    transactional_id: String,
    operation_timeout: Duration,
    transaction_timeout: Duration,
    store: Arc<OutputStore>,
    /// A source took it: a second would share its producer's id and its
    /// store.
    claimed: Arc<AtomicBool>,
}

impl std::fmt::Debug for KafkaTransactions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaTransactions")
            .field("settings", &self.settings)
            .field("transactional_id", &self.transactional_id)
            .field("operation_timeout", &self.operation_timeout)
            .field("transaction_timeout", &self.transaction_timeout)
            .field("outputs_held", &self.store.len())
            .finish()
    }
}

impl KafkaTransactions {
    /// Transactions on the brokers of `settings` (TLS, SASL and any producer
    /// setting pass through) by a producer named `transactional_id`.
    pub fn new(settings: KafkaSettings, transactional_id: impl Into<String>) -> Self {
        Self {
            store: Arc::new(OutputStore::new(
                ProducerLimits::of(&settings),
                Describer::new(settings.clone(), DESCRIBE_TIMEOUT),
            )),
            settings,
            transactional_id: transactional_id.into(),
            operation_timeout: Duration::from_secs(30),
            transaction_timeout: Duration::from_secs(60),
            claimed: Arc::default(),
        }
    }

    /// How long registering the producer (`init_transactions`) and each
    /// transaction (its outputs, offsets and commit) may take before it is
    /// given up (default 30 s). An abort after a failure may take as long
    /// again.
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// How long the broker lets a transaction stay open before it aborts it
    /// (`transaction.timeout.ms`, default 60 s unless the settings say
    /// otherwise): what a crashed instance's open transaction holds back
    /// `read_committed` readers of its outputs, unless an instance with the
    /// same `transactional.id` starts first.
    pub fn transaction_timeout(mut self, timeout: Duration) -> Self {
        self.transaction_timeout = timeout;
        self
    }

    /// The layer that keeps a handler's outputs for their transaction.
    pub fn layer(&self) -> TransactionalLayer {
        TransactionalLayer::new(Arc::clone(&self.store))
    }

    /// The producer's `transactional.id`.
    pub fn transactional_id(&self) -> &str {
        &self.transactional_id
    }

    /// Outputs kept that no transaction committed yet.
    pub fn outputs_held(&self) -> usize {
        self.store.len()
    }

    /// The store, for the one source that takes these transactions; the
    /// claim ends unless [kept](Claim::keep) (the source's build failed).
    pub(crate) fn claim(&self) -> Result<Claim, Error> {
        if self.claimed.swap(true, Ordering::AcqRel) {
            return Err(Error::config(
                "exactly_once",
                "these KafkaTransactions already serve a source; give each source its own, with its own transactional.id",
            ));
        }
        Ok(Claim {
            claimed: Some(Arc::clone(&self.claimed)),
            store: Arc::clone(&self.store),
        })
    }

    /// The producer's librdkafka settings: the given ones, the
    /// `transactional.id`, idempotence, and defaults where they say nothing.
    pub(crate) fn producer_settings(&self) -> Result<KafkaSettings, Error> {
        if self.transactional_id.is_empty() {
            return Err(Error::config(
                "transactional.id",
                "name the producer (`KafkaTransactions::new(settings, \"orders-relay-0\")`)",
            ));
        }
        if self.settings.is_true("enable.idempotence") == Some(false) {
            return Err(Error::config(
                "enable.idempotence",
                "must be true: transactions need the idempotent producer; remove the setting",
            ));
        }
        if self.operation_timeout.is_zero() {
            return Err(Error::config("operation_timeout", "must be more than zero"));
        }
        let mut settings = self.settings.clone();
        let transaction_timeout = self.transaction_timeout.as_millis().to_string();
        let config = settings.client_config_mut();
        let transaction_timeout = config
            .get("transaction.timeout.ms")
            .map_or(transaction_timeout, str::to_owned);
        for (key, value) in [
            ("linger.ms", "5".to_owned()),
            ("partitioner", "murmur2_random".to_owned()),
            ("transaction.timeout.ms", transaction_timeout.clone()),
            // librdkafka refuses a delivery timeout longer than the
            // transaction's.
            ("message.timeout.ms", transaction_timeout),
        ] {
            if config.get(key).is_none() {
                config.set(key, value);
            }
        }
        config.set("enable.idempotence", "true");
        config.set("transactional.id", &self.transactional_id);
        Ok(settings)
    }

    /// Starts the producer (on a blocking thread, bounded by the operation
    /// timeout).
    pub(crate) async fn start(&self) -> Result<Arc<Transactor>, Error> {
        let settings = self.producer_settings()?;
        let transactional_id = self.transactional_id.clone();
        let timeout = self.operation_timeout;
        tokio::task::spawn_blocking(move || {
            Transactor::start(&settings, &transactional_id, timeout).map(Arc::new)
        })
        .await
        .map_err(|error| Error::Spawn(std::io::Error::other(error)))?
    }
}

/// A source's claim on a [`KafkaTransactions`], given up when dropped
/// unless kept.
pub(crate) struct Claim {
    claimed: Option<Arc<AtomicBool>>,
    store: Arc<OutputStore>,
}

impl Claim {
    /// The store of the claimed transactions.
    pub(crate) fn store(&self) -> Arc<OutputStore> {
        Arc::clone(&self.store)
    }

    /// Keeps the claim for good: the source was built.
    pub(crate) fn keep(mut self) {
        self.claimed = None;
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(claimed) = &self.claimed {
            claimed.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_producer_is_transactional_and_idempotent() {
        let transactions = KafkaTransactions::new(KafkaSettings::new("127.0.0.1:9"), "relay-0")
            .transaction_timeout(Duration::from_secs(10));
        let settings = transactions.producer_settings().expect("valid settings");
        assert_eq!(settings.get("transactional.id"), Some("relay-0"));
        assert_eq!(settings.get("enable.idempotence"), Some("true"));
        assert_eq!(settings.get("transaction.timeout.ms"), Some("10000"));
        assert_eq!(settings.get("message.timeout.ms"), Some("10000"));

        let refused = KafkaTransactions::new(
            KafkaSettings::new("127.0.0.1:9").set("enable.idempotence", "false"),
            "relay-0",
        )
        .producer_settings();
        assert!(
            matches!(refused, Err(Error::Config { ref setting, .. }) if setting == "enable.idempotence")
        );
        let unnamed = KafkaTransactions::new(KafkaSettings::new("127.0.0.1:9"), "");
        assert!(unnamed.producer_settings().is_err());
    }

    #[test]
    fn one_source_per_transactions() {
        let transactions = KafkaTransactions::new(KafkaSettings::new("127.0.0.1:9"), "relay-0");
        let claim = transactions.claim().expect("the first claim");
        assert!(transactions.clone().claim().is_err());
        drop(claim);
        let claim = transactions
            .claim()
            .expect("a failed build gives the claim back");
        claim.keep();
        assert!(transactions.claim().is_err());
    }
}
