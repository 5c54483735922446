//! What a database error means for the message: retry it, or give up on it.

use intake_core::{BoxError, ErrorClass, HandlerError};

/// The class of a database failure, by its SQLSTATE.
///
/// - `22xxx` (data exception: a value too long, invalid input syntax, a
///   number out of range) and `23xxx` (integrity constraint violation:
///   unique, foreign key, check, not null, exclusion) are
///   [permanent](ErrorClass::Permanent): the message's data does not fit, and
///   running it again gives the same answer, so it goes to the dead-letter
///   path. If a violation can pass (a foreign key to a row another message
///   will insert), return [`HandlerError::retryable`] yourself: an explicit
///   class is never changed.
/// - Everything else is [retryable](ErrorClass::Retryable): serialization
///   failures (`40001`) and deadlocks (`40P01`) succeed on a new
///   transaction; connection errors (`08xxx`), resource exhaustion
///   (`53xxx`), operator intervention (`57xxx`, a cancelled statement or a
///   server shutdown) and lock timeouts (`55P03`) pass; and errors an operator
///   must fix (`42P01`, a missing table; `42501`, a missing privilege) are no
///   reason to dead-letter every message: the consumer backs off and carries
///   on once the database is fixed.
pub fn sqlstate_class(code: &str) -> ErrorClass {
    if code.starts_with("22") || code.starts_with("23") {
        ErrorClass::Permanent
    } else {
        ErrorClass::Retryable
    }
}

/// The class of a [`sqlx::Error`]: a database error by its SQLSTATE (see
/// [`sqlstate_class`]); any other failure (I/O, TLS, a pool timeout, a
/// protocol error, a row that does not decode) is retryable.
pub fn error_class(error: &sqlx::Error) -> ErrorClass {
    match error {
        sqlx::Error::Database(database) => database
            .code()
            .map_or(ErrorClass::Retryable, |code| sqlstate_class(&code)),
        _ => ErrorClass::Retryable,
    }
}

/// A [`HandlerError`] for a database failure, classified by [`error_class`].
///
/// For handlers that return `Result<(), HandlerError>` and want the database
/// rules for a `sqlx::Error`: `query.execute(&mut *tx).await.map_err(handler_error)?`.
/// A handler that returns the `sqlx::Error` itself gets the same class.
pub fn handler_error(error: sqlx::Error) -> HandlerError {
    let class = error_class(&error);
    HandlerError::retryable(error).reclassify(class)
}

/// Turns a handler's error into a [`HandlerError`]: one the handler built
/// keeps its class; otherwise a `sqlx::Error` in the error or its source
/// chain decides the class, and any other error is retryable.
pub(crate) fn classify_boxed(error: BoxError) -> HandlerError {
    if error.is::<HandlerError>() {
        return HandlerError::from(error);
    }
    let class = database_class_in_chain(&*error).unwrap_or(ErrorClass::Retryable);
    HandlerError::retryable(error).reclassify(class)
}

fn database_class_in_chain(error: &(dyn std::error::Error + 'static)) -> Option<ErrorClass> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(database) = error.downcast_ref::<sqlx::Error>() {
            return Some(error_class(database));
        }
        next = error.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialization_failures_and_deadlocks_are_retryable() {
        assert_eq!(sqlstate_class("40001"), ErrorClass::Retryable);
        assert_eq!(sqlstate_class("40P01"), ErrorClass::Retryable);
    }

    #[test]
    fn constraint_violations_and_bad_data_are_permanent() {
        for code in ["23505", "23503", "23514", "23502", "22001", "22P02"] {
            assert_eq!(sqlstate_class(code), ErrorClass::Permanent, "{code}");
        }
    }

    #[test]
    fn connection_and_operator_errors_are_retryable() {
        for code in [
            "08006", "08001", "57P01", "57014", "53300", "55P03", "42P01",
        ] {
            assert_eq!(sqlstate_class(code), ErrorClass::Retryable, "{code}");
        }
    }

    #[test]
    fn a_lost_connection_is_retryable() {
        let error = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(error_class(&error), ErrorClass::Retryable);
        assert!(handler_error(error).is_retryable());
    }

    #[test]
    fn a_class_the_handler_chose_is_kept() {
        let chosen: BoxError = Box::new(HandlerError::permanent("order has no lines"));
        assert!(classify_boxed(chosen).is_permanent());
    }

    #[test]
    fn an_unknown_error_is_retryable() {
        let unknown: BoxError = "inventory service down".into();
        assert!(classify_boxed(unknown).is_retryable());
    }
}
