//! What can go wrong talking to NATS JetStream, in terms a user can act on.
//!
//! One enum, [`Error`], for the source, the acker and the dead-letter sink.
//! Following hyper's rule, a variant's `Display` says what went wrong at
//! this level and what to do; the client's own error is its
//! [`source`](std::error::Error::source), never part of the text.

use intake_core::{
    BoxError, ConfigError,
    backend::{AckError, DeadLetterError, SourceError},
};

/// A NATS JetStream failure, classified.
///
/// Endpoints in these errors never carry a password, token or nkey seed
/// (see [`Error::endpoint`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The URL could not be parsed.
    #[error("invalid NATS URL `{url}`: {reason}")]
    InvalidUrl {
        /// The URL as given, credentials replaced by `***`.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A setting of a builder cannot work.
    #[error("invalid setting")]
    Config(#[from] ConfigError),
    /// The credentials could not be read (a creds file that is missing or
    /// malformed, an nkey seed that is not one).
    #[error("cannot use the NATS credentials {what}; check the file or seed")]
    Credentials {
        /// Which credentials (a creds file's path; never a secret).
        what: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// No server answered at the address (refused, timed out, closed).
    /// Passes when the server comes back.
    #[error(
        "cannot reach the NATS server at {endpoint}; check the host and port in the URL and that nats-server is running"
    )]
    Unreachable {
        /// The server (without credentials).
        endpoint: String,
        /// The client's failure.
        #[source]
        source: BoxError,
    },
    /// The TLS handshake failed: the server's certificate is not signed by
    /// a trusted CA or is for another host name, the server requires TLS
    /// and the client did not offer it, or the reverse. Retrying does not
    /// help.
    #[error(
        "TLS with the NATS server at {endpoint} failed; check the CA given to `Tls::ca_file`, the host name in the URL, and whether the server requires TLS (`tls://` or `Tls::require`)"
    )]
    Tls {
        /// The server (without credentials).
        endpoint: String,
        /// The client's failure.
        #[source]
        source: BoxError,
    },
    /// The server refused the credentials. Retrying does not help.
    #[error(
        "the NATS server at {endpoint} refused the credentials; check the token, user and password, nkey or creds file"
    )]
    Unauthorized {
        /// The server (without credentials).
        endpoint: String,
        /// The server's answer.
        #[source]
        source: BoxError,
    },
    /// The stream does not exist and the source was not asked to create it.
    #[error(
        "stream `{stream}` does not exist on {endpoint}; create it, or have the source create it with `.create_stream(subjects)`"
    )]
    StreamNotFound {
        /// The server (without credentials).
        endpoint: String,
        /// The stream.
        stream: String,
    },
    /// The consumer was deleted while the source consumed it (the server
    /// said `409 Consumer Deleted`, or nobody answers on its subjects).
    #[error(
        "consumer `{consumer}` of stream `{stream}` on {endpoint} is gone; it was deleted under the running source: build the source again to create it"
    )]
    ConsumerDeleted {
        /// The server (without credentials).
        endpoint: String,
        /// The stream.
        stream: String,
        /// The consumer.
        consumer: String,
    },
    /// The server answered a JetStream API request with an error: a
    /// setting it refuses, a missing permission, JetStream disabled or
    /// unavailable for now (`is_transient` tells).
    #[error("the NATS server at {endpoint} refused to {operation}")]
    JetStream {
        /// The server (without credentials).
        endpoint: String,
        /// What was asked (`create stream \`orders\``).
        operation: String,
        /// Whether the server's answer is one that passes (JetStream not
        /// ready, a timeout), so asking again later may succeed.
        transient: bool,
        /// The server's answer.
        #[source]
        source: BoxError,
    },
    /// The server did not confirm within the time given to it (an ack
    /// batch, a dead-letter publish, a pull request); nothing is assumed
    /// done, so the work is sent again.
    #[error("the NATS server at {endpoint} did not confirm {what} within {waited:?}")]
    Unconfirmed {
        /// The server (without credentials).
        endpoint: String,
        /// What was waited for.
        what: String,
        /// How long.
        waited: std::time::Duration,
    },
    /// The connection is gone and the client could not send.
    #[error("the connection to the NATS server at {endpoint} is lost; the client reconnects")]
    Disconnected {
        /// The server (without credentials).
        endpoint: String,
        /// The client's failure.
        #[source]
        source: BoxError,
    },
    /// The source's reconnect backoff gave up.
    #[error(
        "gave up reconnecting to the NATS server at {endpoint} after {attempts} attempts (the reconnect backoff's cap)"
    )]
    GaveUp {
        /// The server (without credentials).
        endpoint: String,
        /// Attempts made.
        attempts: usize,
    },
    /// The dead-letter destination is a subject the consumed stream itself
    /// stores: every letter would be consumed again.
    #[error(
        "dead-letter subject `{subject}` is stored by stream `{stream}`, which the source consumes; choose a subject of another stream"
    )]
    DeadLetterLoop {
        /// The dead-letter subject.
        subject: String,
        /// The consumed stream.
        stream: String,
    },
}

