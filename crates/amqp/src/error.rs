//! [`Error`]: what can go wrong talking to RabbitMQ, in terms a user can
//! act on, and how it maps onto intake's [`SourceError`] and
//! [`DeadLetterError`].
//!
//! Following hyper's rule, a variant's `Display` describes its own level
//! only (what failed, where, and what to do); the failure beneath it
//! (lapin's error, the broker's reply, rustls's reason) is its
//! [`source`](std::error::Error::source), so a reporter that walks the
//! chain prints each once.

use intake_core::{
    BoxError, ConfigError,
    backend::{AckError, DeadLetterError, SourceError},
};
use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};

/// A failure of the AMQP backend, classified: each variant says what to fix.
///
/// Endpoints in these errors never carry a password (see
/// [`endpoint`](Error::endpoint)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The URL could not be parsed.
    #[error("invalid AMQP URL: {reason}")]
    InvalidUrl {
        /// What is wrong with it (the URL shown redacted).
        reason: String,
    },
    /// A setting of a builder cannot work.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No broker answered at the address (refused, timed out, stalled).
    #[error(
        "cannot reach the AMQP broker at {endpoint}; check the host and port in the URL and that RabbitMQ is running"
    )]
    Unreachable {
        /// The broker (without password).
        endpoint: String,
        /// The underlying failure.
        #[source]
        source: BoxError,
    },
    /// The TLS handshake failed on a certificate: the broker's is not
    /// signed by a trusted CA or is for another host name, or the broker
    /// refused the client's (or that there was none). Retrying does not
    /// help.
    #[error(
        "the TLS handshake with the AMQP broker at {endpoint} failed on a certificate; check that the CA given to `Tls::ca_certificate_pem` signed the broker's certificate for this host name, and that the client certificate (`Tls::client_certificate_pem`) is one the broker accepts"
    )]
    Tls {
        /// The broker (without password).
        endpoint: String,
        /// rustls's reason.
        #[source]
        source: BoxError,
    },
    /// The broker refused the user name or password, or the user may not do
    /// what was asked. Retrying does not help.
    #[error(
        "the AMQP broker at {endpoint} refused access; check the user name and password in the URL and the user's permissions on the vhost"
    )]
    Unauthorized {
        /// The broker (without password).
        endpoint: String,
        /// The broker's reply.
        #[source]
        source: BoxError,
    },
    /// The virtual host does not exist, or the user has no access to it.
    #[error(
        "the AMQP broker at {endpoint} does not let this user into vhost `{vhost}`; create the vhost or grant the user access (`rabbitmqctl set_permissions -p <vhost> <user> '.*' '.*' '.*'`)"
    )]
    VhostNotAllowed {
        /// The broker (without password).
        endpoint: String,
        /// The virtual host from the URL.
        vhost: String,
        /// The broker's reply.
        #[source]
        source: BoxError,
    },
    /// The queue to consume does not exist and the source does not declare it.
    #[error(
        "queue `{queue}` does not exist on {endpoint}; create it on the broker, or have the source declare it with `.declare(Topology::new().queue(..))`"
    )]
    QueueNotFound {
        /// The broker (without password).
        endpoint: String,
        /// The queue.
        queue: String,
        /// The broker's reply.
        #[source]
        source: BoxError,
    },
    /// The broker cannot serve a vhost or a queue for now: a connection
    /// limit is reached, the vhost is down, the queue's process or home node
    /// is down (`NOT_FOUND` that is not "no queue"), an exclusive queue is
    /// still held by a connection the broker has not yet seen go. It passes
    /// without anyone acting; the source retries with its reconnect backoff.
    #[error(
        "the AMQP broker at {endpoint} cannot serve {what} for now; it passes without anyone acting, and the source retries with its reconnect backoff"
    )]
    Unavailable {
        /// The broker (without password).
        endpoint: String,
        /// What it cannot serve (`vhost \`orders\``, `queue \`orders\``).
        what: String,
        /// The broker's reply, which says why.
        #[source]
        source: BoxError,
    },
    /// The broker refused a declaration, most often because the entity
    /// exists with other settings (`PRECONDITION_FAILED - inequivalent arg`),
    /// or because a binding names an exchange that does not exist.
    #[error(
        "the AMQP broker at {endpoint} refused to declare {entity}; make the declaration match the existing one (the broker's reply names the setting), or delete the existing one"
    )]
    Topology {
        /// The broker (without password).
        endpoint: String,
        /// What was declared (`queue \`orders\``).
        entity: String,
        /// The broker's reply.
        #[source]
        source: BoxError,
    },
    /// A delivery that lapin cannot parse (a header name, message id or
    /// routing key that is not UTF-8: AMQP allows any bytes, lapin reads
    /// text) closed the connection on every reconnect until the source's
    /// reconnect backoff gave up. The broker keeps redelivering it; the
    /// runtime retries under its own reconnect backoff.
    #[error(
        "a delivery on queue `{queue}` at {endpoint} (tag {tag} of channel {epoch}) cannot be read and comes back on every reconnect; move it out of the queue, or give the queue a delivery limit and a dead-letter exchange"
    )]
    Unparsable {
        /// The broker (without password).
        endpoint: String,
        /// The queue it came from.
        queue: String,
        /// The channel (intake's partition) it was delivered on last.
        epoch: u32,
        /// Its delivery tag on that channel.
        tag: u64,
        /// lapin's parse error.
        #[source]
        source: BoxError,
    },
    /// A publish to the dead-letter exchange was not confirmed: the broker
    /// refused it, no queue was bound to take it, or the confirm did not come
    /// in time. The original stays unacknowledged.
    #[error("the AMQP broker at {endpoint} did not accept the dead letter: {reason}")]
    NotConfirmed {
        /// The broker (without password).
        endpoint: String,
        /// Why (nacked, unroutable, timed out), and what to do.
        reason: String,
    },
    /// The dead-letter layer asked for a reference letter (origin and
    /// sizes, no payload; written when the letter itself could not be) of
    /// a message from an AMQP queue: the sink does not write one, because
    /// acknowledging a message deletes it from its queue, and its payload
    /// would be lost. The message stays unacknowledged and is delivered
    /// again (or goes where the policy's fallback says).
    #[error(
        "a reference letter (no payload) of a message from queue `{queue}` is not written to {endpoint}: acknowledging the message would delete it and lose its payload, so it stays in its queue; make the dead-letter destination take the whole letter (room, max-length-bytes), or give the policy a fallback"
    )]
    ReferenceNotWritten {
        /// The broker (without password).
        endpoint: String,
        /// The queue the message came from.
        queue: String,
    },
    /// An operation of the [`AmqpDeadLetterStore`](crate::AmqpDeadLetterStore)
    /// on every letter (a count with a filter, a listing to its end, a
    /// purge or replay by filter, or of ids it did not find) stopped
    /// before it looked at them all: its pass held
    /// [`max_letters`](crate::AmqpDeadLetterStoreBuilder::max_letters)
    /// letters unacknowledged. `done` says what it did meanwhile (purged
    /// and replayed letters are gone from the queue).
    #[error(
        "queue `{queue}` at {endpoint} held {ready} letters, and one pass of the dead-letter store looked at {looked_at} of them: it holds at most {max_letters} it leaves in the queue (`max_letters`); {done}, and the letters past them were not looked at; remove or replay the letters before them first, or raise `max_letters`"
    )]
    PassLimit {
        /// The broker (without password).
        endpoint: String,
        /// The dead-letter queue.
        queue: String,
        /// Letters ready when the pass began.
        ready: u64,
        /// Letters it looked at.
        looked_at: u64,
        /// The most it holds unacknowledged.
        max_letters: usize,
        /// What it did: "nothing was changed", "3 were purged", ...
        done: String,
    },
    /// [`AmqpBroker::shutdown`](crate::AmqpBroker) did not stop every
    /// part it keeps (parkings, with their relays and connections; the
    /// publisher, with its outputs awaiting a confirm) within its timeout.
    /// Those end after their current step; what is parked stays parked.
    #[error(
        "{parts} of the parts derived from the AMQP broker at {endpoint} did not stop within {within:?}; they end after their current step, and what is parked stays parked"
    )]
    ShutdownTimedOut {
        /// The broker (without password).
        endpoint: String,
        /// How many parts had not stopped.
        parts: usize,
        /// The timeout given to the shutdown.
        within: std::time::Duration,
    },
    /// Any other broker failure (a lost connection, a closed channel).
    /// Usually transient.
    #[error("the connection or channel to the AMQP broker at {endpoint} failed")]
    Broker {
        /// The broker (without password).
        endpoint: String,
        /// The underlying failure.
        #[source]
        source: BoxError,
    },
}

