//! The group as inspection sees it: members, assignment, committed offsets
//! and lag.

use super::{Group, Ownership};
use crate::memory::snapshot::{GroupSnapshot, MemberSnapshot, PartitionOwner, PartitionState};
use crate::message::Message;

impl Group {
    /// The group as it is now (after handing over released partitions).
    pub(crate) fn snapshot(&mut self, logs: &[Vec<Message>]) -> GroupSnapshot {
        if self.releasing > 0 {
            self.resolve_releases(logs);
        }
        GroupSnapshot {
            topic: self.topic.to_string(),
            group: self.name.to_string(),
            generation: self.generation,
            members: self
                .members
                .iter()
                .map(|member| MemberSnapshot {
                    id: member.id,
                    partitions: {
                        let mut owned = member.owned.clone();
                        owned.sort_unstable();
                        owned
                    },
                    pending_revocations: member.revocations.len(),
                })
                .collect(),
            partitions: self
                .partitions
                .iter()
                .zip(logs)
                .zip(&self.deliveries)
                .enumerate()
                .map(|(partition, ((state, log), delivery))| {
                    let hidden = delivery.hidden_between(state.committed.unwrap_or(0), log.len());
                    partition_snapshot(
                        partition as u32,
                        state.committed,
                        log.len(),
                        hidden,
                        &state.ownership,
                    )
                })
                .collect(),
        }
    }
}

fn partition_snapshot(
    partition: u32,
    committed: Option<usize>,
    high_watermark: usize,
    hidden: usize,
    ownership: &Ownership,
) -> PartitionState {
    PartitionState {
        partition,
        committed: committed.map(|offset| offset as i64),
        high_watermark: high_watermark as i64,
        // Copies parked by other groups are not this group's backlog.
        lag: high_watermark
            .saturating_sub(committed.unwrap_or(0))
            .saturating_sub(hidden) as u64,
        owner: match ownership {
            Ownership::Unowned => PartitionOwner::Unassigned,
            Ownership::Owned { member, .. } => PartitionOwner::Assigned(*member),
            Ownership::Releasing { from, to, .. } => PartitionOwner::Releasing {
                from: *from,
                to: *to,
            },
        },
    }
}
