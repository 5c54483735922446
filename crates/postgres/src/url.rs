//! [`DatabaseUrl`]: a connection URL that keeps its password out of logs.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use intake_core::{ConfigError, redact};

/// A PostgreSQL connection URL, `postgres://user:password@host:port/database?…`.
///
/// `Debug` and `Display` show it [redacted](intake_core::redact::url): the
/// password of the user info and the value of a secret query parameter
/// (`password=`, `sslpassword=`, ...) replaced by `***`, so a URL can be
/// logged, put in an error or printed with `{:?}` without leaking the
/// secret.
///
/// ```
/// use intake_postgres::DatabaseUrl;
///
/// let url: DatabaseUrl = "postgres://app:s3cret@db.internal:5432/orders".parse()?;
/// assert_eq!(url.to_string(), "postgres://app:***@db.internal:5432/orders");
/// assert!(!format!("{url:?}").contains("s3cret"));
/// # Ok::<(), intake_core::ConfigError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl {
    url: String,
    redacted: String,
}

impl DatabaseUrl {
    /// Parses `url`; see [`FromStr`].
    ///
    /// # Errors
    ///
    /// A URL whose scheme is not `postgres://` or `postgresql://`, or whose
    /// password holds an unescaped `/`, `?` or `#` (see
    /// [`check_user_info`](intake_core::redact::check_user_info)).
    pub fn new(url: &str) -> Result<Self, ConfigError> {
        url.parse()
    }

    /// The URL with its password, for the driver. Never log this.
    pub fn expose(&self) -> &str {
        &self.url
    }

    /// The URL with the password replaced by `***`.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }

    /// `text` with every secret of the URL replaced by `***`: for a
    /// driver's error message, which may quote part of the URL (see
    /// [`redact::scrub`]).
    pub fn scrub(&self, text: &str) -> String {
        redact::scrub(text, &self.url)
    }
}

/// The URL as the driver gets it, and the parameters left out of it.
pub(crate) struct DriverUrl<'a> {
    /// The URL without the parameters the driver does not read.
    pub(crate) url: Cow<'a, str>,
    /// Names of the parameters left out, in order, up to the first one with
    /// a secret name (included).
    pub(crate) left_out: Vec<String>,
    /// Parameters left out after a secret one: not named, because a
    /// password holding an unescaped `&` reads as more parameters.
    pub(crate) unnamed: usize,
}

/// The query parameters sqlx 0.9 reads (`PgConnectOptions::parse_from_url`,
/// plus `options[name]`). It logs every other one at `WARN` with its value,
/// which for libpq's `sslpassword` (or the rest of a password holding an
/// `&`) is a secret.
const DRIVER_PARAMETERS: [&str; 18] = [
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

impl DatabaseUrl {
    /// The URL for the driver: without the query parameters it does not
    /// read, which it would log with their values. It ignores them anyway.
    pub(crate) fn for_driver(&self) -> DriverUrl<'_> {
        let mut driver = DriverUrl {
            url: Cow::Borrowed(&self.url),
            left_out: Vec::new(),
            unnamed: 0,
        };
        // As the URL grammar reads it: the fragment from the first `#`, the
        // query from the first `?` before it (`check_user_info` passed, so
        // no password holds either).
        let (before_fragment, fragment) = self
            .url
            .split_at(self.url.find('#').unwrap_or(self.url.len()));
        let Some((base, query)) = before_fragment.split_once('?') else {
            return driver;
        };
        let read = |name: &str| {
            DRIVER_PARAMETERS.contains(&name) || name.starts_with("options[") && name.ends_with(']')
        };
        let parameters = form_urlencoded::parse(query.as_bytes());
        if parameters.clone().all(|(name, _)| read(&name)) {
            return driver;
        }
        let mut kept = form_urlencoded::Serializer::new(String::new());
        let mut after_secret = false;
        for (name, value) in parameters {
            if read(&name) {
                kept.append_pair(&name, &value);
            } else if after_secret {
                driver.unnamed += 1;
            } else {
                driver.left_out.push(name.clone().into_owned());
            }
            after_secret |= redact::is_secret_name(&name);
        }
        driver.url = Cow::Owned(format!("{base}?{}{fragment}", kept.finish()));
        driver
    }
}

impl FromStr for DatabaseUrl {
    type Err = ConfigError;

