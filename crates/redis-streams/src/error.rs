//! The errors of the Redis Streams backend, and how they map onto intake's
//! [`SourceError`], [`AckError`] and [`DeadLetterError`].
//!
//! Every variant says what to fix. None of them carries a password: the
//! endpoint is always the [redacted](crate::Endpoint) form of the URL.

use intake_core::{AckError, ConfigError, DeadLetterError, SourceError};
use redis::{ErrorKind, RedisError};

use crate::connection::Endpoint;

/// A failure of the Redis Streams backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisStreamsError {
    /// The URL cannot be used.
    #[error(
        "invalid Redis URL: {reason}; expected redis://[user[:password]@]host[:port][/db], \
         or rediss://… for TLS"
    )]
    InvalidUrl {
        /// Why it cannot be used.
        reason: String,
    },
    /// A setting cannot work.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The server could not be reached, or the connection to it was lost.
    #[error(
        "cannot reach Redis at {endpoint}: {source}; check that the server is running and that \
         host and port are right"
    )]
    Unreachable {
        /// Where the backend connects (without password).
        endpoint: Endpoint,
        /// The client's error.
        #[source]
        source: RedisError,
    },
    /// The server refused the user name or password.
    #[error(
        "Redis at {endpoint} refused the credentials: {source}; check the user name and password \
         in the URL"
    )]
    Unauthorized {
        /// Where the backend connects (without password).
        endpoint: Endpoint,
        /// The server's answer.
        #[source]
        source: RedisError,
    },
    /// The ACL user may not run a command the backend needs.
    #[error(
        "the Redis user may not run `{command}` ({source}); grant it the stream commands \
         (for example `+@stream +@scripting +info +client`)"
    )]
    Forbidden {
        /// The refused command.
        command: &'static str,
        /// The server's answer.
        #[source]
        source: RedisError,
    },
    /// A configured key exists and holds something other than a stream.
    #[error(
        "key `{key}` holds a value that is not a stream (WRONGTYPE); configure another stream \
         name or remove that key"
    )]
    WrongType {
        /// The key (or, for a command over several streams, all of them).
        key: String,
        /// The server's answer.
        #[source]
        source: RedisError,
    },
    /// The server is too old for the commands the backend needs.
    #[error(
        "Redis {version} at {endpoint} is too old: the backend needs 6.2 or newer \
         (`XPENDING … IDLE` and exclusive id ranges)"
    )]
    UnsupportedServer {
        /// Where the backend connects (without password).
        endpoint: Endpoint,
        /// The version the server reported.
        version: String,
    },
    /// A command failed for another reason.
    #[error("Redis command `{command}` failed: {source}")]
    Command {
        /// The command.
        command: &'static str,
        /// The server's or client's error.
        #[source]
        source: RedisError,
    },
    /// The server answered in a shape the backend does not understand.
    #[error("unexpected reply to `{command}`: {detail}")]
    UnexpectedReply {
        /// The command.
        command: &'static str,
        /// What was wrong with the reply.
        detail: String,
    },
}

impl RedisStreamsError {
    /// Sorts a client error by what the user can do about it.
    ///
    /// `key` names the stream the command touched, for `WRONGTYPE`.
    pub(crate) fn from_redis(
        error: RedisError,
        command: &'static str,
        key: Option<&str>,
        endpoint: &Endpoint,
    ) -> Self {
        let code = server_code(&error);
        let code = code.as_deref();
        if error.kind() == ErrorKind::AuthenticationFailed
            || matches!(code, Some("WRONGPASS" | "NOAUTH"))
        {
            return Self::Unauthorized {
                endpoint: endpoint.clone(),
                source: error,
            };
        }
        if code == Some("NOPERM") {
            return Self::Forbidden {
                command,
                source: error,
            };
        }
        if code == Some("WRONGTYPE") {
            return Self::WrongType {
                key: key.unwrap_or_default().to_owned(),
                source: error,
            };
        }
        if error.kind() == ErrorKind::InvalidClientConfig {
            return Self::InvalidUrl {
                reason: error.to_string(),
            };
        }
        if error.is_io_error()
            || error.is_connection_refusal()
            || error.is_connection_dropped()
            || error.is_timeout()
            || error.is_unrecoverable_error()
        {
            return Self::Unreachable {
                endpoint: endpoint.clone(),
                source: error,
            };
        }
        Self::Command {
            command,
            source: error,
        }
    }

