//! A consumer group on one topic: its members, who owns which partition,
//! committed offsets, and the rebalance protocol.
//!
//! # Ownership of a partition
//!
//! ```text
//!            assign (no earlier owner)
//! Unowned ──────────────────────────────► Owned(member)
//!    ▲                                        │ rebalance moves it away
//!    │ released: the revocation completed,    ▼
//!    │ timed out, or the old owner left   Releasing { from, to }
//!    └────────────────────────────────────────┘ (then assigned to `to`)
//! ```
//!
//! `from` may still commit while `Releasing` (the runtime commits what it
//! drained before it completes the revocation) but no longer fetches; `to`
//! gets the partition, and its `Assigned` event, only once it is released.
//! So a new owner never fetches a partition before the old one let go of it,
//! and a member that lost a partition can never commit it again.
//!
//! Nobody needs a task of its own to watch a revocation: its completion is a
//! shared future that the prospective owner awaits while it waits for work,
//! and that any lock holder checks without blocking.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::broker::BrokerConfig;
use super::consumer::OffsetReset;
use super::fetch::{Delivery, fetch};
use super::snapshot::{GroupSnapshot, MemberSnapshot, PartitionOwner, PartitionState};
use crate::acker::AckError;
use crate::message::{Message, PartitionKey, Position, SourceName};
use crate::source::{Revocation, SourceEvent};

/// Identifies a member of a consumer group (one source). Never reused within
/// a group, so a member that left and a new one are never confused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemberId(pub(crate) u64);

impl fmt::Display for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "member-{}", self.0)
    }
}

/// Resolves once the runtime completed (or dropped) a revocation.
pub(crate) type Release = Shared<BoxFuture<'static, ()>>;

enum Ownership {
    Unowned,
    Owned {
        member: MemberId,
        notify: Arc<Notify>,
    },
    Releasing {
        from: MemberId,
        to: Option<MemberId>,
        release: Release,
        deadline: Instant,
    },
}

/// One partition as the group sees it.
struct GroupPartition {
    /// The next offset to consume, as committed (Kafka's convention).
    committed: Option<usize>,
    ownership: Ownership,
    /// When its owner learned of the current assignment (the group's
    /// announcement count then); `None` until it did.
    announced: Option<u64>,
}

struct Member {
    id: MemberId,
    notify: Arc<Notify>,
    offset_reset: OffsetReset,
    /// Partitions this member owns and fetches.
    owned: Vec<u32>,
    /// Owned partitions whose `Assigned` event was not returned yet; they
    /// are not fetched until it was.
    unannounced: Vec<u32>,
    /// Owned partitions the runtime paused (`Source::pause`): not fetched
    /// until resumed, or assigned again.
    paused: Vec<u32>,
    /// Revocations to hand to the runtime, oldest first.
    revocations: VecDeque<Revocation>,
    /// Index into `owned` of the partition that fetches first next time.
    first: usize,
}

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

/// Partitions released to a waiting member once their old owner lets go.
pub(crate) struct Handoffs {
    /// Completions of the old owners' revocations.
    pub(crate) releases: Vec<Release>,
    /// When the earliest of them times out.
    pub(crate) deadline: Instant,
}

/// A consumer group of one topic.
pub(crate) struct Group {
    topic: SourceName,
    name: Arc<str>,
    config: BrokerConfig,
    pub(crate) faults: Arc<super::faults::FaultState>,
    members: Vec<Member>,
    partitions: Vec<GroupPartition>,
    /// What each partition's owner fetches next, and how often offsets were
    /// delivered; apart from `partitions` so a fetch borrows only these.
    deliveries: Vec<Delivery>,
    /// Number of partitions in `Releasing`, so a fetch checks for handoffs
    /// only while there are any.
    releasing: usize,
    generation: u64,
    /// `Assigned` events handed out so far: the clock that tells a commit
    /// of the current assignment from one sent under an earlier one.
    announcements: u64,
    next_member: u64,
}

impl Group {
    pub(crate) fn new(
        topic: SourceName,
        name: Arc<str>,
        partitions: u32,
        config: BrokerConfig,
    ) -> Self {
        Self {
            topic,
            name,
            config,
            faults: Arc::default(),
            members: Vec::new(),
            partitions: (0..partitions)
                .map(|_| GroupPartition {
                    committed: None,
                    ownership: Ownership::Unowned,
                    announced: None,
                })
                .collect(),
            deliveries: (0..partitions).map(|_| Delivery::default()).collect(),
            releasing: 0,
            generation: 0,
            announcements: 0,
            next_member: 1,
        }
    }

    /// Adds a member and rebalances.
    pub(crate) fn join(
        &mut self,
        offset_reset: OffsetReset,
        logs: &[Vec<Message>],
    ) -> (MemberId, Arc<Notify>) {
        let id = MemberId(self.next_member);
        self.next_member += 1;
        let notify = Arc::new(Notify::new());
        self.members.push(Member {
            id,
            notify: notify.clone(),
            offset_reset,
            owned: Vec::new(),
            unannounced: Vec::new(),
            paused: Vec::new(),
            revocations: VecDeque::new(),
            first: 0,
        });
        tracing::debug!(topic = %self.topic, group = %self.name, member = %id, "member joined");
        self.rebalance(logs);
        (id, notify)
    }

    /// Removes a member: what it owned is free at once (from its committed
    /// offset), and the rest of the group rebalances.
    pub(crate) fn leave(&mut self, id: MemberId, crashed: bool, logs: &[Vec<Message>]) {
        let Some(index) = self.member_index(id) else {
            return;
        };
        let member = self.members.remove(index);
        for partition in 0..self.partitions.len() {
            match &mut self.partitions[partition].ownership {
                Ownership::Owned { member, .. } if *member == id => {
                    self.set_ownership(partition, Ownership::Unowned);
                }
                Ownership::Releasing { from, .. } if *from == id => {
                    self.set_ownership(partition, Ownership::Unowned);
                }
                Ownership::Releasing { to, .. } if *to == Some(id) => *to = None,
                _ => {}
            }
        }
        if crashed {
            tracing::debug!(topic = %self.topic, group = %self.name, member = %id,
                "member left without closing; its uncommitted messages go to the next owner");
        } else {
            tracing::debug!(topic = %self.topic, group = %self.name, member = %id, "member left");
        }
        // Its undelivered revocations are dropped here, which resolves them as
        // abandoned: nobody waits on a member that is gone.
        drop(member);
        self.rebalance(logs);
    }

    /// Spreads the partitions over the members again. Partitions that change
    /// hands go through `Releasing` unless their owner never heard of them.
    fn rebalance(&mut self, logs: &[Vec<Message>]) {
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
    fn set_ownership(&mut self, partition: usize, ownership: Ownership) {
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
    fn resolve_releases(&mut self, logs: &[Vec<Message>]) {
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

    /// The releases `id` waits for, if partitions are on their way to it.
    fn handoffs_to(&self, id: MemberId) -> Option<Handoffs> {
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

    /// Wakes whoever fetches `partition`, after a produce.
    pub(crate) fn wake_owner(&self, partition: u32) {
        if let Ownership::Owned { notify, .. } = &self.partitions[partition as usize].ownership {
            notify.notify_one();
        }
    }

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

    fn member_index(&self, id: MemberId) -> Option<usize> {
        self.members.iter().position(|member| member.id == id)
    }

    fn member_mut(&mut self, id: MemberId) -> Option<&mut Member> {
        self.members.iter_mut().find(|member| member.id == id)
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
