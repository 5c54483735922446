//! [`KafkaAcker`]: commits the commit engine's watermarks as offsets.

use std::sync::{Arc, Weak};
use std::time::Duration;

use intake_core::{
    PartitionKey,
    backend::{AckBatch, AckError, AckMode, Acker, SourceError},
};
use rdkafka::TopicPartitionList;
use rdkafka::consumer::BaseConsumer;
use tokio::time::Instant;

use crate::ownership::{Stamp, next_offset};
use crate::source::context::{KafkaContext, Shared};
use crate::source::handoff::Control;
use crate::transaction::Transactor;

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
/// the broker's round trip. A commit refused for a stale member epoch
/// (KIP-848's `STALE_MEMBER_EPOCH`: the epoch moved with a heartbeat the
/// client had not read yet) is sent again at once, up to three times within
/// 600 ms, before it counts as refused: the partitions are still this
/// consumer's, and the next heartbeat, which librdkafka asks for at once,
/// brings the epoch. Commits during the run are at least the
/// source's [minimum commit interval](crate::KafkaSourceBuilder::min_commit_interval)
/// apart, so a fast consumer does not spend the broker on commits.
///
/// A partition this consumer no longer owns is never committed: its work is
/// refused with [`AckError::NotAssigned`]. Nor is one it was assigned again
/// after the runtime handed the batch over: the batch is of the assignment
/// that ended (held back by the minimum interval or a backoff while a
/// revocation gave the partition up without waiting for it), and its offset
/// could land over what another owner committed meanwhile.
///
/// After a commit (or transaction) the broker refused, the next one of the
/// run waits a backoff, from 200 ms doubling up to 5 s, reset by a commit
/// that succeeds: a broker that refuses every commit is not asked ten times
/// a second, and an exactly-once backlog is not produced again into an
/// aborted transaction at every commit tick. A batch the runtime waits for
/// (a revocation's, the final commit) goes at once.
///
/// Kafka cannot take a single message back, so
/// [`supports_requeue`](Acker::supports_requeue) is `false`: the runtime
/// retries in process. In broadcast mode nothing is committed.
///
/// Of a source built [`exactly_once`](crate::KafkaSourceBuilder::exactly_once),
/// each batch is one Kafka transaction: the kept outputs of the inputs it
/// commits, then their offsets, then the commit (see
/// [`KafkaTransactions`](crate::KafkaTransactions)). A failed transaction is
/// an [`AckError::Broker`] whose source is a [`TransactionError`](crate::TransactionError); a fenced
/// or fatal one also ends the consumer through the source.
pub struct KafkaAcker {
    consumer: Weak<BaseConsumer<KafkaContext>>,
    shared: Arc<Shared>,
    min_interval: Duration,
    last_commit: Option<Instant>,
    transactor: Option<Arc<Transactor>>,
    /// Commits the broker refused in a row.
    refused: u32,
}

/// The backoff after the first refused commit; it doubles with each one
/// more in a row.
const RETRY_FIRST: Duration = Duration::from_millis(200);

/// The longest backoff between refused commits: what a revocation or the
/// final commit may wait behind one.
const RETRY_MAX: Duration = Duration::from_secs(5);

/// The wait before the next commit after `refused` refused in a row.
fn backoff(refused: u32) -> Duration {
    let doublings = refused.saturating_sub(1).min(16);
    RETRY_FIRST.saturating_mul(1 << doublings).min(RETRY_MAX)
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
        transactor: Option<Arc<Transactor>>,
    ) -> Self {
        Self {
            consumer,
            shared,
            min_interval,
            last_commit: None,
            transactor,
            refused: 0,
        }
    }
}

