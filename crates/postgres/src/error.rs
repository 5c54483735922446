//! [`Error`]: the failures of this crate: connecting, migrating, and the
//! steps of an exactly-once transaction.
//!
//! Following hyper's rule, a variant's `Display` describes its own level
//! only; the driver's or server's error beneath it is its
//! [`source`](std::error::Error::source), so a reporter that walks the chain
//! prints each once. No variant carries a password: URLs are redacted.

use intake_core::{BoxError, ConfigError, ErrorClass, HandlerError};

use crate::classify::error_class;
use crate::tls::{Origin, SslMode, TlsChoice};
use crate::url::DatabaseUrl;

/// A failure of the PostgreSQL backend: opening the pool, creating the
/// marker table, or a step of an exactly-once transaction.
///
/// [`is_transient`](Self::is_transient) tells whether the same operation
/// may succeed later; [`class`](Self::class) what happens to the message
/// when an exactly-once step fails (the runtime gets it as a
/// [`HandlerError`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A pool setting cannot work.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The driver refused the URL; the cause says why (password redacted).
    #[error(
        "invalid database URL {url}; expected \
         postgres://[user[:password]@]host[:port]/database[?sslmode=...]"
    )]
    InvalidUrl {
        /// The URL, password redacted.
        url: String,
        /// What the driver objected to (password redacted).
        #[source]
        source: BoxError,
    },
    /// The server refused the user name or password (SQLSTATE `28xxx`). Fix
    /// the credentials; retrying will not help.
    #[error(
        "PostgreSQL at {url} refused the credentials; check the user name and password in the \
         URL and pg_hba.conf"
    )]
    Unauthorized {
        /// The URL, password redacted.
        url: String,
        /// The server's answer.
        #[source]
        source: sqlx::Error,
    },
    /// The TLS handshake failed: the server's certificate is not signed by a
    /// trusted CA, does not name the host, or has expired (under
    /// `sslmode=verify-ca`/`verify-full`). Retrying will not help.
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
    /// The server does not offer TLS (it answered PostgreSQL's
    /// `SSLRequest` with "no"; so does a man in the middle who strips
    /// TLS), and the sslmode requires it: `require`, `verify-ca` or
    /// `verify-full`, given or the default for a host that is not loopback
    /// (see [`PoolConfig`](crate::PoolConfig#tls)). Nothing was sent in
    /// clear text. Retrying will not help: turn TLS on in the server, or,
    /// where the network to it is trusted, set `sslmode=disable` (or
    /// `prefer`) in the URL.
    #[error(
        "PostgreSQL at {url} does not offer TLS, which sslmode={ssl_mode}{} requires; turn TLS on \
         in the server (`ssl = on` with a certificate and key in postgresql.conf), or, only if \
         the network to it is trusted, put sslmode=prefer (or disable) in the URL",
        if *by_default { " (the default for a host that is not loopback)" } else { "" }
    )]
    TlsNotOffered {
        /// The URL, password redacted.
        url: String,
        /// The mode that required TLS.
        ssl_mode: SslMode,
        /// Whether the mode is the default (the URL and `PGSSLMODE` named
        /// none).
        by_default: bool,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// The server could not be reached, or refused the connection for another
    /// reason (no such database, too many connections).
    #[error(
        "cannot connect to PostgreSQL at {url}; check that the server is running, that host, \
         port and database are right, and that it accepts more connections"
    )]
    Unreachable {
        /// The URL, password redacted.
        url: String,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// Creating the processed-marker table failed ([`MarkerTable::migrate`](crate::MarkerTable::migrate)),
    /// for instance for a missing `CREATE` privilege.
    #[error("cannot create the processed-marker table {table}")]
    Migrate {
        /// The table.
        table: String,
        /// The database's error.
        #[source]
        source: sqlx::Error,
    },
    /// No connection, or `BEGIN` failed.
    #[error("cannot begin the exactly-once transaction")]
    Begin(#[source] sqlx::Error),
    /// Inserting the processed-marker failed.
    #[error(
        "cannot insert the processed-marker into {table} (if the table does not exist, run \
         MarkerTable::migrate)"
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
         handler was ignored), so nothing was committed; propagate database errors with `?`"
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
    #[error("COMMIT of the exactly-once transaction failed")]
    Commit(#[source] sqlx::Error),
    /// The message has no usable id in the configured header.
    #[error(
        "the message has no usable id in header `{header}`: {problem}; exactly-once by message \
         id needs every producer to set it (or use MessageId::Position)"
    )]
    MessageId {
        /// The header.
        header: String,
        /// Missing, not UTF-8, empty, too long, or containing a control
        /// character (NUL among them).
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

impl Error {
    /// A failed connect of a pool whose sslmode is `tls`.
    pub(crate) fn from_connect(url: &DatabaseUrl, tls: TlsChoice, error: sqlx::Error) -> Self {
        if tls.mode.requires_tls() && is_tls_not_offered(&error) {
            return Error::TlsNotOffered {
                url: url.redacted().to_owned(),
                ssl_mode: tls.mode,
                by_default: tls.origin == Origin::Default,
                source: error,
            };
        }
        Self::from_driver(url, error)
    }

    pub(crate) fn from_driver(url: &DatabaseUrl, error: sqlx::Error) -> Self {
        let url = url.redacted().to_owned();
        let refused_credentials = matches!(
            &error,
            sqlx::Error::Database(database)
                if database.code().is_some_and(|code| code.starts_with("28"))
        );
        if refused_credentials {
            Error::Unauthorized { url, source: error }
        } else if is_tls_failure(&error) {
            Error::Tls { url, source: error }
        } else {
            Error::Unreachable { url, source: error }
        }
    }

    /// Whether the same operation may succeed when tried again, unchanged:
    /// an unreachable server, and a database error the server expects to
    /// pass by its SQLSTATE (a serialization failure `40001`, a deadlock
    /// `40P01`, a lost connection `08xxx`, resource exhaustion `53xxx`, an
    /// operator's intervention `57xxx`, a lock timeout `55P03`), a failure
    /// without SQLSTATE (I/O, a pool timeout), a transaction the handler
    /// let fail or ended itself, and a message repeated in its batch. Not
    /// transient: settings, the URL, credentials, TLS, bad data and
    /// constraint violations (`22xxx`, `23xxx`), errors an operator must
    /// fix (`42xxx`: a missing table or privilege), and a message without a
    /// usable id.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Unreachable { .. }
            | Error::Aborted(_)
            | Error::TransactionEnded
            | Error::RepeatedInBatch { .. } => true,
            Error::Migrate { source, .. }
            | Error::Begin(source)
            | Error::Marker { source, .. }
            | Error::Commit(source) => is_transient_driver_error(source),
            Error::Config(_)
            | Error::InvalidUrl { .. }
            | Error::Unauthorized { .. }
            | Error::Tls { .. }
            | Error::TlsNotOffered { .. }
            | Error::MessageId { .. }
            | Error::UnstablePosition { .. }
            | Error::TransactionEscaped => false,
        }
    }

    /// The server this error concerns, as a URL without its password, when
    /// the pool was being opened. The steps of a transaction run on a pool
    /// built by the application, whose URL this crate does not keep: `None`.
    pub fn endpoint(&self) -> Option<&str> {
        match self {
            Error::InvalidUrl { url, .. }
            | Error::Unauthorized { url, .. }
            | Error::Tls { url, .. }
            | Error::TlsNotOffered { url, .. }
            | Error::Unreachable { url, .. } => Some(url),
            _ => None,
        }
    }

    /// What the failure means for the message: database failures by their
    /// SQLSTATE ([`error_class`]); a missing message id and a `Tx` that
    /// escaped the handler are permanent (the same message fails the same
    /// way); a transaction the handler let fail or ended itself is retryable
    /// (the handler's own error is unknown, and a retry loses nothing); a
    /// repeated message in a batch is retryable; unstable positions are
    /// retryable (a configuration error: the consumer stalls with this error
    /// until it is fixed, and loses nothing). Failures to open the pool or
    /// create the table, should a handler return them: retryable when
    /// [transient](Self::is_transient), else permanent.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Begin(source) | Error::Marker { source, .. } | Error::Commit(source) => {
                error_class(source)
            }
            Error::MessageId { .. } | Error::TransactionEscaped => ErrorClass::Permanent,
            Error::Aborted(_)
            | Error::TransactionEnded
            | Error::UnstablePosition { .. }
            | Error::RepeatedInBatch { .. } => ErrorClass::Retryable,
            Error::Config(_)
            | Error::InvalidUrl { .. }
            | Error::Unauthorized { .. }
            | Error::Tls { .. }
            | Error::TlsNotOffered { .. }
            | Error::Unreachable { .. }
            | Error::Migrate { .. } => {
                if self.is_transient() {
                    ErrorClass::Retryable
                } else {
                    ErrorClass::Permanent
                }
            }
        }
    }
}

