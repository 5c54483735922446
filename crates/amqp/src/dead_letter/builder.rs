//! [`AmqpDeadLetterSinkBuilder`]: a dead-letter sink's settings, checked
//! before it connects.

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use intake_core::ConfigError;
use intake_core::dead_letter::envelope::{Broker, Carrier};
use tokio::sync::Mutex;

use crate::connection::DEFAULT_CONNECT_TIMEOUT;
use crate::error::Error;
use crate::settings::AmqpSettings;
use crate::topology::{Topology, check_name};

use super::AmqpDeadLetterSink;

/// Builds an [`AmqpDeadLetterSink`]: from the source whose messages it
/// dead-letters ([`AmqpSource::dead_letter_sink`](crate::AmqpSource::dead_letter_sink),
/// which fills in the source's [`AmqpSettings`] and what it consumes), or
/// from settings or a URL ([`AmqpDeadLetterSink::builder`]).
#[must_use = "a builder does nothing until `.build().await`"]
pub struct AmqpDeadLetterSinkBuilder {
    settings: AmqpSettings,
    exchange: Option<String>,
    routing_key: Option<String>,
    consumed_queues: Vec<String>,
    /// The fanout exchange a broadcast source receives from.
    consumed_exchange: Option<String>,
    topology: Topology,
    /// What the source declares: routes the sink does not declare but must
    /// not publish into.
    source_topology: Topology,
    confirm_timeout: Duration,
}

impl fmt::Debug for AmqpDeadLetterSinkBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpDeadLetterSinkBuilder")
            .field("settings", &self.settings)
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .finish_non_exhaustive()
    }
}

impl AmqpDeadLetterSinkBuilder {
    pub(super) fn new(settings: AmqpSettings) -> Self {
        Self {
            settings,
            exchange: None,
            routing_key: None,
            consumed_queues: Vec::new(),
            consumed_exchange: None,
            topology: Topology::new(),
            source_topology: Topology::new(),
            confirm_timeout: Duration::from_secs(30),
        }
    }

    /// A builder for the broker of a source's `settings`, which knows the
    /// routes the source declared (`source_topology`).
    pub(crate) fn for_source(settings: AmqpSettings, source_topology: Topology) -> Self {
        Self {
            source_topology,
            ..Self::new(settings)
        }
    }

    /// Names the fanout exchange a broadcast source receives from: a
    /// destination equal to it is refused, as its dead letters would come
    /// back to every consumer of it.
    pub(crate) fn consumed_exchange(mut self, exchange: String) -> Self {
        self.consumed_exchange = Some(exchange);
        self
    }

    /// Publishes to `exchange`. `""` is the default exchange, which routes by
    /// queue name: then set [`routing_key`](Self::routing_key) to the
    /// dead-letter queue.
    pub fn exchange(mut self, exchange: impl Into<String>) -> Self {
        self.exchange = Some(exchange.into());
        self
    }

    /// Publishes with this routing key. By default, the name of the queue
    /// the message came from, so one direct exchange can serve many queues
    /// with one binding each.
    pub fn routing_key(mut self, routing_key: impl Into<String>) -> Self {
        self.routing_key = Some(routing_key.into());
        self
    }

    /// Names a queue whose messages this sink dead-letters. A destination
    /// that routes them back into it (the default exchange with the queue's
    /// name as routing key, or an exchange declared in the sink's
    /// [topology](Self::declare), or the source's, bound to the queue with
    /// the routing key the dead letters get) is refused by
    /// [`build`](Self::build): they would be consumed again, fail again,
    /// forever. A sink made by
    /// [`AmqpSource::dead_letter_sink`](crate::AmqpSource::dead_letter_sink)
    /// names the source's queue already; call it once per other queue.
    ///
    /// Whether or not it is called, a dead letter the sink's own settings
    /// would route back into the queue it came from is refused when written.
    pub fn consumed_queue(mut self, queue: impl Into<String>) -> Self {
        self.consumed_queues.push(queue.into());
        self
    }

    /// Declares `topology` (the exchange, the dead-letter queue, the binding)
    /// whenever the sink connects.
    pub fn declare(mut self, topology: Topology) -> Self {
        self.topology = topology;
        self
    }

    /// How long to wait for the broker's confirm (default 30 s).
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// Checks the settings and connects (one attempt), so that a wrong
    /// password or a refused declaration shows here.
    pub async fn build(self) -> Result<AmqpDeadLetterSink, Error> {
        let checked = self.settings.check()?;
        let exchange = self.exchange.ok_or_else(|| {
            ConfigError::new(
                "exchange",
                "is not set; call .exchange(\"orders.dlx\") (or .exchange(\"\") with .routing_key(\"orders.dlq\") for the default exchange)",
            )
        })?;
        check_name("exchange", &exchange)?;
        match &self.routing_key {
            Some(routing_key) => check_name("routing_key", routing_key)?,
            None if exchange.is_empty() => {
                return Err(ConfigError::new(
                    "routing_key",
                    "is not set, and the default exchange routes by queue name: the dead letters would go back to their own queue; set .routing_key(\"<dead-letter queue>\")",
                )
                .into());
            }
            None => {}
        }
        self.topology.validate()?;
        let routes = self.topology.joined(&self.source_topology);
        for queue in &self.consumed_queues {
            let routing_key = self.routing_key.as_deref().unwrap_or(queue);
            if routes.routes_into(&exchange, Some(routing_key), queue) {
                return Err(ConfigError::new(
                    "consumed_queue",
                    format!(
                        "`{queue}` is consumed, and exchange `{exchange}` with routing key \
                         `{routing_key}` routes its dead letters back into it, where they would \
                         be consumed again; publish them to a dead-letter queue of their own"
                    ),
                )
                .into());
            }
        }
        if let Some(consumed) = self
            .consumed_exchange
            .filter(|consumed| *consumed == exchange)
        {
            return Err(ConfigError::new(
                "exchange",
                format!(
                    "`{consumed}` is the fanout exchange the source receives from: every dead \
                     letter would come back to each of its consumers, this one included; publish \
                     them to an exchange of their own"
                ),
            )
            .into());
        }
        if self.confirm_timeout.is_zero() {
            return Err(ConfigError::new(
                "confirm_timeout",
                "is zero; give the broker time to confirm",
            )
            .into());
        }
        let sink = AmqpDeadLetterSink {
            connect_timeout: checked.connect_timeout_or(DEFAULT_CONNECT_TIMEOUT),
            url: checked.url,
            exchange,
            routing_key: self.routing_key,
            topology: self.topology,
            routes,
            connection_name: checked.connection_name,
            confirm_timeout: self.confirm_timeout,
            tls: checked.tls,
            carrier: Carrier::keyless(Broker::Amqp),
            link: Mutex::new(None),
            reduced: AtomicU64::new(0),
            instance: random_instance(),
            written: AtomicU64::new(0),
        };
        sink.channel().await?;
        Ok(sink)
    }
}

/// A number no other sink (of this process or another) is likely to draw:
/// the standard library's randomly keyed hasher over the process id and
/// the time.
fn random_instance() -> u64 {
    use std::hash::BuildHasher;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    std::collections::hash_map::RandomState::new().hash_one((std::process::id(), now))
}
