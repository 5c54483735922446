//! [`MemoryAcker`]: commits a member's watermarks to its group.

use std::fmt;
use std::sync::Arc;

use super::faults::{FaultState, InjectedFault};
use super::group::MemberId;
use super::topic::Topic;
use crate::acker::{AckBatch, AckError, AckMode, Acker};

/// Commits the watermarks of one group member: `watermark + 1` per partition,
/// as Kafka commits offsets.
///
/// A commit is accepted only from the member that owns the partition (or is
/// releasing it during a rebalance), and only for the assignment its source
/// had announced when the batch was sent. Once the partition moved to another
/// member, or the source was closed or dropped, or for a batch sent before
/// the current assignment of the partition was announced (work of an earlier
/// assignment, as Kafka refuses a commit of an older generation), it is
/// refused with [`AckError::NotAssigned`]: a member never commits what it
/// lost. In a batch the partitions it still owns are committed, and the first
/// refusal is returned.
pub struct MemoryAcker {
    topic: Arc<Topic>,
    group: usize,
    member: MemberId,
    faults: Arc<FaultState>,
}

impl MemoryAcker {
    pub(crate) fn new(
        topic: Arc<Topic>,
        group: usize,
        member: MemberId,
        faults: Arc<FaultState>,
    ) -> Self {
        Self {
            topic,
            group,
            member,
            faults,
        }
    }

    /// The member this acker commits for.
    pub fn member_id(&self) -> MemberId {
        self.member
    }
}

impl fmt::Debug for MemoryAcker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryAcker")
            .field("topic", &self.topic.name)
            .field("member", &self.member)
            .finish()
    }
}

impl Acker for MemoryAcker {
    fn mode(&self) -> AckMode {
        AckMode::Watermark
    }

    async fn ack(&mut self, batch: &AckBatch) -> Result<(), AckError> {
        // What this member knew of its assignments when it sent the batch:
        // a commit of an assignment announced later is refused.
        let sent_at = self.topic.lock().groups[self.group].announcements();
        if let Some(delay) = self.faults.commit_delay() {
            // Dropped during the delay, the commit never happened.
            tokio::time::sleep(delay).await;
        }
        if self.faults.take_commit_failure() {
            return Err(AckError::Broker(Box::new(InjectedFault::Commit)));
        }
        let mut state = self.topic.lock();
        let state = &mut *state;
        let group = &mut state.groups[self.group];
        let mut first_error = None;
        for ack in &batch.partitions {
            let result = if !ack.requeue.is_empty() {
                Err(AckError::Broker(
                    format!(
                        "{}: the memory broker cannot requeue (Acker::supports_requeue is false)",
                        ack.partition
                    )
                    .into(),
                ))
            } else if let Some(watermark) = ack.watermark {
                group.commit(self.member, &ack.partition, watermark, sent_at, &state.logs)
            } else {
                Ok(())
            };
            if let Err(error) = result {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
