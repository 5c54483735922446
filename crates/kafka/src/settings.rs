//! librdkafka settings, passed through unchanged, with secrets kept out of
//! `Debug` and error messages.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use intake_core::redact;
use rdkafka::ClientConfig;

/// Shown instead of a secret's value.
const REDACTED: &str = "<redacted>";

/// The settings librdkafka itself treats as secrets: the properties it
/// flags sensitive (`_RK_SENSITIVE` in `src/rdkafka_conf.c`, redacted in its
/// own configuration dumps), and the alias
/// `sasl.oauthbearer.client.credentials.client.secret` of one of them. From
/// librdkafka 2.12 (CONFIGURATION.md lists each); among them `sasl.username`
/// and the paths of private keys, which librdkafka hides too.
pub const LIBRDKAFKA_SECRETS: [&str; 14] = [
    "ssl.key.location",
    "ssl.key.password",
    "ssl.key.pem",
    "ssl_key",
    "ssl.ca.pem",
    "ssl.keystore.password",
    "sasl.username",
    "sasl.password",
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.assertion.private.key.file",
    "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.assertion.private.key.pem",
];

/// Whether the value of librdkafka setting `key` is a secret: one of
/// [`LIBRDKAFKA_SECRETS`], or a name that
/// [looks secret](intake_core::redact::is_secret_name) (a password,
/// passphrase, secret, token, private key, ...) or mentions a JAAS line,
/// which embeds a password. Case does not matter: librdkafka refuses a
/// name in another case, and its refusal would quote the value.
///
/// Errs on the side of hiding: the list covers what librdkafka knows today,
/// the name heuristic what later versions (or a typo) may add.
pub fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    LIBRDKAFKA_SECRETS.contains(&key.as_str())
        || redact::is_secret_name(&key)
        || key.contains("jaas")
}

/// Every librdkafka setting for one client, as users already write them
/// (`bootstrap.servers`, `security.protocol`, `sasl.mechanisms`, ...).
///
/// Settings pass through to librdkafka unchanged, so TLS and SASL work as
/// documented there. `Debug` shows every setting but replaces the values of
/// secrets (see [`is_secret`]) with `<redacted>`, and shows any other value
/// that holds a URL [without its credentials](intake_core::redact::url).
///
/// ```
/// use intake_kafka::KafkaSettings;
///
/// let settings = KafkaSettings::new("127.0.0.1:9092")
///     .set("security.protocol", "SASL_SSL")
///     .set("sasl.mechanisms", "PLAIN")
///     .set("sasl.username", "orders")
///     .set("sasl.password", "hunter2");
/// assert!(!format!("{settings:?}").contains("hunter2"));
/// ```
#[derive(Clone, Default)]
pub struct KafkaSettings {
    config: ClientConfig,
}

impl KafkaSettings {
    /// Settings for the brokers at `bootstrap_servers` (`host:port`, comma
    /// separated).
    pub fn new(bootstrap_servers: impl Into<String>) -> Self {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", bootstrap_servers);
        Self { config }
    }

    /// Takes over an rdkafka [`ClientConfig`] as it is.
    pub fn from_client_config(config: ClientConfig) -> Self {
        Self { config }
    }

    /// Sets a librdkafka setting, replacing an earlier value.
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.set(key, value);
        self
    }

    /// The value of a setting, if it was set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.config.get(key)
    }

    /// The brokers, for error messages (`bootstrap.servers` holds no
    /// credentials in Kafka).
    pub fn bootstrap_servers(&self) -> &str {
        self.config
            .get("bootstrap.servers")
            .or_else(|| self.config.get("metadata.broker.list"))
            .unwrap_or("<bootstrap.servers not set>")
    }

    /// The brokers as errors and logs show them: `bootstrap.servers` with
    /// any credentials hidden ([`redact::url`]).
    pub(crate) fn endpoint(&self) -> String {
        redact::url(self.bootstrap_servers())
    }

    /// The underlying rdkafka configuration.
    pub fn client_config(&self) -> &ClientConfig {
        &self.config
    }

    pub(crate) fn client_config_mut(&mut self) -> &mut ClientConfig {
        &mut self.config
    }

    /// Whether a boolean setting was set to true (librdkafka accepts
    /// `true`/`false` in any case).
    pub(crate) fn is_true(&self, key: &str) -> Option<bool> {
        self.get(key)
            .map(|value| value.eq_ignore_ascii_case("true"))
    }
}

