//! [`AnyBroker::from_url`]: the backend named by a URL's scheme.

use std::error::Error;
use std::fmt;

use intake_core::error::BoxError;
use intake_core::redact;

use super::AnyBroker;

/// Each scheme [`AnyBroker::from_url`] knows, and the backend (the feature
/// that compiles it in) that speaks it.
const SCHEMES: [(&str, &str); 10] = [
    ("kafka", "kafka"),
    ("kafkas", "kafka"),
    ("redis", "redis"),
    ("rediss", "redis"),
    ("redis+unix", "redis"),
    ("unix", "redis"),
    ("amqp", "amqp"),
    ("amqps", "amqp"),
    ("nats", "nats"),
    ("tls", "nats"),
];

/// The longest scheme an error quotes: a URL's scheme is a short word, and
/// a longer "scheme" is more likely text that was never meant as one.
const MAX_QUOTED_SCHEME: usize = 16;

impl AnyBroker {
    /// The broker at `url`, of the backend its scheme names:
    ///
    /// | scheme | backend | feature |
    /// |---|---|---|
    /// | `kafka://`, `kafkas://` | Apache Kafka (`KafkaBroker::from_url`) | `kafka` |
    /// | `redis://`, `rediss://`, `redis+unix://`, `unix://` | Redis Streams (`RedisBroker::from_url`) | `redis` |
    /// | `amqp://`, `amqps://` | RabbitMQ (`AmqpBroker::from_url`) | `amqp` |
    /// | `nats://`, `tls://` | NATS JetStream (`NatsBroker::from_url`) | `nats` |
    ///
    /// The rest of the URL (credentials, TLS, the backend's settings in its
    /// query) is the backend's to read, as its own `from_url` documents.
    /// Nothing is connected until a part is derived.
    ///
    /// # Errors
    ///
    /// A [`BrokerUrlError`]: no scheme, a scheme no backend speaks, a
    /// backend this build was compiled without (naming the feature to
    /// enable), or the backend's refusal of the URL. No error shows the
    /// URL's credentials.
    pub fn from_url(url: &str) -> Result<Self, BrokerUrlError> {
        let scheme = scheme_of(url)?;
        let &(scheme, feature) = SCHEMES
            .iter()
            .find(|(known, _)| known.eq_ignore_ascii_case(scheme))
            .ok_or_else(|| BrokerUrlError::UnknownScheme {
                scheme: scheme.to_ascii_lowercase(),
            })?;
        match feature {
            #[cfg(feature = "kafka")]
            "kafka" => intake_kafka::KafkaBroker::from_url(url)
                .map(Self::from)
                .map_err(|error| invalid("Kafka", url, error)),
            #[cfg(feature = "redis")]
            "redis" => intake_redis_streams::RedisBroker::from_url(url)
                .map(Self::from)
                .map_err(|error| invalid("Redis", url, error)),
            #[cfg(feature = "amqp")]
            "amqp" => intake_amqp::AmqpBroker::from_url(url)
                .map(Self::from)
                .map_err(|error| invalid("RabbitMQ", url, error)),
            #[cfg(feature = "nats")]
            "nats" => intake_nats::NatsBroker::from_url(url)
                .map(Self::from)
                .map_err(|error| invalid("NATS", url, error)),
            _ => Err(BrokerUrlError::NotCompiled { scheme, feature }),
        }
    }
}

/// The backend's refusal of `url`, the URL shown redacted.
#[cfg_attr(
    not(any(
        feature = "kafka",
        feature = "redis",
        feature = "amqp",
        feature = "nats"
    )),
    allow(dead_code)
)]
fn invalid(backend: &'static str, url: &str, error: impl Into<BoxError>) -> BrokerUrlError {
    BrokerUrlError::Invalid {
        backend,
        url: redact::url(url.trim()),
        source: error.into(),
    }
}

/// The scheme of `url`, the text before its first `://`, when it has the
/// shape of one (RFC 3986: a letter, then letters, digits, `+`, `-`, `.`).
fn scheme_of(url: &str) -> Result<&str, BrokerUrlError> {
    let (scheme, _) = url
        .trim_start()
        .split_once("://")
        .ok_or(BrokerUrlError::NoScheme)?;
    let mut chars = scheme.chars();
    let shaped = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    // Text before `://` that is no scheme (`app:s3cret@host://`) may hold a
    // secret: it is neither quoted nor matched.
    if shaped && scheme.len() <= MAX_QUOTED_SCHEME {
        Ok(scheme)
    } else {
        Err(BrokerUrlError::NoScheme)
    }
}

/// Why [`AnyBroker::from_url`] gave no broker. No variant holds the URL's
/// credentials: a URL is only ever shown through [`redact::url`].
#[derive(Debug)]
#[non_exhaustive]
pub enum BrokerUrlError {
    /// The URL does not start with `scheme://`.
    NoScheme,
    /// No backend speaks the URL's scheme.
    UnknownScheme {
        /// The scheme, lowercase, without `://`.
        scheme: String,
    },
    /// The backend that speaks the scheme is not compiled in: enable its
    /// feature on the `intake` dependency.
    NotCompiled {
        /// The scheme, without `://`.
        scheme: &'static str,
        /// The feature that compiles the backend in.
        feature: &'static str,
    },
    /// The backend refused the URL; its error, the cause, says why.
    Invalid {
        /// The backend: `Kafka`, `Redis`, `RabbitMQ` or `NATS`.
        backend: &'static str,
        /// The URL, its credentials replaced by `***`.
        url: String,
        /// The backend's error.
        source: BoxError,
    },
}

impl fmt::Display for BrokerUrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const KNOWN: &str = "kafka://, kafkas://, redis://, rediss://, redis+unix://, unix://, \
                             amqp://, amqps://, nats:// or tls://";
        match self {
            Self::NoScheme => write!(
                f,
                "the broker URL does not start with a scheme: write {KNOWN}"
            ),
            Self::UnknownScheme { scheme } => write!(
                f,
                "no backend speaks `{scheme}://`: a broker URL starts with {KNOWN}"
            ),
            Self::NotCompiled { scheme, feature } => write!(
                f,
                "`{scheme}://` needs intake's `{feature}` feature, which this build was \
                 compiled without: add it to the intake dependency \
                 (features = [\"{feature}\"], or \"full\" for every backend)"
            ),
            Self::Invalid { backend, url, .. } => {
                write!(f, "`{url}` is not a broker URL {backend} takes")
            }
        }
    }
}

impl Error for BrokerUrlError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            Self::Invalid { source, .. } => Some(&**source),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scheme_is_a_short_word_before_the_separator() {
        assert_eq!(scheme_of("kafka://h:9092").ok(), Some("kafka"));
        assert_eq!(scheme_of("  Redis+Unix:///s").ok(), Some("Redis+Unix"));
        for no_scheme in [
            "127.0.0.1:9092",
            "app:s3cret@host://x",
            "://host",
            "9kafka://host",
            "averyveryverylongscheme://host",
        ] {
            assert!(
                matches!(scheme_of(no_scheme), Err(BrokerUrlError::NoScheme)),
                "{no_scheme}"
            );
        }
    }

    #[test]
    fn every_scheme_names_a_known_feature() {
        for (scheme, feature) in SCHEMES {
            assert!(scheme.len() <= MAX_QUOTED_SCHEME, "{scheme}");
            assert!(
                ["kafka", "redis", "amqp", "nats"].contains(&feature),
                "{feature}"
            );
        }
    }
}
