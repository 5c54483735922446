//! Which partitions this consumer may commit, shared by the rebalance
//! callback and the acker.
//!
//! A commit for a partition happens only while this consumer owns it: the
//! acker commits under the ownership lock, and the revoke callback takes the
//! same lock to make its final commit and give the partitions up before it
//! returns to librdkafka. So no commit can slip in after a partition was lost.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use intake_core::{AckBatch, AckError, PartitionKey, Position};
use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::topic_partition_list::Offset;

use crate::source::context::KafkaContext;

/// A partition this consumer owns.
#[derive(Debug, Default)]
struct Owned {
    /// The newest offset (the next to consume) sent in a commit.
    requested: Option<i64>,
    /// The newest offset the broker confirmed.
    confirmed: Option<i64>,
    /// The commit of `requested` failed and no newer one was sent: send it
    /// again, or the group's offset stays behind when no later watermark
    /// comes to supersede it.
    retry: bool,
}

/// The partitions this consumer owns and what was committed for them.
#[derive(Debug, Default)]
pub(crate) struct Ownership {
    partitions: Mutex<HashMap<PartitionKey, Owned>>,
}

/// What a commit was asked to do and could not.
#[derive(Debug)]
pub(crate) struct CommitOutcome {
    /// Partitions of the batch this consumer no longer owns.
    pub not_owned: Vec<PartitionKey>,
    /// The broker's error, if the commit failed.
    pub failed: Option<KafkaError>,
}

impl Ownership {
    fn lock(&self) -> MutexGuard<'_, HashMap<PartitionKey, Owned>> {
        self.partitions
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Takes ownership of `partitions` (an assignment).
    pub(crate) fn acquire(&self, partitions: &[PartitionKey]) {
        let mut owned = self.lock();
        for key in partitions {
            owned.insert(key.clone(), Owned::default());
        }
    }

    /// Gives `partitions` up: later commits for them are refused.
    pub(crate) fn release(&self, partitions: &[PartitionKey]) {
        let mut owned = self.lock();
        for key in partitions {
            owned.remove(key);
        }
    }

    /// Gives every partition up (the consumer is closing).
    pub(crate) fn release_all(&self) {
        self.lock().clear();
    }

    /// Commits the watermarks of `batch` for the partitions this consumer
    /// owns: each watermark `w` becomes committed offset `w + 1`.
    pub(crate) fn commit_batch(
        &self,
        consumer: &BaseConsumer<KafkaContext>,
        batch: &AckBatch,
        mode: CommitMode,
    ) -> Result<CommitOutcome, AckError> {
        let mut owned = self.lock();
        let mut offsets = TopicPartitionList::with_capacity(batch.partitions.len());
        let mut not_owned = Vec::new();
        let mut committed = Vec::new();
        for ack in &batch.partitions {
            let Some(watermark) = ack.watermark else {
                continue;
            };
            if !owned.contains_key(&ack.partition) {
                not_owned.push(ack.partition.clone());
                continue;
            }
            let next = next_offset(&ack.partition, watermark)?;
            add_offset(&mut offsets, &ack.partition, next)?;
            committed.push((ack.partition.clone(), next));
        }
        if committed.is_empty() {
            return Ok(CommitOutcome {
                not_owned,
                failed: None,
            });
        }
        for (key, next) in &committed {
            if let Some(state) = owned.get_mut(key) {
                state.requested = Some(*next);
                state.retry = false;
            }
        }
        let failed = consumer.commit(&offsets, mode).err();
        let sync = matches!(mode, CommitMode::Sync);
        for (key, next) in committed {
            if let Some(state) = owned.get_mut(&key) {
                if failed.is_none() && sync {
                    state.confirmed = Some(next);
                } else if failed.is_some() {
                    state.retry = true;
                }
            }
        }
        Ok(CommitOutcome { not_owned, failed })
    }

