//! The consumer runtime: fetch within a budget, dispatch in order, commit in
//! order.
//!
//! A [`Consumer`] joins a [`Source`], an [`Acker`] and a handler (any
//! `tower::Service<Message, Response = ()>`). It admits deliveries while its
//! in-flight budget has room, runs handlers concurrently while keeping the
//! chosen [`DeliveryOrder`], records every outcome in the commit engine, and
//! hands the engine's batches to the acker. Everything runs in the task that
//! awaits [`Consumer::run`]: no task is spawned per message.
//!
//! ```
//! use intake_core::consumer::{Consumer, DeliveryOrder};
//! use intake_core::memory::MemoryBroker;
//! use intake_core::{HandlerError, Message};
//! use tokio_util::sync::CancellationToken;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let broker = MemoryBroker::new();
//! broker.create_topic("orders", 4)?;
//! let (source, acker) = broker.consumer("orders", "billing")?;
//!
//! let handler = tower::service_fn(|message: Message| async move {
//!     tracing::info!(payload = ?message.payload(), "order");
//!     Ok::<_, HandlerError>(())
//! });
//!
//! let shutdown = CancellationToken::new();
//! shutdown.cancel(); // stop at once, for the example
//! let report = Consumer::builder()
//!     .max_in_flight(64)
//!     .ordering(DeliveryOrder::Key)
//!     .build(source, acker, handler)?
//!     .run(shutdown)
//!     .await?;
//! assert!(report.unfinished.is_empty());
//! # Ok(())
//! # }
//! ```

mod ack_loop;
mod byte_budget;
mod control;
mod dispatcher;
mod gate;
mod lanes;
mod report;
#[cfg(feature = "serde")]
pub(crate) mod settings;
mod shared_budget;
mod shutdown;
mod slots;
pub(crate) mod turns;

use std::sync::Arc;
use std::time::Duration;

use tower::Service;

use crate::acker::Acker;
use crate::backoff::{BackoffPolicy, Exponential};
use crate::error::{ConfigError, HandlerError};
use crate::handler::Settles;
use crate::message::Message;
use crate::observer::ConsumerObserver;
use crate::source::Source;

pub use control::ConsumerControl;
pub use report::{RunError, RunReport, SourceClose, Unfinished};
#[cfg(feature = "serde")]
pub use settings::ConsumerSettings;
pub use shared_budget::{MAX_SHARED_BYTES, MAX_SHARED_MESSAGES, SharedBudget};
pub use shutdown::Shutdown;

/// Which deliveries may run at the same time.
///
/// In `Partition` and `Key` order a delivery whose handler publishes through
/// [`PublishLayer`](crate::publish::PublishLayer) hands its partition or key
/// on once its handler returned and its outputs are sent, not when they are
/// confirmed: the next delivery's handler runs while the confirmations are
/// awaited, the outputs still reach the broker in delivery order, and each
/// delivery is acknowledged only once its outputs and those of the earlier
/// deliveries of its key are confirmed (`docs/PUBLISHING.md`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeliveryOrder {
    /// One at a time per partition, in partition order (Kafka's own
    /// guarantee). The default.
    #[default]
    Partition,
    /// One at a time per key within a partition, in order; different keys
    /// run in parallel. Messages without a key run unordered.
    Key,
    /// Any number at a time, any order. Commits stay ordered.
    Unordered,
}

/// The settings of a consumer, checked when it is built.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) max_in_flight: usize,
    pub(crate) max_in_flight_bytes: usize,
    pub(crate) ordering: DeliveryOrder,
    pub(crate) commit_interval: Duration,
    pub(crate) commit_batch: usize,
    pub(crate) fetch_batch: usize,
    pub(crate) max_uncommitted: usize,
    pub(crate) shutdown_deadline: Duration,
    pub(crate) revoke_timeout: Duration,
    pub(crate) backoff: Arc<dyn BackoffPolicy>,
    pub(crate) probe_timeout: Duration,
    pub(crate) reconnect: Arc<dyn BackoffPolicy>,
    pub(crate) observer: Option<Arc<dyn ConsumerObserver>>,
    pub(crate) shared_budget: Option<SharedBudget>,
    /// Where `DeliveryOrder::Key` finds a message's key; `None`: the
    /// broker's key field.
    pub(crate) key_with: Option<KeyFn>,
    /// Pauses and resumes from [`ConsumerControl`]: each built consumer
    /// gets its own.
    pub(crate) control: Arc<control::Shared>,
}

