//! The rebalance protocol: spreading the partitions over the members, and
//! handing a partition that changes hands over once its old owner let go
//! (see the [group's docs](super) for the states of a partition).

use futures_util::FutureExt;
use tokio::time::Instant;

use super::{Group, MemberId, Ownership, Release};
use crate::memory::consumer::OffsetReset;
use crate::message::{Message, PartitionKey};
use crate::source::Revocation;

/// Partitions released to a waiting member once their old owner lets go.
pub(crate) struct Handoffs {
    /// Completions of the old owners' revocations.
    pub(crate) releases: Vec<Release>,
    /// When the earliest of them times out.
    pub(crate) deadline: Instant,
}

impl Group {
    /// Spreads the partitions over the members again. Partitions that change
    /// hands go through `Releasing` unless their owner never heard of them.
    pub(super) fn rebalance(&mut self, logs: &[Vec<Message>]) {
        self.generation += 1;
        let count = self.partitions.len() as u32;
        let members = self.members.len();
        // (old owner, partition, new owner) of every partition to revoke.
        let mut revoked: Vec<(MemberId, u32, Option<MemberId>)> = Vec::new();
        for partition in 0..count {
            let target = self
                .config
                .assignment
                .owner_of(partition, count, members)
                .map(|index| self.members[index].id);
            let p = partition as usize;
            match &mut self.partitions[p].ownership {
                Ownership::Unowned => {
                    if let Some(target) = target {
                        self.transfer(p, target, logs);
                    }
                }
                Ownership::Owned { member, .. } if Some(*member) == target => {}
                Ownership::Owned { member, .. } => {
                    let from = *member;
                    if let Some(owner) = self.member_mut(from) {
                        owner.owned.retain(|&owned| owned != partition);
                        if let Some(at) = owner.unannounced.iter().position(|&q| q == partition) {
                            // The runtime never heard of it, so there is
                            // nothing to drain: hand it over at once.
                            owner.unannounced.swap_remove(at);
                            self.set_ownership(p, Ownership::Unowned);
                            if let Some(target) = target {
                                self.transfer(p, target, logs);
                            }
                            continue;
                        }
                    }
                    revoked.push((from, partition, target));
                }
                Ownership::Releasing { to, .. } => {
                    *to = target;
                    if let Some(member) = target.and_then(|target| self.member_mut(target)) {
                        member.notify.notify_one();
                    }
                }
            }
        }
        let deadline = crate::deadline::after(Instant::now(), self.config.rebalance_timeout);
        for index in 0..self.members.len() {
            let from = self.members[index].id;
            let partitions: Vec<u32> = revoked
                .iter()
                .filter(|(owner, ..)| *owner == from)
                .map(|&(_, partition, _)| partition)
                .collect();
            if partitions.is_empty() {
                continue;
            }
            let keys = partitions
                .iter()
                .map(|&partition| PartitionKey {
                    source: self.topic.clone(),
                    partition,
                })
                .collect();
            let (revocation, handle) = Revocation::new(keys);
            let release: Release = async move {
                // Completed, abandoned or dropped: any outcome releases.
                let _ = handle.wait().await;
            }
            .boxed()
            .shared();
            tracing::debug!(topic = %self.topic, group = %self.name, member = %from,
                ?partitions, generation = self.generation, "revoking partitions");
            let member = &mut self.members[index];
            member.revocations.push_back(revocation);
            member.notify.notify_one();
            for &(_, partition, target) in revoked.iter().filter(|(owner, ..)| *owner == from) {
                self.set_ownership(
                    partition as usize,
                    Ownership::Releasing {
                        from,
                        to: target,
                        release: release.clone(),
                        deadline,
                    },
                );
                if let Some(member) = target.and_then(|target| self.member_mut(target)) {
                    member.notify.notify_one();
                }
            }
        }
    }

    /// Gives an unowned partition to `to`, fetching from the committed
    /// offset (or where `to`'s offset reset says, if nothing was committed).
    fn transfer(&mut self, partition: usize, to: MemberId, logs: &[Vec<Message>]) {
        let Some(index) = self.member_index(to) else {
            return;
        };
        let member = &mut self.members[index];
        let state = &mut self.partitions[partition];
        self.deliveries[partition].rewind(state.committed.unwrap_or(match member.offset_reset {
            OffsetReset::Earliest => 0,
            OffsetReset::Latest => logs[partition].len(),
        }));
        member.owned.push(partition as u32);
        member.unannounced.push(partition as u32);
        // A pause ends with the assignment it was made under.
        member.paused.retain(|&paused| paused != partition as u32);
        state.announced = None;
        member.notify.notify_one();
        let notify = member.notify.clone();
        self.set_ownership(partition, Ownership::Owned { member: to, notify });
    }

    /// Replaces a partition's ownership, keeping the count of releasing
    /// partitions true.
    pub(super) fn set_ownership(&mut self, partition: usize, ownership: Ownership) {
        let state = &mut self.partitions[partition];
        let was = matches!(state.ownership, Ownership::Releasing { .. });
        let is = matches!(ownership, Ownership::Releasing { .. });
        state.ownership = ownership;
        match (was, is) {
            (true, false) => self.releasing -= 1,
            (false, true) => self.releasing += 1,
            _ => {}
        }
    }

    /// Hands over every partition whose old owner let go or ran out of time.
    pub(super) fn resolve_releases(&mut self, logs: &[Vec<Message>]) {
        let now = Instant::now();
        for partition in 0..self.partitions.len() {
            let Ownership::Releasing {
                from,
                to,
                release,
                deadline,
            } = &self.partitions[partition].ownership
            else {
                continue;
            };
            // Polling a clone with a no-op waker drives the revocation's
            // completion without blocking and without a task of its own.
            let released = release.peek().is_some() || release.clone().now_or_never().is_some();
            if !released && now < *deadline {
                continue;
            }
            let (from, to) = (*from, *to);
            if released {
                tracing::debug!(topic = %self.topic, group = %self.name, partition, %from,
                    to = ?to.map(|to| to.to_string()), "partition released");
            } else {
                tracing::warn!(topic = %self.topic, group = %self.name, partition, %from,
                    timeout = ?self.config.rebalance_timeout,
                    "the old owner did not release the partition within the rebalance timeout; \
                     handing it over anyway (its later commits are refused)");
            }
            self.set_ownership(partition, Ownership::Unowned);
            if let Some(to) = to {
                self.transfer(partition, to, logs);
            }
        }
    }

    /// The releases `id` waits for, if partitions are on their way to it.
    pub(super) fn handoffs_to(&self, id: MemberId) -> Option<Handoffs> {
        if self.releasing == 0 {
            return None;
        }
        let mut handoffs: Option<Handoffs> = None;
        for state in &self.partitions {
            if let Ownership::Releasing {
                to: Some(to),
                release,
                deadline,
                ..
            } = &state.ownership
                && *to == id
            {
                let handoffs = handoffs.get_or_insert_with(|| Handoffs {
                    releases: Vec::new(),
                    deadline: *deadline,
                });
                handoffs.releases.push(release.clone());
                handoffs.deadline = handoffs.deadline.min(*deadline);
            }
        }
        handoffs
    }
}