    fn from_str(url: &str) -> Result<Self, ConfigError> {
        let Some((scheme, _)) = url.split_once("://") else {
            return Err(ConfigError::new(
                "database_url",
                "is not a URL; write it as postgres://user:password@host:5432/database",
            ));
        };
        if !matches!(scheme, "postgres" | "postgresql") {
            return Err(ConfigError::new(
                "database_url",
                format!(
                    "has the scheme `{}`; use postgres:// or postgresql://",
                    redact::url(scheme)
                ),
            ));
        }
        let redacted = redact::url(url);
        // `postgres://app:12/x@db/t` is host `app`, port 12, database
        // `x@db/t` to the driver: it would connect elsewhere and show the
        // password's rest as the database.
        redact::check_user_info(url)
            .map_err(|error| ConfigError::new("database_url", format!("{redacted} {error}")))?;
        Ok(Self {
            url: url.to_owned(),
            redacted,
        })
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DatabaseUrl").field(&self.redacted).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_in_the_user_info_is_redacted() {
        let url = DatabaseUrl::new("postgresql://app:p%40ss@db:5432/test?sslmode=require").unwrap();
        assert_eq!(
            url.redacted(),
            "postgresql://app:***@db:5432/test?sslmode=require"
        );
        assert_eq!(
            format!("{url:?}"),
            "DatabaseUrl(\"postgresql://app:***@db:5432/test?sslmode=require\")"
        );
        assert_eq!(
            url.expose(),
            "postgresql://app:p%40ss@db:5432/test?sslmode=require"
        );
    }

    #[test]
    fn a_password_query_parameter_is_redacted() {
        let url = DatabaseUrl::new("postgres://db/test?user=app&password=hunter2&x=1").unwrap();
        // What follows may be the rest of a password holding an `&`.
        assert_eq!(url.to_string(), "postgres://db/test?user=app&password=***");
        assert_eq!(
            url.scrub("bad password hunter2 for app"),
            "bad password *** for app"
        );
    }

    #[test]
    fn a_url_without_credentials_is_shown_as_is() {
        let url = DatabaseUrl::new("postgres://postgres@127.0.0.1:5432/test").unwrap();
        assert_eq!(url.to_string(), "postgres://postgres@127.0.0.1:5432/test");
        assert_eq!(url.scrub("anything"), "anything");
    }

    #[test]
    fn a_password_containing_at_signs_stays_hidden() {
        let url = DatabaseUrl::new("postgres://app:a@b@db/test").unwrap();
        assert_eq!(url.to_string(), "postgres://app:***@db/test");
    }

    #[test]
    fn other_schemes_are_refused() {
        let error = DatabaseUrl::new("mysql://root@db/test").unwrap_err();
        assert!(error.problem.contains("postgres://"), "{error}");
        assert!(DatabaseUrl::new("db:5432").is_err());
        assert!(DatabaseUrl::new("postgres:///test?host=/run/postgresql").is_ok());
    }

    #[test]
    fn a_password_read_as_port_and_database_is_refused_without_showing_it() {
        // Host `app`, port 12, database `SECRET@db/test` to the driver.
        for url in [
            "postgres://app:12/SECRET@db/test",
            "postgres://app:/SECRET@db/test",
            "postgresql://app:ab?SECRET@db/test",
            "postgres://app:ab#SECRET@db/test",
        ] {
            let error = crate::PoolConfig::new(url).unwrap_err();
            let shown = format!("{error} {error:?}");
            assert!(!shown.contains("SECRET"), "{shown}");
            assert!(shown.contains("%2F"), "says what to escape: {shown}");
        }
    }

