//! Broker-side lag: what a consumer group has not yet committed or
//! acknowledged, as the broker counts it.
//!
//! A [`LagProbe`] asks the broker, per partition, how many messages the group
//! still has to finish ([`PartitionLag::messages`]) and, where the broker
//! keeps timestamps it will answer about, how old the oldest of them is
//! ([`PartitionLag::oldest_age`]). It is one query per call, never a cost per
//! message: the caller polls it (every 15 s is plenty), for example through
//! `metrics::LagExporter` (feature `metrics`), which turns each answer into
//! the `intake_broker_lag_messages` gauge.
//!
//! It is not the runtime's *commit lag* (`intake_partition_commit_lag_messages`,
//! see [`ConsumerObserver`](crate::observer::ConsumerObserver)): commit lag
//! counts the messages this consumer has admitted and not yet committed, so
//! it sees nothing of what waits on the broker; broker lag counts everything
//! the group has not committed, whether it was fetched or not, and it is
//! seen by any process, consumer or not.
//!
//! What "not committed" means is each broker's own:
//!
//! | backend | `messages` | `oldest_age` |
//! |---|---|---|
//! | memory | log end − committed offset | age of the first uncommitted message |
//! | Kafka | high watermark − committed offset (from offset 0, or the log start, when the group never committed) | `None` |
//! | Redis Streams | `XINFO GROUPS` `lag` + `pending` (entries never delivered plus delivered and not `XACK`ed) | `None` |
//! | RabbitMQ | the queue's `messages_ready` + unacknowledged (from a passive `queue.declare`) | `None` |
//! | NATS JetStream | the consumer's `num_pending` + `num_ack_pending` | `None` |
//!
//! # Example
//!
//! ```
//! use intake_core::backend::{Broker, RouteAddress};
//! use intake_core::lag::LagProbe;
//! use intake_core::memory::{MemoryBroker, Record};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = MemoryBroker::new();
//! broker.create_topic("orders", 2)?;
//! broker.send("orders", Record::new("a").to_partition(0))?;
//! broker.send("orders", Record::new("b").to_partition(0))?;
//! broker.send("orders", Record::new("c").to_partition(1))?;
//!
//! let probe = broker.lag_probe(&RouteAddress::new("orders", "billing")).await?;
//! let lag = probe.lag().await?;
//! assert_eq!(lag.len(), 2);
//! assert_eq!(lag[0].messages, Some(2));
//! assert_eq!(lag[1].messages, Some(1));
//! assert!(lag[0].oldest_age.is_some());
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::time::{Duration, SystemTime};

use crate::error::BoxError;
use crate::message::PartitionKey;

/// How long a backend's probe waits for the broker unless told otherwise.
pub const DEFAULT_LAG_TIMEOUT: Duration = Duration::from_secs(5);

/// One partition's broker-side lag for a consumer group.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionLag {
    /// The partition (for a queue or a stream without partitions, partition
    /// 0 of it).
    pub partition: PartitionKey,
    /// Messages the group has not committed or acknowledged on the broker;
    /// `None` when the broker cannot say now (Redis after an `XDEL` or a
    /// trim past the group, for instance).
    pub messages: Option<u64>,
    /// Age of the oldest of them, where the broker tells; `Some(ZERO)` when
    /// there are none.
    pub oldest_age: Option<Duration>,
}

impl PartitionLag {
    /// The lag of `partition`: `messages` not committed, of unknown age.
    pub fn new(partition: PartitionKey, messages: Option<u64>) -> Self {
        Self {
            partition,
            messages,
            oldest_age: None,
        }
    }

    /// Sets the age of the oldest uncommitted message.
    pub fn with_oldest_age(mut self, age: Duration) -> Self {
        self.oldest_age = Some(age);
        self
    }
}

