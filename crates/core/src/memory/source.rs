//! [`MemorySource`]: one member of a consumer group, as a [`Source`].

use std::fmt;
use std::sync::Arc;

use futures_util::future::select_all;
use tokio::sync::Notify;

use super::faults::{FaultState, InjectedFault};
use super::group::{MemberId, Poll};
use super::topic::Topic;
use crate::message::{Message, PartitionKey};
use crate::source::{Source, SourceError, SourceEvent};

/// One member of a consumer group: fetches the partitions assigned to it and
/// reports assignments and revocations.
///
/// - Deliveries are clones of the stored messages (reference-count bumps),
///   taken under one lock per batch, fairly across the member's partitions.
/// - [`next`](Source::next) waits without polling and is cancel-safe: it
///   takes messages only in the step that returns them.
/// - Dropping a source without [`close`](Source::close) is a crash: the
///   member leaves at once and whatever it did not commit goes to the next
///   owner of its partitions, with [`attempt`](crate::Metadata::attempt) > 1.
/// - With `max == 0` (the runtime asks so while it may take no delivery:
///   its budget is full, or a partition it could not pause is over its
///   uncommitted window) it returns only assignment changes, never
///   deliveries, as the trait asks.
/// - It [pauses](Source::pause) a partition when the runtime asks (one over
///   its uncommitted window): the partition is not fetched until it is
///   resumed, or assigned to this member again, while the others are. The
///   runtime may still get what one fetch took before the pause.
/// - While partitions are on their way to this member, `next` waits for
///   their old owner to release them, bounded by the broker's rebalance
///   timeout, which needs a Tokio runtime with time enabled.
pub struct MemorySource {
    topic: Arc<Topic>,
    group: usize,
    member: MemberId,
    notify: Arc<Notify>,
    faults: Arc<FaultState>,
    closed: bool,
}

impl MemorySource {
    pub(crate) fn new(
        topic: Arc<Topic>,
        group: usize,
        member: MemberId,
        notify: Arc<Notify>,
        faults: Arc<FaultState>,
    ) -> Self {
        Self {
            topic,
            group,
            member,
            notify,
            faults,
            closed: false,
        }
    }

    /// This source's identity in its group.
    pub fn member_id(&self) -> MemberId {
        self.member
    }

    /// Pauses or resumes fetching `partition` (one lock, once per change);
    /// `false` for a partition of another topic, or once closed.
    fn set_paused(&mut self, partition: &PartitionKey, paused: bool) -> bool {
        if self.closed || *partition.source != *self.topic.name {
            return false;
        }
        let mut state = self.topic.lock();
        state.groups[self.group].pause(self.member, partition.partition, paused)
    }

    fn leave(&mut self, crashed: bool) {
        if std::mem::replace(&mut self.closed, true) {
            return;
        }
        let mut state = self.topic.lock();
        let state = &mut *state;
        state.groups[self.group].leave(self.member, crashed, &state.logs);
    }
}

impl fmt::Debug for MemorySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemorySource")
            .field("topic", &self.topic.name)
            .field("member", &self.member)
            .field("closed", &self.closed)
            .finish()
    }
}

impl Source for MemorySource {
    async fn next(
        &mut self,
        deliveries: &mut Vec<Message>,
        max: usize,
    ) -> Result<SourceEvent, SourceError> {
        if self.closed {
            return Err(SourceError::Fatal(
                format!(
                    "the memory source of topic `{}` was closed",
                    self.topic.name
                )
                .into(),
            ));
        }
        if self.faults.take_fetch_failure() {
            return Err(SourceError::Transient(Box::new(InjectedFault::Fetch)));
        }
        loop {
            // Everything this call takes happens inside this block, which
            // returns without awaiting: a future dropped at the await below
            // has taken nothing.
            let handoffs = {
                let mut state = self.topic.lock();
                let state = &mut *state;
                match state.groups[self.group].poll(self.member, &state.logs, deliveries, max) {
                    Poll::Ready(event) => return Ok(event),
                    Poll::Gone => {
                        return Err(SourceError::Fatal(
                            format!("{} is no longer in its group", self.member).into(),
                        ));
                    }
                    Poll::Wait(handoffs) => handoffs,
                }
            };
            // A wake-up that lands between the poll and this await is kept
            // as the Notify's permit, so none is lost.
            match handoffs {
                None => self.notify.notified().await,
                Some(handoffs) => {
                    tokio::select! {
                        () = self.notify.notified() => {}
                        _ = select_all(handoffs.releases) => {}
                        () = tokio::time::sleep_until(handoffs.deadline) => {}
                    }
                }
            }
        }
    }

    fn pause(&mut self, partition: &PartitionKey) -> bool {
        self.set_paused(partition, true)
    }

    fn resume(&mut self, partition: &PartitionKey) {
        self.set_paused(partition, false);
    }

    async fn close(&mut self) -> Result<(), SourceError> {
        self.leave(false);
        Ok(())
    }
}

impl Drop for MemorySource {
    fn drop(&mut self) {
        self.leave(true);
    }
}
