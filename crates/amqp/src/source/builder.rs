//! Settings of an [`AmqpSource`], checked before anything is sent.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use intake_core::{BackoffPolicy, ConfigError, Exponential};

use crate::connection::DEFAULT_CONNECT_TIMEOUT;
use crate::error::Error;
// The one import loop of the crate, a builder and what it builds:
// `build` opens an `AmqpSource`, which keeps the checked `Settings`.
use crate::settings::AmqpSettings;
use crate::source::AmqpSource;
use crate::tls::Tls;
use crate::topology::{Topology, check_name};
use crate::url::AmqpUrl;

/// What the source consumes.
#[derive(Clone, Debug)]
pub(crate) enum Target {
    /// A named queue, shared with every other consumer of it.
    Queue(String),
    /// Every message published to a fanout exchange, through an exclusive
    /// auto-delete queue of this consumer's own.
    Broadcast {
        /// The fanout exchange.
        exchange: String,
    },
}

/// Everything a source needs to (re)connect.
pub(crate) struct Settings {
    /// As given: what the source's dead-letter sink connects with.
    pub(crate) amqp: AmqpSettings,
    pub(crate) url: AmqpUrl,
    pub(crate) target: Target,
    pub(crate) topology: Topology,
    pub(crate) reconnect: Arc<dyn BackoffPolicy>,
    pub(crate) connection_name: Option<String>,
    pub(crate) connect_timeout: Duration,
    pub(crate) close_timeout: Duration,
    pub(crate) tls: Tls,
}

impl Settings {
    /// The name deliveries carry as their source: the queue, or the
    /// exchange of a broadcast source (its queue is renamed on every
    /// reconnect).
    pub(crate) fn source_name(&self) -> &str {
        match &self.target {
            Target::Queue(queue) => queue,
            Target::Broadcast { exchange } => exchange,
        }
    }
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("url", &self.url)
            .field("target", &self.target)
            .field("connection_name", &self.connection_name)
            .finish_non_exhaustive()
    }
}

/// Builds an [`AmqpSource`]; see [`AmqpSource::builder`].
#[must_use = "a builder does nothing until `.build().await`"]
pub struct AmqpSourceBuilder {
    settings: AmqpSettings,
    target: Option<Target>,
    topology: Topology,
    reconnect: Arc<dyn BackoffPolicy>,
    close_timeout: Duration,
}

