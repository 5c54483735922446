//! [`PoolConfig`]: a bounded connection pool whose URL never reaches a log.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use intake_core::ConfigError;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::error::Error;
use crate::tls::{ClearTextWatch, SslMode, TlsChoice, url_names_ssl_mode};
use crate::url::DatabaseUrl;

/// How to reach PostgreSQL and how many connections to hold at most.
///
/// Every exactly-once message holds one connection from the start of its
/// transaction to the commit, so `max_connections` bounds how many run at
/// once; a handler that finds the pool empty waits up to `acquire_timeout`
/// and then fails with a retryable error. Give the pool at least the
/// consumer's `max_in_flight` (or the batch layer's parallelism) connections,
/// within the server's `max_connections`.
///
/// `Debug` shows the URL without its password.
///
/// # TLS
///
/// Connections use TLS (rustls) as the `sslmode` says, with libpq's
/// meanings:
///
/// | `sslmode` | encrypted | server certificate checked |
/// |---|---|---|
/// | `disable`, `allow` | no | no |
/// | `prefer` | when the server offers TLS, else clear text | no |
/// | `require` | yes, or the connection fails | no |
/// | `verify-ca` | yes | signed by a trusted CA |
/// | `verify-full` | yes | signed by a trusted CA and naming the URL's host |
///
/// The mode is the URL's `sslmode=` when it has one, else the
/// `PGSSLMODE` environment variable's (as libpq reads it), else chosen by
/// the host the driver connects to (after `host=` and `hostaddr=`):
///
/// - a loopback host (`localhost`, 127.0.0.0/8, `::1`) or a Unix socket:
///   `prefer`. Its traffic never leaves the machine, a Unix socket cannot
///   carry TLS at all, and development and CI servers seldom have TLS.
/// - any other host: `require`. libpq's and the driver's default,
///   `prefer`, goes on in clear text whenever the server answers that it
///   has no TLS, and so does when anyone on the way answers that for it:
///   the password (under password authentication) and every row then
///   cross the network readable, and nothing says so. A production user
///   who wrote no `sslmode` expects the connection to be encrypted;
///   `require` makes it so or fails, with [`Error::TlsNotOffered`], which
///   says what to do. It does not check the certificate (most managed
///   servers need their provider's CA for that, which no default can
///   know), so it stops reading on the way, not a man in the middle.
///
/// Only `verify-full` stops a man in the middle; use it wherever the
/// network is not yours: `postgres://app@db.internal/orders?sslmode=verify-full`.
/// Where the network is trusted and the server has no TLS, say so:
/// `sslmode=disable` (or `prefer`). Under `prefer` or `allow` to a host
/// that is not loopback, the pool checks each new connection (one query,
/// `pg_stat_ssl`) until one is in clear text, and then logs a warning,
/// once per pool.
///
/// The chosen mode and why are logged at `info` when the pool is built,
/// shown by `Debug` and given by [`ssl_mode`](Self::ssl_mode). Trusted CAs
/// are the platform's root certificates plus `sslrootcert=<path>` in the
/// URL or [`ssl_root_certificate`](Self::ssl_root_certificate). A client
/// certificate goes in `sslcert` and `sslkey`. A refused certificate fails
/// [`connect`](Self::connect) with [`Error::Tls`], a server without TLS
/// under `require` or a `verify-*` mode with [`Error::TlsNotOffered`].
///
/// ```no_run
/// use std::time::Duration;
/// use intake_postgres::PoolConfig;
///
/// # async fn connect() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = PoolConfig::new("postgres://app:secret@127.0.0.1:5432/orders")?
///     .max_connections(16)
///     .acquire_timeout(Duration::from_secs(2))
///     .connect()
///     .await?;
/// # drop(pool);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PoolConfig {
    url: DatabaseUrl,
    /// The driver's options and the sslmode, read once from the URL, or the
    /// driver's objection (scrubbed).
    driver: Result<(PgConnectOptions, TlsChoice), String>,
    max_connections: u32,
    min_connections: u32,
    acquire_timeout: Duration,
    idle_timeout: Option<Duration>,
    test_before_acquire: bool,
    application_name: String,
    ssl_root_certificate: Option<Vec<u8>>,
}

impl PoolConfig {
    /// A pool of at most 10 connections to `url`.
    ///
    /// # Errors
    ///
    /// A URL that is not a `postgres://` URL.
    pub fn new(url: &str) -> Result<Self, ConfigError> {
        Ok(Self::from_url(url.parse()?))
    }

    /// A pool of at most 10 connections to `url`.
    pub fn from_url(url: DatabaseUrl) -> Self {
        let driver = Self::driver_options(&url);
        Self {
            url,
            driver,
            max_connections: 10,
            min_connections: 0,
            acquire_timeout: Duration::from_secs(5),
            idle_timeout: Some(Duration::from_secs(600)),
            test_before_acquire: false,
            application_name: "intake".to_owned(),
            ssl_root_certificate: None,
        }
    }

