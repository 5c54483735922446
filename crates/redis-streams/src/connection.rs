//! Connections to Redis: the URL, its redacted form, and the two kinds of
//! connection the backend opens.
//!
//! The source's blocking reads get a multiplexed connection of their own: a
//! `XREADGROUP … BLOCK` holds its connection for the whole block, and every
//! other command queued behind it on a shared connection would wait as long.
//! Acknowledgements, claims and dead letters share one
//! [`ConnectionManager`], which reconnects by itself after a failure.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, ConnectionAddr, IntoConnectionInfo};

use intake_core::ConfigError;

use crate::error::{RedisStreamsError, server_code};

/// Where the backend connects, as `scheme://[user@]host:port/db`: the URL
/// without its password, safe for logs and errors.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint(Arc<str>);

impl Endpoint {
    /// The endpoint as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// A URL as the user gave it, which may hold a password. Its `Debug` shows
/// the URL with the password replaced by `***`.
#[derive(Clone)]
pub(crate) struct SecretUrl(String);

impl SecretUrl {
    pub(crate) fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The URL with any password replaced, for `Debug` of a configuration
    /// that has not been parsed yet.
    pub(crate) fn redacted(&self) -> String {
        let url = &self.0;
        let Some(scheme_end) = url.find("://") else {
            return url.clone();
        };
        let authority_start = scheme_end + 3;
        // The user info ends at the last `@`, even past a `/`, `?` or `#`: a
        // password with one of those left unescaped makes the URL invalid,
        // and it is exactly then that the redacted form goes into the error.
        // A path or query holding an `@` is hidden too; a Redis URL has none
        // worth showing.
        let Some(at) = url[authority_start..].rfind('@') else {
            return url.clone();
        };
        let user_info = &url[authority_start..authority_start + at];
        let user = user_info.split(':').next().unwrap_or_default();
        let password_given = user_info.contains(':');
        format!(
            "{}{}{}@{}",
            &url[..authority_start],
            user,
            if password_given { ":***" } else { "" },
            &url[authority_start + at + 1..]
        )
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.redacted(), f)
    }
}

/// Opens the backend's connections to one server.
#[derive(Clone)]
pub(crate) struct Connector {
    client: Client,
    endpoint: Endpoint,
    connect_timeout: Duration,
    command_timeout: Duration,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("endpoint", &self.endpoint)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .finish()
    }
}

impl Connector {
    /// Parses `url`; fails on a URL the client cannot use.
    pub(crate) fn new(
        url: &SecretUrl,
        tls_root_certificate: Option<&[u8]>,
        connect_timeout: Duration,
        command_timeout: Duration,
    ) -> Result<Self, RedisStreamsError> {
        let info = url.0.as_str().into_connection_info().map_err(|error| {
            RedisStreamsError::InvalidUrl {
                reason: format!("{} ({})", error, url.redacted()),
            }
        })?;
        let (scheme, address) = match info.addr() {
            ConnectionAddr::Tcp(..) => ("redis", info.addr().to_string()),
            ConnectionAddr::TcpTls { .. } => ("rediss", info.addr().to_string()),
            ConnectionAddr::Unix(..) => ("unix", info.addr().to_string()),
            _ => ("redis", info.addr().to_string()),
        };
        if scheme == "rediss" {
            install_tls_provider();
        }
        let settings = info.redis_settings();
        let user = settings
            .username()
            .map(|user| format!("{user}@"))
            .unwrap_or_default();
        let endpoint = Endpoint(format!("{scheme}://{user}{address}/{}", settings.db()).into());
        let client = match tls_root_certificate {
            None => Client::open(info).map_err(|error| RedisStreamsError::InvalidUrl {
                reason: format!("{} ({})", error, endpoint),
            })?,
            Some(_) if scheme != "rediss" => {
                return Err(ConfigError::new(
                    "tls_root_certificate",
                    format!("is set, but {endpoint} is not a rediss:// URL, which TLS needs"),
                )
                .into());
            }
            Some(pem) => client_with_root_certificate(info, pem)?,
        };
        Ok(Self {
            client,
            endpoint,
            connect_timeout,
            command_timeout,
        })
    }

