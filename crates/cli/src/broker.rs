//! `--broker URL`: which broker it names, the address in the form each
//! client wants, and the form every line the command prints shows.

use intake_core::redact;
use percent_encoding::percent_decode_str;

use crate::args::KafkaArgs;
use crate::failure::Failure;
use crate::kafka_settings;

/// Which broker a `--broker` URL names.
#[derive(Clone, PartialEq, Eq)]
pub enum Broker {
    /// `kafka://HOST:PORT[,HOST:PORT...]`: the bootstrap servers.
    Kafka {
        /// `HOST:PORT[,HOST:PORT...]`.
        bootstrap: String,
        /// librdkafka settings besides the brokers (TLS, SASL), from
        /// `--kafka-config` and `--kafka-setting`, in order. Values may be
        /// secrets: never shown.
        settings: Vec<(String, String)>,
    },
    /// `redis://…` or `rediss://…`, as given.
    Redis {
        /// The URL as given.
        url: String,
    },
    /// `amqp://…` or `amqps://…`, with an empty vhost spelled `%2f`.
    Amqp {
        /// The URL, vhost spelled out.
        url: String,
    },
    /// `nats://…` or `tls://…`, as given.
    Nats {
        /// The URL as given, credentials included.
        url: String,
    },
}

// Debug goes through the redacted form: a `Broker` may end up in a log
// line or a panic message, and its URL may hold a password.
impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Broker({})", self.endpoint())
    }
}

impl Broker {
    /// Reads `url`; a usage failure says what is wrong with it, without
    /// quoting a password.
    pub fn parse(url: &str) -> Result<Self, Failure> {
        let url = url.trim();
        if let Some(bootstrap) = url.strip_prefix("kafka://") {
            let bootstrap = bootstrap.trim_end_matches('/');
            if bootstrap.is_empty() || bootstrap.contains('@') {
                return Err(Failure::Usage(
                    "--broker kafka:// takes HOST:PORT[,HOST:PORT...]; credentials go in \
                     --kafka-config FILE (sasl.username, sasl.password), not in the URL"
                        .to_owned(),
                ));
            }
            return Ok(Broker::Kafka {
                bootstrap: bootstrap.to_owned(),
                settings: Vec::new(),
            });
        }
        // A password holding an unescaped `/`, `?` or `#` would be read by
        // the client as the host, port or path: it would connect elsewhere
        // and show the rest of the password in its errors.
        if redact::check_user_info(url).is_err() {
            return Err(Failure::Usage(format!(
                "--broker {}: percent-encode `/`, `?`, `#` and `@` in the password",
                redact_nats_style(url)
            )));
        }
        if url.starts_with("redis://") || url.starts_with("rediss://") {
            Ok(Broker::Redis {
                url: url.to_owned(),
            })
        } else if url.starts_with("amqp://") || url.starts_with("amqps://") {
            Ok(Broker::Amqp {
                url: with_default_vhost(url),
            })
        } else if url.starts_with("nats://") || url.starts_with("tls://") {
            Ok(Broker::Nats {
                url: url.to_owned(),
            })
        } else {
            Err(Failure::Usage(
                "--broker must start with kafka://, redis://, rediss://, amqp://, amqps://, \
                 nats:// or tls://"
                    .to_owned(),
            ))
        }
    }

    /// `self` with the librdkafka settings `kafka` gives (a Kafka broker
    /// also takes the file `INTAKE_KAFKA_CONFIG` names, when
    /// `--kafka-config` is not given).
    ///
    /// # Errors
    ///
    /// A usage failure when settings are given for another broker, or are
    /// malformed (see [`kafka_settings::load`]).
    pub fn with_kafka_settings(self, kafka: &KafkaArgs) -> Result<Self, Failure> {
        match self {
            Broker::Kafka { bootstrap, .. } => Ok(Broker::Kafka {
                bootstrap,
                settings: kafka_settings::load(kafka.config.as_deref(), true, &kafka.settings)?,
            }),
            other if kafka.config.is_none() && kafka.settings.is_empty() => Ok(other),
            _ => Err(Failure::Usage(
                "--kafka-config and --kafka-setting apply to a kafka:// broker only".to_owned(),
            )),
        }
    }