impl Error {
    /// Whether the failure may pass by itself, so that retrying after a
    /// backoff may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Unreachable { .. } | Error::Unconfirmed { .. } | Error::Disconnected { .. } => {
                true
            }
            Error::JetStream { transient, .. } => *transient,
            Error::InvalidUrl { .. }
            | Error::Config(_)
            | Error::Credentials { .. }
            | Error::Tls { .. }
            | Error::Unauthorized { .. }
            | Error::StreamNotFound { .. }
            | Error::ConsumerDeleted { .. }
            | Error::GaveUp { .. }
            | Error::DeadLetterLoop { .. } => false,
        }
    }

    /// The server the failure concerns, credentials already removed.
    pub fn endpoint(&self) -> Option<&str> {
        match self {
            Error::Unreachable { endpoint, .. }
            | Error::Tls { endpoint, .. }
            | Error::Unauthorized { endpoint, .. }
            | Error::StreamNotFound { endpoint, .. }
            | Error::ConsumerDeleted { endpoint, .. }
            | Error::JetStream { endpoint, .. }
            | Error::Unconfirmed { endpoint, .. }
            | Error::Disconnected { endpoint, .. }
            | Error::GaveUp { endpoint, .. } => Some(endpoint),
            Error::InvalidUrl { .. }
            | Error::Config(_)
            | Error::Credentials { .. }
            | Error::DeadLetterLoop { .. } => None,
        }
    }
}

impl From<Error> for SourceError {
    fn from(error: Error) -> Self {
        match error {
            Error::Unreachable { ref endpoint, .. } => SourceError::Unreachable {
                endpoint: endpoint.clone(),
                source: Box::new(error),
            },
            Error::Unauthorized { ref endpoint, .. } => SourceError::Unauthorized {
                endpoint: endpoint.clone(),
                source: Box::new(error),
            },
            Error::StreamNotFound { ref stream, .. } => SourceError::NotFound {
                kind: "stream",
                name: stream.clone(),
                hint: "create it, or have the source create it with `.create_stream(subjects)`"
                    .to_owned(),
            },
            Error::InvalidUrl { .. } | Error::Config(_) | Error::DeadLetterLoop { .. } => {
                SourceError::Config(error.to_string())
            }
            error if error.is_transient() => SourceError::Transient(Box::new(error)),
            error => SourceError::Fatal(Box::new(error)),
        }
    }
}

impl From<Error> for AckError {
    fn from(error: Error) -> Self {
        match error {
            Error::Unconfirmed { .. } | Error::Disconnected { .. } | Error::Unreachable { .. } => {
                AckError::Disconnected(Box::new(error))
            }
            error => AckError::Broker(Box::new(error)),
        }
    }
}

impl From<Error> for DeadLetterError {
    fn from(error: Error) -> Self {
        DeadLetterError(Box::new(error))
    }
}

/// Turns a client error into a boxed one for a variant's `source`.
pub(crate) fn boxed(error: impl std::error::Error + Send + Sync + 'static) -> BoxError {
    Box::new(error)
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn display_describes_this_level_only_and_the_cause_is_the_source() {
        let error = Error::Unreachable {
            endpoint: "nats://127.0.0.1:4222".into(),
            source: "connection refused (os error 111)".into(),
        };
        let text = error.to_string();
        assert!(!text.contains("refused (os error"), "{text}");
        assert!(text.contains("nats://127.0.0.1:4222"), "{text}");
        assert_eq!(
            error.source().map(ToString::to_string).as_deref(),
            Some("connection refused (os error 111)")
        );
        assert!(error.is_transient());
        assert_eq!(error.endpoint(), Some("nats://127.0.0.1:4222"));
    }

    #[test]
    fn refused_credentials_stop_the_consumer_and_an_outage_does_not() {
        let unauthorized = SourceError::from(Error::Unauthorized {
            endpoint: "nats://h:4222".into(),
            source: "authorization violation".into(),
        });
        assert!(!unauthorized.is_transient());
        let unreachable = SourceError::from(Error::Unreachable {
            endpoint: "nats://h:4222".into(),
            source: "refused".into(),
        });
        assert!(unreachable.is_transient());
        let unconfirmed = SourceError::from(Error::Unconfirmed {
            endpoint: "nats://h:4222".into(),
            what: "a pull request".into(),
            waited: std::time::Duration::from_secs(5),
        });
        assert!(unconfirmed.is_transient());
    }
}
