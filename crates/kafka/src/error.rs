//! [`Error`]: why a Kafka source or dead-letter sink could not be built, or
//! a dead letter not written.

use std::time::Duration;

use intake_core::{
    BoxError,
    backend::{DeadLetterError, SourceError},
};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::settings::{GroupProtocol, is_secret};

/// Everything this crate reports: a client that could not be built or
/// connected, and a dead letter that could not be written. Each variant
/// says what to fix; the client's own error, where there is one, is its
/// [`source`](std::error::Error::source), never part of its `Display`
/// (boxed: librdkafka's error is large, and this one is returned often).
///
/// The brokers a variant names (see [`endpoint`](Error::endpoint)) are
/// `bootstrap.servers` with any credentials hidden; no variant shows the
/// value of a secret setting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting is missing, unknown to librdkafka, or conflicts with how
    /// intake consumes.
    #[error("invalid Kafka setting `{setting}`: {problem}")]
    Config {
        /// The setting at fault.
        setting: String,
        /// What is wrong and what to do instead (never a secret's value).
        problem: String,
    },
    /// A setting the chosen consumer group protocol does not take: under
    /// [`GroupProtocol::Consumer`] (KIP-848) the broker keeps the session,
    /// the heartbeat and the assignment, so librdkafka refuses
    /// `session.timeout.ms`, `heartbeat.interval.ms`,
    /// `partition.assignment.strategy` and `group.protocol.type`; under
    /// [`GroupProtocol::Classic`] intake refuses `group.remote.assignor`,
    /// which only the broker's assignment reads.
    #[error("Kafka setting `{setting}` cannot be used with group.protocol={protocol}: {fix}")]
    GroupProtocolSetting {
        /// The setting at fault.
        setting: String,
        /// The protocol chosen (`group.protocol`).
        protocol: GroupProtocol,
        /// What to do instead.
        fix: &'static str,
    },
    /// No broker answered within the connect timeout.
    #[error(
        "no Kafka broker answered at {brokers} within {waited:?}; check `bootstrap.servers` and that the broker runs and is reachable"
    )]
    Unreachable {
        /// The configured brokers.
        brokers: String,
        /// How long the client waited.
        waited: Duration,
        /// librdkafka's last error.
        source: Box<KafkaError>,
    },
    /// A topic to consume does not exist.
    #[error(
        "topic `{topic}` does not exist on {brokers}; create it before consuming (intake does not create source topics)"
    )]
    UnknownTopic {
        /// The missing topic.
        topic: String,
        /// The configured brokers.
        brokers: String,
    },
    /// The broker refused the credentials, or this client an operation (its
    /// ACLs).
    #[error(
        "the Kafka broker at {brokers} refused the credentials or the operation; check the `sasl.*` and `ssl.*` settings and the ACLs of this client's user"
    )]
    Unauthorized {
        /// The configured brokers.
        brokers: String,
        /// The broker's answer, by librdkafka's account (never a secret).
        source: BoxError,
    },
    /// The TLS handshake with the brokers failed: the client did not trust
    /// the broker's certificate, or the broker refused the client's.
    #[error(
        "the TLS handshake with the Kafka broker at {brokers} failed; check `ssl.ca.location` (the CA that signed the broker's certificate), the broker's host name in `bootstrap.servers`, and the client certificate settings (`ssl.certificate.location`, `ssl.key.location`)"
    )]
    Tls {
        /// The configured brokers.
        brokers: String,
        /// librdkafka's account of the handshake (never a secret).
        source: BoxError,
    },
    /// A thread for the blocking Kafka client could not start.
    #[error(
        "cannot start a thread for the Kafka client; the process may have run out of threads or memory"
    )]
    Spawn(#[source] std::io::Error),
    /// Any other failure of the Kafka client.
    #[error("the Kafka client for {brokers} failed")]
    Client {
        /// The configured brokers.
        brokers: String,
        /// The client's error.
        source: Box<KafkaError>,
    },
    /// The dead-letter topic does not exist and the sink may not create it.
    #[error(
        "dead-letter topic `{topic}` does not exist on {brokers}; create it, or let the sink create it (`create_missing_topics(true)`)"
    )]
    DeadLetterTopicMissing {
        /// The dead-letter topic.
        topic: String,
        /// The configured brokers.
        brokers: String,
    },
    /// The dead-letter topic does not exist and creating it failed.
    #[error(
        "dead-letter topic `{topic}` does not exist on {brokers} and creating it failed; create it by hand or allow this client to create topics"
    )]
    DeadLetterTopicNotCreated {
        /// The dead-letter topic.
        topic: String,
        /// The configured brokers.
        brokers: String,
        /// The broker's or client's answer.
        source: Box<KafkaError>,
    },
    /// The brokers did not say whether the dead-letter topic exists.
    #[error("cannot look up dead-letter topic `{topic}` on {brokers}")]
    DeadLetterTopicLookup {
        /// The dead-letter topic.
        topic: String,
        /// The configured brokers.
        brokers: String,
        /// The client's error.
        source: Box<KafkaError>,
    },
    /// A dead letter would go to the topic its message came from, and be
    /// consumed again, in a loop.
    #[error(
        "the dead-letter topic `{topic}` is the topic the message came from: it would be consumed again, in a loop; give the sink a topic of its own (`topic_template`)"
    )]
    DeadLetterTopicIsSource {
        /// The topic.
        topic: String,
    },
    /// A dead letter larger than the producer's `message.max.bytes` or the
    /// topic's `max.message.bytes`: it can never be written as it is.
    #[error(
        "the dead letter is larger than `{topic}` on {brokers} takes (the producer's `message.max.bytes` or the topic's `max.message.bytes`)"
    )]
    DeadLetterTooLarge {
        /// The dead-letter topic.
        topic: String,
        /// The configured brokers.
        brokers: String,
        /// The client's error.
        source: Box<KafkaError>,
    },
    /// The broker did not confirm a dead letter within the delivery timeout,
    /// or refused it.
    #[error("producing the dead letter to `{topic}` on {brokers} failed")]
    DeadLetterWrite {
        /// The dead-letter topic.
        topic: String,
        /// The configured brokers.
        brokers: String,
        /// The producer's error.
        source: Box<KafkaError>,
    },
}