    #[test]
    fn the_driver_never_logs_a_parameter_it_does_not_read() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let _entered = runtime.enter();
        let (subscriber, logs) = captured_logs();
        let url = "postgres://app@db/test?sslmode=disable&sslpassword=SECRET&keepalives=SECRET2";
        let pool = tracing::subscriber::with_default(subscriber, || {
            crate::PoolConfig::new(url).map(|config| config.connect_lazy())
        });
        assert!(matches!(pool, Ok(Ok(_))));
        let logs = String::from_utf8_lossy(&logs.lock().expect("the log buffer")).into_owned();
        assert!(!logs.contains("SECRET"), "{logs}");
        assert!(
            logs.contains("sslpassword"),
            "the left-out parameter is named: {logs}"
        );
        assert!(logs.contains("unnamed=1"), "{logs}");
    }

    #[test]
    fn every_parameter_the_driver_reads_reaches_it() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let _entered = runtime.enter();
        let values = |name: &str| match name {
            "sslmode" | "ssl-mode" => "disable",
            "statement-cache-capacity" | "port" => "5432",
            "hostaddr" => "127.0.0.1",
            _ => "x",
        };
        let query: Vec<String> = DRIVER_PARAMETERS
            .iter()
            .chain(&["options[search_path]"])
            .map(|name| format!("{name}={}", values(name)))
            .collect();
        let url = DatabaseUrl::new(&format!("postgres://db/test?{}", query.join("&"))).unwrap();
        let driver = url.for_driver();
        assert_eq!(driver.url, url.expose());
        assert!(driver.left_out.is_empty() && driver.unnamed == 0);
        let fragment = DatabaseUrl::new("postgres://db/t#a?b=c").unwrap();
        assert_eq!(fragment.for_driver().url, fragment.expose());
        // The driver reads each one: it warns about none.
        let (subscriber, logs) = captured_logs();
        let pool = tracing::subscriber::with_default(subscriber, || {
            crate::PoolConfig::from_url(url).connect_lazy()
        });
        assert!(pool.is_ok(), "{:?}", pool.err());
        let logs = String::from_utf8_lossy(&logs.lock().expect("the log buffer")).into_owned();
        assert!(!logs.contains("unrecognized"), "{logs}");
    }

    /// A secret: random characters, any a password or parameter may hold
    /// (those that end a URL's parts unescaped among them), around the
    /// canary `SECRET`. Nothing else in the generated URLs is upper case,
    /// so `SECRET` anywhere in a printed form is a leak, escaped or not.
    fn secret() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let around = "[a-zA-Z0-9/?#@:%!$&'()*+,;=._~\\[\\] -]{0,8}";
        prop_oneof![
            (around, around).prop_map(|(before, after)| format!("{before}SECRET{after}")),
            // Digits then `/`, `?` or `#` read as a port, then a path,
            // query or fragment.
            ("[0-9]{0,5}", "[/?#]", around)
                .prop_map(|(digits, end, after)| format!("{digits}{end}SECRET{after}")),
        ]
    }

    /// PostgreSQL URLs, valid or not, with a secret as the password of the
    /// user info (also with one or no slash after the scheme, or no scheme)
    /// and in the query parameters that carry one (`password`, libpq's
    /// `sslpassword`, which the driver does not know).
    fn postgres_url_with_a_secret() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let scheme = prop::sample::select(vec!["postgres", "postgresql"]);
        let host = "[a-z0-9.]{0,10}(:[0-9]{0,5})?";
        let tail = "(/[a-z0-9]{0,8})?(\\?[a-z_=&0-9-]{0,16})?";
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
                host,
                "([a-z_]{1,4}=[a-z0-9]{0,4}&|host=/run/pg&|sslmode=disable&){0,2}",
                prop::sample::select(vec!["password", "sslpassword", "PASSWORD", "pass%77ord"]),
                secret(),
            )
                .prop_map(|(scheme, host, before, key, secret)| {
                    format!("{scheme}://{host}/test?{before}{key}={secret}")
                }),
        ]
    }

    /// A subscriber that writes every event, the driver's among them, to a
    /// buffer the test reads.
    fn captured_logs() -> (
        impl tracing::Subscriber,
        std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    ) {
        use std::sync::{Arc, Mutex};
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = Arc::clone(&buffer);
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || SharedBuffer(Arc::clone(&writer)))
            .finish();
        (subscriber, buffer)
    }

    struct SharedBuffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for SharedBuffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2_000))]

        #[test]
        fn a_secret_anywhere_in_a_postgres_url_never_shows(url in postgres_url_with_a_secret()) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            let _entered = runtime.enter();
            let (subscriber, logs) = captured_logs();
            let shown = tracing::subscriber::with_default(subscriber, || {
                match crate::PoolConfig::new(&url) {
                    Ok(config) => {
                        let mut shown = format!("{} {:?} {config:?}", config.url(), config.url());
                        if let Err(error) = config.connect_lazy() {
                            shown.push_str(&format!(" {error} {error:?}"));
                        }
                        shown
                    }
                    Err(error) => format!("{error} {error:?}"),
                }
            });
            let logs = String::from_utf8_lossy(&logs.lock().expect("the log buffer")).into_owned();
            proptest::prop_assert!(!shown.contains("SECRET"), "{} shows {}", url, shown);
            proptest::prop_assert!(!logs.contains("SECRET"), "{} logs {}", url, logs);
        }
    }
}