/// Whether a driver's error may pass: a database error unless its SQLSTATE
/// says the data (`22xxx`), a constraint (`23xxx`), the credentials
/// (`28xxx`) or the schema or privileges (`42xxx`) are wrong, which the
/// same operation meets again (the runtime still retries `42xxx`, see
/// [`sqlstate_class`](crate::sqlstate_class): an operator may fix it); of
/// the others, a lost connection, a pool timeout and a crashed worker.
fn is_transient_driver_error(error: &sqlx::Error) -> bool {
    const LASTING: [&str; 4] = ["22", "23", "28", "42"];
    match error {
        sqlx::Error::Database(database) => database
            .code()
            .is_none_or(|code| !LASTING.iter().any(|class| code.starts_with(class))),
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::WorkerCrashed => true,
        _ => false,
    }
}

/// Whether `error` is the driver's "the server answered the `SSLRequest`
/// with no" under a mode that requires TLS. sqlx 0.9 gives it only as
/// text (`sqlx_postgres::connection::tls`); tests/tls_default.rs holds the
/// text to this version.
fn is_tls_not_offered(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Tls(inner) if inner.to_string() == "server does not support TLS")
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

impl From<Error> for HandlerError {
    fn from(error: Error) -> Self {
        let class = error.class();
        HandlerError::retryable(error).reclassify(class)
    }
}
