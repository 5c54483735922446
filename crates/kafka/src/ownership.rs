//! Which partitions this consumer may commit, shared by the rebalance
//! callback and the acker.
//!
//! A commit for a partition happens only while this consumer owns it: the
//! acker commits under the ownership lock, and the revoke callback takes the
//! same lock to make its final commit and give the partitions up before it
//! returns to librdkafka. So no commit can slip in after a partition was lost.
//!
//! Nor for an assignment that ended: the acker takes a [`Stamp`] when the
//! runtime hands it a batch, before it waits out the minimum commit
//! interval or a backoff, and under the lock commits a partition only if
//! this consumer has owned it since then. A batch of the first assignment
//! held back while the partition was given up (a revocation that did not
//! wait for the runtime: the assignment was lost, or the runtime did not
//! drain in time, its final batch queued behind the held one) and assigned
//! to this consumer again would otherwise commit the old assignment's
//! offset, which the broker accepts from the member's current generation:
//! over what another owner committed meanwhile, or past the new
//! assignment's running messages. A stamp costs one atomic load per batch.
//! What it cannot tell is a batch the runtime queued for the old assignment
//! and the acker starts after the callback took the new one but before the
//! runtime heard of it: the runtime drops the old assignment's work from
//! the batches still queued when it hears, and the acker starts one in
//! between only if the batch before ends in that instant.
//!
//! Nor after its topic was deleted: Kafka drops a group's offsets with the
//! topic, and an offset of the old topic committed later may land on a
//! topic created again under the same name (librdkafka retries a commit the
//! broker refused with "unknown topic or partition"), whose consumers would
//! then skip that many of its first records. A partition whose topic the
//! broker no longer knows is [forgotten](Ownership::forget_deleted): owned
//! until librdkafka takes it back, never committed again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use intake_core::{PartitionKey, Position, backend::AckError};
use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::topic_partition_list::Offset;

/// How many times a commit refused for a stale member epoch is sent again
/// at once (see [`commit_sync`]).
const STALE_EPOCH_RESENDS: u32 = 3;

/// The pause before the first such resend; the next ones wait twice and
/// three times as long (600 ms in all, well inside the final commit's
/// margin of a revocation).
const STALE_EPOCH_PAUSE: Duration = Duration::from_millis(100);

/// Commits `list` synchronously. A commit the broker refused because it
/// carried an older member epoch than the member's (`STALE_MEMBER_EPOCH`,
/// KIP-848's consumer protocol: a heartbeat moved the epoch before the
/// client read its answer) is sent again after a short pause, up to
/// [`STALE_EPOCH_RESENDS`] times: librdkafka 2.12 does not resend a manual
/// commit refused so, it only asks for the next heartbeat at once, which
/// brings the current epoch. The refusal says nothing of ownership (a
/// member that lost its partitions is told `UNKNOWN_MEMBER_ID` or
/// `FENCED_MEMBER_EPOCH`), and the caller holds the ownership lock, so the
/// partitions are still this consumer's when it resends. Refused every
/// time, the refusal is returned like any other.
fn commit_sync<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    list: &TopicPartitionList,
) -> KafkaResult<()> {
    let mut resent = 0;
    loop {
        match consumer.commit(list, CommitMode::Sync) {
            Err(error) if is_stale_epoch(&error) && resent < STALE_EPOCH_RESENDS => {
                resent += 1;
                tracing::debug!(
                    %error,
                    resend = resent,
                    "kafka commit refused for a stale member epoch; sending it again with the next"
                );
                std::thread::sleep(STALE_EPOCH_PAUSE.saturating_mul(resent));
            }
            outcome => return outcome,
        }
    }
}

/// Whether the broker refused a commit for its stale member epoch.
fn is_stale_epoch(error: &KafkaError) -> bool {
    error.rdkafka_error_code() == Some(RDKafkaErrorCode::StaleMemberEpoch)
}