impl Error {
    /// Whether trying again later may succeed (the broker was unreachable or
    /// the connection dropped), as opposed to a fault of configuration or
    /// credentials.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Unreachable { .. }
                | Error::Broker { .. }
                | Error::NotConfirmed { .. }
                | Error::Unparsable { .. }
                | Error::Unavailable { .. }
        )
    }

    /// The broker the failure concerns (`amqp://user@host:5672/vhost`,
    /// never the password), or `None` for a URL or setting refused before
    /// any connection.
    pub fn endpoint(&self) -> Option<&str> {
        match self {
            Error::InvalidUrl { .. } | Error::Config(_) => None,
            Error::Unreachable { endpoint, .. }
            | Error::Tls { endpoint, .. }
            | Error::Unauthorized { endpoint, .. }
            | Error::VhostNotAllowed { endpoint, .. }
            | Error::QueueNotFound { endpoint, .. }
            | Error::Unavailable { endpoint, .. }
            | Error::Topology { endpoint, .. }
            | Error::Unparsable { endpoint, .. }
            | Error::NotConfirmed { endpoint, .. }
            | Error::ReferenceNotWritten { endpoint, .. }
            | Error::PassLimit { endpoint, .. }
            | Error::ShutdownTimedOut { endpoint, .. }
            | Error::Broker { endpoint, .. } => Some(endpoint),
        }
    }
}

