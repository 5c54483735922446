//! The `sslmode` of a pool: the URL's, else `PGSSLMODE`'s, else chosen by
//! the host (review M1: libpq's and sqlx's default, `prefer`, falls back
//! to clear text without a word).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgSslMode};

/// How a connection uses TLS: libpq's `sslmode`, the URL's `sslmode=`
/// parameter. See [`PoolConfig`](crate::PoolConfig) for what each one
/// protects against, and which one a URL without `sslmode` gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SslMode {
    /// Clear text only.
    Disable,
    /// Clear text (the driver never tries TLS under `allow`).
    Allow,
    /// TLS when the server offers it, else clear text; the server's
    /// certificate is not checked.
    Prefer,
    /// TLS or no connection; the server's certificate is not checked.
    Require,
    /// TLS or no connection, with a certificate a trusted CA signed.
    VerifyCa,
    /// TLS or no connection, with a certificate a trusted CA signed for the
    /// URL's host: the only mode that stops a man in the middle.
    VerifyFull,
}

impl SslMode {
    /// The mode as a URL spells it: `disable`, ..., `verify-full`.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// Whether a connection in this mode fails rather than go on in clear
    /// text.
    pub fn requires_tls(self) -> bool {
        matches!(
            self,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull
        )
    }

    fn from_driver(mode: PgSslMode) -> Self {
        match mode {
            PgSslMode::Disable => SslMode::Disable,
            PgSslMode::Allow => SslMode::Allow,
            PgSslMode::Prefer => SslMode::Prefer,
            PgSslMode::Require => SslMode::Require,
            PgSslMode::VerifyCa => SslMode::VerifyCa,
            PgSslMode::VerifyFull => SslMode::VerifyFull,
        }
    }

    fn to_driver(self) -> PgSslMode {
        match self {
            SslMode::Disable => PgSslMode::Disable,
            SslMode::Allow => PgSslMode::Allow,
            SslMode::Prefer => PgSslMode::Prefer,
            SslMode::Require => PgSslMode::Require,
            SslMode::VerifyCa => PgSslMode::VerifyCa,
            SslMode::VerifyFull => PgSslMode::VerifyFull,
        }
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a pool's sslmode comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// `sslmode=` (or `ssl-mode=`) in the URL.
    Url,
    /// The `PGSSLMODE` environment variable, as libpq reads it.
    Environment,
    /// Neither: the default for the host.
    Default,
}

/// A pool's sslmode, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TlsChoice {
    pub(crate) mode: SslMode,
    pub(crate) origin: Origin,
    /// Whether the driver connects to a loopback address or a Unix socket:
    /// traffic that never leaves this machine.
    pub(crate) loopback: bool,
}

impl TlsChoice {
    /// The choice for `options` as the driver read them from a URL that
    /// names an sslmode (`url_says`) or not, with `PGSSLMODE` = `environment`;
    /// and the options with that mode set.
    pub(crate) fn choose(
        options: PgConnectOptions,
        url_says: bool,
        environment: Option<&str>,
    ) -> (PgConnectOptions, Self) {
        let loopback = is_loopback(options.get_host(), options.get_socket().is_some());
        let from_environment = environment.and_then(|value| PgSslMode::from_str(value).ok());
        let (mode, origin) = match (url_says, from_environment) {
            (true, _) => (SslMode::from_driver(options.get_ssl_mode()), Origin::Url),
            // The driver read the variable too; the same value.
            (false, Some(mode)) => (SslMode::from_driver(mode), Origin::Environment),
            (false, None) => (default_for(loopback), Origin::Default),
        };
        let choice = Self {
            mode,
            origin,
            loopback,
        };
        (options.ssl_mode(mode.to_driver()), choice)
    }

    /// Whether connections may end in clear text over a network: the pool
    /// then checks each new connection until it finds one in clear text,
    /// and warns once. `disable` is no surprise, and loopback traffic
    /// stays on the machine.
    pub(crate) fn watches_for_clear_text(&self) -> bool {
        matches!(self.mode, SslMode::Prefer | SslMode::Allow) && !self.loopback
    }
}

