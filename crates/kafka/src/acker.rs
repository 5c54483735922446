//! [`KafkaAcker`]: commits the commit engine's watermarks as offsets.

use std::sync::Arc;

use intake_core::{AckBatch, AckError, AckMode, Acker};
use rdkafka::consumer::{BaseConsumer, CommitMode};

use crate::ownership::CommitOutcome;
use crate::source::context::{KafkaContext, Shared};

/// Commits offsets for a [`KafkaSource`](crate::KafkaSource): each
/// partition's watermark `w` as committed offset `w + 1`, one commit per
/// batch across partitions.
///
/// Batches during the run are committed asynchronously (librdkafka sends
/// them in order; a failure is logged and superseded by the next commit).
/// [`sync`](AckBatch::sync) batches (before a revocation completes, at
/// shutdown) wait for the broker. A partition this consumer no longer owns
/// is never committed: its work is refused with [`AckError::NotAssigned`].
///
/// Kafka cannot take a single message back, so
/// [`supports_requeue`](Acker::supports_requeue) is `false`: the runtime
/// retries in process. In broadcast mode nothing is committed.
pub struct KafkaAcker {
    consumer: Arc<BaseConsumer<KafkaContext>>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for KafkaAcker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaAcker")
            .field("brokers", &self.shared.brokers)
            .field("commits", &self.shared.commits)
            .finish_non_exhaustive()
    }
}

impl KafkaAcker {
    pub(crate) fn new(consumer: Arc<BaseConsumer<KafkaContext>>, shared: Arc<Shared>) -> Self {
        Self { consumer, shared }
    }
}

impl Acker for KafkaAcker {
    fn mode(&self) -> AckMode {
        AckMode::Watermark
    }

    fn supports_requeue(&self) -> bool {
        false
    }

    async fn ack(&mut self, batch: &AckBatch) -> Result<(), AckError> {
        if !self.shared.commits || batch.partitions.iter().all(|ack| ack.watermark.is_none()) {
            return Ok(());
        }
        let outcome = if batch.sync {
            // A synchronous commit waits for the broker: off the async
            // workers.
            let consumer = self.consumer.clone();
            let shared = self.shared.clone();
            let batch = batch.clone();
            tokio::task::spawn_blocking(move || {
                shared
                    .ownership
                    .commit_batch(&consumer, &batch, CommitMode::Sync)
            })
            .await
            .map_err(|error| AckError::Broker(Box::new(error)))??
        } else {
            self.shared
                .ownership
                .commit_batch(&self.consumer, batch, CommitMode::Async)?
        };
        report(outcome)
    }
}

fn report(outcome: CommitOutcome) -> Result<(), AckError> {
    if let Some(error) = outcome.failed {
        return Err(AckError::Broker(Box::new(error)));
    }
    match outcome.not_owned.into_iter().next() {
        Some(partition) => Err(AckError::NotAssigned(partition)),
        None => Ok(()),
    }
}
