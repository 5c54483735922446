//! Helpers for tests that run a consumer or an [`App`](crate::app::App) on
//! the [`MemoryBroker`]: wait until a group has committed everything, assert
//! that it has, and read back the dead letters a route wrote.
//!
//! They replace the loop every such test wrote by hand (poll the group's lag,
//! sleep, give up after a while), and say what is still uncommitted, per
//! partition, when the wait runs out.

use std::fmt;
use std::time::Duration;

use crate::dead_letter::DeadLetter;
use crate::memory::{GroupSnapshot, MemoryBroker, MemoryError, PartitionState};

/// How often [`wait_until_committed`] reads the group: the memory broker has
/// no notification for commits, and a read is one lock of the topic.
const POLL: Duration = Duration::from_millis(1);

/// Why [`wait_until_committed`] returned without everything committed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommitWaitError {
    /// The broker could not say what the group committed (the topic does
    /// not exist).
    #[error("cannot read what group `{group}` committed of `{topic}`")]
    Broker {
        /// The topic.
        topic: String,
        /// The group.
        group: String,
        /// The broker's answer.
        #[source]
        source: MemoryError,
    },
    /// Time ran out with messages not committed.
    #[error(transparent)]
    Uncommitted(#[from] Uncommitted),
}

/// What a group has not committed of a topic, per partition: the answer of a
/// [`wait_until_committed`] that ran out of time, and the message of a failed
/// [`assert_committed`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Uncommitted {
    /// The topic.
    pub topic: String,
    /// The group.
    pub group: String,
    /// How long the wait lasted (`None` for an assertion, which does not
    /// wait).
    pub waited: Option<Duration>,
    /// The partitions with messages not committed, by number.
    pub partitions: Vec<PartitionState>,
}

impl Uncommitted {
    /// Messages produced and not committed, over all partitions.
    pub fn messages(&self) -> u64 {
        self.partitions.iter().map(|partition| partition.lag).sum()
    }

    /// What `snapshot` has left to commit, `None` when it committed
    /// everything produced.
    fn of(snapshot: GroupSnapshot, waited: Option<Duration>) -> Option<Self> {
        let partitions: Vec<_> = snapshot
            .partitions
            .into_iter()
            .filter(|partition| partition.lag > 0)
            .collect();
        (!partitions.is_empty()).then_some(Self {
            topic: snapshot.topic,
            group: snapshot.group,
            waited,
            partitions,
        })
    }
}

impl std::error::Error for Uncommitted {}

impl fmt::Display for Uncommitted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "group `{}` has {} message(s) of `{}` not committed",
            self.group,
            self.messages(),
            self.topic
        )?;
        if let Some(waited) = self.waited {
            write!(f, " after waiting {waited:?}")?;
        }
        for (index, partition) in self.partitions.iter().enumerate() {
            f.write_str(if index == 0 { ": " } else { "; " })?;
            match partition.committed {
                Some(committed) => write!(
                    f,
                    "partition {} committed up to offset {committed} of {}",
                    partition.partition, partition.high_watermark
                )?,
                None => write!(
                    f,
                    "partition {} committed nothing of {}",
                    partition.partition, partition.high_watermark
                )?,
            }
        }
        Ok(())
    }
}

