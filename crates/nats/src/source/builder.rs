//! [`NatsSourceBuilder`]: what to consume, as whom, and how to recover.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use intake_core::{BackoffPolicy, ConfigError, Exponential};

use super::NatsSource;
use crate::connection;
use crate::error::{Error, boxed};
use crate::settings::{NatsSettings, default_reconnect_backoff};

/// How a [`NatsSource`] consumes a stream; get one from
/// [`NatsSource::builder`], which takes how to connect
/// ([`NatsSettings`](crate::NatsSettings): the URL, credentials, TLS, ...)
/// or a URL alone.
///
/// ```no_run
/// use std::time::Duration;
/// use intake_nats::NatsSource;
///
/// # async fn run() -> Result<(), intake_nats::Error> {
/// let source = NatsSource::builder("nats://127.0.0.1:4222")
///     .stream("ORDERS")
///     .consumer("billing")
///     .create_stream(["orders.>"])
///     .ack_wait(Duration::from_secs(30))
///     .build()
///     .await?;
/// # drop(source);
/// # Ok(())
/// # }
/// ```
#[must_use]
pub struct NatsSourceBuilder {
    pub(super) settings: NatsSettings,
    pub(super) stream: Option<String>,
    pub(super) consumer: Option<String>,
    pub(super) broadcast: bool,
    pub(super) create_stream: Option<Vec<String>>,
    pub(super) filter_subject: Option<String>,
    pub(super) ack_wait: Duration,
    pub(super) max_deliveries: Option<u32>,
    pub(super) redelivery_backoff: Arc<dyn BackoffPolicy>,
    pub(super) max_ack_pending: Option<i64>,
    pub(super) park_room: usize,
    pub(super) partition_token: Option<usize>,
    pub(super) ack_timeout: Duration,
    pub(super) fetch_wait: Duration,
    pub(super) dead_letter_subject: Option<String>,
}

impl std::fmt::Debug for NatsSourceBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsSourceBuilder")
            .field("settings", &self.settings)
            .field("stream", &self.stream)
            .field("consumer", &self.consumer)
            .field("broadcast", &self.broadcast)
            .field("create_stream", &self.create_stream)
            .field("filter_subject", &self.filter_subject)
            .field("ack_wait", &self.ack_wait)
            .field("max_deliveries", &self.max_deliveries)
            .field("max_ack_pending", &self.max_ack_pending)
            .field("park_room", &self.park_room)
            .field("partition_token", &self.partition_token)
            .field("ack_timeout", &self.ack_timeout)
            .field("fetch_wait", &self.fetch_wait)
            .finish_non_exhaustive()
    }
}