    /// The librdkafka settings of a Kafka broker: the bootstrap servers,
    /// then the settings given; `None` for another broker.
    pub fn kafka_settings(&self) -> Option<intake_kafka::KafkaSettings> {
        match self {
            Broker::Kafka {
                bootstrap,
                settings,
            } => Some(settings.iter().fold(
                intake_kafka::KafkaSettings::new(bootstrap.as_str()),
                |all, (key, value)| all.set(key.as_str(), value.as_str()),
            )),
            _ => None,
        }
    }

    /// The scheme's broker, as messages name it.
    #[allow(
        dead_code,
        reason = "names the broker in Failure::Unsupported, which no broker answers now"
    )]
    pub fn kind(&self) -> &'static str {
        match self {
            Broker::Kafka { .. } => "Kafka",
            Broker::Redis { .. } => "Redis",
            Broker::Amqp { .. } => "RabbitMQ",
            Broker::Nats { .. } => "NATS",
        }
    }

    /// The URL as printed: without passwords (nor, for NATS, tokens).
    pub fn endpoint(&self) -> String {
        match self {
            Broker::Kafka { bootstrap, .. } => format!("kafka://{bootstrap}"),
            Broker::Redis { url } | Broker::Amqp { url } => redact::url(url),
            // A NATS URL's lone user info is a token, which the generic
            // redaction would show as a user name.
            Broker::Nats { url } => redact_nats_style(url),
        }
    }
}

/// lapin reads an empty path as the vhost "", which RabbitMQ does not have;
/// an AMQP URL without a vhost means "/".
fn with_default_vhost(url: &str) -> String {
    let authority_start = url.find("://").map_or(0, |at| at + 3);
    let authority_end = url[authority_start..]
        .find('/')
        .map(|at| at + authority_start);
    match authority_end {
        None => format!("{url}/%2f"),
        Some(slash) if url[slash + 1..].is_empty() => format!("{url}%2f"),
        Some(_) => url.to_owned(),
    }
}

/// `url` with each address's whole user info (up to its last `@`)
/// replaced, whatever it holds; then the generic redaction for secret
/// query parameters.
fn redact_nats_style(url: &str) -> String {
    let hidden = url
        .split(',')
        .map(|address| {
            let start = address.find("://").map_or(0, |at| at + 3);
            match address[start..].rfind('@') {
                Some(at) => format!(
                    "{}{}@{}",
                    &address[..start],
                    redact::REDACTED,
                    &address[start + at + 1..]
                ),
                None => address.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",");
    redact::url(&hidden)
}

/// Credentials in a NATS URL, which async-nats does not read from it.
#[derive(Clone, PartialEq, Eq)]
pub enum NatsCredentials {
    /// `nats://token@host`.
    Token(String),
    /// `nats://user:password@host`.
    UserPassword(String, String),
}

impl std::fmt::Debug for NatsCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NatsCredentials::Token(_) => f.write_str("Token(***)"),
            NatsCredentials::UserPassword(user, _) => write!(f, "UserPassword({user}, ***)"),
        }
    }
}

