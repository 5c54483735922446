//! [`Error`]: the failures of the Redis Streams backend, and how they map
//! onto intake's [`SourceError`], [`AckError`] and [`DeadLetterError`].
//!
//! Every variant says what to fix. None of them carries a password: the
//! endpoint is always the [redacted](crate::Endpoint) form of the URL.
//! Following hyper's rule, a variant's `Display` describes its own level
//! only; the client's or server's error beneath it is its
//! [`source`](std::error::Error::source), so a reporter that walks the
//! chain prints each once.

use intake_core::{
    BoxError, ConfigError,
    backend::{AckError, DeadLetterError, SourceError},
};
use redis::{ErrorKind, RedisError};

use crate::endpoint::Endpoint;

/// A failure of the Redis Streams backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The URL cannot be used; the cause says why.
    #[error(
        "invalid Redis URL `{url}`; expected redis://[user[:password]@]host[:port][/db], \
         or rediss://… for TLS"
    )]
    InvalidUrl {
        /// The URL, its secrets replaced by `***`.
        url: String,
        /// What the client (or the check for an ambiguous password) objected
        /// to.
        #[source]
        source: BoxError,
    },
    /// A setting cannot work.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The server could not be reached, or the connection to it was lost.
    #[error(
        "cannot reach Redis at {endpoint}; check that the server is running and that host and \
         port are right"
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
        "Redis at {endpoint} refused the credentials; check the user name and password in the URL"
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
        "the Redis user at {endpoint} may not run `{command}`; grant it the stream commands \
         (for example `+@stream +@scripting +info +client`)"
    )]
    Forbidden {
        /// Where the backend connects (without password).
        endpoint: Endpoint,
        /// The refused command.
        command: &'static str,
        /// The server's answer.
        #[source]
        source: RedisError,
    },
    /// A configured key exists and holds something other than a stream.
    #[error(
        "key `{key}` at {endpoint} holds a value that is not a stream (WRONGTYPE); configure \
         another stream name or remove that key"
    )]
    WrongType {
        /// Where the backend connects (without password).
        endpoint: Endpoint,
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
    /// A command failed for another reason; the cause is the server's or
    /// client's error.
    #[error("Redis command `{command}` failed at {endpoint}")]
    Command {
        /// Where the backend connects (without password).
        endpoint: Endpoint,
        /// The command.
        command: &'static str,
        /// The server's or client's error.
        #[source]
        source: RedisError,
    },
    /// A reference letter (origin and sizes, no payload) was asked for an
    /// entry that does not outlive its acknowledgement: the payload would be
    /// lost while counted as dead-lettered. The entry stays pending.
    #[error(
        "no reference letter of entry {position} of `{stream}` at {endpoint}: {why}, so the \
         letter would point at nothing; the entry stays pending, to be dead-lettered whole later"
    )]
    ReferenceNotWritten {
        /// Where the backend connects (without password).
        endpoint: Endpoint,
        /// The stream of the entry the reference would name.
        stream: String,
        /// Its id.
        position: String,
        /// Why the entry goes away.
        why: &'static str,
    },
    /// A [`RedisBroker`](crate::RedisBroker)'s parts did not stop within
    /// the time [`shutdown`](intake_core::backend::Broker::shutdown) was
    /// given (a runtime too busy to run the parking movers' last poll).
    /// They were told to stop: what is parked stays parked, for the next
    /// instance's mover.
    #[error("{running} parking movers did not stop within {timeout:?}")]
    ShutdownTimedOut {
        /// The time the shutdown was given.
        timeout: std::time::Duration,
        /// The movers not yet stopped when it ran out.
        running: usize,
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

impl Error {
    /// Sorts a client error by what the user can do about it.
    ///
    /// `key` names the stream the command touched, for `WRONGTYPE`.
    pub(crate) fn from_redis(
        error: RedisError,
        command: &'static str,
        key: Option<&str>,
        endpoint: &Endpoint,
    ) -> Self {
        let endpoint = endpoint.clone();
        let code = server_code(&error);
        let code = code.as_deref();
        if error.kind() == ErrorKind::AuthenticationFailed
            || matches!(code, Some("WRONGPASS" | "NOAUTH"))
        {
            return Self::Unauthorized {
                endpoint,
                source: error,
            };
        }
        if code == Some("NOPERM") {
            return Self::Forbidden {
                endpoint,
                command,
                source: error,
            };
        }
        if code == Some("WRONGTYPE") {
            return Self::WrongType {
                endpoint,
                key: key.unwrap_or_default().to_owned(),
                source: error,
            };
        }
        if error.kind() == ErrorKind::InvalidClientConfig {
            return Self::InvalidUrl {
                url: endpoint.to_string(),
                source: Box::new(error),
            };
        }
        if error.is_io_error()
            || error.is_connection_refusal()
            || error.is_connection_dropped()
            || error.is_timeout()
            || error.is_unrecoverable_error()
        {
            return Self::Unreachable {
                endpoint,
                source: error,
            };
        }
        Self::Command {
            endpoint,
            command,
            source: error,
        }
    }

    /// The server this error is about, as `scheme://[user@]host:port/db`
    /// (no password), or `None` for a setting or URL that was refused
    /// before connecting and for a reply the backend could not read.
    pub fn endpoint(&self) -> Option<&str> {
        match self {
            Self::Unreachable { endpoint, .. }
            | Self::Unauthorized { endpoint, .. }
            | Self::Forbidden { endpoint, .. }
            | Self::WrongType { endpoint, .. }
            | Self::UnsupportedServer { endpoint, .. }
            | Self::ReferenceNotWritten { endpoint, .. }
            | Self::Command { endpoint, .. } => Some(endpoint.as_str()),
            Self::InvalidUrl { .. }
            | Self::Config(_)
            | Self::ShutdownTimedOut { .. }
            | Self::UnexpectedReply { .. } => None,
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

impl From<Error> for SourceError {
    fn from(error: Error) -> Self {
        match error {
            // `SourceError::Config` holds text only: the URL's problem
            // goes into it with the cause.
            Error::InvalidUrl { ref source, .. } => {
                SourceError::Config(format!("{error}: {source}"))
            }
            Error::Config(_) => SourceError::Config(error.to_string()),
            Error::Unreachable { endpoint, source } => SourceError::Unreachable {
                endpoint: endpoint.to_string(),
                source: Box::new(source),
            },
            Error::Unauthorized { endpoint, source } => SourceError::Unauthorized {
                endpoint: endpoint.to_string(),
                source: Box::new(source),
            },
            error if error.is_transient() => SourceError::Transient(Box::new(error)),
            error => SourceError::Fatal(Box::new(error)),
        }
    }
}

impl From<Error> for AckError {
    fn from(error: Error) -> Self {
        match error {
            Error::Unreachable { .. } => AckError::Disconnected(Box::new(error)),
            error => AckError::Broker(Box::new(error)),
        }
    }
}

impl From<Error> for DeadLetterError {
    fn from(error: Error) -> Self {
        DeadLetterError(Box::new(error))
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    /// A client error of each kind the backend sorts into its own variant
    /// (a lost connection, refused credentials, a missing permission, a key
    /// of another type, any other server error), each with `CAUSE` in its
    /// text.
    fn causes() -> Vec<RedisError> {
        vec![
            RedisError::from(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "CAUSE-io",
            )),
            redis::make_extension_error("WRONGPASS".into(), Some("CAUSE-auth".into())),
            redis::make_extension_error("NOPERM".into(), Some("CAUSE-perm".into())),
            redis::make_extension_error("WRONGTYPE".into(), Some("CAUSE-type".into())),
            redis::make_extension_error("ERR".into(), Some("CAUSE-other".into())),
        ]
    }

    #[test]
    fn each_variant_describes_its_own_level_and_keeps_the_cause_as_source() {
        let endpoint = Endpoint::from_redacted("redis://app@cache:6379/0");
        for cause in causes() {
            let error = Error::from_redis(cause, "XREADGROUP", Some("orders"), &endpoint);
            let shown = error.to_string();
            assert!(
                !shown.contains("CAUSE"),
                "{error:?} prints its cause: `{shown}`; the cause belongs to source()"
            );
            let source = error.source().map(ToString::to_string);
            assert!(
                source
                    .as_deref()
                    .is_some_and(|source| source.contains("CAUSE")),
                "{error:?}: the cause is not kept as source(): {source:?}"
            );
        }
    }

    #[test]
    fn an_error_from_the_server_names_its_endpoint_and_a_refused_setting_none() {
        let endpoint = Endpoint::from_redacted("redis://app@cache:6379/0");
        for cause in causes() {
            let error = Error::from_redis(cause, "XREADGROUP", Some("orders"), &endpoint);
            assert_eq!(
                error.endpoint(),
                Some("redis://app@cache:6379/0"),
                "{error:?}"
            );
        }
        let refused = Error::from(ConfigError::new("group", "is empty"));
        assert_eq!(refused.endpoint(), None);
    }

    #[test]
    fn an_invalid_url_in_a_source_error_keeps_what_was_wrong() {
        let error = Error::InvalidUrl {
            url: "redis://app:***@cache".to_owned(),
            source: "port is not a number".into(),
        };
        let SourceError::Config(text) = SourceError::from(error) else {
            panic!("an invalid URL is a configuration error");
        };
        assert!(text.contains("redis://app:***@cache"), "{text}");
        assert!(text.contains("port is not a number"), "{text}");
    }
}