/// What was being done when lapin failed; decides how its error reads.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Operation<'a> {
    /// Opening the connection (TCP, TLS, login, vhost).
    Connect,
    /// Checking that a queue exists (passive declare) or consuming it.
    UseQueue(&'a str),
    /// Declaring an entity ("queue `orders`").
    Declare(&'a str),
    /// Anything on an open connection.
    Other,
}

impl Operation<'_> {
    /// What a broker that cannot serve this operation cannot serve.
    fn subject(&self, vhost: &str) -> Option<String> {
        match self {
            Operation::Connect => Some(format!("vhost `{vhost}`")),
            Operation::UseQueue(queue) => Some(format!("queue `{queue}`")),
            Operation::Declare(entity) => Some((*entity).to_owned()),
            Operation::Other => None,
        }
    }
}

/// Whether a broker reply describes a condition that passes by itself, as
/// opposed to one the user must fix (credentials, permissions, a missing
/// vhost, queue or exchange, a declaration that contradicts what exists, a
/// protocol misuse). Unknown replies count as passing: a fatal stop needs a
/// reason the user can act on.
fn passes(kind: &AMQPErrorKind, message: &str) -> bool {
    match kind {
        AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED | AMQPSoftError::PRECONDITIONFAILED)
        | AMQPErrorKind::Hard(
            AMQPHardError::COMMANDINVALID
            | AMQPHardError::SYNTAXERROR
            | AMQPHardError::NOTIMPLEMENTED
            | AMQPHardError::INVALIDPATH,
        ) => false,
        // "NOT_FOUND - no queue 'orders' in vhost '/'" (or exchange) means
        // it does not exist; the other NOT_FOUND replies say that it exists
        // and cannot be reached: its home node is down, its process was
        // stopped by its supervisor or crashed, an operation on it timed out.
        AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) => !message.starts_with("NOT_FOUND - no "),
        // Connection limits of the node, vhost or user, and a limit lookup
        // that timed out, pass; a vhost that does not exist, access refused
        // to it, or limits negotiated beyond the broker's do not.
        AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED) => {
            message.contains("limit (")
                || message.contains("timeout")
                || message.contains("is down")
        }
        _ => true,
    }
}