/// A NATS URL split into its addresses (without credentials) and the
/// credentials of the first address that has any.
pub fn nats_addresses(url: &str) -> Result<(Vec<String>, Option<NatsCredentials>), Failure> {
    let mut addresses = Vec::new();
    let mut credentials = None;
    for address in url.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        let parsed = url::Url::parse(address).map_err(|error| {
            Failure::Usage(format!(
                "--broker {}: not a NATS URL ({error})",
                redact_nats_style(address)
            ))
        })?;
        let decode = |text: &str| percent_decode_str(text).decode_utf8_lossy().into_owned();
        if credentials.is_none() && !parsed.username().is_empty() {
            let user = decode(parsed.username());
            credentials = Some(match parsed.password() {
                Some(password) => NatsCredentials::UserPassword(user, decode(password)),
                None => NatsCredentials::Token(user),
            });
        }
        let host = parsed.host_str().ok_or_else(|| {
            Failure::Usage(format!(
                "--broker {}: a NATS URL needs a host",
                redact_nats_style(address)
            ))
        })?;
        let port = parsed.port().unwrap_or(4222);
        addresses.push(format!("{}://{host}:{port}", parsed.scheme()));
    }
    if addresses.is_empty() {
        return Err(Failure::Usage(
            "--broker nats:// needs HOST:PORT".to_owned(),
        ));
    }
    Ok((addresses, credentials))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scheme_names_its_broker() {
        assert_eq!(
            Broker::parse("kafka://127.0.0.1:9092/").unwrap(),
            Broker::Kafka {
                bootstrap: "127.0.0.1:9092".to_owned(),
                settings: Vec::new(),
            }
        );
        assert!(matches!(
            Broker::parse("redis://127.0.0.1:6379/0").unwrap(),
            Broker::Redis { .. }
        ));
        assert!(matches!(
            Broker::parse("rediss://h").unwrap(),
            Broker::Redis { .. }
        ));
        assert!(matches!(
            Broker::parse("nats://127.0.0.1:4222").unwrap(),
            Broker::Nats { .. }
        ));
        assert!(matches!(
            Broker::parse("tls://h:4222").unwrap(),
            Broker::Nats { .. }
        ));
    }

    #[test]
    fn an_amqp_url_without_vhost_means_the_default_one() {
        for (given, meant) in [
            ("amqp://guest:guest@h:5672", "amqp://guest:guest@h:5672/%2f"),
            (
                "amqp://guest:guest@h:5672/",
                "amqp://guest:guest@h:5672/%2f",
            ),
            ("amqp://h/orders", "amqp://h/orders"),
        ] {
            assert_eq!(
                Broker::parse(given).unwrap(),
                Broker::Amqp {
                    url: meant.to_owned()
                }
            );
        }
    }

    #[test]
    fn unknown_schemes_and_empty_kafka_are_usage_errors() {
        for bad in [
            "http://h",
            "kafka://",
            "127.0.0.1:9092",
            "",
            "kafka://u:p@h:9092",
        ] {
            assert!(
                matches!(Broker::parse(bad), Err(Failure::Usage(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn no_password_or_token_is_ever_shown() {
        for (url, shown) in [
            ("amqp://app:s3cret@h:5672/%2f", "amqp://app:***@h:5672/%2f"),
            ("redis://:s3cret@h:6379", "redis://:***@h:6379"),
            ("nats://s3cret@h:4222", "nats://***@h:4222"),
            (
                "nats://u:s3cret@a:4222,nats://b:4222",
                "nats://***@a:4222,nats://b:4222",
            ),
        ] {
            let broker = Broker::parse(url).unwrap();
            assert_eq!(broker.endpoint(), shown);
            assert!(!format!("{broker:?}").contains("s3cret"));
        }
        let Err(error) = Broker::parse("amqp://app:12/s3cret@h") else {
            panic!("an ambiguous password must be refused");
        };
        assert!(!error.to_string().contains("s3cret"), "{error}");
    }

    #[test]
    fn nats_credentials_come_out_of_the_url() {
        let (addresses, credentials) = nats_addresses("nats://app:p%40ss@a:4223,nats://b").unwrap();
        assert_eq!(addresses, ["nats://a:4223", "nats://b:4222"]);
        assert_eq!(
            credentials,
            Some(NatsCredentials::UserPassword(
                "app".to_owned(),
                "p@ss".to_owned()
            ))
        );
        let (_, token) = nats_addresses("nats://t0ken@a").unwrap();
        assert_eq!(token, Some(NatsCredentials::Token("t0ken".to_owned())));
        assert!(!format!("{token:?}").contains("t0ken"));
    }
}
