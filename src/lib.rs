//! intake: consume messages from brokers with async fn handlers, tower
//! middleware and ordered commits.
//!
//! This facade re-exports [`intake_core`]; the features `kafka`, `redis` and
//! `amqp` add the backend crates.
#![warn(missing_docs)]

pub use intake_core::*;

/// RabbitMQ (AMQP 0.9.1): see [`intake_amqp`].
#[cfg(feature = "amqp")]
pub use intake_amqp as amqp;