impl NatsSourceBuilder {
    /// Default of [`ack_wait`](Self::ack_wait).
    pub const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);
    /// Default of [`max_deliveries`](Self::max_deliveries).
    pub const DEFAULT_MAX_DELIVERIES: u32 = 5;
    /// Default of [`park_room`](Self::park_room).
    pub const DEFAULT_PARK_ROOM: usize = 1_000;

    pub(super) fn new(settings: NatsSettings) -> Self {
        Self {
            settings,
            stream: None,
            consumer: None,
            broadcast: false,
            create_stream: None,
            filter_subject: None,
            ack_wait: Self::DEFAULT_ACK_WAIT,
            max_deliveries: Some(Self::DEFAULT_MAX_DELIVERIES),
            redelivery_backoff: Arc::new(
                Exponential::new(Duration::from_secs(1), Duration::from_secs(60)).retry_forever(),
            ),
            max_ack_pending: None,
            park_room: Self::DEFAULT_PARK_ROOM,
            partition_token: None,
            ack_timeout: Duration::from_secs(10),
            fetch_wait: Duration::from_secs(5),
            dead_letter_subject: None,
        }
    }

    /// The stream to consume (required).
    pub fn stream(mut self, stream: impl Into<String>) -> Self {
        self.stream = Some(stream.into());
        self
    }

    /// The consumer group: a durable pull consumer of this name, shared by
    /// every instance that names it (each message goes to one of them).
    /// Created if missing. Required unless [`broadcast`](Self::broadcast).
    pub fn consumer(mut self, durable: impl Into<String>) -> Self {
        self.consumer = Some(durable.into());
        self
    }

    /// Every instance receives every new message: an ephemeral pull
    /// consumer of its own, from the messages stored after it started,
    /// removed by the server once the instance is gone.
    pub fn broadcast(mut self) -> Self {
        self.broadcast = true;
        self
    }

    /// Creates the stream with these subjects if it does not exist (file
    /// storage, the server's default limits). Without it a missing stream
    /// is [`Error::StreamNotFound`].
    pub fn create_stream<S: Into<String>>(mut self, subjects: impl IntoIterator<Item = S>) -> Self {
        self.create_stream = Some(subjects.into_iter().map(Into::into).collect());
        self
    }

    /// Consumes only the stream's messages on subjects matching `subject`
    /// (for a consumer this source creates).
    pub fn filter_subject(mut self, subject: impl Into<String>) -> Self {
        self.filter_subject = Some(subject.into());
        self
    }

    /// How long the server waits for an acknowledgement before it delivers
    /// a message again (default 30 s), for a consumer this source creates;
    /// an existing consumer keeps its own. The source reports every
    /// delivery it holds in progress (`+WPI`) before half of it has passed,
    /// so a slow handler is not given a second copy while it runs; a
    /// crashed consumer's messages come back after it.
    pub fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = ack_wait;
        self
    }

    /// The retry cap: a message the server delivered more often than this
    /// (its handler kept failing, or its consumer kept crashing) is
    /// dead-lettered by the source itself, as retryable, without calling
    /// the handler (default 5). A park that waits in the process
    /// ([`NatsParking`](crate::NatsParking)) is no delivery: parks are
    /// capped by the parking layer's `max_parks`. The consumer's own
    /// `max_deliver` is left unlimited: at that limit the server stops
    /// delivering a message without acknowledging it anywhere, a silent
    /// drop.
    pub fn max_deliveries(mut self, deliveries: u32) -> Self {
        self.max_deliveries = Some(deliveries);
        self
    }

    /// No retry cap: a message is delivered until it is acknowledged.
    pub fn unlimited_deliveries(mut self) -> Self {
        self.max_deliveries = None;
        self
    }

    /// The delay of a retry handed back to the server (`-NAK` with a
    /// delay): the policy's delay for retry `n` after the `n`-th delivery
    /// failed (default 1 s doubling to 60 s). Where the policy gives up,
    /// the consumer's `ack_wait`.
    pub fn redelivery_backoff(mut self, policy: impl BackoffPolicy) -> Self {
        self.redelivery_backoff = Arc::new(policy);
        self
    }

    /// The consumer's `max_ack_pending`: deliveries the server lets the
    /// whole group hold unacknowledged. By default twice the consumer's
    /// budget (`ConsumerBuilder::max_in_flight`: the budget, and as many
    /// acknowledged deliveries whose acks are still on their way, which the
    /// server counts until they land) plus the [`park_room`](Self::park_room).
    /// Raised on an existing consumer that allows less, never lowered
    /// (other instances share it). Set it to the sum over the instances
    /// for a group of several. Set explicitly, it is what the server gets,
    /// and the room for parks is what it leaves beyond twice the budget.
    pub fn max_ack_pending(mut self, pending: i64) -> Self {
        self.max_ack_pending = Some(pending);
        self
    }

    /// How many [parked](crate::NatsParking) messages the consumer's
    /// `max_ack_pending` leaves room for beyond the budget (default
    /// [`DEFAULT_PARK_ROOM`](Self::DEFAULT_PARK_ROOM), 1,000).
    ///
    /// A parked message is delivered and unacknowledged until it is due, so
    /// the server counts it in `max_ack_pending`. Once twice the budget
    /// plus this many are pending (the room filled with parked messages,
    /// logged once per stretch), the server sends nothing new, and the
    /// consumer takes new messages only as parked ones come back: with a
    /// room of 1,000 and parks of 10 minutes, about 1,000 new messages
    /// every 10 minutes while every one of them parks. Parked messages wait
    /// in the process's memory (at most its `max_in_flight_bytes`; past
    /// that a park goes back to the server): size the room for how many
    /// parks a delay's worth of traffic makes.
    pub fn park_room(mut self, room: usize) -> Self {
        self.park_room = room;
        self
    }

    /// Takes the partition from token `index` (from 0) of the subject, when
    /// it is a number: the token NATS's deterministic partitioning
    /// (`{{partition(n, …)}}` in a subject mapping) writes. Messages of one
    /// partition run one at a time under `DeliveryOrder::Partition`. Without it,
    /// every message is in partition 0.
    pub fn partition_token(mut self, index: usize) -> Self {
        self.partition_token = Some(index);
        self
    }

    /// How long the server may take to confirm a batch of acknowledgements,
    /// a dead letter or a JetStream API request (default 10 s).
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = timeout;
        self
    }

    /// How long one pull request waits on the server for messages before
    /// it expires and the next is sent (default 5 s).
    pub fn fetch_wait(mut self, wait: Duration) -> Self {
        self.fetch_wait = wait;
        self
    }

    /// Where the source writes the messages it dead-letters itself (past
    /// [`max_deliveries`](Self::max_deliveries)); default
    /// `<stream>.<consumer>.dlq`, as [`NatsSource::dead_letter_sink`].
    pub fn dead_letter_subject(mut self, subject: impl Into<String>) -> Self {
        self.dead_letter_subject = Some(subject.into());
        self
    }

    fn check(&self) -> Result<(String, Option<String>), Error> {
        let stream = self.stream.clone().ok_or_else(|| {
            ConfigError::new("stream", "name the stream to consume: `.stream(..)`")
        })?;
        if stream.is_empty() || stream.contains(['.', '*', '>', ' ', '/', '\\']) {
            return Err(ConfigError::new(
                "stream",
                format!("`{stream}` is no stream name: no `.`, `*`, `>`, spaces or slashes"),
            )
            .into());
        }
        let consumer = match (&self.consumer, self.broadcast) {
            (Some(_), true) => {
                return Err(ConfigError::new(
                    "consumer",
                    "a broadcast source has an ephemeral consumer of its own: drop `.consumer(..)` or `.broadcast()`",
                )
                .into());
            }
            (None, false) => {
                return Err(ConfigError::new(
                    "consumer",
                    "name the consumer group (`.consumer(..)`), or consume every message with `.broadcast()`",
                )
                .into());
            }
            (Some(consumer), false) => {
                if consumer.is_empty() || consumer.contains(['.', '*', '>', ' ', '/', '\\']) {
                    return Err(ConfigError::new(
                        "consumer",
                        format!(
                            "`{consumer}` is no consumer name: no `.`, `*`, `>`, spaces or slashes"
                        ),
                    )
                    .into());
                }
                Some(consumer.clone())
            }
            (None, true) => None,
        };
        if self.ack_wait < Duration::from_millis(100) {
            return Err(ConfigError::new("ack_wait", "at least 100 ms").into());
        }
        if self.max_deliveries == Some(0) {
            return Err(ConfigError::new(
                "max_deliveries",
                "at least 1 (or `unlimited_deliveries()`)",
            )
            .into());
        }
        if self.fetch_wait < Duration::from_millis(10) {
            return Err(ConfigError::new("fetch_wait", "at least 10 ms").into());
        }
        if self.max_ack_pending.is_some_and(|pending| pending < 1) {
            return Err(ConfigError::new("max_ack_pending", "at least 1").into());
        }
        self.redelivery_backoff.validate()?;
        Ok((stream, consumer))
    }

    /// Connects, finds (or creates) the stream and the consumer, and
    /// returns the source.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] or [`Error::Config`] for settings that cannot
    /// work; [`Error::Unreachable`] (transient), [`Error::Unauthorized`],
    /// [`Error::Tls`], [`Error::Credentials`] when connecting fails;
    /// [`Error::StreamNotFound`]; [`Error::JetStream`] when the server
    /// refuses to create or describe the consumer.
    pub async fn build(self) -> Result<NatsSource, Error> {
        let (stream, durable) = self.check()?;
        let settings = self
            .settings
            .connect_settings(self.ack_timeout, default_reconnect_backoff)?;
        let connection = connection::connect(&settings).await?;
        let endpoint = connection.endpoint.to_string();
        let context = jetstream::new(connection.client.clone());
        let js_error = |operation: String, transient: bool| {
            let endpoint = endpoint.clone();
            move |error: Box<dyn std::error::Error + Send + Sync>| Error::JetStream {
                endpoint,
                operation,
                transient,
                source: error,
            }
        };
        let found = context.get_stream(&stream).await;
        let handle = match found {
            Ok(handle) => handle,
            Err(error)
                if matches!(
                    error.kind(),
                    jetstream::context::GetStreamErrorKind::JetStream(ref js)
                        if js.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
                ) =>
            {
                match &self.create_stream {
                    Some(subjects) => context
                        .get_or_create_stream(jetstream::stream::Config {
                            name: stream.clone(),
                            subjects: subjects.clone(),
                            storage: jetstream::stream::StorageType::File,
                            ..Default::default()
                        })
                        .await
                        .map_err(|error| {
                            js_error(format!("create stream `{stream}`"), false)(boxed(error))
                        })?,
                    None => {
                        return Err(Error::StreamNotFound {
                            endpoint: endpoint.clone(),
                            stream,
                        });
                    }
                }
            }
            Err(error) => {
                let transient = !matches!(
                    error.kind(),
                    jetstream::context::GetStreamErrorKind::InvalidStreamName
                );
                return Err(js_error(format!("describe stream `{stream}`"), transient)(
                    boxed(error),
                ));
            }
        };
        let (consumer_name, config) = match &durable {
            Some(durable) => match handle.consumer_info(durable).await {
                Ok(info) => {
                    let config = info.config.clone();
                    check_existing(&stream, durable, &config)?;
                    (durable.clone(), config)
                }
                Err(error)
                    if error.kind() == jetstream::context::ConsumerInfoErrorKind::NotFound =>
                {
                    let config = self.consumer_config(Some(durable.clone()));
                    let created: consumer::Consumer<consumer::pull::Config> =
                        handle.create_consumer(config).await.map_err(|error| {
                            js_error(
                                format!("create consumer `{durable}` of stream `{stream}`"),
                                false,
                            )(boxed(error))
                        })?;
                    tracing::info!(%stream, consumer = %durable, "created the durable consumer");
                    let info = created.cached_info().clone();
                    (info.name.clone(), info.config.clone())
                }
                Err(error) => {
                    return Err(js_error(
                        format!("describe consumer `{durable}` of stream `{stream}`"),
                        true,
                    )(boxed(error)));
                }
            },
            None => {
                let created: consumer::Consumer<consumer::pull::Config> = handle
                    .create_consumer(self.consumer_config(None))
                    .await
                    .map_err(|error| {
                        js_error(
                            format!("create a broadcast consumer of stream `{stream}`"),
                            false,
                        )(boxed(error))
                    })?;
                let info = created.cached_info().clone();
                (info.name.clone(), info.config.clone())
            }
        };
        let max_deliveries = match (self.max_deliveries, config.max_deliver) {
            (_, 1) => {
                return Err(ConfigError::new(
                    "max_deliveries",
                    format!(
                        "consumer `{consumer_name}` has max_deliver 1: a failed message is never delivered again; set it to -1 (unlimited) or at least 2"
                    ),
                )
                .into());
            }
            (cap, limit) if limit > 1 => {
                let server_cap = u32::try_from(limit - 1).unwrap_or(u32::MAX);
                tracing::warn!(
                    consumer = %consumer_name,
                    max_deliver = limit,
                    "the consumer has a max_deliver: the server stops delivering a message at it without a trace, so the source dead-letters a message on its last delivery"
                );
                Some(cap.map_or(server_cap, |cap| cap.min(server_cap)))
            }
            (cap, _) => cap,
        };
        NatsSource::start(super::Started {
            connection,
            stream,
            consumer: consumer_name,
            durable: durable.is_some(),
            ack_wait: config.ack_wait.max(Duration::from_millis(100)),
            max_ack_pending: config.max_ack_pending,
            explicit_max_ack_pending: self.max_ack_pending,
            max_deliveries,
            builder: self,
        })
        .await
    }

    fn consumer_config(&self, durable: Option<String>) -> consumer::pull::Config {
        consumer::pull::Config {
            durable_name: durable.clone(),
            name: durable,
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: self.ack_wait,
            max_deliver: -1,
            filter_subject: self.filter_subject.clone().unwrap_or_default(),
            max_ack_pending: self.max_ack_pending.unwrap_or(1_000),
            deliver_policy: match self.broadcast {
                true => consumer::DeliverPolicy::New,
                false => consumer::DeliverPolicy::All,
            },
            inactive_threshold: match self.broadcast {
                true => (self.ack_wait * 2).max(Duration::from_secs(60)),
                false => Duration::ZERO,
            },
            ..Default::default()
        }
    }
}

/// An existing consumer must be one intake can drive: pull, explicit acks.
fn check_existing(stream: &str, consumer: &str, config: &consumer::Config) -> Result<(), Error> {
    if config.deliver_subject.is_some() {
        return Err(ConfigError::new(
            "consumer",
            format!("consumer `{consumer}` of stream `{stream}` is a push consumer; intake pulls: use a pull consumer (no deliver subject)"),
        )
        .into());
    }
    if !matches!(config.ack_policy, consumer::AckPolicy::Explicit) {
        return Err(ConfigError::new(
            "consumer",
            format!("consumer `{consumer}` of stream `{stream}` does not acknowledge each message (ack policy none or all); intake acknowledges explicitly: use `ack_policy: explicit`"),
        )
        .into());
    }
    Ok(())
}