    /// Whether the group's consumer group or stream vanished (`NOGROUP`):
    /// someone ran `XGROUP DESTROY` or deleted the key.
    pub(crate) fn is_missing_group(&self) -> bool {
        matches!(self, Self::Command { source, .. } if server_code(source).as_deref() == Some("NOGROUP"))
    }

    /// Whether retrying later may succeed: a lost connection, or a server
    /// that refuses for a while ([`TRANSIENT_CODES`]: a failover, a data set
    /// being loaded, a disk that cannot take a snapshot, memory full).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Unreachable { .. } => true,
            Self::Command { source, .. } => {
                server_code(source).is_some_and(|code| TRANSIENT_CODES.contains(&code.as_str()))
            }
            _ => false,
        }
    }
}

/// Error codes of a server that refuses for a while, each retried with
/// backoff rather than stopping the consumer: each clears without a change
/// on the consumer's side.
///
/// - `READONLY`: the server was a master and is a replica now (failover);
///   a new connection reaches the new master where the address follows it.
/// - `MASTERDOWN`, `NOREPLICAS`: a replica lost its master, or a master has
///   too few replicas for `min-replicas-to-write`.
/// - `LOADING`, `BUSY`: the server is loading its data set, or running a
///   long script.
/// - `TRYAGAIN`, `CLUSTERDOWN`: a cluster moving slots or without quorum.
/// - `MISCONF`: the server refuses writes while it cannot save a snapshot
///   (full disk); `OOM`: memory is full until entries are trimmed or
///   evicted. Both need an operator, but on the server, and the consumer
///   goes on by itself once they are fixed.
pub const TRANSIENT_CODES: [&str; 9] = [
    "READONLY",
    "MASTERDOWN",
    "NOREPLICAS",
    "LOADING",
    "BUSY",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "MISCONF",
    "OOM",
];

/// The server's error code (`WRONGTYPE`, `NOGROUP`, …), also when the error
/// came back from a pipeline, where the client keeps it one level down.
pub(crate) fn server_code(error: &RedisError) -> Option<String> {
    if let Some(code) = error.code() {
        return Some(code.to_owned());
    }
    error
        .clone()
        .into_server_errors()
        .and_then(|errors| errors.first().map(|(_, error)| error.code().to_owned()))
}

impl From<RedisStreamsError> for SourceError {
    fn from(error: RedisStreamsError) -> Self {
        match error {
            RedisStreamsError::InvalidUrl { .. } | RedisStreamsError::Config(_) => {
                SourceError::Config(error.to_string())
            }
            RedisStreamsError::Unreachable { endpoint, source } => SourceError::Unreachable {
                endpoint: endpoint.to_string(),
                source: Box::new(source),
            },
            RedisStreamsError::Unauthorized { endpoint, source } => SourceError::Unauthorized {
                endpoint: endpoint.to_string(),
                source: Box::new(source),
            },
            error if error.is_transient() => SourceError::Transient(Box::new(error)),
            error => SourceError::Fatal(Box::new(error)),
        }
    }
}

impl From<RedisStreamsError> for AckError {
    fn from(error: RedisStreamsError) -> Self {
        match error {
            RedisStreamsError::Unreachable { .. } => AckError::Disconnected(Box::new(error)),
            error => AckError::Broker(Box::new(error)),
        }
    }
}

impl From<RedisStreamsError> for DeadLetterError {
    fn from(error: RedisStreamsError) -> Self {
        DeadLetterError(Box::new(error))
    }
}