/// Waits until `group` has committed everything produced to `topic` so far,
/// for at most `timeout` (on Tokio's clock, so a test with a paused clock
/// waits in virtual time).
///
/// The group reads as fully committed when every partition's committed
/// offset has reached its end, the state a [`Consumer`](crate::consumer::Consumer)
/// or app route reaches at its first commit after handling the last message
/// (within its `commit_interval`). A partition that holds nothing counts as
/// committed.
///
/// # Errors
///
/// [`CommitWaitError::Uncommitted`] when `timeout` passed first, naming each
/// partition still behind and how far it got; [`CommitWaitError::Broker`]
/// when `topic` does not exist.
///
/// # Example
///
/// ```
/// use std::time::Duration;
///
/// use intake_core::backend::testkit::wait_until_committed;
/// use intake_core::consumer::Consumer;
/// use intake_core::memory::{MemoryBroker, Record};
/// use intake_core::{Payload, handler_fn};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let broker = MemoryBroker::new();
/// broker.create_topic("orders", 2)?;
/// broker.send_batch("orders", (0..10).map(|id| Record::new(id.to_string())))?;
///
/// let (source, acker) = broker.consumer("orders", "billing")?;
/// let consumer = Consumer::builder()
///     .commit_interval(Duration::from_millis(5))
///     .build(source, acker, handler_fn(|Payload(_): Payload| async {}))?;
/// let stop = CancellationToken::new();
/// let running = tokio::spawn(consumer.run(stop.clone()));
///
/// wait_until_committed(&broker, "orders", "billing", Duration::from_secs(10)).await?;
/// stop.cancel();
/// assert_eq!(running.await??.succeeded, 10);
/// # Ok(())
/// # }
/// ```
pub async fn wait_until_committed(
    broker: &MemoryBroker,
    topic: &str,
    group: &str,
    timeout: Duration,
) -> Result<(), CommitWaitError> {
    // A timeout too large for the clock waits without end.
    let deadline = tokio::time::Instant::now().checked_add(timeout);
    loop {
        let snapshot = broker
            .group(topic, group)
            .map_err(|source| CommitWaitError::Broker {
                topic: topic.to_owned(),
                group: group.to_owned(),
                source,
            })?;
        let expired = deadline.is_some_and(|deadline| tokio::time::Instant::now() >= deadline);
        match Uncommitted::of(snapshot, Some(timeout)) {
            None => return Ok(()),
            Some(uncommitted) if expired => return Err(uncommitted.into()),
            Some(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// Asserts that `group` has committed everything produced to `topic`, now,
/// without waiting: after a consumer's or app's run returned, which commits
/// what it finished before returning.
///
/// # Panics
///
/// When a partition has messages not committed (the message names each
/// one, as [`Uncommitted`] displays it), or when `topic` does not exist.
///
/// # Example
///
/// ```
/// use intake_core::backend::testkit::assert_committed;
/// use intake_core::consumer::Consumer;
/// use intake_core::memory::{MemoryBroker, Record};
/// use intake_core::{Payload, handler_fn};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let broker = MemoryBroker::new();
/// broker.create_topic("orders", 1)?;
/// broker.send("orders", Record::new("order 1"))?;
///
/// let (source, acker) = broker.consumer("orders", "billing")?;
/// let stop = CancellationToken::new();
/// let handler = handler_fn({
///     let stop = stop.clone();
///     move |Payload(_): Payload| {
///         let stop = stop.clone();
///         async move { stop.cancel() }
///     }
/// });
/// // The run stops after the one message, and commits it on the way out.
/// Consumer::builder().build(source, acker, handler)?.run(stop).await?;
/// assert_committed(&broker, "orders", "billing");
/// # Ok(())
/// # }
/// ```
#[track_caller]
pub fn assert_committed(broker: &MemoryBroker, topic: &str, group: &str) {
    match broker.group(topic, group) {
        Ok(snapshot) => {
            if let Some(uncommitted) = Uncommitted::of(snapshot, None) {
                panic!("{uncommitted}");
            }
        }
        Err(error) => panic!("cannot read what group `{group}` committed of `{topic}`: {error}"),
    }
}

/// The dead letters `group` wrote for `topic`, oldest first: what a route's
/// [`DeadLetterLayer`](crate::dead_letter::DeadLetterLayer) over
/// [`broker.dead_letter_sink(topic, group)`](MemoryBroker::dead_letter_sink)
/// sent, read back as any consumer of the dead-letter topic would
/// ([`MemoryBroker::dead_letters`]). Empty when the route wrote none.
///
/// # Panics
///
/// When `topic` does not exist, or something other than a dead-letter sink
/// wrote to its dead-letter topic.
///
/// # Example
///
/// ```
/// use std::time::Duration;
///
/// use intake_core::backend::testkit::{dead_letters, wait_until_committed};
/// use intake_core::consumer::Consumer;
/// use intake_core::dead_letter::DeadLetterLayer;
/// use intake_core::memory::{MemoryBroker, Record};
/// use intake_core::{HandlerError, Payload, handler_fn};
/// use tokio_util::sync::CancellationToken;
/// use tower::ServiceBuilder;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let broker = MemoryBroker::new();
/// broker.create_topic("orders", 1)?;
/// broker.send("orders", Record::new("fine"))?;
/// broker.send("orders", Record::new("poison"))?;
///
/// let handler = ServiceBuilder::new()
///     .layer(DeadLetterLayer::new(broker.dead_letter_sink("orders", "billing")?))
///     .service(handler_fn(|Payload(payload): Payload| async move {
///         match &payload[..] {
///             b"poison" => Err(HandlerError::permanent("unknown customer")),
///             _ => Ok(()),
///         }
///     }));
/// let (source, acker) = broker.consumer("orders", "billing")?;
/// let consumer = Consumer::builder()
///     .commit_interval(Duration::from_millis(5))
///     .build(source, acker, handler)?;
/// let stop = CancellationToken::new();
/// let running = tokio::spawn(consumer.run(stop.clone()));
/// wait_until_committed(&broker, "orders", "billing", Duration::from_secs(10)).await?;
/// stop.cancel();
/// running.await??;
///
/// let letters = dead_letters(&broker, "orders", "billing");
/// assert_eq!(letters.len(), 1);
/// assert_eq!(letters[0].message.payload(), "poison");
/// assert!(letters[0].error.contains("unknown customer"));
/// # Ok(())
/// # }
/// ```
#[track_caller]
pub fn dead_letters(broker: &MemoryBroker, topic: &str, group: &str) -> Vec<DeadLetter> {
    match broker.dead_letters(topic, group) {
        Ok(letters) => letters,
        Err(error) => {
            panic!("cannot read the dead letters group `{group}` wrote for `{topic}`: {error}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acker::{AckBatch, Acker, PartitionAck};
    use crate::memory::Record;
    use crate::source::{Source, SourceEvent};

    /// Commits offsets `..=last` of `partition` as a member of `group`.
    async fn commit_through(broker: &MemoryBroker, group: &str, last: &[(u32, i64)]) {
        let (mut source, mut acker) = broker.consumer("orders", group).expect("consumer");
        let mut buf = Vec::new();
        assert!(matches!(
            source.next(&mut buf, 64).await,
            Ok(SourceEvent::Assigned(_))
        ));
        assert!(matches!(
            source.next(&mut buf, 64).await,
            Ok(SourceEvent::Delivered)
        ));
        let partitions = last
            .iter()
            .map(|&(partition, offset)| {
                let message = buf
                    .iter()
                    .find(|message| {
                        message.metadata().partition() == partition
                            && message.metadata().position() == crate::Position::Offset(offset)
                    })
                    .expect("delivered");
                let mut done = PartitionAck::new(message.metadata().partition_key());
                done.watermark = Some(message.metadata().position());
                done
            })
            .collect();
        acker
            .ack(&AckBatch {
                partitions,
                sync: true,
            })
            .await
            .expect("commit");
        source.close().await.expect("close");
    }

    fn broker_with(per_partition: &[u32]) -> MemoryBroker {
        let broker = MemoryBroker::new();
        let partitions = u32::try_from(per_partition.len()).expect("partitions");
        broker.create_topic("orders", partitions).expect("topic");
        for (partition, &count) in (0..).zip(per_partition) {
            for id in 0..count {
                broker
                    .send(
                        "orders",
                        Record::new(id.to_string()).to_partition(partition),
                    )
                    .expect("send");
            }
        }
        broker
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_that_runs_out_names_every_partition_left_behind() {
        // Partition 0 committed part of its messages, partition 1 nothing,
        // partition 2 everything and partition 3 holds nothing.
        let broker = broker_with(&[5, 3, 2, 0]);
        commit_through(&broker, "billing", &[(0, 1), (2, 1)]).await;

        let error = wait_until_committed(&broker, "orders", "billing", Duration::from_secs(2))
            .await
            .expect_err("not everything is committed");
        let CommitWaitError::Uncommitted(uncommitted) = &error else {
            panic!("expected uncommitted messages, got {error:?}");
        };
        assert_eq!(
            uncommitted
                .partitions
                .iter()
                .map(|partition| (partition.partition, partition.committed, partition.lag))
                .collect::<Vec<_>>(),
            [(0, Some(2), 3), (1, None, 3)]
        );
        assert_eq!(uncommitted.messages(), 6);
        assert_eq!(
            error.to_string(),
            "group `billing` has 6 message(s) of `orders` not committed after waiting 2s: \
             partition 0 committed up to offset 2 of 5; partition 1 committed nothing of 3"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_returns_once_the_last_partition_is_committed() {
        let broker = broker_with(&[2, 2]);
        let waiting = tokio::spawn({
            let broker = broker.clone();
            async move {
                wait_until_committed(&broker, "orders", "billing", Duration::from_secs(60)).await
            }
        });
        commit_through(&broker, "billing", &[(0, 1)]).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "partition 1 is not committed yet");

        commit_through(&broker, "billing", &[(1, 1)]).await;
        waiting
            .await
            .expect("join")
            .expect("everything is committed");
        assert_committed(&broker, "orders", "billing");
    }

    #[tokio::test]
    async fn an_unknown_topic_is_an_error_at_once() {
        let broker = MemoryBroker::new();
        let error = wait_until_committed(&broker, "orders", "billing", Duration::MAX)
            .await
            .expect_err("no such topic");
        assert!(matches!(
            &error,
            CommitWaitError::Broker {
                source: MemoryError::UnknownTopic { .. },
                ..
            }
        ));
        assert_eq!(
            error.to_string(),
            "cannot read what group `billing` committed of `orders`"
        );
    }

    #[test]
    fn an_empty_topic_is_committed() {
        let broker = broker_with(&[0, 0]);
        assert_committed(&broker, "orders", "never-consumed");
    }

    #[test]
    #[should_panic(
        expected = "group `billing` has 2 message(s) of `orders` not committed: \
                    partition 1 committed nothing of 2"
    )]
    fn the_assertion_says_what_is_left() {
        let broker = broker_with(&[0, 2]);
        assert_committed(&broker, "orders", "billing");
    }

    #[test]
    fn a_group_that_wrote_no_dead_letters_reads_none() {
        let broker = broker_with(&[1]);
        assert!(dead_letters(&broker, "orders", "billing").is_empty());
    }
}