impl fmt::Debug for AmqpSourceBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpSourceBuilder")
            .field("settings", &self.settings)
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl AmqpSourceBuilder {
    /// How long [`Source::close`](intake_core::backend::Source::close) waits for the
    /// broker unless [`close_timeout`](Self::close_timeout) says otherwise.
    pub const DEFAULT_CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

    pub(crate) fn new(settings: impl Into<AmqpSettings>) -> Self {
        Self {
            settings: settings.into(),
            target: None,
            topology: Topology::new(),
            reconnect: Arc::new(
                Exponential::new(Duration::from_millis(100), Duration::from_secs(10))
                    .retry_forever(),
            ),
            close_timeout: Self::DEFAULT_CLOSE_TIMEOUT,
        }
    }

    /// Consumes `queue`. Consumers of one queue share its messages.
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.target = Some(Target::Queue(queue.into()));
        self
    }

    /// Receives every message published to the fanout `exchange` (declared
    /// durable if missing), through an exclusive, auto-delete, server-named
    /// queue of this source's own. The queue lives as long as the
    /// connection: what is published while the source reconnects is not
    /// seen by it.
    pub fn broadcast(mut self, exchange: impl Into<String>) -> Self {
        self.target = Some(Target::Broadcast {
            exchange: exchange.into(),
        });
        self
    }

    /// Declares `topology` on connect and on every reconnect. Without it, the
    /// queue must exist: a missing one is [`Error::QueueNotFound`].
    pub fn declare(mut self, topology: Topology) -> Self {
        self.topology = topology;
        self
    }

    /// How the source waits between attempts to reconnect to the broker
    /// after the connection or channel is lost. Default: from 100 ms,
    /// doubling up to 10 s, forever (the same on every intake backend).
    /// Checked with [`BackoffPolicy::validate`] by [`build`](Self::build).
    ///
    /// A channel that had delivered messages (or lasted the
    /// [connect timeout](AmqpSettings::connect_timeout)) is reopened at once; one
    /// lost younger and empty, or lost to a delivery lapin cannot parse,
    /// counts as a failed attempt like a failed reconnect, so a broker that
    /// drops every new consumer is never reconnected to in a tight loop.
    /// Every failed attempt is logged at `WARN`. A refusal that retrying
    /// cannot fix (credentials, a missing queue) is reported at once. When
    /// a policy with a retry cap gives up, [`Source::next`] returns the last
    /// error, the consumer's own
    /// [`reconnect_backoff`](intake_core::ConsumerBuilder::reconnect_backoff)
    /// paces its next call, and that call starts a new series of attempts.
    ///
    /// [`Source::next`]: intake_core::backend::Source::next
    pub fn reconnect_backoff(mut self, policy: impl BackoffPolicy) -> Self {
        self.reconnect = Arc::new(policy);
        self
    }

    /// How long [`Source::close`](intake_core::backend::Source::close) waits for the
    /// broker to answer the consumer's cancel, the hand-back of unfinished
    /// deliveries and the closing of channel and connection (default 5 s).
    /// Past it the connection is dropped, close reports
    /// [`SourceError::Unreachable`](intake_core::backend::SourceError::Unreachable),
    /// and the broker requeues the unacknowledged deliveries once it notices
    /// the connection is gone.
    pub fn close_timeout(mut self, timeout: Duration) -> Self {
        self.close_timeout = timeout;
        self
    }

    /// Checks the settings without touching the network.
    pub(crate) fn settings(self) -> Result<Settings, Error> {
        let checked = self.settings.check()?;
        let target = self.target.ok_or_else(|| {
            ConfigError::new(
                "queue",
                "is not set; call .queue(\"name\") to consume a queue or .broadcast(\"exchange\") to receive every message of a fanout exchange",
            )
        })?;
        match &target {
            Target::Queue(queue) if queue.is_empty() => {
                return Err(
                    ConfigError::new("queue", "is empty; name the queue to consume").into(),
                );
            }
            Target::Queue(queue) => check_name("queue", queue)?,
            Target::Broadcast { exchange } if exchange.is_empty() => {
                return Err(ConfigError::new(
                    "broadcast",
                    "needs a fanout exchange name; the default exchange cannot fan out",
                )
                .into());
            }
            Target::Broadcast { exchange } => check_name("broadcast", exchange)?,
        }
        self.topology.validate()?;
        self.reconnect.validate().map_err(|error| {
            ConfigError::new(
                "reconnect_backoff",
                format!("`{}` {}", error.setting, error.problem),
            )
        })?;
        if self.close_timeout.is_zero() {
            return Err(ConfigError::new(
                "close_timeout",
                "is zero; the broker needs a moment to take unfinished deliveries back",
            )
            .into());
        }
        Ok(Settings {
            connect_timeout: checked.connect_timeout_or(DEFAULT_CONNECT_TIMEOUT),
            amqp: self.settings,
            url: checked.url,
            target,
            topology: self.topology,
            reconnect: self.reconnect,
            connection_name: checked.connection_name,
            close_timeout: self.close_timeout,
            tls: checked.tls,
        })
    }

    /// Checks the settings, connects, declares the topology, checks that the
    /// queue exists and starts consuming: one attempt, so a wrong password,
    /// a missing queue or a broker that is down are reported here as a typed
    /// [`Error`] (retry it yourself if the broker may still be starting).
    /// Later connection losses are retried by the source.
    pub async fn build(self) -> Result<AmqpSource, Error> {
        AmqpSource::open(self.settings()?).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

    fn config_error(builder: AmqpSourceBuilder) -> ConfigError {
        match builder.settings() {
            Err(Error::Config(error)) => error,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn a_source_without_a_queue_says_how_to_name_one() {
        let error = config_error(AmqpSourceBuilder::new(URL));
        assert!(error.problem.contains(".queue("));
    }

    #[test]
    fn tls_settings_on_a_plain_url_are_refused() {
        let error = config_error(
            AmqpSourceBuilder::new(AmqpSettings::new(URL).tls(Tls::new().ca_certificate_pem("x")))
                .queue("q"),
        );
        assert_eq!(error.setting, "tls");
        assert!(error.problem.contains("amqps://"));
    }

    #[test]
    fn a_zero_close_timeout_is_refused() {
        let error = config_error(
            AmqpSourceBuilder::new(URL)
                .queue("q")
                .close_timeout(Duration::ZERO),
        );
        assert_eq!(error.setting, "close_timeout");
    }

    #[test]
    fn the_default_reconnect_backoff_grows_from_100_ms_to_10_s_and_never_gives_up() {
        let settings = AmqpSourceBuilder::new(URL).queue("q").settings().unwrap();
        let first = settings.reconnect.delay(1).expect("a first retry");
        assert!(
            (Duration::from_millis(90)..=Duration::from_millis(110)).contains(&first),
            "{first:?}"
        );
        for retry in [11, 1_000, u32::MAX] {
            let delay = settings
                .reconnect
                .delay(retry)
                .unwrap_or_else(|| panic!("gave up at retry {retry}"));
            assert!(
                (Duration::from_secs(9)..=Duration::from_secs(11)).contains(&delay),
                "{delay:?}"
            );
        }
    }

    #[test]
    fn an_invalid_reconnect_backoff_is_refused_when_the_source_is_built() {
        let error = config_error(AmqpSourceBuilder::new(URL).queue("q").reconnect_backoff(
            Exponential::new(Duration::from_secs(10), Duration::from_secs(1)),
        ));
        assert_eq!(error.setting, "reconnect_backoff");
        assert!(error.problem.contains("backoff.min"), "{error}");
    }

    #[test]
    fn debug_output_never_shows_the_password() {
        let builder = AmqpSourceBuilder::new("amqp://app:hunter2@broker:5672/%2f").queue("q");
        assert!(!format!("{builder:?}").contains("hunter2"));
        let settings = builder.settings().unwrap();
        assert!(!format!("{settings:?}").contains("hunter2"));
    }
}
