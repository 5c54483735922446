//! [`RedisSettings`]: the connection to one Redis server, given once and
//! passed to every builder of the crate and to the [`RedisBroker`](crate::RedisBroker).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::connection::{Connector, SecretUrl};
use crate::endpoint::Endpoint;
use crate::error::Error;

/// How to reach one Redis server: the URL, the TLS root certificate, and
/// how long to wait for a connection and for a command's reply. Every
/// builder of the crate takes them ([`RedisStreamsSource::builder`],
/// [`RedisStreamsPublisher::builder`], [`RedisParking::builder`],
/// [`RedisDeadLetterSink::builder`], [`RedisDeadLetters::builder`],
/// [`RedisLagProbe::new`]) and so does [`RedisBroker::new`], which derives
/// every part from them.
///
/// A URL converts into settings with the defaults, so
/// `RedisStreamsSource::builder("redis://127.0.0.1:6379")` needs no
/// settings of its own. The URL is
/// `redis://[user[:password]@]host[:port][/db]`, or `rediss://…` for TLS
/// (feature `tls`, on by default), or a unix socket. Nothing is checked
/// until a builder builds (or [`endpoint`](Self::endpoint) is asked); the
/// password never appears in `Debug` output, logs or errors.
///
/// ```
/// use std::time::Duration;
/// use intake_redis_streams::{RedisSettings, RedisStreamsSource};
///
/// let settings = RedisSettings::new("rediss://app:hunter2@cache.internal:6380/0")
///     .connect_timeout(Duration::from_secs(2))
///     .command_timeout(Duration::from_secs(3));
/// assert!(!format!("{settings:?}").contains("hunter2"));
/// let builder = RedisStreamsSource::builder(settings.clone())
///     .stream("orders")
///     .group("billing");
/// # let _ = builder;
/// ```
///
/// [`RedisStreamsSource::builder`]: crate::RedisStreamsSource::builder
/// [`RedisStreamsPublisher::builder`]: crate::RedisStreamsPublisher::builder
/// [`RedisParking::builder`]: crate::RedisParking::builder
/// [`RedisDeadLetterSink::builder`]: crate::RedisDeadLetterSink::builder
/// [`RedisDeadLetters::builder`]: crate::RedisDeadLetters::builder
/// [`RedisLagProbe::new`]: crate::RedisLagProbe::new
/// [`RedisBroker::new`]: crate::RedisBroker::new
#[derive(Clone)]
pub struct RedisSettings {
    pub(crate) url: SecretUrl,
    /// Shared by the clones: every part of a broker holds the settings.
    pub(crate) tls_root_certificate: Option<Arc<[u8]>>,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
}

impl RedisSettings {
    /// Default of [`connect_timeout`](Self::connect_timeout).
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
    /// Default of [`command_timeout`](Self::command_timeout).
    pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

    /// The server at `url`, with the platform's root certificates and the
    /// default timeouts (5 s each).
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: SecretUrl::new(url),
            tls_root_certificate: None,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            command_timeout: Self::DEFAULT_COMMAND_TIMEOUT,
        }
    }

    /// Trusts the CA certificate `pem` (PEM text) instead of the platform's
    /// root certificates, for a `rediss://` server whose certificate a
    /// private CA signed. Building anything with it fails with
    /// [`Error::Config`] for a URL that is not `rediss://`.
    #[cfg(feature = "tls")]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_certificate = Some(pem.into().into());
        self
    }

    /// How long to wait for a connection (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long to wait for the reply to a command (default 5 s). A
    /// source's blocking read gets its block time on top; a publisher
    /// bounds each pipeline by it, a parking each park and mover round,
    /// reconnecting included; a dead-letter store each command of an
    /// operation.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// The server, without password.
    ///
    /// Fails with [`Error::InvalidUrl`] for a URL the client cannot use
    /// (and with [`Error::Config`] for a root certificate the URL cannot
    /// use).
    pub fn endpoint(&self) -> Result<Endpoint, Error> {
        Ok(self.connector()?.endpoint().clone())
    }

    /// Checks the URL and the TLS settings, and makes the client that
    /// opens the connections.
    pub(crate) fn connector(&self) -> Result<Connector, Error> {
        Connector::new(self)
    }
}

impl fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &self.url)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("tls_root_certificate", &self.tls_root_certificate.is_some())
            .finish()
    }
}

impl From<&str> for RedisSettings {
    fn from(url: &str) -> Self {
        Self::new(url)
    }
}

impl From<String> for RedisSettings {
    fn from(url: String) -> Self {
        Self::new(url)
    }
}

impl From<&String> for RedisSettings {
    fn from(url: &String) -> Self {
        Self::new(url.as_str())
    }
}

impl From<&RedisSettings> for RedisSettings {
    fn from(settings: &RedisSettings) -> Self {
        settings.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_password_and_shows_the_rest() {
        let settings = RedisSettings::new("redis://app:s3cr3t@cache:6379/2")
            .connect_timeout(Duration::from_secs(1));
        let shown = format!("{settings:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("app:***@cache:6379/2"), "{shown}");
        assert!(shown.contains("1s"), "{shown}");
        assert_eq!(
            settings
                .endpoint()
                .ok()
                .map(|endpoint| endpoint.to_string()),
            Some("redis://app@cache:6379/2".to_owned())
        );
    }

    #[test]
    fn a_url_converts_with_the_defaults() {
        for settings in [
            RedisSettings::from("redis://h"),
            RedisSettings::from("redis://h".to_owned()),
            RedisSettings::from(&"redis://h".to_owned()),
        ] {
            assert_eq!(settings.url.expose(), "redis://h");
            assert_eq!(settings.connect_timeout, Duration::from_secs(5));
            assert_eq!(settings.command_timeout, Duration::from_secs(5));
            assert!(settings.tls_root_certificate.is_none());
        }
    }
}
