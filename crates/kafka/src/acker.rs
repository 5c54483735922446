//! [`KafkaAcker`]: commits the commit engine's watermarks as offsets.

use std::sync::{Arc, Weak};
use std::time::Duration;

use intake_core::{
    PartitionKey,
    backend::{AckBatch, AckError, AckMode, Acker},
};
use rdkafka::consumer::BaseConsumer;
use tokio::time::Instant;

use crate::ownership::next_offset;
use crate::source::context::{KafkaContext, Shared};

/// Commits offsets for a [`KafkaSource`](crate::KafkaSource): each
/// partition's watermark `w` as committed offset `w + 1`, one commit per
/// batch across partitions.
///
/// Every batch waits for the broker's answer (a synchronous commit, on a
/// blocking thread). A refused commit comes back to the runtime as an error,
/// and the runtime sends the partitions' newest watermarks again with its
/// next batch; a revocation or a shutdown that waits for its batch knows the
/// offsets are on the broker. Waiting costs no throughput: the runtime sends
/// one batch at a time and collects the next meanwhile, so batches grow with
/// the broker's round trip. Commits during the run are at least the
/// source's [minimum commit interval](crate::KafkaSourceBuilder::min_commit_interval)
/// apart, so a fast consumer does not spend the broker on commits.
///
/// A partition this consumer no longer owns is never committed: its work is
/// refused with [`AckError::NotAssigned`].
///
/// Kafka cannot take a single message back, so
/// [`supports_requeue`](Acker::supports_requeue) is `false`: the runtime
/// retries in process. In broadcast mode nothing is committed.
pub struct KafkaAcker {
    consumer: Weak<BaseConsumer<KafkaContext>>,
    shared: Arc<Shared>,
    min_interval: Duration,
    last_commit: Option<Instant>,
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
    pub(crate) fn new(
        consumer: Weak<BaseConsumer<KafkaContext>>,
        shared: Arc<Shared>,
        min_interval: Duration,
    ) -> Self {
        Self {
            consumer,
            shared,
            min_interval,
            last_commit: None,
        }
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
        if !self.shared.commits {
            return Ok(());
        }
        let mut offsets: Vec<(PartitionKey, i64)> = Vec::with_capacity(batch.partitions.len());
        for ack in &batch.partitions {
            if let Some(watermark) = ack.watermark {
                offsets.push((
                    ack.partition.clone(),
                    next_offset(&ack.partition, watermark)?,
                ));
            }
        }
        if offsets.is_empty() {
            return Ok(());
        }
        if !batch.sync
            && let Some(last) = self.last_commit
        {
            // The runtime keeps collecting completions meanwhile; the batch
            // after this one carries them.
            tokio::time::sleep_until(last + self.min_interval).await;
        }
        self.last_commit = Some(Instant::now());
        let consumer = self.consumer.clone();
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || match consumer.upgrade() {
            Some(consumer) => shared.ownership.commit(&consumer, &offsets),
            // The source has closed: it owns no partition any more.
            None => match offsets.into_iter().next() {
                Some((partition, _)) => Err(AckError::NotAssigned(partition)),
                None => Ok(()),
            },
        })
        .await
        .map_err(|error| AckError::Broker(Box::new(error)))?
    }
}