impl fmt::Display for TlsChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match (self.origin, self.loopback) {
            (Origin::Url, _) => "from the URL",
            (Origin::Environment, _) => "from PGSSLMODE",
            (Origin::Default, true) => "the default for a loopback host",
            (Origin::Default, false) => "the default for a host that is not loopback",
        };
        write!(f, "{} ({why})", self.mode)
    }
}

/// The sslmode of a URL that names none (nor `PGSSLMODE`): `prefer` for a
/// loopback host, whose traffic never leaves the machine (and a Unix
/// socket cannot carry TLS at all), `require` for any other host.
pub(crate) fn default_for(loopback: bool) -> SslMode {
    if loopback {
        SslMode::Prefer
    } else {
        SslMode::Require
    }
}

/// Whether `host` (as the driver will connect to it) is this machine by
/// its loopback interface: a Unix socket (`socket`, or a host that is a
/// directory), `localhost`, an address in 127.0.0.0/8 or `::1` (also
/// IPv4-mapped). Any other name counts as remote, even one that resolves
/// to 127.0.0.1 today: what a name resolves to can change.
pub(crate) fn is_loopback(host: &str, socket: bool) -> bool {
    if socket || host.starts_with('/') {
        return true;
    }
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let bare = host
        .strip_prefix('[')
        .and_then(|inner| inner.strip_suffix(']'))
        .unwrap_or(host);
    match bare.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => ip.is_loopback(),
        Ok(IpAddr::V6(ip)) => {
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|ip| ip.is_loopback())
        }
        Err(_) => false,
    }
}

/// Whether a query string names an sslmode, as the driver reads it.
pub(crate) fn url_names_ssl_mode(url: &str) -> bool {
    let before_fragment = url.split('#').next().unwrap_or(url);
    before_fragment.split_once('?').is_some_and(|(_, query)| {
        form_urlencoded::parse(query.as_bytes())
            .any(|(name, _)| name == "sslmode" || name == "ssl-mode")
    })
}

/// Longest wait for the check of a new connection's encryption; past it
/// the connection is used unchecked (the driver finishes the query on the
/// connection's next use).
const CLEAR_TEXT_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Checks each new connection of a pool whose mode lets it fall back to
/// clear text, until one did: then warns, once per pool, and checks no
/// more. One query per new connection until then.
#[derive(Clone)]
pub(crate) struct ClearTextWatch {
    warned: Arc<AtomicBool>,
    url: Arc<str>,
    mode: SslMode,
}

impl ClearTextWatch {
    pub(crate) fn new(redacted_url: &str, mode: SslMode) -> Self {
        Self {
            warned: Arc::new(AtomicBool::new(false)),
            url: redacted_url.into(),
            mode,
        }
    }