/// What this consumer asked to commit for a partition it owns, and what the
/// broker confirmed.
#[derive(Debug, Default)]
struct Owned {
    /// The newest offset (the next one to consume) a commit was attempted
    /// for. Only finished work is ever attempted, so committing it later is
    /// always safe while the partition is owned.
    requested: Option<i64>,
    /// The newest offset the broker confirmed.
    confirmed: Option<i64>,
    /// The broker said the partition's topic does not exist any more: its
    /// offsets went with it, and none is committed again.
    topic_deleted: bool,
    /// The [`Ownership::assignments`] count this ownership began with: a
    /// batch stamped before it is of an earlier assignment.
    since: u64,
}

impl Owned {
    /// The offset to commit before giving the partition up, if the broker
    /// has not confirmed it (or a newer one) yet.
    fn unconfirmed(&self, also: Option<i64>) -> Option<i64> {
        let target = self.requested.max(also)?;
        match self.confirmed {
            Some(confirmed) if confirmed >= target => None,
            _ => Some(target),
        }
    }
}

/// Whether a commit lists an offset the broker already confirmed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resend {
    /// Skipped: the broker has it.
    Never,
    /// Listed again (a transaction's offsets go with its outputs).
    Confirmed,
}

/// The partitions this consumer owns and what was committed for them.
#[derive(Debug, Default)]
pub(crate) struct Ownership {
    partitions: Mutex<HashMap<PartitionKey, Owned>>,
    /// Assignments taken so far, moved on under the lock by each
    /// [`acquire`](Self::acquire); read without it for a [`Stamp`].
    assignments: AtomicU64,
}

/// When the acker took a batch, as the count of assignments taken by then:
/// the batch commits only partitions owned since (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stamp(u64);

impl Ownership {
    fn lock(&self) -> MutexGuard<'_, HashMap<PartitionKey, Owned>> {
        self.partitions
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Takes ownership of `partitions` (an assignment), each afresh: a batch
    /// stamped before this commits none of them.
    pub(crate) fn acquire(&self, partitions: &[PartitionKey]) {
        let mut owned = self.lock();
        // Under the lock, so that a commit that finds the partition owned
        // also finds when its ownership began.
        let since = self.assignments.fetch_add(1, Ordering::AcqRel) + 1;
        for key in partitions {
            owned.insert(
                key.clone(),
                Owned {
                    since,
                    ..Owned::default()
                },
            );
        }
    }

    /// Now, for a batch the acker is handed: what it may commit is what is
    /// owned now and still owned, without a new assignment, when it commits.
    pub(crate) fn stamp(&self) -> Stamp {
        Stamp(self.assignments.load(Ordering::Acquire))
    }

    /// Marks `partitions` (of a topic the broker no longer knows) as never
    /// to be committed again; they stay owned until released.
    pub(crate) fn forget_deleted(&self, partitions: &[PartitionKey]) {
        let mut owned = self.lock();
        for key in partitions {
            if let Some(state) = owned.get_mut(key) {
                state.topic_deleted = true;
            }
        }
    }

    /// Gives `partitions` up without committing: later commits for them are
    /// refused.
    pub(crate) fn release(&self, partitions: &[PartitionKey]) {
        let mut owned = self.lock();
        for key in partitions {
            owned.remove(key);
        }
    }

    /// Gives every partition up (the consumer has closed).
    pub(crate) fn release_all(&self) {
        self.lock().clear();
    }

