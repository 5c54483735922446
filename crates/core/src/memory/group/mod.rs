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
//!
//! The group's parts: [`rebalance`] (who owns which partition, and the
//! handover), [`fetching`] (a member's poll: events and deliveries),
//! [`commit`] (committed offsets, and the offsets hidden from the group) and
//! [`snapshot`] (inspection).

mod commit;
mod fetching;
mod rebalance;
mod snapshot;

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use futures_util::future::{BoxFuture, Shared};
use tokio::sync::Notify;
use tokio::time::Instant;

pub(crate) use self::fetching::Poll;
pub(crate) use self::rebalance::Handoffs;
use super::broker::BrokerConfig;
use super::consumer::OffsetReset;
use super::fetch::Delivery;
use crate::message::{Message, SourceName};
use crate::source::Revocation;

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

    fn member_index(&self, id: MemberId) -> Option<usize> {
        self.members.iter().position(|member| member.id == id)
    }

    fn member_mut(&mut self, id: MemberId) -> Option<&mut Member> {
        self.members.iter_mut().find(|member| member.id == id)
    }
}
