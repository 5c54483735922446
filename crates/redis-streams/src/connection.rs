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

use intake_core::{ConfigError, redact};

use crate::endpoint::Endpoint;
use crate::error::{Error, server_code};
use crate::settings::RedisSettings;

/// A URL as the user gave it, which may hold a password (in the user info,
/// or in `?pass=` for a unix socket). Its `Debug` shows the URL with the
/// secrets replaced by `***`.
#[derive(Clone)]
pub(crate) struct SecretUrl(String);

impl SecretUrl {
    pub(crate) fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The URL as given, secrets included: only for handing it on to the
    /// client, never to print.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with any password replaced (see [`redact::url`]), for
    /// `Debug` and for errors about a URL that did not parse.
    pub(crate) fn redacted(&self) -> String {
        redact::url(&self.0)
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
    /// What the client was made of; its timeouts bound each connection.
    settings: RedisSettings,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("endpoint", &self.endpoint)
            .field("settings", &self.settings)
            .finish()
    }
}

impl Connector {
    /// Parses the URL of `settings`; fails on a URL the client cannot use,
    /// or a root certificate it cannot use.
    pub(crate) fn new(settings: &RedisSettings) -> Result<Self, Error> {
        let url = &settings.url;
        let info = url
            .expose()
            .into_connection_info()
            .map_err(|error| Error::InvalidUrl {
                url: url.redacted(),
                source: Box::new(error),
            })?;
        // Parsed is not enough: `unix://:@/pw@` parses as the socket
        // `/pw@`, which the endpoint would show.
        redact::check_user_info(url.expose()).map_err(|error| Error::InvalidUrl {
            url: url.redacted(),
            source: Box::new(error),
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
        let parsed = info.redis_settings();
        let user = parsed
            .username()
            .map(|user| format!("{user}@"))
            .unwrap_or_default();
        // Built from the parsed parts (no password among them), and still
        // shown through the redaction: a user name decoded from `%3A` and
        // `%40` would otherwise print like user info.
        let endpoint = Endpoint::from_redacted(redact::url(&format!(
            "{scheme}://{user}{address}/{}",
            parsed.db()
        )));
        let client = match settings.tls_root_certificate.as_deref() {
            None => Client::open(info).map_err(|error| Error::InvalidUrl {
                url: endpoint.to_string(),
                source: Box::new(error),
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
            settings: settings.clone(),
        })
    }

    /// The redacted endpoint.
    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// How long opening a connection may take.
    pub(crate) fn connect_timeout(&self) -> Duration {
        self.settings.connect_timeout
    }

    /// How long a command's reply may take.
    pub(crate) fn command_timeout(&self) -> Duration {
        self.settings.command_timeout
    }

    /// A connection of its own for blocking reads of at most `block`.
    pub(crate) async fn blocking_reader(
        &self,
        block: Duration,
    ) -> Result<MultiplexedConnection, Error> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.settings.connect_timeout))
            .set_response_timeout(Some(block + self.settings.command_timeout));
        self.client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|error| self.error(error, "HELLO"))
    }

    /// The shared, self-reconnecting connection for short commands.
    pub(crate) async fn shared(&self) -> Result<ConnectionManager, Error> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.settings.connect_timeout))
            .set_response_timeout(Some(self.settings.command_timeout))
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_secs(2));
        ConnectionManager::new_with_config(self.client.clone(), config)
            .await
            .map_err(|error| self.error(error, "HELLO"))
    }

    /// Classifies a client error of `command`.
    pub(crate) fn error(&self, error: redis::RedisError, command: &'static str) -> Error {
        Error::from_redis(error, command, None, &self.endpoint)
    }

    /// Classifies a client error of `command` on stream `key`.
    pub(crate) fn key_error(
        &self,
        error: redis::RedisError,
        command: &'static str,
        key: &str,
    ) -> Error {
        Error::from_redis(error, command, Some(key), &self.endpoint)
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
fn client_with_root_certificate(info: redis::ConnectionInfo, pem: &[u8]) -> Result<Client, Error> {
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
) -> Result<Client, Error> {
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
) -> Result<(), Error> {
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
        return Err(Error::UnsupportedServer {
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
        let connector = Connector::new(&RedisSettings::new("redis://bob:pa55@127.0.0.1:6390/3"));
        let endpoint = connector.map(|connector| connector.endpoint().to_string());
        assert_eq!(
            endpoint.ok().as_deref(),
            Some("redis://bob@127.0.0.1:6390/3")
        );
    }

    /// Everything the crate prints about `url`: the source builder's `Debug`,
    /// and the endpoint and `Debug` of the connector, or the error.
    fn printed_forms(url: &str) -> String {
        let builder = format!("{:?}", crate::RedisStreamsSource::builder(url));
        let parsed = Connector::new(&RedisSettings::new(url));
        match parsed {
            Ok(connector) => format!("{builder} {} {connector:?}", connector.endpoint()),
            Err(error) => format!("{builder} {error} {error:?}"),
        }
    }

    #[test]
    fn the_shapes_that_leaked_show_no_secret() {
        let leaks: Vec<(&str, String)> = [
            // The password's rest became the socket path.
            "unix://:@/SECRET@",
            // A unix socket takes its password in the query.
            "unix:///run/redis.sock?db=x&pass=SECRET",
            "redis+unix:///run/redis.sock?pass=SECRET&db=x",
            // One slash: no authority, so no user info to a URL parser.
            "redis:/u:SECRET@h",
            "rediss://:#SECRET@",
        ]
        .into_iter()
        .map(|url| (url, printed_forms(url)))
        .filter(|(_, shown)| shown.contains("SECRET"))
        .collect();
        assert!(leaks.is_empty(), "{leaks:#?}");
    }

    /// A secret: random characters, any a password or parameter may hold
    /// (those that end a URL's parts unescaped among them), around the
    /// canary `SECRET`. Nothing else in the generated URLs is upper case,
    /// so `SECRET` anywhere in a printed form is a leak, escaped or not.
    fn secret() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let around = "[a-zA-Z0-9/?#@:%!$&'()*+,;=._~\\[\\] -]{0,8}";
        (around, around).prop_map(|(before, after)| format!("{before}SECRET{after}"))
    }

    /// Redis URLs, valid or not, with a secret in every place one can take:
    /// the password of the user info (also of a URL with one or no slash
    /// after the scheme, or none at all), and the `pass`/`password` query
    /// parameters (unix sockets take their password there).
    fn redis_url_with_a_secret() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let scheme = prop::sample::select(vec!["redis", "rediss", "unix", "redis+unix"]);
        let host = "([a-z0-9.]{0,10}|\\[::1\\])(:[0-9]{0,5})?";
        let tail = "(/[0-9a-z/.]{0,10})?(\\?[a-z0-9=&]{0,12})?";
        prop_oneof![
            (scheme.clone(), "[a-z]{0,4}", secret(), host, tail).prop_map(
                |(scheme, user, secret, host, tail)| format!(
                    "{scheme}://{user}:{secret}@{host}{tail}"
                )
            ),
            (
                scheme.clone(),
                prop::sample::select(vec!["", "/", "///"]),
                "[a-z]{0,4}",
                secret(),
                host,
            )
                .prop_map(|(scheme, slashes, user, secret, host)| {
                    format!("{scheme}:{slashes}{user}:{secret}@{host}")
                }),
            // No scheme. `user://x@host` is a URL of scheme `user` by the
            // URL grammar (see `redact::url`), so the password does not
            // start with `//` here.
            ("[a-z]{0,4}", secret(), host)
                .prop_filter("`user://` is a scheme", |(user, secret, _)| {
                    user.is_empty() || !secret.starts_with("//")
                })
                .prop_map(|(user, secret, host)| format!("{user}:{secret}@{host}")),
            (
                scheme,
                "(/[a-z0-9.]{1,8}){0,2}",
                "([a-z]{1,4}=[a-z0-9]{0,4}&){0,2}",
                prop::sample::select(vec!["pass", "password", "PASS", "pa%73s", "auth"]),
                secret(),
            )
                .prop_map(|(scheme, path, before, key, secret)| {
                    format!("{scheme}://{path}?{before}{key}={secret}")
                }),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2_000))]

        #[test]
        fn a_secret_anywhere_in_a_redis_url_never_shows(url in redis_url_with_a_secret()) {
            let builder = crate::RedisStreamsSource::builder(url.clone());
            let shown = format!("{builder:?}");
            proptest::prop_assert!(!shown.contains("SECRET"), "{}", shown);
            let parsed = Connector::new(&RedisSettings::new(url.clone()));
            let shown = match parsed {
                Ok(connector) => format!("{} {connector:?}", connector.endpoint()),
                Err(error @ (Error::InvalidUrl { .. } | Error::Config(_))) => {
                    format!("{error} {error:?}")
                }
                Err(other) => return Err(proptest::test_runner::TestCaseError::fail(
                    format!("unexpected error {other:?}"),
                )),
            };
            proptest::prop_assert!(!shown.contains("SECRET"), "{} shows {}", url, shown);
        }

        #[test]
        fn any_text_as_a_redis_url_is_parsed_or_refused_with_a_typed_error(url in ".{0,60}") {
            let parsed = Connector::new(&RedisSettings::new(url));
            let typed = matches!(
                parsed,
                Ok(_) | Err(Error::InvalidUrl { .. } | Error::Config(_))
            );
            proptest::prop_assert!(typed, "{:?}", parsed.err());
        }
    }

    #[test]
    fn a_url_of_another_scheme_is_invalid() {
        let connector = Connector::new(&RedisSettings::new("http://user:pa55@127.0.0.1"));
        match connector {
            Err(error @ Error::InvalidUrl { .. }) => {
                let shown = format!("{error} {error:?}");
                assert!(!shown.contains("pa55"), "{shown}");
            }
            other => panic!("expected InvalidUrl, got {other:?}"),
        }
    }
}