/// A function that finds a message's ordering key (see
/// [`ConsumerBuilder::key_with`]).
pub(crate) type KeyFn = Arc<dyn for<'a> Fn(&'a Message) -> Option<&'a [u8]> + Send + Sync>;

/// Builds a [`Consumer`]; every setting has a default that suits a
/// production consumer.
#[derive(Clone)]
pub struct ConsumerBuilder {
    settings: Settings,
}

impl std::fmt::Debug for ConsumerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let settings = &self.settings;
        f.debug_struct("ConsumerBuilder")
            .field("max_in_flight", &settings.max_in_flight)
            .field("max_in_flight_bytes", &settings.max_in_flight_bytes)
            .field("ordering", &settings.ordering)
            .field("commit_interval", &settings.commit_interval)
            .field("commit_batch", &settings.commit_batch)
            .field("fetch_batch", &settings.fetch_batch)
            .field("max_uncommitted", &settings.max_uncommitted)
            .field("shutdown_deadline", &settings.shutdown_deadline)
            .field("revoke_timeout", &settings.revoke_timeout)
            .field("probe_timeout", &settings.probe_timeout)
            .field("shared_budget", &settings.shared_budget)
            .field("key_with", &settings.key_with.as_ref().map(|_| "fn"))
            .finish_non_exhaustive()
    }
}

impl Default for ConsumerBuilder {
    fn default() -> Self {
        Self {
            settings: Settings {
                max_in_flight: 256,
                max_in_flight_bytes: DEFAULT_MAX_IN_FLIGHT_BYTES,
                ordering: DeliveryOrder::default(),
                commit_interval: Duration::from_millis(100),
                commit_batch: 1024,
                fetch_batch: 1024,
                max_uncommitted: 100_000,
                shutdown_deadline: Duration::from_secs(30),
                revoke_timeout: Duration::from_secs(10),
                backoff: Arc::new(
                    Exponential::new(Duration::from_millis(100), Duration::from_secs(30))
                        .retry_forever(),
                ),
                probe_timeout: Duration::from_secs(30),
                reconnect: Arc::new(
                    Exponential::new(Duration::from_millis(100), Duration::from_secs(10))
                        .retry_forever(),
                ),
                observer: None,
                shared_budget: None,
                key_with: None,
                control: Arc::default(),
            },
        }
    }
}

/// The largest in-flight budget a consumer accepts. Each unit is a slot in an
/// arena allocated at start.
pub const MAX_IN_FLIGHT_LIMIT: usize = 1 << 20;

/// The default byte budget: 64 MiB of messages held at once.
pub const DEFAULT_MAX_IN_FLIGHT_BYTES: usize = 64 << 20;

impl ConsumerBuilder {
    /// Deliveries held at once, queued or running. Default 256. With
    /// [`max_in_flight_bytes`](Self::max_in_flight_bytes) it bounds what the
    /// runtime holds; the source sizes its own buffers and the broker's
    /// prefetch from both ([`Source::set_limits`]).
    pub fn max_in_flight(mut self, max_in_flight: usize) -> Self {
        self.settings.max_in_flight = max_in_flight;
        self
    }

