//! [`AmqpSettings`]: how to reach a RabbitMQ broker, given once and passed
//! to every builder and to [`AmqpBroker`](crate::AmqpBroker): the URL (with
//! its credentials), TLS, the connection's name and the connect timeout.

use std::fmt;
use std::time::Duration;

use intake_core::{ConfigError, redact};

use crate::error::Error;
use crate::tls::Tls;
use crate::url::AmqpUrl;

/// How to reach a RabbitMQ broker: its URL, TLS beyond the defaults, the
/// name its connections show and how long connecting may take, given once
/// and passed to every builder ([`AmqpSource::builder`](crate::AmqpSource::builder),
/// [`AmqpPublisher::builder`](crate::AmqpPublisher::builder),
/// [`AmqpDeadLetterSink::builder`](crate::AmqpDeadLetterSink::builder),
/// [`AmqpParking::builder`](crate::AmqpParking::builder),
/// [`AmqpDeadLetterStore::builder`](crate::AmqpDeadLetterStore::builder))
/// and to [`AmqpBroker::new`](crate::AmqpBroker::new). Each part still opens
/// connections of its own with them. A URL (`&str` or `String`) converts
/// into settings with nothing else set, so a builder also takes a URL.
///
/// The URL is `amqp://user:password@host:5672/vhost`, or `amqps://` for
/// TLS (checked against the system's root certificates unless
/// [`tls`](Self::tls) adds a private CA or a client certificate); the
/// default vhost `/` is written `%2f`. Query parameters `heartbeat`
/// (seconds), `frame_max` and `channel_max` are passed to the broker: a
/// shorter heartbeat than RabbitMQ's default 60 s notices a silently dead
/// network sooner. The URL is checked when a part is built (an
/// [`Error::InvalidUrl`] then, shown redacted).
///
/// `Debug` never shows the password: it prints the endpoint
/// (`amqp://user@host:port/vhost`).
///
/// ```no_run
/// use std::time::Duration;
/// use intake_amqp::{AmqpPublisher, AmqpSettings, AmqpSource};
///
/// # async fn run() -> Result<(), intake_amqp::Error> {
/// let settings = AmqpSettings::new("amqp://billing:hunter2@127.0.0.1:5672/%2f")
///     .connection_name("billing")
///     .connect_timeout(Duration::from_secs(5));
/// assert!(!format!("{settings:?}").contains("hunter2"));
/// let source = AmqpSource::builder(&settings).queue("payments").build().await?;
/// let publisher = AmqpPublisher::builder(settings).build().await?;
/// # drop((source, publisher));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct AmqpSettings {
    /// As given, credentials included: never printed.
    url: String,
    tls: Tls,
    connection_name: Option<String>,
    /// `None`: each part's own default (see [`AmqpSettings::connect_timeout`]).
    connect_timeout: Option<Duration>,
}

/// The settings of one part, checked: the URL parsed, the TLS settings
/// checked against its scheme.
pub(crate) struct Checked {
    pub(crate) url: AmqpUrl,
    pub(crate) tls: Tls,
    pub(crate) connection_name: Option<String>,
    pub(crate) connect_timeout: Option<Duration>,
}

impl Checked {
    /// The connect timeout, or the part's own `default` where none is set.
    pub(crate) fn connect_timeout_or(&self, default: Duration) -> Duration {
        self.connect_timeout.unwrap_or(default)
    }
}

impl AmqpSettings {
    /// How long a connection attempt may take unless
    /// [`connect_timeout`](Self::connect_timeout) says otherwise (a
    /// parking's connections take its
    /// [`timeout`](crate::AmqpParkingBuilder::timeout) instead, a
    /// dead-letter store's its
    /// [`command_timeout`](crate::AmqpDeadLetterStoreBuilder::command_timeout)).
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = crate::connection::DEFAULT_CONNECT_TIMEOUT;