/// Turns a lapin error into an [`Error`] that says what to fix.
pub(crate) fn classify(
    error: lapin::Error,
    endpoint: &str,
    vhost: &str,
    operation: Operation<'_>,
) -> Error {
    let endpoint = endpoint.to_owned();
    if let Operation::Connect = operation
        && is_certificate_failure(&error)
    {
        return Error::Tls {
            endpoint,
            source: Box::new(error),
        };
    }
    if let lapin::ErrorKind::ProtocolError(amqp) = error.kind() {
        let kind = amqp.kind().clone();
        let message = amqp.get_message().as_str();
        if let Some(what) = operation.subject(vhost).filter(|_| passes(&kind, message)) {
            return Error::Unavailable {
                endpoint,
                what,
                source: Box::new(error),
            };
        }
        match (kind, operation) {
            (AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED), _) => {
                return Error::Unauthorized {
                    endpoint,
                    source: Box::new(error),
                };
            }
            (AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED), Operation::Connect) => {
                return Error::VhostNotAllowed {
                    endpoint,
                    vhost: vhost.to_owned(),
                    source: Box::new(error),
                };
            }
            (AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND), Operation::UseQueue(queue)) => {
                return Error::QueueNotFound {
                    endpoint,
                    queue: queue.to_owned(),
                    source: Box::new(error),
                };
            }
            (_, Operation::Declare(entity)) => {
                return Error::Topology {
                    endpoint,
                    entity: entity.to_owned(),
                    source: Box::new(error),
                };
            }
            _ => {}
        }
    }
    match operation {
        Operation::Connect => Error::Unreachable {
            endpoint,
            source: Box::new(error),
        },
        _ => Error::Broker {
            endpoint,
            source: Box::new(error),
        },
    }
}

/// Whether the I/O error under `error` is rustls refusing a certificate or
/// the broker refusing ours, as opposed to the network failing.
fn is_certificate_failure(error: &lapin::Error) -> bool {
    let lapin::ErrorKind::IOError(io) = error.kind() else {
        return false;
    };
    let Some(rustls) = io
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    else {
        return false;
    };
    matches!(
        rustls,
        rustls::Error::InvalidCertificate(_)
            | rustls::Error::NoCertificatesPresented
            | rustls::Error::UnsupportedNameType
            | rustls::Error::AlertReceived(
                rustls::AlertDescription::BadCertificate
                    | rustls::AlertDescription::UnsupportedCertificate
                    | rustls::AlertDescription::CertificateRevoked
                    | rustls::AlertDescription::CertificateExpired
                    | rustls::AlertDescription::CertificateUnknown
                    | rustls::AlertDescription::UnknownCA
                    | rustls::AlertDescription::CertificateRequired
                    | rustls::AlertDescription::AccessDenied
                    | rustls::AlertDescription::HandshakeFailure
            )
    )
}

impl From<Error> for SourceError {
    fn from(error: Error) -> Self {
        match error {
            Error::Unreachable { endpoint, source } => {
                SourceError::Unreachable { endpoint, source }
            }
            Error::Unauthorized { ref endpoint, .. } | Error::Tls { ref endpoint, .. } => {
                SourceError::Unauthorized {
                    endpoint: endpoint.clone(),
                    source: Box::new(error),
                }
            }
            Error::QueueNotFound { ref queue, .. } => SourceError::NotFound {
                kind: "queue",
                name: queue.clone(),
                hint: "create it on the broker, or have the source declare it with `.declare(Topology::new().queue(..))`".into(),
            },
            Error::VhostNotAllowed { ref vhost, .. } => SourceError::NotFound {
                kind: "vhost",
                name: vhost.clone(),
                hint: error.to_string(),
            },
            Error::InvalidUrl { .. } | Error::Config(_) => {
                SourceError::Config(error.to_string())
            }
            Error::Topology { .. }
            | Error::ReferenceNotWritten { .. }
            | Error::PassLimit { .. }
            | Error::ShutdownTimedOut { .. } => SourceError::Fatal(Box::new(error)),
            Error::Broker { .. }
            | Error::NotConfirmed { .. }
            | Error::Unparsable { .. }
            | Error::Unavailable { .. } => {
                SourceError::Transient(Box::new(error))
            }
        }
    }
}

impl From<Error> for DeadLetterError {
    fn from(error: Error) -> Self {
        DeadLetterError(Box::new(error))
    }
}