    /// Bytes of messages ([`Message::byte_size`](crate::Message::byte_size):
    /// payload, key, headers) held at once, queued or running. Default
    /// [`DEFAULT_MAX_IN_FLIGHT_BYTES`] (64 MiB). A delivery that would pass
    /// it waits for room, except when nothing is held (one message larger
    /// than the budget still gets through); fetching stops while the budget
    /// is spent. The runtime holds at most this plus one fetch batch (what
    /// a fetch brought beyond the room waits in the fetch buffer);
    /// `docs/ARCHITECTURE.md` lists every buffer with its bound.
    pub fn max_in_flight_bytes(mut self, bytes: usize) -> Self {
        self.settings.max_in_flight_bytes = bytes;
        self
    }

    /// Which deliveries may run at the same time. Default
    /// [`DeliveryOrder::Partition`].
    pub fn ordering(mut self, ordering: DeliveryOrder) -> Self {
        self.settings.ordering = ordering;
        self
    }

    /// Where [`DeliveryOrder::Key`] finds a message's key, for producers
    /// that put it in a header or the payload rather than the broker's key
    /// field (a Redis entry's fields, an AMQP message's headers). It borrows
    /// from the message, so it costs no allocation; it runs once per
    /// message, on the runtime's task, before the handler: keep it cheap. A
    /// message it finds no key for runs unordered, counted in
    /// [`RunReport::without_key`] and warned about once per run. Default: the
    /// broker's key ([`Message::key`]).
    ///
    /// ```
    /// use intake_core::consumer::{Consumer, DeliveryOrder};
    ///
    /// // One customer's orders in order, the customer in a header.
    /// let builder = Consumer::builder()
    ///     .ordering(DeliveryOrder::Key)
    ///     .key_with(|message| message.headers().get("customer").map(|value| &value[..]));
    /// # let _ = builder;
    /// ```
    pub fn key_with<F>(mut self, key: F) -> Self
    where
        F: for<'a> Fn(&'a Message) -> Option<&'a [u8]> + Send + Sync + 'static,
    {
        self.settings.key_with = Some(Arc::new(key));
        self
    }

    /// Longest time a completion waits before it is acknowledged. Default
    /// 100 ms. Shorter means fewer duplicates after a crash, longer means
    /// fewer broker round trips.
    pub fn commit_interval(mut self, interval: Duration) -> Self {
        self.settings.commit_interval = interval;
        self
    }

    /// Completions that trigger an acknowledgement before the interval ends
    /// (when no acknowledgement is already under way). Default 1024, and
    /// never more than a quarter of [`max_in_flight`](Self::max_in_flight):
    /// a broker that counts unacknowledged deliveries against the consumer's
    /// prefetch (AMQP, where the prefetch is the budget) stops delivering
    /// while finished work waits for its acknowledgement, so waiting for
    /// more completions than the budget holds would stall until the
    /// interval ends.
    pub fn commit_batch(mut self, completions: usize) -> Self {
        self.settings.commit_batch = completions;
        self
    }

    /// Most deliveries asked of the source at once. Default 1024.
    pub fn fetch_batch(mut self, deliveries: usize) -> Self {
        self.settings.fetch_batch = deliveries;
        self
    }

    /// Most deliveries of one partition between its watermark and its newest
    /// admitted message. A message that never finishes holds the watermark;
    /// at this bound its partition is paused (the others keep flowing) until
    /// the watermark moves, so a stuck message cannot grow the commit engine
    /// without bound. It is resumed once three quarters of the bound are
    /// left. A source that cannot pause one partition
    /// ([`Source::pause`]) stops fetching
    /// every partition meanwhile. Default 100,000; at least
    /// [`max_in_flight`](Self::max_in_flight).
    pub fn max_uncommitted(mut self, deliveries: usize) -> Self {
        self.settings.max_uncommitted = deliveries;
        self
    }

    /// How long a graceful shutdown waits for running handlers. Default 30 s.
    ///
    /// The steps after that, the final commit and the source's close, share
    /// what is left of the deadline, and at least `min(deadline, 5 s)` when
    /// the handlers used all of it: whatever the broker does (no answer, a
    /// client that reconnects forever), the run ends within twice the
    /// deadline, and its [`RunReport`] says what could not be committed.
    ///
    /// Any duration is accepted; one too long to add to the clock
    /// (`Duration::MAX`) means "as long as it takes", as it does for every
    /// other duration setting.
    pub fn shutdown_deadline(mut self, deadline: Duration) -> Self {
        self.settings.shutdown_deadline = deadline;
        self
    }

    /// How long a revocation waits for the revoked partitions' running
    /// handlers before it commits and releases them. Default 10 s.
    pub fn revoke_timeout(mut self, timeout: Duration) -> Self {
        self.settings.revoke_timeout = timeout;
        self
    }

    /// Consumer-level backoff: after a retryable failure reaches the runtime,
    /// pause intake for the policy's delay, then probe with one delivery.
    /// Default: exponential from 100 ms to 30 s. Pass
    /// [`Disabled`](crate::backoff::Disabled) to never pause. Checked with
    /// [`BackoffPolicy::validate`] when the consumer is built.
    pub fn backoff(mut self, policy: impl BackoffPolicy) -> Self {
        self.settings.backoff = Arc::new(policy);
        self
    }

    /// Longest time the consumer-level backoff waits for its probe. While a
    /// probe runs every other delivery waits for its outcome; a probe still
    /// running after this counts as failed, and the consumer backs off
    /// again and then probes with another delivery (the first one keeps
    /// running, and its outcome decides nothing). Default 30 s.
    pub fn probe_timeout(mut self, timeout: Duration) -> Self {
        self.settings.probe_timeout = timeout;
        self
    }

    /// Delays between attempts to fetch again after a transient source
    /// error. Default: exponential from 100 ms to 10 s, forever. Checked
    /// with [`BackoffPolicy::validate`] when the consumer is built.
    pub fn reconnect_backoff(mut self, policy: impl BackoffPolicy) -> Self {
        self.settings.reconnect = Arc::new(policy);
        self
    }

    /// Receives partition and in-flight state at every commit tick (the
    /// metrics layer's collector implements it).
    pub fn observer(mut self, observer: Arc<dyn ConsumerObserver>) -> Self {
        self.settings.observer = Some(observer);
        self
    }

    /// An in-flight budget shared with other consumers (see
    /// [`SharedBudget`]): this consumer holds at most
    /// [`max_in_flight`](Self::max_in_flight) deliveries, and all the
    /// consumers sharing the budget together at most its limits. A consumer
    /// whose fetched deliveries find the shared budget spent waits, without
    /// polling, until another one frees room.
    pub fn shared_budget(mut self, budget: SharedBudget) -> Self {
        self.settings.shared_budget = Some(budget);
        self
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let settings = &self.settings;
        if settings.max_in_flight == 0 {
            return Err(ConfigError::new(
                "max_in_flight",
                "is 0: the consumer could never hold a delivery; use at least 1",
            ));
        }
        if settings.max_in_flight > MAX_IN_FLIGHT_LIMIT {
            return Err(ConfigError::new(
                "max_in_flight",
                format!(
                    "is {}, above the limit of {MAX_IN_FLIGHT_LIMIT}",
                    settings.max_in_flight
                ),
            ));
        }
        if settings.max_in_flight_bytes == 0 {
            return Err(ConfigError::new(
                "max_in_flight_bytes",
                "is 0: the consumer could never hold a delivery; use the memory its messages may \
                 take, such as 64 MiB",
            ));
        }
        if settings.commit_interval.is_zero() {
            return Err(ConfigError::new(
                "commit_interval",
                "is zero; use a positive interval such as 100 ms",
            ));
        }
        if settings.probe_timeout.is_zero() {
            return Err(ConfigError::new(
                "probe_timeout",
                "is zero: every probe would time out at once; use the longest time a \
                 handler may take, such as 30 s",
            ));
        }
        if settings.commit_batch == 0 {
            return Err(ConfigError::new("commit_batch", "is 0; use at least 1"));
        }
        if settings.fetch_batch == 0 {
            return Err(ConfigError::new("fetch_batch", "is 0; use at least 1"));
        }
        settings
            .backoff
            .validate()
            .map_err(|error| policy_error("backoff", &error))?;
        settings
            .reconnect
            .validate()
            .map_err(|error| policy_error("reconnect_backoff", &error))?;
        if settings.max_uncommitted < settings.max_in_flight {
            return Err(ConfigError::new(
                "max_uncommitted",
                format!(
                    "({}) is below max_in_flight ({}); it must allow at least a full budget per partition",
                    settings.max_uncommitted, settings.max_in_flight
                ),
            ));
        }
        Ok(())
    }

    /// Checks the settings and builds the consumer.
    pub fn build<S, A, H>(
        self,
        source: S,
        acker: A,
        handler: H,
    ) -> Result<Consumer<S, A, H>, ConfigError>
    where
        S: Source,
        A: Acker,
        // `Settles` (only `()`) rather than `Response = ()`: a handler that
        // returns outputs is then refused with a message that names
        // `PublishLayer`, not with a bare type mismatch.
        H: Service<Message, Response: Settles> + Send + 'static,
        H::Error: Into<HandlerError> + Send + 'static,
        H::Future: Send + 'static,
    {
        self.validate()?;
        let mut settings = self.settings;
        settings.control = Arc::default();
        Ok(Consumer {
            source,
            acker,
            handler,
            settings,
        })
    }
}

