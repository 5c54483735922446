//! [`AmqpPublisherBuilder`]: a publisher's settings, checked before it
//! connects.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use intake_core::{BackoffPolicy, ConfigError, Exponential};
use tokio::sync::{Mutex, Semaphore, mpsc};

use crate::connection::DEFAULT_CONNECT_TIMEOUT;
use crate::error::Error;
use crate::settings::AmqpSettings;
use crate::topology::{Topology, check_name};

use super::receipt::collect_confirms;
use super::{AmqpPublisher, LinkState, Routing, Shared};

/// Builds an [`AmqpPublisher`]; see [`AmqpPublisher::builder`].
#[must_use = "a builder does nothing until `.build().await`"]
pub struct AmqpPublisherBuilder {
    settings: AmqpSettings,
    routing: Routing,
    topology: Topology,
    persistent: bool,
    send_timeout: Duration,
    confirm_timeout: Duration,
    max_payload_bytes: usize,
    max_unconfirmed: usize,
    reconnect: Arc<dyn BackoffPolicy>,
}

impl fmt::Debug for AmqpPublisherBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpPublisherBuilder")
            .field("settings", &self.settings)
            .field("routing", &self.routing)
            .field("max_unconfirmed", &self.max_unconfirmed)
            .finish_non_exhaustive()
    }
}

impl AmqpPublisherBuilder {
    /// The default bound on outputs awaiting their confirm.
    pub const DEFAULT_MAX_UNCONFIRMED: usize = 1_000;
    /// The default wait for room and a connection in a send, and for a
    /// confirm.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
    /// The default largest payload: RabbitMQ 4's `max_message_size`.
    pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 16 << 20;

    pub(super) fn new(settings: AmqpSettings) -> Self {
        Self {
            settings,
            routing: Routing::Exchange(String::new()),
            topology: Topology::new(),
            persistent: true,
            send_timeout: Self::DEFAULT_TIMEOUT,
            confirm_timeout: Self::DEFAULT_TIMEOUT,
            max_payload_bytes: Self::DEFAULT_MAX_PAYLOAD_BYTES,
            max_unconfirmed: Self::DEFAULT_MAX_UNCONFIRMED,
            reconnect: Arc::new(
                Exponential::new(Duration::from_millis(100), Duration::from_secs(10))
                    .retry_forever(),
            ),
        }
    }

    /// Publishes every output to `exchange`, with its destination as the
    /// routing key. The default is `""`, the default exchange, which routes
    /// to the queue the routing key names.
    pub fn exchange(mut self, exchange: impl Into<String>) -> Self {
        self.routing = Routing::Exchange(exchange.into());
        self
    }

    /// Publishes each output to the exchange its destination names, with
    /// the output's key as the routing key (`""` without a key), so that an
    /// [`AmqpSource`](crate::AmqpSource) reads the key back as the
    /// message's key. The destination `""` is the default exchange, where
    /// the key names the queue.
    pub fn route_by_key(mut self) -> Self {
        self.routing = Routing::ByKey;
        self
    }

    /// Declares `topology` (exchanges, queues, bindings) whenever the
    /// publisher connects.
    pub fn declare(mut self, topology: Topology) -> Self {
        self.topology = topology;
        self
    }

    /// Publishes with `delivery-mode` 1: the broker may keep the outputs in
    /// memory only (faster, lost with the broker). Persistent by default.
    pub fn transient(mut self) -> Self {
        self.persistent = false;
        self
    }

    /// How many outputs may await the broker's confirm at once (default
    /// 1,000): the publisher's buffer, and so its backpressure.
    pub fn max_unconfirmed(mut self, max: usize) -> Self {
        self.max_unconfirmed = max;
        self
    }

    /// How long a send waits for room and for a connection (default 30 s).
    pub fn send_timeout(mut self, timeout: Duration) -> Self {
        self.send_timeout = timeout;
        self
    }

    /// How long a sent output waits for the broker's confirm (default
    /// 30 s).
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// The largest payload sent (default 16 MiB, RabbitMQ 4's
    /// `max_message_size`; RabbitMQ 3 allows 128 MiB). A larger one is
    /// rejected before it is sent: the broker would close the channel on
    /// it, failing every other output in flight.
    pub fn max_payload_bytes(mut self, max: usize) -> Self {
        self.max_payload_bytes = max;
        self
    }

    /// How long to wait between failed attempts to reconnect (default:
    /// from 100 ms doubling to 10 s, never giving up). A policy that gives
    /// up closes the publisher.
    pub fn reconnect_backoff(mut self, policy: impl BackoffPolicy) -> Self {
        self.reconnect = Arc::new(policy);
        self
    }

    /// Checks the settings and connects once, so that a wrong password or a
    /// refused declaration shows here. A broker that cannot be reached now
    /// is not an error: the first send connects (and fails as unavailable
    /// while it cannot).
    ///
    /// # Errors
    ///
    /// [`Error`] for a bad URL or setting, or a connection the broker
    /// refuses for a reason retrying does not fix.
    pub async fn build(self) -> Result<AmqpPublisher, Error> {
        let checked = self.settings.check()?;
        let connect_timeout = checked.connect_timeout_or(DEFAULT_CONNECT_TIMEOUT);
        let url = checked.url;
        if let Routing::Exchange(exchange) = &self.routing {
            check_name("exchange", exchange)?;
        }
        self.topology.validate()?;
        self.reconnect.validate().map_err(|error| {
            ConfigError::new("reconnect_backoff", format!("is invalid: {error}"))
        })?;
        for (setting, timeout) in [
            ("send_timeout", self.send_timeout),
            ("confirm_timeout", self.confirm_timeout),
        ] {
            if timeout.is_zero() {
                return Err(ConfigError::new(setting, "is zero; give the broker time").into());
            }
        }
        if self.max_unconfirmed == 0 || self.max_unconfirmed > Semaphore::MAX_PERMITS {
            return Err(ConfigError::new(
                "max_unconfirmed",
                "must be at least 1 (the outputs in flight at once)",
            )
            .into());
        }
        let (pending, queue) = mpsc::unbounded_channel();
        tokio::spawn(collect_confirms(
            queue,
            url.endpoint().to_owned(),
            url.vhost().to_owned(),
        ));
        let publisher = AmqpPublisher {
            shared: Arc::new(Shared {
                url,
                tls: checked.tls,
                connection_name: checked.connection_name,
                connect_timeout,
                topology: self.topology,
                routing: self.routing,
                persistent: self.persistent,
                send_timeout: self.send_timeout,
                confirm_timeout: self.confirm_timeout,
                max_payload_bytes: self.max_payload_bytes,
                max_unconfirmed: self.max_unconfirmed,
                reconnect: self.reconnect,
                room: Arc::new(Semaphore::new(self.max_unconfirmed)),
                link: Mutex::new(LinkState::default()),
                pending,
                closed: AtomicBool::new(false),
            }),
        };
        let shared = &publisher.shared;
        match shared.connect(None).await {
            Ok(link) => shared.link.lock().await.live = Some(link),
            Err(error) if error.is_transient() => {
                tracing::warn!(
                    endpoint = shared.url.endpoint(),
                    %error,
                    "AMQP publisher cannot connect yet; the first send tries again"
                );
                let mut link = shared.link.lock().await;
                link.failures = 1;
                link.last_error = Some(Arc::new(error));
            }
            Err(error) => return Err(error),
        }
        Ok(publisher)
    }
}
