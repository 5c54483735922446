//! [`NatsSettings`]: how to reach a NATS server, given once and passed to
//! every builder (source, publisher, dead-letter store) and to
//! [`NatsBroker`](crate::NatsBroker): the URL, credentials, TLS, the
//! connect timeout, the connection's name and the reconnect backoff.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_nats::ConnectOptions;
use intake_core::redact::REDACTED;
use intake_core::{BackoffPolicy, Exponential};

use crate::connection::ConnectSettings;
use crate::error::Error;
use crate::url::ServerUrls;

/// How the client proves who it is, besides credentials in the URL.
///
/// `Debug` never shows a secret: a token, password or seed prints as `***`;
/// a creds file shows its path only.
#[derive(Clone)]
pub(crate) enum Credentials {
    Token(String),
    UserPassword(String, String),
    /// An nkey seed (`SU…`).
    Nkey(String),
    /// A `.creds` file: a user JWT and its nkey seed.
    File(PathBuf),
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Token(_) => write!(f, "Token({REDACTED})"),
            Credentials::UserPassword(user, _) => write!(f, "UserPassword({user}, {REDACTED})"),
            Credentials::Nkey(_) => write!(f, "Nkey({REDACTED})"),
            Credentials::File(path) => write!(f, "File({})", path.display()),
        }
    }
}

/// TLS settings: which CAs to trust, a client certificate, whether to
/// require TLS even for a `nats://` URL.
///
/// ```
/// use intake_nats::Tls;
///
/// let tls = Tls::new()
///     .ca_file("/etc/nats/ca.pem")
///     .client_certificate("/etc/nats/client.pem", "/etc/nats/client.key");
/// # drop(tls);
/// ```
#[derive(Clone, Debug, Default)]
pub struct Tls {
    ca_files: Vec<PathBuf>,
    client: Option<(PathBuf, PathBuf)>,
    required: bool,
    first: bool,
}

impl Tls {
    /// TLS with the system's trusted roots, required.
    pub fn new() -> Self {
        Self {
            required: true,
            ..Self::default()
        }
    }

    /// Trusts the CA certificates (PEM) in `path` too.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_files.push(path.into());
        self
    }

    /// Presents this client certificate and key (PEM files) to a server
    /// that verifies clients.
    pub fn client_certificate(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client = Some((cert.into(), key.into()));
        self
    }

    /// Starts TLS before the server's greeting (`handshake_first` servers).
    pub fn handshake_first(mut self) -> Self {
        self.first = true;
        self
    }

    pub(crate) fn apply(&self, mut options: ConnectOptions) -> ConnectOptions {
        for ca in &self.ca_files {
            options = options.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &self.client {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        if self.first {
            options = options.tls_first();
        }
        options.require_tls(self.required)
    }
}

/// The reconnect backoff of a source, a publisher and the broker's lag
/// probes when none is set: 100 ms doubling to 10 s, forever.
pub(crate) fn default_reconnect_backoff() -> Arc<dyn BackoffPolicy> {
    Arc::new(Exponential::new(Duration::from_millis(100), Duration::from_secs(10)).retry_forever())
}

/// How to reach a NATS server (or cluster): the URL, credentials, TLS, the
/// connect timeout, the connection's name and the reconnect backoff, given
/// once and passed to every builder ([`NatsSource::builder`](crate::NatsSource::builder),
/// [`NatsPublisher::builder`](crate::NatsPublisher::builder),
/// [`NatsDeadLetters::builder`](crate::NatsDeadLetters::builder)) and to
/// [`NatsBroker::new`](crate::NatsBroker::new). Each part still makes a
/// connection of its own with them. A URL (`&str` or `String`) converts
/// into settings with nothing else set, so a builder also takes a URL.
///
/// The URL is `nats://[user:password@|token@]host[:port]`, `tls://…` for
/// TLS, several separated by commas; it is checked when a part connects.
///
/// `Debug` never shows a secret: credentials in the URL or given to a
/// setter print as `***` (a creds file shows its path only).
///
/// ```no_run
/// use std::time::Duration;
/// use intake_nats::{NatsPublisher, NatsSettings, NatsSource, Tls};
///
/// # async fn run() -> Result<(), intake_nats::Error> {
/// let settings = NatsSettings::new("tls://nats.internal:4222")
///     .user_password("billing", "hunter2")
///     .tls(Tls::new().ca_file("/etc/nats/ca.pem"))
///     .connect_timeout(Duration::from_secs(5))
///     .connection_name("billing");
/// assert!(!format!("{settings:?}").contains("hunter2"));
/// let source = NatsSource::builder(settings.clone())
///     .stream("ORDERS")
///     .consumer("billing")
///     .build()
///     .await?;
/// let publisher = NatsPublisher::builder(settings).build().await?;
/// # drop((source, publisher));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct NatsSettings {
    url: String,
    credentials: Option<Credentials>,
    tls: Option<Tls>,
    connect_timeout: Duration,
    name: Option<String>,
    /// `None`: each part's own default.
    reconnect_backoff: Option<Arc<dyn BackoffPolicy>>,
}