    /// The redacted endpoint.
    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// A connection of its own for blocking reads of at most `block`.
    pub(crate) async fn blocking_reader(
        &self,
        block: Duration,
    ) -> Result<MultiplexedConnection, RedisStreamsError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(block + self.command_timeout));
        self.client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|error| self.error(error, "HELLO"))
    }

    /// The shared, self-reconnecting connection for short commands.
    pub(crate) async fn shared(&self) -> Result<ConnectionManager, RedisStreamsError> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.command_timeout))
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_secs(2));
        ConnectionManager::new_with_config(self.client.clone(), config)
            .await
            .map_err(|error| self.error(error, "HELLO"))
    }

    /// Classifies a client error of `command`.
    pub(crate) fn error(
        &self,
        error: redis::RedisError,
        command: &'static str,
    ) -> RedisStreamsError {
        RedisStreamsError::from_redis(error, command, None, &self.endpoint)
    }

    /// Classifies a client error of `command` on stream `key`.
    pub(crate) fn key_error(
        &self,
        error: redis::RedisError,
        command: &'static str,
        key: &str,
    ) -> RedisStreamsError {
        RedisStreamsError::from_redis(error, command, Some(key), &self.endpoint)
    }
}

/// The connection of the acker and the dead-letter sink: a
/// [`ConnectionManager`], replaced as a whole when the server it reaches
/// turns out to be a replica.
///
/// A `ConnectionManager` reconnects only when its connection drops. After a
/// failover the demoted master keeps the connection open and answers every
/// write with `READONLY`, so without a new connection (which reaches the
/// new master where the address follows it: DNS, a virtual IP, a proxy)
/// every acknowledgement would fail until the process restarts.
#[derive(Clone)]
pub(crate) struct SharedConnection {
    current: Arc<Mutex<ConnectionManager>>,
    connector: Connector,
}

impl SharedConnection {
    pub(crate) fn new(connection: ConnectionManager, connector: Connector) -> Self {
        Self {
            current: Arc::new(Mutex::new(connection)),
            connector,
        }
    }

    /// The current connection (a cheap handle to it).
    pub(crate) fn get(&self) -> ConnectionManager {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn connector(&self) -> &Connector {
        &self.connector
    }

    /// After `error`: connects anew if the server answered `READONLY`.
    /// Returns whether a new connection is in place.
    pub(crate) async fn replace_if_replica(&self, error: &redis::RedisError) -> bool {
        if server_code(error).as_deref() != Some("READONLY") {
            return false;
        }
        match self.connector.shared().await {
            Ok(connection) => {
                tracing::warn!(
                    endpoint = %self.connector.endpoint(),
                    "Redis answered READONLY (a failover made it a replica); connected anew"
                );
                *self.current.lock().unwrap_or_else(PoisonError::into_inner) = connection;
                true
            }
            Err(error) => {
                tracing::warn!(%error, "could not connect anew after READONLY");
                false
            }
        }
    }
}

#[cfg(feature = "tls")]
fn client_with_root_certificate(
    info: redis::ConnectionInfo,
    pem: &[u8],
) -> Result<Client, RedisStreamsError> {
    let certificates = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(pem.to_vec()),
    };
    Client::build_with_tls(info, certificates).map_err(|error| {
        ConfigError::new(
            "tls_root_certificate",
            format!("cannot be used: {error}; give the CA certificate in PEM form"),
        )
        .into()
    })
}

#[cfg(not(feature = "tls"))]
fn client_with_root_certificate(
    _info: redis::ConnectionInfo,
    _pem: &[u8],
) -> Result<Client, RedisStreamsError> {
    Err(ConfigError::new("tls_root_certificate", "needs the `tls` feature").into())
}