    /// Commits, synchronously, each `(partition, next offset)` whose
    /// partition this consumer has owned since `stamp` and whose offset the
    /// broker has not confirmed yet: a batch of confirmed offsets only (a final commit
    /// re-sends every watermark) costs no round trip, and cannot be refused
    /// by a rebalance in progress. Blocks for a broker round trip: call it
    /// off the async workers. Generic over the consumer's context so that
    /// this file does not name the source's context, which holds the
    /// ownership (the two would import each other).
    ///
    /// # Errors
    ///
    /// [`AckError::Broker`] when the broker refused the commit (for a stale
    /// member epoch: after [`commit_sync`]'s resends),
    /// [`AckError::NotAssigned`] when the commit of the owned partitions
    /// succeeded but some partition of the batch is no longer owned, was
    /// assigned again since `stamp`, or its topic was deleted.
    pub(crate) fn commit<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        stamp: Stamp,
        offsets: &[(PartitionKey, i64)],
    ) -> Result<(), AckError> {
        self.commit_owned(
            offsets,
            stamp,
            Resend::Never,
            |list, _| {
                commit_sync(consumer, list).map_err(|error| AckError::Broker(Box::new(error)))
            },
            |_| {},
        )
    }

    /// Commits, with `commit`, each `(partition, next offset)` whose
    /// partition this consumer has owned since `stamp`, under the ownership
    /// lock: `commit` gets them as a list and as pairs. What
    /// [`commit`](Self::commit) does with a consumer commit, an
    /// exactly-once acker does with a transaction. `gone` is called, under
    /// the lock, for each partition of the batch this consumer does not own
    /// (or whose topic was deleted); not for one it owns under a newer
    /// assignment, whose state is that assignment's.
    ///
    /// # Errors
    ///
    /// `commit`'s error, or [`AckError::NotAssigned`] as for
    /// [`commit`](Self::commit).
    /// Unlike [`commit`](Self::commit), confirmed offsets are listed again:
    /// a transaction carries its outputs with its offsets.
    pub(crate) fn commit_with(
        &self,
        offsets: &[(PartitionKey, i64)],
        stamp: Stamp,
        commit: impl FnOnce(&TopicPartitionList, &[(PartitionKey, i64)]) -> Result<(), AckError>,
        gone: impl FnMut(&PartitionKey),
    ) -> Result<(), AckError> {
        self.commit_owned(offsets, stamp, Resend::Confirmed, commit, gone)
    }

    fn commit_owned(
        &self,
        offsets: &[(PartitionKey, i64)],
        stamp: Stamp,
        resend: Resend,
        commit: impl FnOnce(&TopicPartitionList, &[(PartitionKey, i64)]) -> Result<(), AckError>,
        mut gone: impl FnMut(&PartitionKey),
    ) -> Result<(), AckError> {
        let mut owned = self.lock();
        let mut list = TopicPartitionList::with_capacity(offsets.len());
        let mut listed = Vec::with_capacity(offsets.len());
        let mut not_owned = None;
        for (key, next) in offsets {
            match owned.get_mut(key) {
                Some(state) if !state.topic_deleted && state.since <= stamp.0 => {
                    if resend == Resend::Never
                        && state.confirmed.is_some_and(|confirmed| confirmed >= *next)
                    {
                        continue;
                    }
                    add_offset(&mut list, key, *next)?;
                    state.requested = Some(*next);
                    listed.push((key.clone(), *next));
                }
                Some(state) if !state.topic_deleted => {
                    fenced(key, *next);
                    not_owned = Some(key.clone());
                }
                _ => {
                    gone(key);
                    not_owned = Some(key.clone());
                }
            }
        }
        if list.count() > 0 {
            commit(&list, &listed)?;
            for (key, next) in &listed {
                if let Some(state) = owned.get_mut(key) {
                    state.confirmed = Some(*next);
                }
            }
        }
        match not_owned {
            Some(partition) => Err(AckError::NotAssigned(partition)),
            None => Ok(()),
        }
    }

    /// The final commit of a revocation (or of a close): commits,
    /// synchronously, for each of `revoked` that this consumer owns, the
    /// newest offset it attempted or that `watermarks` reports done, unless
    /// the broker already confirmed it (or its topic was deleted); then gives
    /// the partitions up. Returns how many partitions it committed.
    ///
    /// Runs on the polling thread inside the rebalance callback, before
    /// librdkafka unassigns the partitions.
    pub(crate) fn commit_and_release<C: ConsumerContext>(
        &self,
        consumer: &BaseConsumer<C>,
        revoked: &[PartitionKey],
        watermarks: &[(PartitionKey, Position)],
    ) -> Result<usize, KafkaError> {
        let mut owned = self.lock();
        let mut list = TopicPartitionList::new();
        for key in revoked {
            let Some(state) = owned.get(key).filter(|state| !state.topic_deleted) else {
                continue;
            };
            let done = watermarks
                .iter()
                .find(|(partition, _)| partition == key)
                .and_then(|(_, watermark)| next_offset(key, *watermark).ok());
            if let Some(next) = state.unconfirmed(done) {
                // A partition of this consumer's own assignment cannot fail
                // to be listed.
                let _ = add_offset(&mut list, key, next);
            }
        }
        let result = match list.count() {
            0 => Ok(0),
            count => commit_sync(consumer, &list).map(|()| count),
        };
        for key in revoked {
            owned.remove(key);
        }
        result
    }
}