impl NatsSettings {
    /// Default of [`connect_timeout`](Self::connect_timeout).
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

    /// The server(s) at `url`, with no other setting.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            credentials: None,
            tls: None,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            name: None,
            reconnect_backoff: None,
        }
    }

    /// Authenticates with a token.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.credentials = Some(Credentials::Token(token.into()));
        self
    }

    /// Authenticates with a user name and password.
    pub fn user_password(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some(Credentials::UserPassword(user.into(), password.into()));
        self
    }

    /// Authenticates with an nkey seed (`SU…`).
    pub fn nkey(mut self, seed: impl Into<String>) -> Self {
        self.credentials = Some(Credentials::Nkey(seed.into()));
        self
    }

    /// Authenticates with a `.creds` file (a user JWT and its nkey seed).
    pub fn credentials_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.credentials = Some(Credentials::File(path.into()));
        self
    }

    /// TLS settings (a `tls://` URL requires TLS with the system's roots).
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// How long connecting may take, at build and at each reconnect
    /// (default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The connection's name, as the server's monitoring shows it.
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The delays between reconnects after a connection is lost (default
    /// 100 ms doubling to 10 s, forever; 5 s at most for a dead-letter
    /// store's). A policy that gives up ends a source with
    /// [`Error::GaveUp`]; a publisher's sends are then
    /// [closed](intake_core::publish::PublishErrorKind::Closed).
    pub fn reconnect_backoff(mut self, policy: impl BackoffPolicy) -> Self {
        self.reconnect_backoff = Some(Arc::new(policy));
        self
    }

    /// The server(s), as logs and errors show them (no credentials).
    pub fn endpoint(&self) -> String {
        crate::url::redact(&self.url)
    }

    /// What one part connects with: the URL parsed, the reconnect backoff
    /// checked (`default` where none is set), and `request_timeout` for
    /// the client's requests.
    pub(crate) fn connect_settings(
        &self,
        request_timeout: Duration,
        default: fn() -> Arc<dyn BackoffPolicy>,
    ) -> Result<ConnectSettings, Error> {
        let reconnect_backoff = self.reconnect_backoff.clone().unwrap_or_else(default);
        reconnect_backoff.validate()?;
        Ok(ConnectSettings {
            urls: ServerUrls::parse(&self.url)?,
            credentials: self.credentials.clone(),
            tls: self.tls.clone(),
            reconnect_backoff,
            connect_timeout: self.connect_timeout,
            request_timeout,
            name: self.name.clone(),
        })
    }
}

impl std::fmt::Debug for NatsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsSettings")
            .field("url", &self.endpoint())
            .field("credentials", &self.credentials)
            .field("tls", &self.tls)
            .field("connect_timeout", &self.connect_timeout)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl From<&str> for NatsSettings {
    fn from(url: &str) -> Self {
        Self::new(url)
    }
}

impl From<String> for NatsSettings {
    fn from(url: String) -> Self {
        Self::new(url)
    }
}

impl From<&String> for NatsSettings {
    fn from(url: &String) -> Self {
        Self::new(url.as_str())
    }
}

impl From<&NatsSettings> for NatsSettings {
    fn from(settings: &NatsSettings) -> Self {
        settings.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_a_secret() {
        let shown = [
            NatsSettings::new("nats://app:s3cret@127.0.0.1:4222").token("t0ken"),
            NatsSettings::new("nats://tok3n@127.0.0.1").user_password("app", "passw0rd"),
            NatsSettings::new("nats://127.0.0.1").nkey("SUseed"),
        ]
        .iter()
        .map(|settings| format!("{settings:?} {}", settings.endpoint()))
        .collect::<String>();
        for secret in ["s3cret", "t0ken", "tok3n", "passw0rd", "SUseed"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("UserPassword(app, ***)"), "{shown}");
    }

    #[test]
    fn a_url_is_settings_with_the_defaults() {
        let settings = NatsSettings::from("nats://127.0.0.1:4222");
        assert_eq!(
            settings.connect_timeout,
            NatsSettings::DEFAULT_CONNECT_TIMEOUT
        );
        assert!(settings.credentials.is_none() && settings.tls.is_none());
        let resolved = settings
            .connect_settings(Duration::from_secs(1), default_reconnect_backoff)
            .expect("a valid URL");
        assert_eq!(resolved.urls.addresses, ["nats://127.0.0.1:4222"]);
    }
}
