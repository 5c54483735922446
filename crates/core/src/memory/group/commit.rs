//! Committed offsets: a member's commit, checked against its current
//! assignment, and the offsets hidden from the group (copies another group
//! parked), which a commit passes over.

use super::{Group, MemberId, Ownership};
use crate::acker::AckError;
use crate::message::{Message, PartitionKey, Position};

impl Group {
    /// The announcement clock now; an acknowledgement reads it when it is
    /// sent and hands it to [`commit`](Self::commit).
    pub(crate) fn announcements(&self) -> u64 {
        self.announcements
    }

    /// Commits `watermark + 1` for `key` on behalf of `id`, for an
    /// acknowledgement sent when the announcement clock read `sent_at`.
    ///
    /// Like Kafka's generation check, a commit sent before its member
    /// learned of its current assignment of the partition is refused: it
    /// carries work of an earlier assignment, which the broker already handed
    /// to someone else (perhaps then back to this member), and which could
    /// otherwise move the committed offset back behind what others committed
    /// since.
    pub(crate) fn commit(
        &mut self,
        id: MemberId,
        key: &PartitionKey,
        watermark: Position,
        sent_at: u64,
        logs: &[Vec<Message>],
    ) -> Result<(), AckError> {
        if key.source != self.topic || key.partition as usize >= self.partitions.len() {
            return Err(AckError::Broker(
                format!(
                    "{key} is not a partition of topic `{}` ({} partitions)",
                    self.topic,
                    self.partitions.len()
                )
                .into(),
            ));
        }
        let partition = key.partition as usize;
        let state = &mut self.partitions[partition];
        let owns = match &state.ownership {
            Ownership::Owned { member, .. } => *member == id,
            Ownership::Releasing { from, .. } => *from == id,
            Ownership::Unowned => false,
        };
        let current = state
            .announced
            .is_some_and(|announced| announced <= sent_at);
        if !owns || !current {
            return Err(AckError::NotAssigned(key.clone()));
        }
        let high_watermark = logs[partition].len();
        let next = match watermark {
            Position::Offset(offset) => usize::try_from(offset.saturating_add(1)).ok(),
            _ => {
                return Err(AckError::Broker(
                    format!("{key}: the memory broker commits offsets, not {watermark:?}").into(),
                ));
            }
        };
        let Some(next) = next.filter(|&next| next <= high_watermark) else {
            return Err(AckError::Broker(
                format!(
                    "{key}: cannot commit past offset {watermark}: the partition ends at {high_watermark}"
                )
                .into(),
            ));
        };
        // Copies another group parked right after it are not this group's
        // to consume: pass over them, as Kafka's position passes over
        // control records.
        let next = self.deliveries[partition].visible_from(next, high_watermark);
        state.committed = Some(next);
        self.deliveries[partition].forget_below(next);
        Ok(())
    }

    /// Hides `offset` of `partition` from this group: a copy another group
    /// parked, which goes back to that group alone.
    pub(crate) fn hide(&mut self, partition: u32, offset: usize) {
        self.deliveries[partition as usize].hide(offset);
    }

    /// The first offset of `partition` from `offset` on that this group
    /// consumes (`end` if none before it).
    pub(crate) fn visible_from(&self, partition: u32, offset: usize, end: usize) -> usize {
        self.deliveries[partition as usize].visible_from(offset, end)
    }
}