impl fmt::Debug for KafkaSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: BTreeMap<&str, Cow<'_, str>> = self
            .config
            .config_map()
            .into_iter()
            .map(|(key, value)| match is_secret(key) {
                true => (key, Cow::Borrowed(REDACTED)),
                false => (key, Cow::Owned(redact::url(value))),
            })
            .collect();
        f.debug_map().entries(shown).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_a_secret() {
        let settings = KafkaSettings::new("b:9092")
            .set("sasl.password", "p1")
            .set("ssl.key.password", "p2")
            .set("ssl.key.pem", "p3")
            .set("sasl.jaas.config", "p4")
            .set("sasl.oauthbearer.client.secret", "p5")
            .set("sasl.oauthbearer.config", "p6")
            .set("ssl.keystore.password", "p7")
            .set("sasl.mechanisms", "SCRAM-SHA-512")
            .set(
                "sasl.oauthbearer.token.endpoint.url",
                "https://app:p8@idp/token",
            )
            .set("client.rack", "https://app:p9@example/rack");
        let shown = format!("{settings:?}");
        for secret in ["p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9"] {
            assert!(!shown.contains(secret), "{secret} leaked in {shown}");
        }
        assert!(shown.contains("SCRAM-SHA-512"));
        assert!(shown.contains("b:9092"));
        assert!(shown.contains("https://app:***@example/rack"), "{shown}");
    }

    /// The settings librdkafka 2.12.1 itself treats as secrets: the
    /// properties flagged `_RK_SENSITIVE` in `src/rdkafka_conf.c` (redacted
    /// in its own configuration dumps), and the alias
    /// `sasl.oauthbearer.client.credentials.client.secret` of one of them
    /// (CONFIGURATION.md). Written out here, not taken from the code under
    /// test, so a name the code misses fails this test.
    const LIBRDKAFKA_SENSITIVE: [&str; 14] = [
        "ssl.key.location",
        "ssl.key.password",
        "ssl.key.pem",
        "ssl_key",
        "ssl.ca.pem",
        "ssl.keystore.password",
        "sasl.username",
        "sasl.password",
        "sasl.oauthbearer.config",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.client.credentials.client.secret",
        "sasl.oauthbearer.assertion.private.key.file",
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "sasl.oauthbearer.assertion.private.key.pem",
    ];

    #[test]
    fn no_setting_librdkafka_treats_as_a_secret_shows_in_debug_or_errors() {
        for (index, key) in LIBRDKAFKA_SENSITIVE.iter().enumerate() {
            let secret = format!("SECRET{index}");
            let settings = KafkaSettings::new("127.0.0.1:9")
                .set("group.id", "visible-group")
                .set(*key, format!("value-of-{secret}"));
            let shown = format!("{settings:?}");
            assert!(!shown.contains(&secret), "{key} shows in {shown}");
            assert!(shown.contains("visible-group"), "{shown}");
            // librdkafka refuses some of these values (a feature it was built
            // without, a file that does not exist, text that is no PEM), and
            // its refusal comes back as the client's error.
            let created = settings
                .client_config()
                .create::<rdkafka::consumer::BaseConsumer>();
            if let Err(error) = created {
                let error = crate::Error::from_kafka(error, "127.0.0.1:9", Default::default());
                let shown = format!("{error} {error:?}");
                assert!(!shown.contains(&secret), "{key} shows in {shown}");
            }
        }
    }

    #[test]
    fn a_refused_secret_setting_is_named_in_the_error_without_its_value() {
        for key in LIBRDKAFKA_SENSITIVE {
            let error = crate::Error::from_kafka(
                rdkafka::error::KafkaError::ClientConfig(
                    rdkafka::types::RDKafkaConfRes::RD_KAFKA_CONF_INVALID,
                    "Invalid value".into(),
                    key.to_owned(),
                    "value-of-SECRET".into(),
                ),
                "127.0.0.1:9",
                Default::default(),
            );
            let shown = format!("{error} {error:?}");
            assert!(shown.contains(key), "{shown}");
            assert!(!shown.contains("SECRET"), "{key} shows in {shown}");
        }
    }
}