    /// Most connections open at once. Default 10; at least 1.
    pub fn max_connections(mut self, max: u32) -> Self {
        self.max_connections = max;
        self
    }

    /// Connections kept open while idle. Default 0; at most
    /// `max_connections`.
    pub fn min_connections(mut self, min: u32) -> Self {
        self.min_connections = min;
        self
    }

    /// Longest wait for a free connection before the message fails with a
    /// retryable error. Default 5 s.
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// Idle connections above `min_connections` are closed after this long.
    /// Default 10 minutes; `None` keeps them.
    pub fn idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Ping each connection before handing it out. Default `false`: the ping
    /// is a round trip per message, and a dead connection already fails the
    /// transaction's first statement with a retryable error (the message is
    /// retried on a fresh connection).
    pub fn test_before_acquire(mut self, test: bool) -> Self {
        self.test_before_acquire = test;
        self
    }

    /// The `application_name` the server shows in `pg_stat_activity`.
    /// Default `intake`.
    pub fn application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = name.into();
        self
    }

    /// Trusts the CA certificate `pem` (PEM text) for the server's
    /// certificate, besides the platform's root certificates: the
    /// `sslrootcert` of the URL, given as content rather than a path (from a
    /// secret store, say). Checked only under `sslmode=verify-ca` or
    /// `verify-full`; see [the type docs](Self) for the modes.
    pub fn ssl_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ssl_root_certificate = Some(pem.into());
        self
    }

    /// The URL (its `Display` and `Debug` hide the password).
    pub fn url(&self) -> &DatabaseUrl {
        &self.url
    }

    /// The sslmode connections use: the URL's, else `PGSSLMODE`'s, else
    /// `prefer` for a loopback host and `require` for any other (see
    /// [TLS](Self#tls)). `None` when the driver cannot read the URL
    /// ([`connect`](Self::connect) then fails with [`Error::InvalidUrl`]).
    pub fn ssl_mode(&self) -> Option<SslMode> {
        self.driver.as_ref().ok().map(|(_, tls)| tls.mode)
    }

    /// Checks the settings, opens the pool and one connection (so that a
    /// wrong host or password fails here, not at the first message).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for settings that cannot work,
    /// [`Error::InvalidUrl`] for a URL the driver refuses,
    /// [`Error::Unauthorized`] for refused credentials,
    /// [`Error::TlsNotOffered`] for a server without TLS under an sslmode
    /// that requires it, [`Error::Tls`] for a refused certificate and
    /// [`Error::Unreachable`] when the server cannot be reached.
    pub async fn connect(&self) -> Result<PgPool, Error> {
        let (pool_options, connect_options, tls) = self.options()?;
        pool_options
            .connect_with(connect_options)
            .await
            .map_err(|error| Error::from_connect(&self.url, tls, error))
    }

    /// Like [`connect`](Self::connect), but opens connections only when they
    /// are first needed.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] or [`Error::InvalidUrl`].
    pub fn connect_lazy(&self) -> Result<PgPool, Error> {
        let (pool_options, connect_options, _) = self.options()?;
        Ok(pool_options.connect_lazy_with(connect_options))
    }

    /// The driver's reading of `url`, with the sslmode this crate chooses.
    fn driver_options(url: &DatabaseUrl) -> Result<(PgConnectOptions, TlsChoice), String> {
        let driver = url.for_driver();
        let options = PgConnectOptions::from_str(&driver.url)
            .map_err(|error| url.scrub(&error.to_string()))?;
        let environment = std::env::var("PGSSLMODE").ok();
        Ok(TlsChoice::choose(
            options,
            url_names_ssl_mode(&driver.url),
            environment.as_deref(),
        ))
    }

    fn options(&self) -> Result<(PgPoolOptions, PgConnectOptions, TlsChoice), Error> {
        self.validate()?;
        let driver = self.url.for_driver();
        if !driver.left_out.is_empty() || driver.unnamed > 0 {
            tracing::warn!(
                url = %self.url,
                parameters = %driver.left_out.join(", "),
                unnamed = driver.unnamed,
                "ignoring connection parameters the driver does not read",
            );
        }
        let (connect_options, tls) = self.driver.clone().map_err(|error| Error::InvalidUrl {
            url: self.url.redacted().to_owned(),
            source: error.into(),
        })?;
        tracing::info!(
            url = %self.url,
            sslmode = %tls.mode,
            chosen = %tls,
            "PostgreSQL pool",
        );
        let connect_options = connect_options.application_name(&self.application_name);
        let connect_options = match &self.ssl_root_certificate {
            Some(pem) => connect_options.ssl_root_cert_from_pem(pem.clone()),
            None => connect_options,
        };
        let pool_options = PgPoolOptions::new()
            .max_connections(self.max_connections)
            .min_connections(self.min_connections)
            .acquire_timeout(self.acquire_timeout)
            .idle_timeout(self.idle_timeout)
            .test_before_acquire(self.test_before_acquire);
        let pool_options = if tls.watches_for_clear_text() {
            let watch = ClearTextWatch::new(self.url.redacted(), tls.mode);
            pool_options.after_connect(move |connection, _| {
                let watch = watch.clone();
                Box::pin(async move {
                    watch.check(connection).await;
                    Ok(())
                })
            })
        } else {
            pool_options
        };
        Ok((pool_options, connect_options, tls))
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.max_connections == 0 {
            return Err(ConfigError::new(
                "max_connections",
                "is 0: no transaction could ever run; use at least 1",
            ));
        }
        if self.min_connections > self.max_connections {
            return Err(ConfigError::new(
                "min_connections",
                format!(
                    "({}) is above max_connections ({})",
                    self.min_connections, self.max_connections
                ),
            ));
        }
        if self.acquire_timeout.is_zero() {
            return Err(ConfigError::new(
                "acquire_timeout",
                "is zero: every message would fail while the pool is busy; use a few seconds",
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for PoolConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ssl_mode = match &self.driver {
            Ok((_, tls)) => tls.to_string(),
            Err(_) => "unknown: the driver cannot read the URL".to_owned(),
        };
        f.debug_struct("PoolConfig")
            .field("url", &self.url)
            .field("ssl_mode", &ssl_mode)
            .field("max_connections", &self.max_connections)
            .field("min_connections", &self.min_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("test_before_acquire", &self.test_before_acquire)
            .field("application_name", &self.application_name)
            .field("ssl_root_certificate", &self.ssl_root_certificate.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_password() {
        let config = PoolConfig::new("postgres://app:topsecret@db/test").unwrap();
        let shown = format!("{config:?}");
        assert!(!shown.contains("topsecret"), "{shown}");
        assert!(shown.contains("app:***@db"), "{shown}");
    }

    #[test]
    fn debug_and_ssl_mode_show_the_chosen_sslmode_and_why() {
        let remote = PoolConfig::new("postgres://app:topsecret@db.internal/test").unwrap();
        assert_eq!(remote.ssl_mode(), Some(SslMode::Require));
        let shown = format!("{remote:?}");
        assert!(
            shown.contains(r#"ssl_mode: "require (the default for a host that is not loopback)""#),
            "{shown}"
        );
        let local = PoolConfig::new("postgres://app@localhost/test").unwrap();
        assert_eq!(local.ssl_mode(), Some(SslMode::Prefer));
        assert!(format!("{local:?}").contains("prefer (the default for a loopback host)"));
        let explicit = PoolConfig::new("postgres://db.internal/test?sslmode=disable").unwrap();
        assert_eq!(explicit.ssl_mode(), Some(SslMode::Disable));
        assert!(format!("{explicit:?}").contains("disable (from the URL)"));
        let unread = PoolConfig::new("postgres://db/test?sslmode=sometimes").unwrap();
        assert_eq!(unread.ssl_mode(), None);
        assert!(matches!(
            unread.connect_lazy(),
            Err(Error::InvalidUrl { .. })
        ));
    }

    #[tokio::test]
    async fn a_failed_connection_never_shows_the_password() {
        // Nothing listens on port 1.
        let config = PoolConfig::new("postgres://app:topsecret@127.0.0.1:1/test")
            .unwrap()
            .acquire_timeout(Duration::from_millis(500));
        let error = config.connect().await.unwrap_err();
        assert!(matches!(error, Error::Unreachable { .. }), "{error:?}");
        for shown in [error.to_string(), format!("{error:?}")] {
            assert!(!shown.contains("topsecret"), "{shown}");
            assert!(shown.contains("127.0.0.1:1"), "{shown}");
        }
    }

    #[test]
    fn an_empty_pool_is_refused_when_built() {
        let config = PoolConfig::new("postgres://db/test")
            .unwrap()
            .max_connections(0);
        let error = config.connect_lazy().unwrap_err();
        assert!(error.to_string().contains("max_connections"), "{error}");
    }

    #[test]
    fn min_connections_may_not_exceed_the_bound() {
        let config = PoolConfig::new("postgres://db/test")
            .unwrap()
            .max_connections(2)
            .min_connections(3);
        assert!(matches!(
            config.connect_lazy(),
            Err(Error::Config(error)) if error.setting == "min_connections"
        ));
    }
}