impl Error {
    /// Whether trying again later, unchanged, may succeed: no broker
    /// answered, or a dead-letter topic could not be looked up, created or
    /// written for a reason that passes (a timeout, a lost connection).
    /// Settings, credentials, a missing source topic and a letter too large
    /// stay as they are until someone changes them.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Unreachable { .. } => true,
            Error::DeadLetterTopicLookup { source, .. }
            | Error::DeadLetterTopicNotCreated { source, .. }
            | Error::DeadLetterWrite { source, .. } => passes(source),
            Error::Config { .. }
            | Error::GroupProtocolSetting { .. }
            | Error::UnknownTopic { .. }
            | Error::Unauthorized { .. }
            | Error::Tls { .. }
            | Error::Spawn(_)
            | Error::Client { .. }
            | Error::DeadLetterTopicMissing { .. }
            | Error::DeadLetterTopicIsSource { .. }
            | Error::DeadLetterTooLarge { .. } => false,
        }
    }

    /// The brokers the error is about (`bootstrap.servers`, credentials
    /// hidden through [`intake_core::redact::url`]), when it is about
    /// brokers.
    pub fn endpoint(&self) -> Option<&str> {
        match self {
            Error::Unreachable { brokers, .. }
            | Error::UnknownTopic { brokers, .. }
            | Error::Unauthorized { brokers, .. }
            | Error::Tls { brokers, .. }
            | Error::Client { brokers, .. }
            | Error::DeadLetterTopicMissing { brokers, .. }
            | Error::DeadLetterTopicNotCreated { brokers, .. }
            | Error::DeadLetterTopicLookup { brokers, .. }
            | Error::DeadLetterTooLarge { brokers, .. }
            | Error::DeadLetterWrite { brokers, .. } => Some(brokers),
            Error::Config { .. }
            | Error::GroupProtocolSetting { .. }
            | Error::Spawn(_)
            | Error::DeadLetterTopicIsSource { .. } => None,
        }
    }

    /// A setting that cannot work.
    pub(crate) fn config(setting: &str, problem: impl Into<String>) -> Self {
        Error::Config {
            setting: setting.into(),
            problem: problem.into(),
        }
    }

    /// Classifies an rdkafka error from creating a client or fetching
    /// metadata. Values of secret settings never reach the error: a
    /// configuration error is rewritten, not kept as the source.
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
                Error::Config {
                    setting: key,
                    problem,
                }
            }
            KafkaError::ClientCreation(reason) => match GroupProtocol::refusal(&reason) {
                // librdkafka's own guard, met by a consumer whose settings
                // intake did not check first (a parking's mover, a
                // dead-letter store's reader).
                Some(refused) => refused,
                None => Error::Config {
                    setting: "(client)".into(),
                    problem: reason,
                },
            },
            KafkaError::MetadataFetch(code) | KafkaError::Global(code) if is_unreachable(code) => {
                Error::Unreachable {
                    brokers: brokers.into(),
                    waited,
                    source: Box::new(error),
                }
            }
            KafkaError::MetadataFetch(code) | KafkaError::Global(code)
                if is_not_authorized(code) =>
            {
                Error::Unauthorized {
                    brokers: brokers.into(),
                    source: Box::new(error),
                }
            }
            KafkaError::MetadataFetch(code) | KafkaError::Global(code) => {
                match ConnectionFailure::of(code) {
                    Some(failure) => failure.into_error(brokers, Box::new(error)),
                    None => Error::Client {
                        brokers: brokers.into(),
                        source: Box::new(error),
                    },
                }
            }
            other => Error::Client {
                brokers: brokers.into(),
                source: Box::new(other),
            },
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

