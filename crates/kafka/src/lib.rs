//! Kafka for intake, on rdkafka: a [`KafkaSource`], its [`KafkaAcker`] and
//! a [`KafkaDeadLetterSink`].
//!
//! | intake | Kafka |
//! |---|---|
//! | partition | topic-partition |
//! | position | offset ([`Position::Offset`](intake_core::Position::Offset)) |
//! | ack | commit the watermark + 1, batched; synchronous on revoke and shutdown |
//! | retry | in process (Kafka cannot take one message back) |
//! | dead letter | produce to `<topic>.<group>.dlq` with origin headers |
//! | backpressure | pause the assigned partitions, keep polling |
//! | broadcast | a group of its own per instance, from the end |
//!
//! All librdkafka settings pass through [`KafkaSettings`], so TLS and SASL are
//! configured as usual; secrets never appear in logs or `Debug`.
//!
//! ```no_run
//! use intake_kafka::{KafkaDeadLetterSink, KafkaSettings, KafkaSource};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let settings = KafkaSettings::new("127.0.0.1:9092")
//!     .set("partition.assignment.strategy", "cooperative-sticky");
//! let source = KafkaSource::builder(settings.clone())
//!     .group("billing")
//!     .topic("orders")
//!     .build()
//!     .await?;
//! let acker = source.acker();
//! let dead_letters = KafkaDeadLetterSink::builder(settings, "billing").build()?;
//! // Hand `source`, `acker` and `dead_letters` to an intake consumer.
//! # let _ = (acker, dead_letters);
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

mod acker;
pub mod dead_letter;
mod error;
mod ownership;
mod settings;
mod source;

pub use acker::KafkaAcker;
pub use dead_letter::{KafkaDeadLetterSink, KafkaDeadLetterSinkBuilder};
pub use error::ConnectError;
pub use settings::{KafkaSettings, is_secret};
pub use source::{KafkaSource, KafkaSourceBuilder};

/// The rdkafka version this crate builds on, for settings and types that
/// pass through.
pub use rdkafka;
