//! Why a Kafka source or dead-letter sink could not be built.

use std::time::Duration;

use intake_core::SourceError;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::settings::is_secret;

/// A Kafka client that could not be built or connected. Each variant says
/// what to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// A setting is missing, unknown to librdkafka, or conflicts with how
    /// intake consumes.
    #[error("invalid Kafka setting `{setting}`: {problem}")]
    Config {
        /// The setting at fault.
        setting: String,
        /// What is wrong and what to do instead (never a secret's value).
        problem: String,
    },
    /// No broker answered within the connect timeout.
    #[error(
        "no Kafka broker answered at {brokers} within {waited:?} ({reason}); check `bootstrap.servers` and that the broker runs and is reachable"
    )]
    Unreachable {
        /// The configured brokers.
        brokers: String,
        /// How long the source waited.
        waited: Duration,
        /// librdkafka's last error.
        reason: String,
    },
    /// A topic does not exist.
    #[error(
        "topic `{topic}` does not exist on {brokers}; create it before consuming (intake does not create source topics)"
    )]
    UnknownTopic {
        /// The missing topic.
        topic: String,
        /// The configured brokers.
        brokers: String,
    },
    /// The broker refused the credentials or the client's certificate.
    #[error(
        "the Kafka broker at {brokers} refused the credentials ({reason}); check the `sasl.*` and `ssl.*` settings"
    )]
    Unauthorized {
        /// The configured brokers.
        brokers: String,
        /// The broker's answer.
        reason: String,
    },
    /// The TLS handshake with the brokers failed: the client did not trust
    /// the broker's certificate, or the broker refused the client's.
    #[error(
        "the TLS handshake with the Kafka broker at {brokers} failed ({reason}); check `ssl.ca.location` (the CA that signed the broker's certificate), the broker's host name in `bootstrap.servers`, and the client certificate settings (`ssl.certificate.location`, `ssl.key.location`)"
    )]
    Tls {
        /// The configured brokers.
        brokers: String,
        /// librdkafka's account of the handshake (never a secret).
        reason: String,
    },
    /// A thread for the blocking Kafka client could not run.
    #[error("cannot run the kafka client's thread: {0}")]
    Spawn(#[source] std::io::Error),
    /// Any other failure of the Kafka client.
    #[error("the Kafka client failed: {0}")]
    Client(#[source] KafkaError),
}

impl ConnectError {
    /// Classifies an rdkafka error from creating a client or fetching
    /// metadata. Values of secret settings never reach the message.
    pub(crate) fn from_kafka(error: KafkaError, brokers: &str, waited: Duration) -> Self {
        match error {
            KafkaError::ClientConfig(_, description, key, value) => {
                let problem = if is_secret(&key) {
                    // librdkafka quotes a refused value in some messages.
                    match value.is_empty() {
                        true => description,
                        false => description.replace(&value, "<redacted>"),
                    }
                } else {
                    format!("{description} (value `{value}`)")
                };
                ConnectError::Config {
                    setting: key,
                    problem,
                }
            }
            KafkaError::ClientCreation(reason) => ConnectError::Config {
                setting: "(client)".into(),
                problem: reason,
            },
            KafkaError::MetadataFetch(code) | KafkaError::Global(code) if is_unreachable(code) => {
                ConnectError::Unreachable {
                    brokers: brokers.into(),
                    waited,
                    reason: code.to_string(),
                }
            }
            KafkaError::MetadataFetch(code) | KafkaError::Global(code)
                if is_not_authorized(code) =>
            {
                ConnectError::Unauthorized {
                    brokers: brokers.into(),
                    reason: code.to_string(),
                }
            }
            KafkaError::MetadataFetch(code) | KafkaError::Global(code) => {
                match ConnectionFailure::of(code) {
                    Some(failure) => failure.into_connect_error(brokers, code.to_string()),
                    None => ConnectError::Client(error),
                }
            }
            other => ConnectError::Client(other),
        }
    }
}

/// Error codes that mean no broker could be reached.
pub(crate) fn is_unreachable(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::OperationTimedOut
            | RDKafkaErrorCode::AllBrokersDown
            | RDKafkaErrorCode::BrokerTransportFailure
            | RDKafkaErrorCode::Resolve
            | RDKafkaErrorCode::RequestTimedOut
    )
}

/// What a failed connection to the brokers was, by librdkafka's account.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConnectionFailure {
    /// The TLS handshake failed (`_SSL`).
    Tls,
    /// The broker refused the credentials (`_AUTHENTICATION`, SASL).
    Authentication,
}

impl ConnectionFailure {
    /// The failure an error code of librdkafka's error callback means, if
    /// it is about the client's credentials or certificates.
    pub(crate) fn of(code: RDKafkaErrorCode) -> Option<Self> {
        match code {
            RDKafkaErrorCode::SSL => Some(Self::Tls),
            RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed => {
                Some(Self::Authentication)
            }
            _ => None,
        }
    }

    /// The build error for this failure.
    pub(crate) fn into_connect_error(self, brokers: &str, reason: String) -> ConnectError {
        let brokers = brokers.to_owned();
        match self {
            Self::Tls => ConnectError::Tls { brokers, reason },
            Self::Authentication => ConnectError::Unauthorized { brokers, reason },
        }
    }
}

/// Error codes that mean the broker refused this client an operation (its
/// ACLs): nothing passes until someone grants it.
pub(crate) fn is_not_authorized(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::GroupAuthorizationFailed
            | RDKafkaErrorCode::ClusterAuthorizationFailed
    )
}

impl From<ConnectError> for SourceError {
    fn from(error: ConnectError) -> Self {
        match error {
            ConnectError::Config { .. } => SourceError::Config(error.to_string()),
            ConnectError::Unreachable { ref brokers, .. } => SourceError::Unreachable {
                endpoint: brokers.clone(),
                source: Box::new(error),
            },
            ConnectError::UnknownTopic { topic, brokers } => SourceError::NotFound {
                kind: "topic",
                name: topic,
                hint: format!("create it on {brokers} before consuming"),
            },
            ConnectError::Unauthorized { ref brokers, .. }
            | ConnectError::Tls { ref brokers, .. } => SourceError::Unauthorized {
                endpoint: brokers.clone(),
                source: Box::new(error),
            },
            ConnectError::Spawn(error) => SourceError::Fatal(Box::new(error)),
            ConnectError::Client(error) => SourceError::Fatal(Box::new(error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::types::RDKafkaConfRes;

    use super::*;

    #[test]
    fn a_bad_secret_setting_names_the_setting_but_not_the_value() {
        let error = ConnectError::from_kafka(
            KafkaError::ClientConfig(
                RDKafkaConfRes::RD_KAFKA_CONF_INVALID,
                "Invalid value".into(),
                "ssl.key.pem".into(),
                "-----BEGIN PRIVATE KEY----- s3cret".into(),
            ),
            "b:9092",
            Duration::ZERO,
        );
        let shown = format!("{error} {error:?}");
        assert!(shown.contains("ssl.key.pem"));
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn a_metadata_timeout_means_unreachable() {
        let error = ConnectError::from_kafka(
            KafkaError::MetadataFetch(RDKafkaErrorCode::OperationTimedOut),
            "b:9092",
            Duration::from_secs(5),
        );
        assert!(matches!(error, ConnectError::Unreachable { .. }));
        assert!(SourceError::from(error).is_transient());
    }
}
