//! intake: consume messages from brokers with async fn handlers, tower
//! middleware and ordered commits.
//!
//! This facade re-exports [`intake_core`]; the features `kafka`, `redis` and
//! `amqp` add the backend crates.
#![warn(missing_docs)]

pub use intake_core::*;

/// The Kafka backend: source, acker and dead-letter sink on rdkafka.
#[cfg(feature = "kafka")]
pub use intake_kafka as kafka;

/// The Redis Streams backend (feature `redis`).
#[cfg(feature = "redis")]
pub use intake_redis_streams as redis_streams;

/// RabbitMQ (AMQP 0.9.1): source, acker and dead-letter sinks on lapin
/// (feature `amqp`).
#[cfg(feature = "amqp")]
pub use intake_amqp as amqp;
