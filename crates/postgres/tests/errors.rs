//! `intake_postgres::Error`: which failures are transient, where they
//! happened, and hyper's rule (a variant's `Display` is its own level, the
//! driver's or server's error is its `source()`), with the server's own
//! errors.

mod common;

use std::error::Error as _;
use std::time::Duration;

use common::Fixture;
use intake_core::ErrorClass;
use intake_postgres::{Error, PoolConfig};

/// The error the server answers to a statement that raises `sqlstate`.
async fn server_error(db: &Fixture, sqlstate: &str) -> sqlx::Error {
    let statement = format!(
        "DO $$ BEGIN RAISE EXCEPTION 'raised for the test' USING ERRCODE = '{sqlstate}'; END $$"
    );
    let error = sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
        .execute(&db.pool)
        .await
        .expect_err("the statement raises");
    let code = error
        .as_database_error()
        .and_then(|database| database.code())
        .map(|code| code.into_owned());
    assert_eq!(code.as_deref(), Some(sqlstate), "{error}");
    error
}

#[tokio::test]
async fn serialization_failures_and_deadlocks_are_transient_constraint_violations_are_not() {
    let Some(db) = Fixture::new("serialization_failures_and_deadlocks_are_transient").await else {
        return;
    };
    for (sqlstate, transient) in [
        ("40001", true),  // serialization failure
        ("40P01", true),  // deadlock
        ("55P03", true),  // lock not available
        ("23505", false), // unique violation
        ("23503", false), // foreign key violation
        ("22001", false), // value too long
        ("42P01", false), // missing table: an operator must act
    ] {
        let commit = Error::Commit(server_error(&db, sqlstate).await);
        assert_eq!(commit.is_transient(), transient, "COMMIT, {sqlstate}");
        let marker = Error::Marker {
            table: "markers".to_owned(),
            source: server_error(&db, sqlstate).await,
        };
        assert_eq!(marker.is_transient(), transient, "marker, {sqlstate}");
        let migrate = Error::Migrate {
            table: "markers".to_owned(),
            source: server_error(&db, sqlstate).await,
        };
        assert_eq!(migrate.is_transient(), transient, "migrate, {sqlstate}");
    }
    // What happens to the message stays as it was: only bad data and
    // constraint violations are permanent.
    for (sqlstate, class) in [
        ("40001", ErrorClass::Retryable),
        ("23505", ErrorClass::Permanent),
        ("42P01", ErrorClass::Retryable),
    ] {
        let commit = Error::Commit(server_error(&db, sqlstate).await);
        assert_eq!(commit.class(), class, "{sqlstate}");
    }
}

#[tokio::test]
async fn a_database_error_is_the_source_and_not_repeated_in_the_display() {
    let Some(db) = Fixture::new("a_database_error_is_the_source").await else {
        return;
    };
    let error = Error::Commit(server_error(&db, "40001").await);
    let shown = error.to_string();
    assert!(!shown.contains("raised for the test"), "{shown}");
    let source = error.source().expect("the server's error is the source");
    assert!(
        source.to_string().contains("raised for the test"),
        "{source}"
    );
    assert_eq!(error.endpoint(), None, "a step on the application's pool");
}

#[tokio::test]
async fn an_unreachable_server_is_transient_with_its_endpoint_and_without_the_password() {
    // Nothing listens on port 1.
    let error = PoolConfig::new("postgres://app:topsecret@127.0.0.1:1/test")
        .expect("a URL")
        .acquire_timeout(Duration::from_millis(500))
        .connect()
        .await
        .expect_err("nothing listens on port 1");
    assert!(matches!(error, Error::Unreachable { .. }), "{error:?}");
    assert!(error.is_transient());
    let endpoint = error.endpoint().expect("the server it tried");
    assert!(endpoint.contains("127.0.0.1:1"), "{endpoint}");
    assert!(!endpoint.contains("topsecret"), "{endpoint}");
    let shown = error.to_string();
    let cause = error.source().expect("the driver's error").to_string();
    assert!(!shown.contains(&cause), "{shown} repeats {cause}");
    for shown in [shown, format!("{error:?}")] {
        assert!(!shown.contains("topsecret"), "{shown}");
    }
}

#[test]
fn settings_that_cannot_work_are_not_transient() {
    let error = PoolConfig::new("postgres://db/test")
        .expect("a URL")
        .max_connections(0)
        .connect_lazy()
        .expect_err("an empty pool");
    assert!(matches!(error, Error::Config(_)), "{error:?}");
    assert!(!error.is_transient());
    assert_eq!(error.class(), ErrorClass::Permanent);
}
