//! intake: consume messages from brokers with async fn handlers, tower
//! middleware and ordered commits.
//!
//! This facade re-exports [`intake_core`]; the features `kafka`, `redis` and
//! `amqp` add the backend crates.
#![warn(missing_docs)]

pub use intake_core::*;

/// Exactly-once effects in PostgreSQL (feature `postgres`).
#[cfg(feature = "postgres")]
pub use intake_postgres as postgres;