    /// Checks `connection` (fresh from the driver) unless a warning was
    /// given. Never fails the connection: a check that fails says nothing.
    pub(crate) async fn check(&self, connection: &mut sqlx::PgConnection) {
        if self.warned.load(Ordering::Relaxed) {
            return;
        }
        let query = sqlx::query_scalar::<_, bool>(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
        )
        .fetch_optional(connection);
        let encrypted = match tokio::time::timeout(CLEAR_TEXT_CHECK_TIMEOUT, query).await {
            Ok(Ok(Some(encrypted))) => encrypted,
            Ok(Ok(None)) => return,
            Ok(Err(error)) => {
                tracing::debug!(url = %self.url, %error, "cannot tell whether the connection is encrypted");
                return;
            }
            Err(_) => {
                tracing::debug!(url = %self.url, "no answer in time on whether the connection is encrypted");
                return;
            }
        };
        if !encrypted && !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                url = %self.url,
                sslmode = %self.mode,
                "the connection to PostgreSQL is not encrypted: the server did not take TLS, so \
                 its traffic (the password among it, under password authentication) crosses the \
                 network in clear text, and whoever can refuse TLS on the way can make every \
                 connection do so; set sslmode=require (or verify-full) in the URL to refuse \
                 clear text, or sslmode=disable to say it is meant",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_are_told_from_remote_ones_without_a_network() {
        for host in [
            "127.0.0.1",
            "127.8.9.10",
            "::1",
            "[::1]",
            "[::ffff:127.0.0.1]",
            "localhost",
            "LocalHost",
            "localhost.",
            "/var/run/postgresql",
        ] {
            assert!(is_loopback(host, false), "{host} is loopback");
            assert_eq!(default_for(is_loopback(host, false)), SslMode::Prefer);
        }
        assert!(is_loopback("localhost", true), "a Unix socket");
        for host in [
            "db.internal",
            "10.0.0.5",
            "192.0.2.2",
            "[2001:db8::1]",
            "0.0.0.0",
            "localhost.example.com",
            "127.0.0.1.nip.io",
            "mylocalhost",
            "",
        ] {
            assert!(!is_loopback(host, false), "{host} is not loopback");
            assert_eq!(default_for(is_loopback(host, false)), SslMode::Require);
        }
    }

    fn choice(url: &str, environment: Option<&str>) -> TlsChoice {
        let options = PgConnectOptions::from_str(url).expect("a URL");
        let (options, choice) = TlsChoice::choose(options, url_names_ssl_mode(url), environment);
        assert_eq!(SslMode::from_driver(options.get_ssl_mode()), choice.mode);
        choice
    }

    #[test]
    fn a_url_without_sslmode_gets_require_unless_its_host_is_loopback() {
        let remote = choice("postgres://app@db.internal/orders", None);
        assert_eq!(
            (remote.mode, remote.origin),
            (SslMode::Require, Origin::Default)
        );
        assert_eq!(
            remote.to_string(),
            "require (the default for a host that is not loopback)"
        );
        let local = choice("postgres://app@127.0.0.1:5432/orders", None);
        assert_eq!(
            (local.mode, local.origin),
            (SslMode::Prefer, Origin::Default)
        );
        assert_eq!(
            local.to_string(),
            "prefer (the default for a loopback host)"
        );
        // The host the driver connects to decides: `host=` and `hostaddr=`
        // override the URL's.
        assert_eq!(
            choice("postgres://localhost/t?host=db.internal", None).mode,
            SslMode::Require
        );
        assert_eq!(
            choice("postgres://localhost/t?hostaddr=10.1.2.3", None).mode,
            SslMode::Require
        );
        assert_eq!(
            choice("postgres://db.internal/t?host=/run/postgresql", None).mode,
            SslMode::Prefer
        );
    }

    #[test]
    fn an_explicit_sslmode_is_kept_for_any_host() {
        for mode in [
            SslMode::Disable,
            SslMode::Allow,
            SslMode::Prefer,
            SslMode::Require,
            SslMode::VerifyCa,
            SslMode::VerifyFull,
        ] {
            for host in ["db.internal", "127.0.0.1"] {
                let url = format!("postgres://{host}/t?sslmode={mode}");
                let chosen = choice(&url, Some("disable"));
                assert_eq!((chosen.mode, chosen.origin), (mode, Origin::Url), "{url}");
                let chosen = choice(&format!("postgres://{host}/t?ssl-mode={mode}"), None);
                assert_eq!(chosen.mode, mode);
            }
        }
    }

    #[test]
    fn pgsslmode_counts_as_explicit_when_the_url_says_nothing() {
        let chosen = choice("postgres://db.internal/t", Some("prefer"));
        assert_eq!(
            (chosen.mode, chosen.origin),
            (SslMode::Prefer, Origin::Environment)
        );
        assert_eq!(chosen.to_string(), "prefer (from PGSSLMODE)");
        // A value the driver does not read is no choice.
        let chosen = choice("postgres://db.internal/t", Some("sometimes"));
        assert_eq!(
            (chosen.mode, chosen.origin),
            (SslMode::Require, Origin::Default)
        );
    }

    #[test]
    fn only_modes_that_may_fall_back_over_a_network_are_watched() {
        assert!(choice("postgres://db/t?sslmode=prefer", None).watches_for_clear_text());
        assert!(choice("postgres://db/t?sslmode=allow", None).watches_for_clear_text());
        assert!(!choice("postgres://db/t?sslmode=disable", None).watches_for_clear_text());
        assert!(!choice("postgres://db/t", None).watches_for_clear_text());
        assert!(!choice("postgres://127.0.0.1/t", None).watches_for_clear_text());
    }
}
