//! librdkafka settings, passed through unchanged, with secrets kept out of
//! `Debug` and error messages.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use intake_core::redact;
use rdkafka::ClientConfig;

use crate::error::Error;

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

/// The consumer group protocol a consumer joins its group with
/// (librdkafka's `group.protocol`).
///
/// [`Classic`](Self::Classic), the default, is the protocol every Kafka
/// broker serves: the group's leader (a member) assigns, with
/// `partition.assignment.strategy`, and the client keeps its session
/// (`session.timeout.ms`, `heartbeat.interval.ms`).
/// [`Consumer`](Self::Consumer) is KIP-848's protocol (Apache Kafka 4.0 and
/// later, librdkafka 2.12 and later): the broker assigns, incrementally,
/// with `group.remote.assignor`, and keeps the session and heartbeat
/// timings (`group.consumer.session.timeout.ms`,
/// `group.consumer.heartbeat.interval.ms` on the broker). librdkafka refuses
/// the classic settings under it; so does intake, when the consumer is
/// built, with [`Error::GroupProtocolSetting`] naming the setting and its
/// replacement.
///
/// The crate docs' "Group protocol" section says what changes for a
/// consumer, and the librdkafka 2.12 defect that a consumer passing
/// `max.poll.interval.ms` may meet under [`Consumer`](Self::Consumer).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GroupProtocol {
    /// The classic protocol (`group.protocol=classic`): librdkafka's
    /// default.
    #[default]
    Classic,
    /// KIP-848's consumer protocol (`group.protocol=consumer`).
    Consumer,
}

impl GroupProtocol {
    /// Both protocols, classic first.
    pub const ALL: [GroupProtocol; 2] = [GroupProtocol::Classic, GroupProtocol::Consumer];

    /// The value of librdkafka's `group.protocol`: `classic` or `consumer`.
    pub fn as_str(self) -> &'static str {
        match self {
            GroupProtocol::Classic => "classic",
            GroupProtocol::Consumer => "consumer",
        }
    }

    /// Why `setting`, set by the user, cannot be used with this protocol,
    /// and what to use instead; `None` when it can.
    fn refuses(self, setting: &str) -> Option<&'static str> {
        match (self, setting) {
            (GroupProtocol::Consumer, "session.timeout.ms") => Some(
                "under the consumer protocol (KIP-848) the broker keeps the session: set `group.consumer.session.timeout.ms` on the broker (or on the group with IncrementalAlterConfigs) and remove the setting, or keep GroupProtocol::Classic",
            ),
            (GroupProtocol::Consumer, "heartbeat.interval.ms") => Some(
                "under the consumer protocol (KIP-848) the broker sets the heartbeat: set `group.consumer.heartbeat.interval.ms` on the broker (or on the group) and remove the setting, or keep GroupProtocol::Classic",
            ),
            (GroupProtocol::Consumer, "partition.assignment.strategy") => Some(
                "under the consumer protocol (KIP-848) the broker assigns: name its assignor with `group.remote.assignor` (`uniform` or `range`) instead, or keep GroupProtocol::Classic",
            ),
            (GroupProtocol::Consumer, "group.protocol.type") => {
                Some("the consumer protocol (KIP-848) has no protocol type; remove the setting")
            }
            (GroupProtocol::Classic, "group.remote.assignor") => Some(
                "only the consumer protocol (KIP-848) has the broker assign; choose GroupProtocol::Consumer, or name the classic assignor with `partition.assignment.strategy`",
            ),
            _ => None,
        }
    }
}

impl GroupProtocol {
    /// The typed error for librdkafka's refusal to create a consumer under
    /// the consumer protocol (`` `session.timeout.ms` is not supported for
    /// `group.protocol=consumer`... ``, librdkafka 2.12's
    /// `rd_kafka_conf_finalize`), if `reason` is one.
    pub(crate) fn refusal(reason: &str) -> Option<Error> {
        PROTOCOL_BOUND.into_iter().find_map(|setting| {
            let quoted = format!("`{setting}` is not supported");
            let fix = GroupProtocol::Consumer.refuses(setting)?;
            reason
                .starts_with(&quoted)
                .then(|| Error::GroupProtocolSetting {
                    setting: setting.to_owned(),
                    protocol: GroupProtocol::Consumer,
                    fix,
                })
        })
    }
}

impl fmt::Display for GroupProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for GroupProtocol {
    type Err = Error;

    /// `classic` or `consumer`, in any case, as librdkafka reads
    /// `group.protocol`.
    fn from_str(value: &str) -> Result<Self, Error> {
        let value = value.trim();
        GroupProtocol::ALL
            .into_iter()
            .find(|protocol| value.eq_ignore_ascii_case(protocol.as_str()))
            .ok_or_else(|| {
                Error::config(
                    "group.protocol",
                    format!("`{value}` is not a group protocol: write `classic` (the default) or `consumer` (KIP-848)"),
                )
            })
    }
}

/// The settings some protocol refuses (see [`GroupProtocol`]).
const PROTOCOL_BOUND: [&str; 5] = [
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "partition.assignment.strategy",
    "group.protocol.type",
    "group.remote.assignor",
];

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

    /// Joins consumer groups with `protocol` (librdkafka's
    /// `group.protocol`; default [`GroupProtocol::Classic`]). Producers made
    /// from these settings ignore it, as every consumer setting, and
    /// librdkafka says so once per producer (a `CONFWARN` warning).
    ///
    /// ```
    /// use intake_kafka::{GroupProtocol, KafkaSettings};
    ///
    /// let settings = KafkaSettings::new("127.0.0.1:9092").group_protocol(GroupProtocol::Consumer);
    /// assert_eq!(settings.get("group.protocol"), Some("consumer"));
    /// assert_eq!(settings.chosen_group_protocol().ok(), Some(GroupProtocol::Consumer));
    /// ```
    pub fn group_protocol(self, protocol: GroupProtocol) -> Self {
        self.set("group.protocol", protocol.as_str())
    }

    /// The group protocol these settings choose: `group.protocol` as
    /// [`group_protocol`](Self::group_protocol) or
    /// [`set`](Self::set) gave it, [`GroupProtocol::Classic`] when unset.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] (setting `group.protocol`) for a value that is
    /// neither `classic` nor `consumer`.
    pub fn chosen_group_protocol(&self) -> Result<GroupProtocol, Error> {
        self.get("group.protocol")
            .map_or(Ok(GroupProtocol::Classic), str::parse)
    }

    /// The chosen group protocol, once checked against the settings it
    /// refuses (see [`GroupProtocol`]): what a consumer's build checks
    /// before librdkafka, whose own refusal names neither the fix nor the
    /// setting as a field.
    ///
    /// # Errors
    ///
    /// [`Error::GroupProtocolSetting`] for the first refused setting,
    /// [`Error::Config`] for an unknown `group.protocol`.
    pub fn checked_group_protocol(&self) -> Result<GroupProtocol, Error> {
        let protocol = self.chosen_group_protocol()?;
        for setting in PROTOCOL_BOUND {
            if self.get(setting).is_some()
                && let Some(fix) = protocol.refuses(setting)
            {
                return Err(Error::GroupProtocolSetting {
                    setting: setting.to_owned(),
                    protocol,
                    fix,
                });
            }
        }
        Ok(protocol)
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