/// Logs a commit refused because the partition was assigned again since
/// its batch was taken: rare, and worth knowing when offsets look odd.
#[cold]
fn fenced(partition: &PartitionKey, next: i64) {
    tracing::info!(
        %partition,
        offset = next,
        "a commit of an earlier assignment of this kafka partition is dropped: the partition was given up and assigned to this consumer again since its batch was taken, and the new assignment commits its own progress"
    );
}

/// The offset to commit after `watermark`: the next one to consume.
pub(crate) fn next_offset(partition: &PartitionKey, watermark: Position) -> Result<i64, AckError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::ClientConfig;

    /// A consumer of a group on an address where nothing listens.
    fn unreachable_consumer() -> BaseConsumer {
        ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("group.id", "g")
            .create()
            .expect("a consumer")
    }

    #[test]
    fn a_partition_of_a_deleted_topic_is_never_committed_again() {
        // Nothing is sent to this address: every commit below is refused
        // before it reaches a broker.
        let consumer = unreachable_consumer();
        let ownership = Ownership::default();
        let orders = PartitionKey::new("orders", 0);
        ownership.acquire(std::slice::from_ref(&orders));
        ownership.forget_deleted(std::slice::from_ref(&orders));
        match ownership.commit(&consumer, ownership.stamp(), &[(orders.clone(), 10)]) {
            Err(AckError::NotAssigned(partition)) => assert_eq!(partition, orders),
            other => panic!("expected NotAssigned, got {other:?}"),
        }
        let committed = ownership
            .commit_and_release(
                &consumer,
                std::slice::from_ref(&orders),
                &[(orders.clone(), Position::Offset(9))],
            )
            .expect("nothing to commit");
        assert_eq!(committed, 0);
        assert!(ownership.lock().is_empty(), "released");
    }

    #[test]
    fn a_commit_of_offsets_the_broker_already_confirmed_sends_nothing() {
        // A final commit re-sends every partition's watermark; one landing
        // in a rebalance was refused and logged as "finished messages may
        // be delivered again" although the broker had them all (seen on
        // librdkafka's mock cluster). Nothing listens at this address: a
        // commit that reaches the consumer fails.
        let consumer = unreachable_consumer();
        let ownership = Ownership::default();
        let orders = PartitionKey::new("orders", 0);
        ownership.acquire(std::slice::from_ref(&orders));
        if let Some(state) = ownership.lock().get_mut(&orders) {
            state.requested = Some(10);
            state.confirmed = Some(10);
        }
        let (sent, outcome) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = sent.send(ownership.commit(&consumer, ownership.stamp(), &[(orders, 10)]));
        });
        let outcome = outcome
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("answered without a broker");
        assert!(outcome.is_ok(), "{outcome:?}");
    }

    /// What a commit did: its outcome, what went to the broker, and which
    /// partitions were reported gone.
    struct Recorded {
        outcome: Result<(), AckError>,
        listed: Vec<(PartitionKey, i64)>,
        gone: Vec<PartitionKey>,
    }

    /// Commits `offsets` of a batch stamped `stamp`, recording what it did.
    fn commit_recorded(
        ownership: &Ownership,
        stamp: Stamp,
        offsets: &[(PartitionKey, i64)],
    ) -> Recorded {
        let mut listed = Vec::new();
        let mut gone = Vec::new();
        let outcome = ownership.commit_with(
            offsets,
            stamp,
            |_, owned| {
                listed.extend_from_slice(owned);
                Ok(())
            },
            |partition| gone.push(partition.clone()),
        );
        Recorded {
            outcome,
            listed,
            gone,
        }
    }

    #[test]
    fn a_batch_taken_before_a_partition_was_assigned_again_does_not_commit_it() {
        let ownership = Ownership::default();
        let orders = PartitionKey::new("orders", 0);
        let other = PartitionKey::new("orders", 1);
        ownership.acquire(&[orders.clone(), other.clone()]);
        let held = ownership.stamp();
        // Given up without waiting for the runtime, then assigned again.
        ownership.release(std::slice::from_ref(&orders));
        ownership.acquire(std::slice::from_ref(&orders));

        let Recorded {
            outcome,
            listed,
            gone,
        } = commit_recorded(
            &ownership,
            held,
            &[(orders.clone(), 10), (other.clone(), 4)],
        );
        match outcome {
            Err(AckError::NotAssigned(partition)) => assert_eq!(partition, orders),
            other => panic!("expected NotAssigned, got {other:?}"),
        }
        assert_eq!(listed, vec![(other, 4)], "the partition owned throughout");
        assert!(gone.is_empty(), "owned, by the new assignment: {gone:?}");
        assert_eq!(
            ownership
                .lock()
                .get(&orders)
                .and_then(|state| state.requested),
            None,
            "the new assignment's state is untouched"
        );

        let Recorded {
            outcome, listed, ..
        } = commit_recorded(&ownership, ownership.stamp(), &[(orders.clone(), 12)]);
        assert!(outcome.is_ok(), "{outcome:?}");
        assert_eq!(listed, vec![(orders, 12)], "a batch of the new assignment");
    }

    #[test]
    fn a_partition_given_up_is_gone_for_every_batch() {
        let ownership = Ownership::default();
        let orders = PartitionKey::new("orders", 0);
        ownership.acquire(std::slice::from_ref(&orders));
        ownership.release(std::slice::from_ref(&orders));
        let Recorded {
            outcome,
            listed,
            gone,
        } = commit_recorded(&ownership, ownership.stamp(), &[(orders.clone(), 10)]);
        assert!(
            matches!(outcome, Err(AckError::NotAssigned(_))),
            "{outcome:?}"
        );
        assert!(listed.is_empty());
        assert_eq!(gone, vec![orders]);
    }

    #[test]
    fn a_confirmed_offset_is_not_committed_again() {
        let owned = Owned {
            requested: Some(10),
            confirmed: Some(10),
            topic_deleted: false,
            since: 1,
        };
        assert_eq!(owned.unconfirmed(None), None);
        assert_eq!(owned.unconfirmed(Some(8)), None);
    }

    #[test]
    fn an_attempt_the_broker_did_not_confirm_is_committed_again() {
        let owned = Owned {
            requested: Some(10),
            confirmed: Some(4),
            topic_deleted: false,
            since: 1,
        };
        assert_eq!(owned.unconfirmed(None), Some(10));
    }

    #[test]
    fn the_newer_of_the_attempt_and_the_reported_watermark_wins() {
        let owned = Owned {
            requested: Some(10),
            confirmed: None,
            topic_deleted: false,
            since: 1,
        };
        assert_eq!(owned.unconfirmed(Some(12)), Some(12));
        assert_eq!(owned.unconfirmed(Some(7)), Some(10));
        assert_eq!(Owned::default().unconfirmed(None), None);
    }
}
