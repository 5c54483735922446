//! What can go wrong talking to RabbitMQ, in terms a user can act on.

use intake_core::{AckError, BoxError, ConfigError, DeadLetterError, SourceError};
use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};

/// An AMQP failure, classified: each variant says what to fix.
///
/// Endpoints in these errors never carry a password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AmqpError {
    /// The URL could not be parsed.
    #[error("invalid AMQP URL: {reason}")]
    InvalidUrl {
        /// What is wrong with it.
        reason: String,
    },
    /// A setting of a builder cannot work.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No broker answered at the address (refused, timed out, TLS failed).
    #[error(
        "cannot reach the AMQP broker at {endpoint}: {source}; check the host and port in the URL and that RabbitMQ is running"
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
        "the AMQP broker at {endpoint} refused access: {message}; check the user name and password in the URL and the user's permissions on the vhost"
    )]
    Unauthorized {
        /// The broker (without password).
        endpoint: String,
        /// The broker's reply.
        message: String,
    },
    /// The virtual host does not exist, or the user has no access to it.
    #[error(
        "the AMQP broker at {endpoint} does not let this user into vhost `{vhost}`: {message}; create the vhost or grant the user access (`rabbitmqctl set_permissions -p <vhost> <user> '.*' '.*' '.*'`)"
    )]
    VhostNotAllowed {
        /// The broker (without password).
        endpoint: String,
        /// The virtual host from the URL.
        vhost: String,
        /// The broker's reply.
        message: String,
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
    },
    /// The broker cannot serve a vhost or a queue for now: a connection
    /// limit is reached, the vhost is down, the queue's process or home node
    /// is down (`NOT_FOUND` that is not "no queue"), an exclusive queue is
    /// still held by a connection the broker has not yet seen go. It passes
    /// without anyone acting; the source retries with its reconnect backoff.
    #[error(
        "the AMQP broker at {endpoint} cannot serve {what} for now ({message}); retrying with backoff"
    )]
    Unavailable {
        /// The broker (without password).
        endpoint: String,
        /// What it cannot serve (`vhost \`orders\``, `queue \`orders\``).
        what: String,
        /// The broker's reply.
        message: String,
    },
    /// The broker refused a declaration, most often because the entity
    /// exists with other settings (`PRECONDITION_FAILED - inequivalent arg`).
    #[error(
        "the AMQP broker at {endpoint} refused to declare {entity}: {message}; make the declaration match the existing one, or delete the existing one"
    )]
    Topology {
        /// The broker (without password).
        endpoint: String,
        /// What was declared (`queue \`orders\``).
        entity: String,
        /// The broker's reply.
        message: String,
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
    /// A publish to the dead-letter exchange was not confirmed.
    #[error("the broker did not accept the dead letter: {reason}")]
    NotConfirmed {
        /// Why (nacked, unroutable, timed out).
        reason: String,
    },
    /// Any other broker failure (a lost connection, a closed channel).
    /// Usually transient.
    #[error("AMQP error on {endpoint}: {source}")]
    Broker {
        /// The broker (without password).
        endpoint: String,
        /// The underlying failure.
        #[source]
        source: BoxError,
    },
}

impl AmqpError {
    /// Whether trying again later may succeed (the broker was unreachable or
    /// the connection dropped), as opposed to a fault of configuration or
    /// credentials.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            AmqpError::Unreachable { .. }
                | AmqpError::Broker { .. }
                | AmqpError::NotConfirmed { .. }
                | AmqpError::Unparsable { .. }
                | AmqpError::Unavailable { .. }
        )
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

/// Turns a lapin error into an [`AmqpError`] that says what to fix.
pub(crate) fn classify(
    error: lapin::Error,
    endpoint: &str,
    vhost: &str,
    operation: Operation<'_>,
) -> AmqpError {
    let endpoint = endpoint.to_owned();
    if let Operation::Connect = operation
        && is_certificate_failure(&error)
    {
        return AmqpError::Tls {
            endpoint,
            source: Box::new(error),
        };
    }
    if let lapin::ErrorKind::ProtocolError(amqp) = error.kind() {
        let message = amqp.get_message().to_string();
        if let Some(what) = operation
            .subject(vhost)
            .filter(|_| passes(amqp.kind(), &message))
        {
            return AmqpError::Unavailable {
                endpoint,
                what,
                message,
            };
        }
        match (amqp.kind(), operation) {
            (AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED), _) => {
                return AmqpError::Unauthorized { endpoint, message };
            }
            (AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED), Operation::Connect) => {
                return AmqpError::VhostNotAllowed {
                    endpoint,
                    vhost: vhost.to_owned(),
                    message,
                };
            }
            (AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND), Operation::UseQueue(queue)) => {
                return AmqpError::QueueNotFound {
                    endpoint,
                    queue: queue.to_owned(),
                };
            }
            (_, Operation::Declare(entity)) => {
                return AmqpError::Topology {
                    endpoint,
                    entity: entity.to_owned(),
                    message,
                };
            }
            _ => {}
        }
    }
    match operation {
        Operation::Connect => AmqpError::Unreachable {
            endpoint,
            source: Box::new(error),
        },
        _ => AmqpError::Broker {
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

impl From<AmqpError> for SourceError {
    fn from(error: AmqpError) -> Self {
        match error {
            AmqpError::Unreachable { endpoint, source } => {
                SourceError::Unreachable { endpoint, source }
            }
            AmqpError::Unauthorized { ref endpoint, .. } | AmqpError::Tls { ref endpoint, .. } => {
                SourceError::Unauthorized {
                    endpoint: endpoint.clone(),
                    source: Box::new(error),
                }
            }
            AmqpError::QueueNotFound { ref queue, .. } => SourceError::NotFound {
                kind: "queue",
                name: queue.clone(),
                hint: "create it on the broker, or have the source declare it with `.declare(Topology::new().queue(..))`".into(),
            },
            AmqpError::VhostNotAllowed { ref vhost, .. } => SourceError::NotFound {
                kind: "vhost",
                name: vhost.clone(),
                hint: error.to_string(),
            },
            AmqpError::InvalidUrl { .. } | AmqpError::Config(_) => {
                SourceError::Config(error.to_string())
            }
            AmqpError::Topology { .. } => SourceError::Fatal(Box::new(error)),
            AmqpError::Broker { .. }
            | AmqpError::NotConfirmed { .. }
            | AmqpError::Unparsable { .. }
            | AmqpError::Unavailable { .. } => {
                SourceError::Transient(Box::new(error))
            }
        }
    }
}

impl From<AmqpError> for DeadLetterError {
    fn from(error: AmqpError) -> Self {
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
        assert!(matches!(error, AmqpError::Unauthorized { .. }));
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
        assert!(matches!(error, AmqpError::VhostNotAllowed { .. }));
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
        assert!(matches!(error, AmqpError::Unreachable { .. }));
        assert!(SourceError::from(error).is_transient());
    }
}