    /// The broker at `url`, with no other setting.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            tls: Tls::new(),
            connection_name: None,
            connect_timeout: None,
        }
    }

    /// TLS beyond the defaults for an `amqps://` URL: a private CA to trust,
    /// a client certificate to present (see [`Tls`]). Refused when a part is
    /// built on an `amqp://` URL.
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = tls;
        self
    }

    /// Names the connections (shown by `rabbitmqctl list_connections
    /// client_properties` and the management UI). A part with connections
    /// of its own appends what they are for (` (dead letters)`,
    /// ` (parking)`, ...).
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = Some(name.into());
        self
    }

    /// How long one connection attempt may take (default
    /// [`DEFAULT_CONNECT_TIMEOUT`](Self::DEFAULT_CONNECT_TIMEOUT), 10 s;
    /// a parking's own connections default to its
    /// [`timeout`](crate::AmqpParkingBuilder::timeout), a dead-letter
    /// store's to its
    /// [`command_timeout`](crate::AmqpDeadLetterStoreBuilder::command_timeout)).
    /// For a source, from the TCP connect to the consumer's start
    /// (handshake, channel, declarations, `basic.qos`, `basic.consume`), so
    /// that a broker that accepts connections and then stalls is a failed
    /// attempt, retried after the reconnect backoff. Zero is refused when a
    /// part is built.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// The broker as logs and errors show it: `amqp://user@host:port/vhost`,
    /// without the password (a URL that does not parse is shown
    /// [redacted](intake_core::redact::url)).
    pub fn endpoint(&self) -> String {
        AmqpUrl::parse(&self.url)
            .map(|url| url.endpoint().to_owned())
            .unwrap_or_else(|_| redact::url(&self.url))
    }

    /// The connection name, if one is set.
    pub(crate) fn name(&self) -> Option<&str> {
        self.connection_name.as_deref()
    }

    /// These settings with the connection name `name` (or none).
    pub(crate) fn named(mut self, name: Option<String>) -> Self {
        self.connection_name = name;
        self
    }

    /// These settings with the connection name, if any, followed by
    /// ` ({part})`: the name of a part's own connection.
    pub(crate) fn for_part(self, part: &str) -> Self {
        let name = self
            .connection_name
            .as_ref()
            .map(|name| format!("{name} ({part})"));
        self.named(name)
    }

    /// Parses the URL and checks the TLS settings and the connect timeout,
    /// for a part being built.
    pub(crate) fn check(&self) -> Result<Checked, Error> {
        let url = AmqpUrl::parse(&self.url)?;
        self.tls.check_for(&url)?;
        if self
            .connect_timeout
            .is_some_and(|timeout| timeout.is_zero())
        {
            return Err(
                ConfigError::new("connect_timeout", "is zero; give it at least a second").into(),
            );
        }
        Ok(Checked {
            url,
            tls: self.tls.clone(),
            connection_name: self.connection_name.clone(),
            connect_timeout: self.connect_timeout,
        })
    }
}

impl fmt::Debug for AmqpSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpSettings")
            .field("endpoint", &self.endpoint())
            .field("tls", &self.tls)
            .field("connection_name", &self.connection_name)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

impl From<&str> for AmqpSettings {
    fn from(url: &str) -> Self {
        Self::new(url)
    }
}

impl From<String> for AmqpSettings {
    fn from(url: String) -> Self {
        Self::new(url)
    }
}

impl From<&String> for AmqpSettings {
    fn from(url: &String) -> Self {
        Self::new(url.as_str())
    }
}

impl From<&AmqpSettings> for AmqpSettings {
    fn from(settings: &AmqpSettings) -> Self {
        settings.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_endpoint_never_show_the_password() {
        for url in [
            "amqp://app:hunter2@broker:5672/%2f",
            "amqp://app:12/hunter2@broker",
            "amqps://app:hunter2@",
        ] {
            let settings = AmqpSettings::new(url)
                .connection_name("billing")
                .tls(Tls::new().ca_certificate_pem("x"));
            let shown = format!("{settings:?} {}", settings.endpoint());
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("billing"), "{shown}");
        }
        let settings = AmqpSettings::new("amqp://app:hunter2@broker:5672/%2f");
        assert_eq!(settings.endpoint(), "amqp://app@broker:5672/%2f");
    }

    #[test]
    fn a_url_is_settings_with_the_defaults() {
        let checked = AmqpSettings::from("amqp://guest:guest@127.0.0.1:5672/%2f")
            .check()
            .expect("a valid URL");
        assert_eq!(checked.connect_timeout, None);
        assert_eq!(
            checked.connect_timeout_or(AmqpSettings::DEFAULT_CONNECT_TIMEOUT),
            Duration::from_secs(10)
        );
        assert!(checked.connection_name.is_none());
        assert_eq!(checked.url.endpoint(), "amqp://guest@127.0.0.1:5672/%2f");
    }

    #[test]
    fn a_bad_setting_is_refused_when_checked() {
        let plain = "amqp://guest:guest@127.0.0.1:5672/%2f";
        let refused = |settings: AmqpSettings| match settings.check() {
            Err(Error::Config(error)) => error.setting,
            Err(other) => panic!("expected a config error, got {other:?}"),
            Ok(_) => panic!("accepted"),
        };
        assert_eq!(
            refused(AmqpSettings::new(plain).connect_timeout(Duration::ZERO)),
            "connect_timeout"
        );
        assert_eq!(
            refused(AmqpSettings::new(plain).tls(Tls::new().ca_certificate_pem("x"))),
            "tls"
        );
        assert!(matches!(
            AmqpSettings::new("kafka://x").check(),
            Err(Error::InvalidUrl { .. })
        ));
    }

    #[test]
    fn a_part_appends_what_its_connection_is_for() {
        let settings = AmqpSettings::new("amqp://127.0.0.1").connection_name("billing");
        assert_eq!(
            settings.for_part("parking").name(),
            Some("billing (parking)")
        );
        assert_eq!(
            AmqpSettings::new("amqp://127.0.0.1")
                .for_part("parking")
                .name(),
            None
        );
    }
}
