//! A member's poll: its next event (a revocation, an assignment) or a batch
//! of deliveries, and what wakes it.

use super::{Group, Handoffs, MemberId, Ownership};
use crate::memory::fetch::fetch;
use crate::message::{Message, PartitionKey};
use crate::source::SourceEvent;

/// What a member's poll found.
pub(crate) enum Poll {
    /// An event to return; for [`SourceEvent::Delivered`] the buffer was
    /// filled.
    Ready(SourceEvent),
    /// Nothing yet: wait for a wake-up, and for these handoffs if any.
    Wait(Option<Handoffs>),
    /// The member is no longer in the group.
    Gone,
}

impl Group {
    /// The member's next event, or a batch of at most `max` deliveries
    /// appended to `buf`. Synchronous, so a caller that returns right after
    /// it loses nothing when its future is dropped later.
    pub(crate) fn poll(
        &mut self,
        id: MemberId,
        logs: &[Vec<Message>],
        buf: &mut Vec<Message>,
        max: usize,
    ) -> Poll {
        if self.releasing > 0 {
            self.resolve_releases(logs);
        }
        let Some(index) = self.member_index(id) else {
            return Poll::Gone;
        };
        let member = &mut self.members[index];
        if let Some(revocation) = member.revocations.pop_front() {
            return Poll::Ready(SourceEvent::Revoked(revocation));
        }
        if !member.unannounced.is_empty() {
            self.announcements += 1;
            let keys = member
                .unannounced
                .drain(..)
                .map(|partition| {
                    self.partitions[partition as usize].announced = Some(self.announcements);
                    PartitionKey {
                        source: self.topic.clone(),
                        partition,
                    }
                })
                .collect();
            return Poll::Ready(SourceEvent::Assigned(keys));
        }
        let fetched = fetch(
            &member.owned,
            &member.paused,
            &mut member.first,
            &mut self.deliveries,
            logs,
            buf,
            max,
        );
        if fetched > 0 {
            return Poll::Ready(SourceEvent::Delivered);
        }
        Poll::Wait(self.handoffs_to(id))
    }

    /// Stops (`paused`) or resumes fetching `partition` for member `id`;
    /// `false` if `id` is no longer in the group.
    pub(crate) fn pause(&mut self, id: MemberId, partition: u32, paused: bool) -> bool {
        let Some(member) = self.member_mut(id) else {
            return false;
        };
        member.paused.retain(|&other| other != partition);
        if paused {
            member.paused.push(partition);
        }
        true
    }

    /// Wakes whoever fetches `partition`, after a produce.
    pub(crate) fn wake_owner(&self, partition: u32) {
        if let Ownership::Owned { notify, .. } = &self.partitions[partition as usize].ownership {
            notify.notify_one();
        }
    }
}