/// What a group has parked at one delay tier and not yet taken back.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParkedTier {
    /// The tier as the backend names it: the delay (`1s`, `5m`) where
    /// parking has fixed tiers (Kafka retry topics, RabbitMQ wait queues),
    /// `exact` where each message keeps its own due time (Redis), `all`
    /// where the backend counts only the total.
    pub tier: String,
    /// Messages parked there.
    pub messages: u64,
    /// When the first of them is due back, where the backend knows it.
    pub next_due: Option<SystemTime>,
}

impl ParkedTier {
    /// `messages` parked at `tier`, due time unknown.
    pub fn new(tier: impl Into<String>, messages: u64) -> Self {
        Self {
            tier: tier.into(),
            messages,
            next_due: None,
        }
    }

    /// Sets when the first of them is due back.
    pub fn with_next_due(mut self, due: SystemTime) -> Self {
        self.next_due = Some(due);
        self
    }

    /// The messages of every tier in `tiers` (saturating).
    pub fn total(tiers: &[ParkedTier]) -> u64 {
        tiers
            .iter()
            .fold(0u64, |sum, tier| sum.saturating_add(tier.messages))
    }
}

/// A lag query that did not produce an answer.
///
/// The broker's or client's own error is the [`source`](std::error::Error::source);
/// no variant carries a password or a secret of the connection settings.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LagError {
    /// The broker did not answer within the probe's timeout.
    #[error("the broker did not answer the lag query within {0:?}")]
    TimedOut(Duration),
    /// The broker could not be reached or the connection broke: asking again
    /// later may succeed.
    #[error("the broker could not be asked for the group's lag")]
    Unavailable(#[source] BoxError),
    /// The broker refused the query or answered something the probe cannot
    /// read (an unknown group, stream or queue, a permission): asking again
    /// will not help until something changes.
    #[error("the broker refused the lag query")]
    Refused(#[source] BoxError),
}

impl LagError {
    /// A backend's failed query: [`Unavailable`](Self::Unavailable) when
    /// the backend deems `error` transient, else [`Refused`](Self::Refused).
    pub fn from_backend(
        error: impl std::error::Error + Send + Sync + 'static,
        transient: bool,
    ) -> Self {
        match transient {
            true => Self::Unavailable(Box::new(error)),
            false => Self::Refused(Box::new(error)),
        }
    }

    /// Whether the same query may succeed later without a change of
    /// settings.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::TimedOut(_) | Self::Unavailable(_))
    }
}

/// Asks a broker how far a consumer group is behind, per partition.
///
/// Each call is one bounded query (or a few) to the broker: every
/// implementation gives up after its timeout with [`LagError::TimedOut`]
/// rather than wait for a broker that does not answer.
pub trait LagProbe: Send + Sync + 'static {
    /// The consumer group (for AMQP, the queue; for NATS, the durable
    /// consumer) whose lag this probe reports.
    fn group(&self) -> &str;

    /// The group's lag on every partition it consumes, ordered by
    /// partition.
    fn lag(&self) -> impl Future<Output = Result<Vec<PartitionLag>, LagError>> + Send;

    /// How many of the group's messages are parked and not yet back (in
    /// Kafka retry topics, RabbitMQ wait queues, Redis due indexes): a
    /// backlog broker lag does not show, since the originals are
    /// acknowledged. `None` where the backend cannot count them (NATS
    /// holds its parks in the consumer, where broker lag counts them).
    /// The default counts none.
    fn parked(&self) -> impl Future<Output = Result<Option<u64>, LagError>> + Send {
        async { Ok(None) }
    }

    /// The parked backlog per delay tier ([`ParkedTier`]), with when the
    /// next message is due back where the backend knows it; `None` where
    /// the backend cannot count them. The default is [`parked`](Self::parked)
    /// as one tier, `all`.
    fn parked_tiers(
        &self,
    ) -> impl Future<Output = Result<Option<Vec<ParkedTier>>, LagError>> + Send {
        async {
            Ok(self
                .parked()
                .await?
                .map(|messages| vec![ParkedTier::new("all", messages)]))
        }
    }
}