    /// Records the broker's answer to an asynchronous commit (from the
    /// commit callback): a failed offset that is still the newest requested
    /// one is marked for another try.
    pub(crate) fn record_commit_result(&self, succeeded: bool, offsets: &TopicPartitionList) {
        let mut owned = self.lock();
        for element in offsets.elements() {
            let (Offset::Offset(offset), Ok(partition)) =
                (element.offset(), u32::try_from(element.partition()))
            else {
                continue;
            };
            let key = PartitionKey::new(element.topic(), partition);
            let Some(state) = owned.get_mut(&key) else {
                continue;
            };
            if state.requested != Some(offset) {
                continue;
            }
            if succeeded && element.error().is_ok() {
                state.confirmed = Some(offset);
                state.retry = false;
            } else {
                state.retry = true;
            }
        }
    }

    /// Sends again, asynchronously, every commit that failed and was not
    /// superseded. Returns how many partitions it covered.
    pub(crate) fn retry_failed(&self, consumer: &BaseConsumer<KafkaContext>) -> usize {
        let mut owned = self.lock();
        let mut offsets = TopicPartitionList::new();
        let mut count = 0;
        for (key, state) in owned.iter_mut() {
            let Some(next) = state.requested.filter(|_| state.retry) else {
                continue;
            };
            state.retry = false;
            if add_offset(&mut offsets, key, next).is_ok() {
                count += 1;
            }
        }
        if count > 0
            && let Err(error) = consumer.commit(&offsets, CommitMode::Async)
        {
            tracing::warn!(%error, "retrying failed kafka commits failed");
            for state in owned.values_mut() {
                if state.requested.is_some() && state.confirmed != state.requested {
                    state.retry = true;
                }
            }
        }
        count
    }

    /// The final commit of a revocation: commits, synchronously, each
    /// `(partition, watermark)` that a synchronous commit has not already
    /// confirmed, then gives the partitions up. Runs on the polling thread
    /// inside the rebalance callback, before librdkafka unassigns them.
    pub(crate) fn commit_and_release(
        &self,
        consumer: &BaseConsumer<KafkaContext>,
        revoked: &[PartitionKey],
        watermarks: &[(PartitionKey, Position)],
    ) -> Result<usize, KafkaError> {
        let mut owned = self.lock();
        let mut offsets = TopicPartitionList::new();
        let mut count = 0;
        for (key, watermark) in watermarks {
            let Some(state) = owned.get(key) else {
                continue;
            };
            let Ok(next) = next_offset(key, *watermark) else {
                continue;
            };
            if state.confirmed.is_some_and(|confirmed| confirmed >= next) && !state.retry {
                continue;
            }
            if add_offset(&mut offsets, key, next).is_ok() {
                count += 1;
            }
        }
        let result = if count > 0 {
            consumer.commit(&offsets, CommitMode::Sync).map(|()| count)
        } else {
            Ok(0)
        };
        for key in revoked {
            owned.remove(key);
        }
        result
    }
}

/// The offset to commit after `watermark`: the next one to consume.
fn next_offset(partition: &PartitionKey, watermark: Position) -> Result<i64, AckError> {
    match watermark {
        Position::Offset(offset) => offset.checked_add(1).ok_or_else(|| {
            AckError::Broker(format!("offset {offset} of {partition} cannot be committed").into())
        }),
        other => Err(AckError::Broker(
            format!("{partition}: position {other} is not a Kafka offset").into(),
        )),
    }
}

fn add_offset(
    offsets: &mut TopicPartitionList,
    partition: &PartitionKey,
    next: i64,
) -> Result<(), AckError> {
    let number = i32::try_from(partition.partition).map_err(|_| {
        AckError::Broker(format!("{partition}: partition number out of Kafka's range").into())
    })?;
    offsets
        .add_partition_offset(&partition.source, number, Offset::Offset(next))
        .map_err(|error| AckError::Broker(Box::new(error)))
}
