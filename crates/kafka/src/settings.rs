//! librdkafka settings, passed through unchanged, with secrets kept out of
//! `Debug` and error messages.

use std::collections::BTreeMap;
use std::fmt;

use rdkafka::ClientConfig;

/// Shown instead of a secret's value.
const REDACTED: &str = "<redacted>";

/// Whether the value of librdkafka setting `key` is a secret (a password, a
/// private key, a token or a JAAS line that embeds one).
///
/// Errs on the side of hiding: any key that mentions a password, a secret,
/// a token or a private key counts.
pub fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key.contains("password")
        || key.contains("secret")
        || key.contains("token")
        || key.contains("jaas")
        || key.contains("oauthbearer.config")
        || key == "ssl.key.pem"
        || key.ends_with("key.pem")
        || key == "ssl_key"
}

/// Every librdkafka setting for one client, as users already write them
/// (`bootstrap.servers`, `security.protocol`, `sasl.mechanisms`, ...).
///
/// Settings pass through to librdkafka unchanged, so TLS and SASL work as
/// documented there. `Debug` shows every setting but replaces the values of
/// secrets (see [`is_secret`]) with `<redacted>`.
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
        let shown: BTreeMap<&str, &str> = self
            .config
            .config_map()
            .into_iter()
            .map(|(key, value)| (key, if is_secret(key) { REDACTED } else { value }))
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
            .set("sasl.username", "alice");
        let shown = format!("{settings:?}");
        for secret in ["p1", "p2", "p3", "p4", "p5", "p6", "p7"] {
            assert!(!shown.contains(secret), "{secret} leaked in {shown}");
        }
        assert!(shown.contains("alice"));
        assert!(shown.contains("b:9092"));
    }
}
