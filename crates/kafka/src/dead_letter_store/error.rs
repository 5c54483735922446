//! What a step of the dead-letter log fails with: the public error, and
//! the failures of blocking steps and produces before their context.

use std::fmt;
use std::time::Duration;

use rdkafka::error::KafkaError;

/// Why a step of [`KafkaDeadLetters`](crate::KafkaDeadLetters) failed: the
/// [`source`](std::error::Error::source) of a
/// [`StoreError::Broker`](intake_core::dead_letter::store::StoreError::Broker).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeadLetterLogError {
    /// The broker did not answer within the timeout.
    #[error("no answer from {brokers} within {waited:?} to {step}")]
    TimedOut {
        /// The brokers (credentials hidden).
        brokers: String,
        /// What was asked.
        step: String,
        /// How long it waited.
        waited: Duration,
    },
    /// The client or the broker failed.
    #[error("the Kafka client for {brokers} could not {step}")]
    Client {
        /// The brokers (credentials hidden).
        brokers: String,
        /// What was asked.
        step: String,
        /// librdkafka's error.
        #[source]
        source: Box<KafkaError>,
    },
    /// The blocking task that talked to the broker ended without an answer
    /// (the runtime is shutting down).
    #[error("the blocking read of {topic} ended without an answer")]
    Interrupted {
        /// The dead-letter topic.
        topic: String,
        /// Why the task ended.
        #[source]
        source: tokio::task::JoinError,
    },
}

/// What a blocking step failed with, before it is given its context.
pub(super) enum Failure {
    TimedOut { step: String, waited: Duration },
    Client { step: String, source: KafkaError },
}

/// A produce that failed or was not confirmed in time.
#[derive(Debug)]
pub(super) enum KafkaErrorOrTimeout {
    Kafka(KafkaError),
    TimedOut,
}

impl fmt::Display for KafkaErrorOrTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KafkaErrorOrTimeout::Kafka(error) => error.fmt(f),
            KafkaErrorOrTimeout::TimedOut => f.write_str("not confirmed within the timeout"),
        }
    }
}
