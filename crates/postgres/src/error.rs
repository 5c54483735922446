//! The errors of this crate: connecting, migrating, and the steps of an
//! exactly-once transaction.

use intake_core::{ConfigError, ErrorClass, HandlerError};

use crate::classify::error_class;
use crate::url::DatabaseUrl;

/// Opening the pool failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// A pool setting cannot work.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The driver refused the URL.
    #[error("invalid database URL {url}: {reason}")]
    InvalidUrl {
        /// The URL, password redacted.
        url: String,
        /// What the driver objected to (password redacted).
        reason: String,
    },
    /// The server refused the user name or password (SQLSTATE `28xxx`). Fix
    /// the credentials; retrying will not help.
    #[error("PostgreSQL at {url} refused the credentials: {source}")]
    Unauthorized {
        /// The URL, password redacted.
        url: String,
        /// The server's answer.
        #[source]
        source: sqlx::Error,
    },
    /// The TLS handshake failed: the server's certificate is not signed by a
    /// trusted CA, does not name the host, or has expired (under
    /// `sslmode=verify-ca`/`verify-full`), or the server does not offer TLS
    /// (under `sslmode=require`). Retrying will not help.
    #[error(
        "the TLS handshake with PostgreSQL at {url} failed; with sslmode=verify-full the \
         server's certificate must be signed by a CA in the platform's trust store or in \
         `sslrootcert` (PoolConfig::ssl_root_certificate), and name the host of the URL"
    )]
    Tls {
        /// The URL, password redacted.
        url: String,
        /// The driver's error, with the TLS library's reason.
        #[source]
        source: sqlx::Error,
    },
    /// The server could not be reached, or refused the connection for another
    /// reason (no such database, too many connections).
    #[error("cannot connect to PostgreSQL at {url}: {source}")]
    Unreachable {
        /// The URL, password redacted.
        url: String,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
}

impl ConnectError {
    pub(crate) fn from_driver(url: &DatabaseUrl, error: sqlx::Error) -> Self {
        let url = url.redacted().to_owned();
        let refused_credentials = matches!(
            &error,
            sqlx::Error::Database(database)
                if database.code().is_some_and(|code| code.starts_with("28"))
        );
        if refused_credentials {
            ConnectError::Unauthorized { url, source: error }
        } else if is_tls_failure(&error) {
            ConnectError::Tls { url, source: error }
        } else {
            ConnectError::Unreachable { url, source: error }
        }
    }
}

/// Whether `error` is a failed TLS set-up: sqlx reports its own checks as
/// `Error::Tls`, and the handshake's as an I/O error that wraps rustls's.
fn is_tls_failure(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Tls(_) => true,
        sqlx::Error::Io(io) => io
            .get_ref()
            .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some()),
        _ => false,
    }
}

/// Creating the marker table failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot create the processed-marker table {table}: {source}")]
pub struct MigrateError {
    /// The table.
    pub table: String,
    /// The database's error.
    #[source]
    pub source: sqlx::Error,
}

/// A step of an exactly-once transaction failed. Its [class](Self::class)
/// decides what happens to the message; the runtime gets it as a
/// [`HandlerError`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExactlyOnceError {
    /// No connection, or `BEGIN` failed.
    #[error("cannot begin the exactly-once transaction: {0}")]
    Begin(#[source] sqlx::Error),
    /// Inserting the processed-marker failed.
    #[error(
        "cannot insert the processed-marker into {table} (if the table does not exist, run \
         MarkerTable::migrate): {source}"
    )]
    Marker {
        /// The marker table.
        table: String,
        /// The database's error.
        #[source]
        source: sqlx::Error,
    },
    /// The transaction had failed when the handler returned `Ok`: a database
    /// error inside the handler was ignored. Nothing was committed (PostgreSQL
    /// would have turned the `COMMIT` into a rollback); the message is
    /// retried. Propagate database errors from the handler with `?`.
    #[error(
        "the handler returned Ok, but its transaction had failed (a database error inside the \
         handler was ignored), so nothing was committed: {0}"
    )]
    Aborted(#[source] sqlx::Error),
    /// The handler ended the transaction itself (`COMMIT` or `ROLLBACK` in
    /// SQL), so its effects and the marker may not have committed together.
    /// The message is retried; if they did commit, the retry skips it.
    #[error(
        "the handler ended the exactly-once transaction itself (COMMIT or ROLLBACK in SQL); \
         leave committing to the framework"
    )]
    TransactionEnded,
    /// `COMMIT` failed. If it failed after the server committed (a lost
    /// connection), the retry finds the marker and skips the message.
    #[error("COMMIT of the exactly-once transaction failed: {0}")]
    Commit(#[source] sqlx::Error),
    /// The message has no usable id in the configured header.
    #[error(
        "the message has no usable id in header `{header}`: {problem}; exactly-once by message \
         id needs every producer to set it (or use MessageId::Position)"
    )]
    MessageId {
        /// The header.
        header: String,
        /// Missing, not UTF-8, empty, too long or containing NUL.
        problem: &'static str,
    },
    /// The broker's positions are not stable across redeliveries, so they
    /// cannot identify a message.
    #[error(
        "{source_name} positions are AMQP delivery tags, which change on every redelivery; \
         identify messages by a header instead: MessageId::header(\"amqp.message-id\")"
    )]
    UnstablePosition {
        /// The source (queue) the message came from.
        source_name: String,
    },
    /// The same message (same id) appears twice in one batch. The later copy
    /// is retried (without backoff) and then skipped as a duplicate once the
    /// first copy has committed.
    #[error(
        "message {message_id} appears twice in one batch; this copy is retried after the first \
         one commits, and is then skipped as a duplicate"
    )]
    RepeatedInBatch {
        /// The message id (a position or a header value).
        message_id: String,
    },
    /// The handler moved its [`Tx`](crate::Tx) somewhere that outlived it (a
    /// spawned task, a struct), so the transaction cannot be committed.
    #[error(
        "the handler's Tx outlived the handler (moved into a spawned task or stored); use the \
         Tx only inside the handler so that it can be committed"
    )]
    TransactionEscaped,
}

impl ExactlyOnceError {
    /// What the failure means for the message: database failures by their
    /// SQLSTATE ([`error_class`]); a missing message id and a `Tx` that
    /// escaped the handler are permanent (the same message fails the same
    /// way); a transaction the handler let fail or ended itself is retryable
    /// (the handler's own error is unknown, and a retry loses nothing); a
    /// repeated message in a batch is retryable; unstable positions are
    /// retryable (a configuration error: the consumer stalls with this error
    /// until it is fixed, and loses nothing).
    pub fn class(&self) -> ErrorClass {
        match self {
            ExactlyOnceError::Begin(source)
            | ExactlyOnceError::Marker { source, .. }
            | ExactlyOnceError::Commit(source) => error_class(source),
            ExactlyOnceError::MessageId { .. } | ExactlyOnceError::TransactionEscaped => {
                ErrorClass::Permanent
            }
            ExactlyOnceError::Aborted(_)
            | ExactlyOnceError::TransactionEnded
            | ExactlyOnceError::UnstablePosition { .. }
            | ExactlyOnceError::RepeatedInBatch { .. } => ErrorClass::Retryable,
        }
    }
}

impl From<ExactlyOnceError> for HandlerError {
    fn from(error: ExactlyOnceError) -> Self {
        let class = error.class();
        HandlerError::retryable(error).reclassify(class)
    }
}
