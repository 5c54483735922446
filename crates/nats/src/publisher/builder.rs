//! [`NatsPublisherBuilder`]: where to publish, as whom, and the bounds.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use async_nats::jetstream;
use intake_core::ConfigError;
use tokio::sync::{Semaphore, mpsc};

use super::{Inner, NatsPublisher};
use crate::connection;
use crate::error::Error;
use crate::settings::{NatsSettings, default_reconnect_backoff};

/// How much a [`NatsPublisher`] keeps in flight and how long it waits; get
/// one from [`NatsPublisher::builder`], which takes how to connect
/// ([`NatsSettings`](crate::NatsSettings), as a source's) or a URL alone.
///
/// ```no_run
/// use std::time::Duration;
/// use intake_nats::NatsPublisher;
///
/// # async fn run() -> Result<(), intake_nats::Error> {
/// let publisher = NatsPublisher::builder("nats://app:secret@127.0.0.1:4222")
///     .max_unconfirmed(500)
///     .send_timeout(Duration::from_secs(5))
///     .ack_timeout(Duration::from_secs(5))
///     .message_id_header("order-id")
///     .build()
///     .await?;
/// # drop(publisher);
/// # Ok(())
/// # }
/// ```
#[must_use]
pub struct NatsPublisherBuilder {
    settings: NatsSettings,
    ack_timeout: Duration,
    send_timeout: Duration,
    max_unconfirmed: usize,
    message_id_header: Option<Arc<str>>,
    key_token: bool,
}

impl std::fmt::Debug for NatsPublisherBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsPublisherBuilder")
            .field("settings", &self.settings)
            .field("ack_timeout", &self.ack_timeout)
            .field("send_timeout", &self.send_timeout)
            .field("max_unconfirmed", &self.max_unconfirmed)
            .field("message_id_header", &self.message_id_header)
            .field("key_token", &self.key_token)
            .finish_non_exhaustive()
    }
}

impl NatsPublisherBuilder {
    /// Default of [`max_unconfirmed`](Self::max_unconfirmed).
    pub const DEFAULT_MAX_UNCONFIRMED: usize = 1_000;
    /// Default of [`ack_timeout`](Self::ack_timeout), as the source's.
    pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(10);
    /// Default of [`send_timeout`](Self::send_timeout).
    pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(10);

    pub(super) fn new(settings: NatsSettings) -> Self {
        Self {
            settings,
            ack_timeout: Self::DEFAULT_ACK_TIMEOUT,
            send_timeout: Self::DEFAULT_SEND_TIMEOUT,
            max_unconfirmed: Self::DEFAULT_MAX_UNCONFIRMED,
            message_id_header: None,
            key_token: true,
        }
    }

    /// The most outputs sent and not yet acknowledged by their stream
    /// (default 1,000): a send past it waits for an ack. It bounds the
    /// client's memory for outputs and the work a lost connection leaves
    /// unconfirmed.
    pub fn max_unconfirmed(mut self, outputs: usize) -> Self {
        self.max_unconfirmed = outputs;
        self
    }

    /// How long a send may wait for room among the unconfirmed outputs
    /// (default 10 s); past it the send is
    /// [unavailable](intake_core::publish::PublishErrorKind::Unavailable).
    pub fn send_timeout(mut self, timeout: Duration) -> Self {
        self.send_timeout = timeout;
        self
    }

    /// How long an output's publish ack may take from its send (default
    /// 10 s); past it the receipt is
    /// [unavailable](intake_core::publish::PublishErrorKind::Unavailable).
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = timeout;
        self
    }

    /// Sends the value of each output's header `name` as its `Nats-Msg-Id`,
    /// so that the stream drops an output published again within its
    /// duplicate window (an output without the header has no id). Off by
    /// default: see Duplicates on [`NatsPublisher`].
    pub fn message_id_header(mut self, name: impl Into<Arc<str>>) -> Self {
        self.message_id_header = Some(name.into());
        self
    }

    /// Publishes every output to its destination subject, its key left out
    /// (by default the key is the subject's last token, what this crate's
    /// source reads back as the key).
    pub fn ignore_keys(mut self) -> Self {
        self.key_token = false;
        self
    }

    fn check(&self) -> Result<(), Error> {
        if self.max_unconfirmed == 0 || u32::try_from(self.max_unconfirmed).is_err() {
            return Err(ConfigError::new("max_unconfirmed", "at least 1, at most 2^32 - 1").into());
        }
        if self.ack_timeout.is_zero() {
            return Err(ConfigError::new("ack_timeout", "more than zero").into());
        }
        if self.send_timeout.is_zero() {
            return Err(ConfigError::new("send_timeout", "more than zero").into());
        }
        if self.message_id_header.as_deref() == Some("") {
            return Err(ConfigError::new("message_id_header", "name a header").into());
        }
        Ok(())
    }

    /// Connects and returns the publisher.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] or [`Error::Config`] for settings that cannot
    /// work; [`Error::Unreachable`] (transient), [`Error::Unauthorized`],
    /// [`Error::Tls`], [`Error::Credentials`] when connecting fails.
    pub async fn build(self) -> Result<NatsPublisher, Error> {
        self.check()?;
        let settings = self
            .settings
            .connect_settings(self.ack_timeout, default_reconnect_backoff)?;
        let connection = connection::connect(&settings).await?;
        // The context's own bound on acks in flight is the publisher's: an
        // output whose receipt was dropped unresolved still holds a place
        // there until its ack comes (or the ack timeout passes).
        let context = jetstream::ContextBuilder::new()
            .timeout(self.ack_timeout)
            .ack_timeout(self.ack_timeout)
            .max_ack_inflight(self.max_unconfirmed)
            .backpressure_on_inflight(true)
            .build(connection.client.clone());
        tracing::debug!(
            endpoint = %connection.endpoint,
            max_unconfirmed = self.max_unconfirmed,
            "connected the publisher"
        );
        let (in_flight, incoming) = mpsc::unbounded_channel();
        tokio::spawn(super::await_acks(incoming));
        Ok(NatsPublisher {
            inner: Arc::new(Inner {
                context,
                client: connection.client,
                endpoint: connection.endpoint,
                events: connection.events,
                permits: Arc::new(Semaphore::new(self.max_unconfirmed)),
                max_unconfirmed: self.max_unconfirmed,
                send_timeout: self.send_timeout,
                ack_timeout: self.ack_timeout,
                message_id_header: self.message_id_header,
                key_token: self.key_token,
                closed: AtomicBool::new(false),
                in_flight,
            }),
        })
    }
}