/// Commits `offsets` of the partitions this consumer owns in one
/// transaction with the kept outputs of their inputs, then drops those
/// outputs. Runs under the ownership lock, so a partition given up
/// meanwhile is not committed, and its outputs are not produced.
fn commit_transaction(
    consumer: &BaseConsumer<KafkaContext>,
    shared: &Shared,
    transactor: &Transactor,
    stamp: Stamp,
    offsets: &[(PartitionKey, i64)],
) -> Result<(), AckError> {
    let Some(store) = &shared.exactly_once else {
        return shared.ownership.commit(consumer, stamp, offsets);
    };
    let mut fatal = None;
    // Outputs of a partition this consumer does not own are the next
    // owner's to make again; those of one it owns again are the new
    // assignment's, and stay.
    let gone = |partition: &PartitionKey| store.forget(std::slice::from_ref(partition));
    let transact = |list: &TopicPartitionList, owned: &[(PartitionKey, i64)]| {
        let mut outputs = Vec::new();
        for (partition, next) in owned {
            store.before(partition, *next, &mut outputs);
        }
        let count = outputs.len();
        let small = store.small_destinations();
        match transactor.commit(consumer, outputs, list, &small) {
            Ok(()) => {
                for (partition, next) in owned {
                    store.committed(partition, *next);
                }
                tracing::trace!(
                    outputs = count,
                    partitions = owned.len(),
                    "kafka transaction committed"
                );
                Ok(())
            }
            Err(error) => {
                if error.is_fatal() && transactor.first_report() {
                    fatal = Some(error.duplicate());
                }
                if error.refused_a_record() {
                    // Every output was checked against what its destination
                    // accepted when read: that may have changed.
                    store.reread_all();
                    tracing::error!(
                        transactional_id = transactor.transactional_id(),
                        outputs = count,
                        error = %intake_core::ErrorChain::new(&error),
                        "the broker refused a record of the transaction although every output was checked against its destination's limits when kept (did a topic's max.message.bytes or cleanup.policy change?); the transaction is tried again after a backoff, and while it keeps being refused nothing commits (a restart checks the inputs again)"
                    );
                }
                Err(AckError::Broker(Box::new(error)))
            }
        }
    };
    let outcome = shared.ownership.commit_with(offsets, stamp, transact, gone);
    if let Some(error) = fatal {
        tracing::error!(
            transactional_id = transactor.transactional_id(),
            error = %intake_core::ErrorChain::new(&error),
            "kafka transactional producer fenced or failed; the consumer stops"
        );
        shared
            .handoff
            .push_control(Control::Error(SourceError::Fatal(Box::new(error))));
    }
    outcome
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
        // Before any wait below: a partition given up and assigned again
        // meanwhile is not this batch's to commit.
        let stamp = self.shared.ownership.stamp();
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
            let wait = match self.refused {
                0 => self.min_interval,
                refused => self.min_interval.max(backoff(refused)),
            };
            tokio::time::sleep_until(last + wait).await;
        }
        self.last_commit = Some(Instant::now());
        if let Some(store) = &self.shared.exactly_once {
            let due = store.due();
            if !due.is_empty() {
                crate::transaction::reread(store, due);
            }
        }
        let consumer = self.consumer.clone();
        let shared = self.shared.clone();
        let transactor = self.transactor.clone();
        let outcome = tokio::task::spawn_blocking(move || match consumer.upgrade() {
            Some(consumer) => match &transactor {
                Some(transactor) => {
                    commit_transaction(&consumer, &shared, transactor, stamp, &offsets)
                }
                None => shared.ownership.commit(&consumer, stamp, &offsets),
            },
            // The source has closed: it owns no partition any more.
            None => match offsets.into_iter().next() {
                Some((partition, _)) => Err(AckError::NotAssigned(partition)),
                None => Ok(()),
            },
        })
        .await
        .map_err(|error| AckError::Broker(Box::new(error)))
        .flatten();
        match &outcome {
            // A partition that moved away says nothing of the broker: the
            // others were committed.
            Ok(()) | Err(AckError::NotAssigned(_)) => self.refused = 0,
            Err(_) => self.refused = self.refused.saturating_add(1),
        }
        outcome
    }
}