/// Whether a request that failed with `error` may succeed when sent again
/// unchanged: anything but a client that could not be made, a refusal of
/// this client's rights, or a request the broker finds invalid.
pub(crate) fn passes(error: &KafkaError) -> bool {
    let code = match error {
        KafkaError::ClientConfig(..)
        | KafkaError::ClientCreation(_)
        | KafkaError::AdminOpCreation(_) => return false,
        // rdkafka does not report the code of a failed admin operation.
        KafkaError::AdminOp(code) => Some(*code),
        other => other.rdkafka_error_code(),
    };
    !code.is_some_and(|code| is_not_authorized(code) || is_permanent(code))
}

/// Error codes of a request that will fail the same way every time.
fn is_permanent(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::InvalidTopic
            | RDKafkaErrorCode::InvalidPartitions
            | RDKafkaErrorCode::InvalidReplicationFactor
            | RDKafkaErrorCode::InvalidConfig
            | RDKafkaErrorCode::PolicyViolation
            | RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidRecord
            | RDKafkaErrorCode::UnsupportedVersion
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

    /// The error for this failure, with librdkafka's account as its cause.
    pub(crate) fn into_error(self, brokers: &str, account: BoxError) -> Error {
        let brokers = brokers.to_owned();
        match self {
            Self::Tls => Error::Tls {
                brokers,
                source: account,
            },
            Self::Authentication => Error::Unauthorized {
                brokers,
                source: account,
            },
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

impl From<Error> for SourceError {
    fn from(error: Error) -> Self {
        match error {
            Error::Config { .. } | Error::GroupProtocolSetting { .. } => {
                SourceError::Config(error.to_string())
            }
            Error::Unreachable { ref brokers, .. } => SourceError::Unreachable {
                endpoint: brokers.clone(),
                source: Box::new(error),
            },
            Error::UnknownTopic { topic, brokers } => SourceError::NotFound {
                kind: "topic",
                name: topic,
                hint: format!("create it on {brokers} before consuming"),
            },
            Error::Unauthorized { ref brokers, .. } | Error::Tls { ref brokers, .. } => {
                SourceError::Unauthorized {
                    endpoint: brokers.clone(),
                    source: Box::new(error),
                }
            }
            error if error.is_transient() => SourceError::Transient(Box::new(error)),
            error => SourceError::Fatal(Box::new(error)),
        }
    }
}

impl From<Error> for DeadLetterError {
    /// A letter too large for its topic is [rejected](DeadLetterError::rejected):
    /// the dead-letter layer writes its reference at once instead of trying
    /// a write that fails the same way every time.
    fn from(error: Error) -> Self {
        match error {
            Error::DeadLetterTooLarge { .. } => DeadLetterError::rejected(error),
            error => DeadLetterError(Box::new(error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::types::RDKafkaConfRes;

    use super::*;

    #[test]
    fn a_bad_secret_setting_names_the_setting_but_not_the_value() {
        let error = Error::from_kafka(
            KafkaError::ClientConfig(
                RDKafkaConfRes::RD_KAFKA_CONF_INVALID,
                "Invalid value".into(),
                "ssl.key.pem".into(),
                "-----BEGIN PRIVATE KEY----- s3cret".into(),
            ),
            "b:9092",
            Duration::ZERO,
        );
        let shown = format!("{} {error:?}", chain(&error));
        assert!(shown.contains("ssl.key.pem"));
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn a_metadata_timeout_means_unreachable() {
        let error = Error::from_kafka(
            KafkaError::MetadataFetch(RDKafkaErrorCode::OperationTimedOut),
            "b:9092",
            Duration::from_secs(5),
        );
        assert!(matches!(error, Error::Unreachable { .. }));
        assert!(error.is_transient());
        assert_eq!(error.endpoint(), Some("b:9092"));
        assert!(SourceError::from(error).is_transient());
    }

    /// The error and every cause below it, as a log line with the chain
    /// would show them.
    fn chain(error: &dyn std::error::Error) -> String {
        let mut shown = error.to_string();
        let mut cause = error.source();
        while let Some(inner) = cause {
            shown.push_str(" / ");
            shown.push_str(&inner.to_string());
            cause = inner.source();
        }
        shown
    }

    #[test]
    fn no_variant_prints_its_cause_which_is_its_source() {
        let timed_out = Error::from_kafka(
            KafkaError::MetadataFetch(RDKafkaErrorCode::OperationTimedOut),
            "b:9092",
            Duration::from_secs(5),
        );
        let refused = ConnectionFailure::Tls
            .into_error("b:9093", "certificate verify failed (MARKER)".into());
        let failed = Error::from_kafka(
            KafkaError::Subscription("MARKER".into()),
            "b:9092",
            Duration::ZERO,
        );
        for (error, cause) in [
            (timed_out, "Local: Timed out"),
            (refused, "MARKER"),
            (failed, "MARKER"),
        ] {
            let shown = error.to_string();
            assert!(!shown.contains(cause), "{shown}");
            assert!(chain(&error).contains(cause), "{}", chain(&error));
        }
    }

    #[test]
    fn what_passes_by_itself_is_transient_and_what_needs_a_change_is_not() {
        let brokers = || "b:9092".to_owned();
        let topic = || "orders.billing.dlq".to_owned();
        let transient = [
            Error::DeadLetterTopicLookup {
                topic: topic(),
                brokers: brokers(),
                source: Box::new(KafkaError::MetadataFetch(
                    RDKafkaErrorCode::OperationTimedOut,
                )),
            },
            Error::DeadLetterWrite {
                topic: topic(),
                brokers: brokers(),
                source: Box::new(KafkaError::MessageProduction(
                    RDKafkaErrorCode::MessageTimedOut,
                )),
            },
        ];
        for error in transient {
            assert!(error.is_transient(), "{error:?}");
        }
        let lasting = [
            Error::config("group", "set one"),
            Error::DeadLetterTopicNotCreated {
                topic: topic(),
                brokers: brokers(),
                source: Box::new(KafkaError::AdminOp(
                    RDKafkaErrorCode::TopicAuthorizationFailed,
                )),
            },
            Error::DeadLetterTopicNotCreated {
                topic: topic(),
                brokers: brokers(),
                source: Box::new(KafkaError::AdminOp(
                    RDKafkaErrorCode::InvalidReplicationFactor,
                )),
            },
            Error::DeadLetterTopicIsSource { topic: topic() },
        ];
        for error in lasting {
            assert!(!error.is_transient(), "{error:?}");
            assert!(!SourceError::from(error).is_transient());
        }
    }

    #[test]
    fn a_letter_too_large_is_rejected_for_good_and_other_write_failures_are_not() {
        let too_large = DeadLetterError::from(Error::DeadLetterTooLarge {
            topic: "orders.billing.dlq".into(),
            brokers: "b:9092".into(),
            source: Box::new(KafkaError::MessageProduction(
                RDKafkaErrorCode::MessageSizeTooLarge,
            )),
        });
        assert!(too_large.is_rejected());
        let timed_out = DeadLetterError::from(Error::DeadLetterWrite {
            topic: "orders.billing.dlq".into(),
            brokers: "b:9092".into(),
            source: Box::new(KafkaError::MessageProduction(
                RDKafkaErrorCode::MessageTimedOut,
            )),
        });
        assert!(!timed_out.is_rejected());
        assert!(chain(&timed_out).contains("orders.billing.dlq"));
    }
}
