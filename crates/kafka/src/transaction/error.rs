//! [`TransactionError`]: why a transaction of an exactly-once pipeline did
//! not commit.

use intake_core::BoxError;

/// Why a transaction of an [exactly-once pipeline](crate::KafkaTransactions)
/// did not commit. It reaches the runtime as the source of an
/// [`AckError::Broker`](intake_core::backend::AckError::Broker); the fatal
/// ones also stop the consumer through its source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransactionError {
    /// Another instance took over: a producer with the same
    /// `transactional.id` started (its epoch fenced this one), or another
    /// member took this consumer's `group.instance.id`. Nothing of this
    /// instance commits again: it must stop, and the partitions' owner
    /// handles what it did not commit. (A group generation that moved on,
    /// as at every cooperative or KIP-848 rebalance, is no fence: that
    /// transaction is [aborted](Self::Aborted) and the next one carries the
    /// current generation.)
    #[error(
        "transactional producer `{transactional_id}` was fenced: another instance took over its partitions or its transactional.id; this instance commits nothing more and must stop"
    )]
    Fenced {
        /// The producer's `transactional.id`.
        transactional_id: String,
        /// The broker's refusal.
        source: BoxError,
    },
    /// The transaction was aborted: neither its outputs nor its offsets
    /// count. The runtime sends the watermarks again and the next
    /// transaction carries the same outputs.
    #[error(
        "the transaction of producer `{transactional_id}` was aborted; its outputs and offsets go into the next one"
    )]
    Aborted {
        /// The producer's `transactional.id`.
        transactional_id: String,
        /// Why.
        source: BoxError,
    },
    /// The producer cannot go on (librdkafka's fatal error, or a commit
    /// whose outcome stayed unknown past the operation timeout): this
    /// instance commits nothing more and must be started again, which
    /// aborts whatever transaction it left open.
    #[error(
        "transactional producer `{transactional_id}` failed and cannot go on; start the consumer again"
    )]
    Fatal {
        /// The producer's `transactional.id`.
        transactional_id: String,
        /// Why.
        source: BoxError,
    },
}

impl TransactionError {
    /// Whether this instance can commit nothing more.
    pub fn is_fatal(&self) -> bool {
        matches!(self, Self::Fenced { .. } | Self::Fatal { .. })
    }

    /// Whether the broker aborted it for a record's sake (a batch too
    /// large, an invalid record): what a destination accepts may have
    /// changed since it was read.
    pub(crate) fn refused_a_record(&self) -> bool {
        let Self::Aborted { source, .. } = self else {
            return false;
        };
        source
            .downcast_ref::<rdkafka::error::KafkaError>()
            .and_then(rdkafka::error::KafkaError::rdkafka_error_code)
            .is_some_and(|code| {
                matches!(
                    code,
                    rdkafka::error::RDKafkaErrorCode::MessageSizeTooLarge
                        | rdkafka::error::RDKafkaErrorCode::MessageBatchTooLarge
                        | rdkafka::error::RDKafkaErrorCode::InvalidRecord
                        | rdkafka::error::RDKafkaErrorCode::InvalidDifferentRecord
                )
            })
    }

    /// A copy for a second reader (the source as well as the acker); the
    /// cause is kept as text.
    pub(crate) fn duplicate(&self) -> Self {
        let source = |cause: &BoxError| -> BoxError { cause.to_string().into() };
        match self {
            Self::Fenced {
                transactional_id,
                source: cause,
            } => Self::Fenced {
                transactional_id: transactional_id.clone(),
                source: source(cause),
            },
            Self::Aborted {
                transactional_id,
                source: cause,
            } => Self::Aborted {
                transactional_id: transactional_id.clone(),
                source: source(cause),
            },
            Self::Fatal {
                transactional_id,
                source: cause,
            } => Self::Fatal {
                transactional_id: transactional_id.clone(),
                source: source(cause),
            },
        }
    }
}