/// A policy's own error, reported under the consumer setting that holds it.
fn policy_error(setting: &'static str, error: &ConfigError) -> ConfigError {
    ConfigError::new(setting, format!("`{}` {}", error.setting, error.problem))
}

/// A configured consumer, ready to [`run`](Consumer::run).
pub struct Consumer<S, A, H> {
    source: S,
    acker: A,
    handler: H,
    // The app sets a route's shared budget and drain deadline here.
    pub(crate) settings: Settings,
}

impl<S, A, H> std::fmt::Debug for Consumer<S, A, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("max_in_flight", &self.settings.max_in_flight)
            .field("ordering", &self.settings.ordering)
            .finish_non_exhaustive()
    }
}

impl Consumer<(), (), ()> {
    /// A builder with the default settings.
    pub fn builder() -> ConsumerBuilder {
        ConsumerBuilder::default()
    }
}

impl<S, A, H> Consumer<S, A, H> {
    /// Pauses and resumes this consumer's partitions, before and while it
    /// runs (see [`ConsumerControl`]).
    pub fn control(&self) -> ConsumerControl {
        ConsumerControl {
            shared: self.settings.control.clone(),
        }
    }

    /// The same consumer around another handler made from this one's (an
    /// [`App`](crate::app::App) route settles its handler's answer so).
    pub(crate) fn map_handler<H2>(self, map: impl FnOnce(H) -> H2) -> Consumer<S, A, H2> {
        Consumer {
            source: self.source,
            acker: self.acker,
            handler: map(self.handler),
            settings: self.settings,
        }
    }
}

impl<S, A, H> Consumer<S, A, H>
where
    S: Source,
    A: Acker,
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    /// Runs until `shutdown` fires (or the source is exhausted or fails).
    ///
    /// Shutdown is graceful: fetching stops, no new handler starts, running
    /// handlers get until the shutdown deadline, everything finished is
    /// committed, the source is closed (both bounded, see
    /// [`ConsumerBuilder::shutdown_deadline`]), and the report lists what
    /// was left unfinished or uncommitted (the broker delivers it again).
    pub async fn run(self, shutdown: impl Into<Shutdown>) -> Result<RunReport, RunError> {
        let Consumer {
            source,
            acker,
            handler,
            settings,
        } = self;
        dispatcher::run(source, acker, handler, settings, shutdown.into()).await
    }
}

#[cfg(test)]
mod tests;