/// An acknowledgement that lapin could not send: the channel is gone (its
/// deliveries return to the queue) or the broker refused it.
pub(crate) fn ack_error(error: lapin::Error) -> AckError {
    match error.kind() {
        lapin::ErrorKind::IOError(_)
        | lapin::ErrorKind::InvalidChannelState(..)
        | lapin::ErrorKind::InvalidConnectionState(_)
        | lapin::ErrorKind::MissingHeartbeatError => AckError::Disconnected(Box::new(error)),
        _ => AckError::Broker(Box::new(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::protocol::AMQPError as ProtocolError;

    fn protocol(kind: AMQPErrorKind, message: &str) -> lapin::Error {
        lapin::ErrorKind::ProtocolError(ProtocolError::new(kind, message.into())).into()
    }

    #[test]
    fn a_refused_login_is_unauthorized_and_not_transient() {
        let error = classify(
            protocol(
                AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED),
                "ACCESS_REFUSED - Login was refused",
            ),
            "amqp://guest@127.0.0.1:5672/%2f",
            "/",
            Operation::Connect,
        );
        assert!(matches!(error, Error::Unauthorized { .. }));
        assert!(!error.is_transient());
        assert!(matches!(
            SourceError::from(error),
            SourceError::Unauthorized { .. }
        ));
    }

    #[test]
    fn a_missing_queue_names_the_queue_and_the_fix() {
        let error = classify(
            protocol(
                AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND),
                "NOT_FOUND - no queue 'orders'",
            ),
            "amqp://guest@127.0.0.1:5672/%2f",
            "/",
            Operation::UseQueue("orders"),
        );
        assert!(error.to_string().contains("`orders`"));
        assert!(error.to_string().contains("declare"));
        match SourceError::from(error) {
            SourceError::NotFound { kind, name, .. } => {
                assert_eq!((kind, name.as_str()), ("queue", "orders"));
            }
            other => panic!("expected NotFound, got {other:?}"),
        }
    }

    #[test]
    fn an_unknown_vhost_says_how_to_grant_access() {
        let error = classify(
            protocol(
                AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED),
                "NOT_ALLOWED - vhost orders not found",
            ),
            "amqp://guest@127.0.0.1:5672/orders",
            "orders",
            Operation::Connect,
        );
        assert!(matches!(error, Error::VhostNotAllowed { .. }));
    }

    /// Replies RabbitMQ gives (`rabbit_reader`, `rabbit_amqqueue`) and what
    /// they are: each transient one is retried, each fatal one names what to
    /// fix.
    #[test]
    fn conditions_that_pass_are_transient_and_those_to_fix_are_not() {
        use AMQPErrorKind::{Hard, Soft};
        let cases = [
            (
                Soft(AMQPSoftError::NOTFOUND),
                "NOT_FOUND - home node 'rabbit@b' of durable queue 'orders' in vhost '/' is down or inaccessible",
                Operation::UseQueue("orders"),
                true,
            ),
            (
                Soft(AMQPSoftError::NOTFOUND),
                "NOT_FOUND - queue 'orders' in vhost '/' process is stopped by supervisor",
                Operation::Declare("queue `orders`"),
                true,
            ),
            (
                Soft(AMQPSoftError::NOTFOUND),
                "NOT_FOUND - queue 'orders' in vhost '/' has crashed and failed to restart",
                Operation::UseQueue("orders"),
                true,
            ),
            (
                Soft(AMQPSoftError::NOTFOUND),
                "NOT_FOUND - failed to perform operation on queue 'orders' in vhost '/' due to timeout",
                Operation::UseQueue("orders"),
                true,
            ),
            (
                Soft(AMQPSoftError::NOTFOUND),
                "NOT_FOUND - no queue 'orders' in vhost '/'",
                Operation::UseQueue("orders"),
                false,
            ),
            (
                Soft(AMQPSoftError::NOTFOUND),
                "NOT_FOUND - no exchange 'orders.dlx' in vhost '/'",
                Operation::Declare("binding of queue `a` to exchange `orders.dlx`"),
                false,
            ),
            (
                Soft(AMQPSoftError::RESOURCELOCKED),
                "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'q' in vhost '/'",
                Operation::Declare("queue `q`"),
                true,
            ),
            (
                Soft(AMQPSoftError::PRECONDITIONFAILED),
                "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in vhost '/'",
                Operation::Declare("queue `q`"),
                false,
            ),
            (
                Hard(AMQPHardError::NOTALLOWED),
                "NOT_ALLOWED - access to vhost '/' refused for user 'app': connection limit (10) is reached",
                Operation::Connect,
                true,
            ),
            (
                Hard(AMQPHardError::NOTALLOWED),
                "NOT_ALLOWED - connection refused: node connection limit (1000) is reached",
                Operation::Connect,
                true,
            ),
            (
                Hard(AMQPHardError::NOTALLOWED),
                "NOT_ALLOWED - access to vhost '/' refused for user 'app': connection limit cannot be queried, timeout",
                Operation::Connect,
                true,
            ),
            (
                Hard(AMQPHardError::NOTALLOWED),
                "NOT_ALLOWED - vhost orders not found",
                Operation::Connect,
                false,
            ),
            (
                Hard(AMQPHardError::NOTALLOWED),
                "NOT_ALLOWED - access to vhost 'orders' refused for user 'app'",
                Operation::Connect,
                false,
            ),
            (
                Hard(AMQPHardError::INTERNALERROR),
                "INTERNAL_ERROR - access to vhost 'orders' refused for user 'app': vhost 'orders' is down",
                Operation::Connect,
                true,
            ),
        ];
        for (kind, message, operation, transient) in cases {
            let error = classify(
                protocol(kind, message),
                "amqp://app@b:5672/%2f",
                "/",
                operation,
            );
            assert_eq!(error.is_transient(), transient, "{message}: {error:?}");
            assert_eq!(
                SourceError::from(error).is_transient(),
                transient,
                "{message}"
            );
        }
    }

    #[test]
    fn an_io_failure_while_connecting_is_unreachable_and_transient() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let error = classify(
            lapin::Error::from(lapin::ErrorKind::IOError(std::sync::Arc::new(io))),
            "amqp://guest@127.0.0.1:1/%2f",
            "/",
            Operation::Connect,
        );
        assert!(matches!(error, Error::Unreachable { .. }));
        assert!(SourceError::from(error).is_transient());
    }

    /// hyper's rule: each variant's text is its own level (what failed,
    /// where, what to do); the broker's reply or the I/O failure beneath is
    /// its `source()`, never repeated in it.
    #[test]
    fn display_describes_its_own_level_and_leaves_the_cause_to_source() {
        use AMQPErrorKind::{Hard, Soft};
        use std::error::Error as _;
        let io = || {
            lapin::Error::from(lapin::ErrorKind::IOError(std::sync::Arc::new(
                std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused by peer"),
            )))
        };
        let cases = [
            (io(), Operation::Connect),
            (io(), Operation::Other),
            (
                protocol(
                    Soft(AMQPSoftError::ACCESSREFUSED),
                    "ACCESS_REFUSED - Login was refused",
                ),
                Operation::Connect,
            ),
            (
                protocol(
                    Hard(AMQPHardError::NOTALLOWED),
                    "NOT_ALLOWED - vhost orders not found",
                ),
                Operation::Connect,
            ),
            (
                protocol(
                    Soft(AMQPSoftError::NOTFOUND),
                    "NOT_FOUND - no queue 'orders'",
                ),
                Operation::UseQueue("orders"),
            ),
            (
                protocol(
                    Soft(AMQPSoftError::NOTFOUND),
                    "NOT_FOUND - home node 'rabbit@b' of durable queue 'orders' is down",
                ),
                Operation::UseQueue("orders"),
            ),
            (
                protocol(
                    Soft(AMQPSoftError::PRECONDITIONFAILED),
                    "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q'",
                ),
                Operation::Declare("queue `q`"),
            ),
        ];
        for (lapin_error, operation) in cases {
            let error = classify(lapin_error, "amqp://app@b:5672/%2f", "/", operation);
            let cause = error
                .source()
                .unwrap_or_else(|| panic!("{error:?} keeps no cause"))
                .to_string();
            let shown = error.to_string();
            assert!(
                !shown.contains(&cause),
                "`{shown}` repeats its cause `{cause}`"
            );
            assert!(shown.contains("amqp://app@b:5672/%2f"), "{shown}");
        }
    }

    #[test]
    fn every_error_after_a_connection_names_its_endpoint_and_never_the_password() {
        let url = crate::AmqpUrl::parse("amqp://app:hunter2@b:5672/%2f").unwrap();
        let error = classify(
            protocol(
                AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED),
                "ACCESS_REFUSED - Login was refused",
            ),
            url.endpoint(),
            url.vhost(),
            Operation::Connect,
        );
        assert_eq!(error.endpoint(), Some("amqp://app@b:5672/%2f"));
        let invalid = crate::AmqpUrl::parse("amqp://app:hunter2@[::1]:5672/%2f").unwrap_err();
        assert_eq!(invalid.endpoint(), None);
        let printed = format!("{error} {error:?} {invalid} {invalid:?}");
        assert!(!printed.contains("hunter2"), "{printed}");
    }
}
