//! Inspection: what a consumer group owns, has committed and still has to
//! consume.

use super::group::MemberId;

/// A consumer group of one topic at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupSnapshot {
    /// The topic.
    pub topic: String,
    /// The group.
    pub group: String,
    /// How many rebalances the group went through.
    pub generation: u64,
    /// The members, in the order they joined.
    pub members: Vec<MemberSnapshot>,
    /// Every partition of the topic, by number.
    pub partitions: Vec<PartitionState>,
}

impl GroupSnapshot {
    /// Messages produced and not committed, over all partitions.
    pub fn lag(&self) -> u64 {
        self.partitions.iter().map(|partition| partition.lag).sum()
    }

    /// The committed offset of each partition (the next offset to consume),
    /// `None` where the group never committed.
    pub fn committed(&self) -> Vec<Option<i64>> {
        self.partitions
            .iter()
            .map(|partition| partition.committed)
            .collect()
    }

    /// The partitions `member` owns, ascending (empty if it is not a member).
    pub fn partitions_of(&self, member: MemberId) -> &[u32] {
        self.members
            .iter()
            .find(|snapshot| snapshot.id == member)
            .map_or(&[], |snapshot| &snapshot.partitions)
    }
}

/// One member of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemberSnapshot {
    /// The member.
    pub id: MemberId,
    /// Partitions it owns (and fetches, once its source announced them),
    /// ascending.
    pub partitions: Vec<u32>,
    /// Revocations its source has not handed to the runtime yet.
    pub pending_revocations: usize,
}

/// One partition as a group sees it, at the moment of its
/// [`GroupSnapshot`]. Not the runtime's
/// [`PartitionSnapshot`](crate::observer::PartitionSnapshot), which is a
/// consumer's view of a partition it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionState {
    /// The partition number.
    pub partition: u32,
    /// The committed offset: the next offset the group will consume. `None`
    /// if the group never committed this partition.
    pub committed: Option<i64>,
    /// The offset the next produced message gets (the partition's length).
    pub high_watermark: i64,
    /// `high_watermark - committed`, counting from offset 0 when nothing was
    /// committed, less the copies other groups parked (which this group
    /// never gets).
    pub lag: u64,
    /// Who owns the partition.
    pub owner: PartitionOwner,
}

/// Who owns a partition of a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PartitionOwner {
    /// Nobody (the group has no members).
    Unassigned,
    /// This member fetches and commits it.
    Assigned(MemberId),
    /// A rebalance is moving it: `from` was told to release it and may
    /// still commit it; `to` gets it once `from` released it, left, or ran
    /// out of rebalance time.
    Releasing {
        /// The previous owner.
        from: MemberId,
        /// The next owner, if the group has one for it.
        to: Option<MemberId>,
    },
}

impl PartitionState {
    /// A partition of a group that holds nothing yet; `private` of its
    /// messages are copies parked by other groups, which it never gets.
    pub(crate) fn unconsumed(partition: u32, high_watermark: usize, private: usize) -> Self {
        Self {
            partition,
            committed: None,
            high_watermark: high_watermark as i64,
            lag: high_watermark.saturating_sub(private) as u64,
            owner: PartitionOwner::Unassigned,
        }
    }
}