#[cfg(feature = "tls")]
fn install_tls_provider() {
    // The redis client builds its rustls configuration from the process-wide
    // crypto provider, and rustls cannot pick one by itself when an
    // application links more than one. Installing ring fails harmlessly when
    // the application already chose a provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(not(feature = "tls"))]
fn install_tls_provider() {}

/// Fails unless the server is Redis 6.2 or newer (`XPENDING … IDLE` and
/// exclusive id ranges came with 6.2). A server that hides `INFO` from this
/// user is given the benefit of the doubt.
pub(crate) async fn check_server_version(
    connection: &mut MultiplexedConnection,
    connector: &Connector,
) -> Result<(), RedisStreamsError> {
    let info: String = match redis::cmd("INFO")
        .arg("server")
        .query_async(connection)
        .await
    {
        Ok(info) => info,
        Err(error) if error.code() == Some("NOPERM") => {
            tracing::debug!("INFO is not permitted; skipping the Redis version check");
            return Ok(());
        }
        Err(error) => return Err(connector.error(error, "INFO")),
    };
    let Some(version) = info
        .lines()
        .find_map(|line| line.strip_prefix("redis_version:"))
        .map(str::trim)
    else {
        return Ok(());
    };
    let mut parts = version.split('.').map(|part| part.parse::<u32>().ok());
    let major = parts.next().flatten().unwrap_or(0);
    let minor = parts.next().flatten().unwrap_or(0);
    if (major, minor) < (6, 2) {
        return Err(RedisStreamsError::UnsupportedServer {
            endpoint: connector.endpoint().clone(),
            version: version.to_owned(),
        });
    }
    tracing::debug!(endpoint = %connector.endpoint(), version, "connected to Redis");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_keeps_the_user_and_hides_the_password() {
        let url = SecretUrl::new("redis://alice:s3cr3t@cache.internal:6380/2");
        assert_eq!(url.redacted(), "redis://alice:***@cache.internal:6380/2");
        assert!(!format!("{url:?}").contains("s3cr3t"));
    }

    #[test]
    fn redaction_of_a_password_without_user() {
        let url = SecretUrl::new("rediss://:hunter2@example.com");
        assert_eq!(url.redacted(), "rediss://:***@example.com");
    }

    #[test]
    fn a_url_without_credentials_is_shown_as_is() {
        let url = SecretUrl::new("redis://127.0.0.1:6379");
        assert_eq!(url.redacted(), "redis://127.0.0.1:6379");
    }

    #[test]
    fn the_endpoint_of_a_parsed_url_has_no_password() {
        let connector = Connector::new(
            &SecretUrl::new("redis://bob:pa55@127.0.0.1:6390/3"),
            None,
            Duration::from_secs(1),
            Duration::from_secs(1),
        );
        let endpoint = connector.map(|connector| connector.endpoint().to_string());
        assert_eq!(
            endpoint.ok().as_deref(),
            Some("redis://bob@127.0.0.1:6390/3")
        );
    }

    /// Characters a password may hold, including those that end a URL's
    /// authority when left unescaped.
    const PASSWORD_CHARS: &str = "[a-zA-Z0-9/?#@:%!$&'()*+,;=._~-]";

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1_000))]

        #[test]
        fn redaction_never_shows_a_password(
            scheme in proptest::sample::select(vec!["redis", "rediss", "unix", "http", "redis+unix"]),
            user in "[a-z]{0,6}",
            password in proptest::string::string_regex(&format!("{PASSWORD_CHARS}{{1,12}}"))
                .expect("a valid pattern"),
            rest in "[a-z0-9.:/?=&]{0,24}",
        ) {
            let secret = format!("{password}<SECRET>");
            let url = SecretUrl::new(format!("{scheme}://{user}:{secret}@{rest}"));
            let redacted = url.redacted();
            proptest::prop_assert!(!redacted.contains("<SECRET>"), "{}", redacted);
            let shown = format!("{url:?}");
            proptest::prop_assert!(!shown.contains("<SECRET>"), "{}", shown);
        }

        #[test]
        fn any_url_is_parsed_or_refused_with_a_typed_error_that_hides_the_password(
            url in proptest::prop_oneof![
                ".{0,60}",
                "(redis|rediss|unix)://([a-z]{0,4}(:[a-z/@?#]{0,8}<SECRET>)?@)?[a-z0-9.\\[\\]:%]{0,20}(/[0-9a-z?=&]{0,10})?",
            ],
        ) {
            let parsed = Connector::new(
                &SecretUrl::new(url.clone()),
                None,
                Duration::from_secs(1),
                Duration::from_secs(1),
            );
            match parsed {
                Ok(connector) => {
                    proptest::prop_assert!(!connector.endpoint().as_str().contains("<SECRET>"));
                }
                Err(RedisStreamsError::InvalidUrl { reason }) => {
                    proptest::prop_assert!(!reason.contains("<SECRET>"), "{}", reason);
                }
                Err(RedisStreamsError::Config(error)) => {
                    proptest::prop_assert!(!error.to_string().contains("<SECRET>"));
                }
                Err(other) => proptest::prop_assert!(false, "unexpected error {other:?}"),
            }
        }
    }

    #[test]
    fn a_url_of_another_scheme_is_invalid() {
        let connector = Connector::new(
            &SecretUrl::new("http://user:pa55@127.0.0.1"),
            None,
            Duration::from_secs(1),
            Duration::from_secs(1),
        );
        match connector {
            Err(RedisStreamsError::InvalidUrl { reason }) => assert!(!reason.contains("pa55")),
            other => panic!("expected InvalidUrl, got {other:?}"),
        }
    }
}
