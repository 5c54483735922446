//! Partitions paused through the control
//! ([`ConsumerControl`](crate::consumer::ConsumerControl)).
//!
//! The commands are taken at a pass of the loop when the control's flag is
//! raised (`apply_control`), never per message. A paused partition's
//! deliveries start no more: one fetched while it is paused is admitted (a
//! slot, a ticket: its partition's watermark stays before it) and held
//! without joining its lane (`admit_paused`); one that waited in `ready`
//! when the pause came is held as it reaches the front (`pump`). Running
//! deliveries finish and commit as usual. The source is asked to stop
//! fetching the partition through the queue of pauses the uncommitted
//! window already uses (`partitions.rs`). A resume puts the held deliveries
//! back in their order: those that joined their lane to `ready`, the others
//! into their lanes, where they queue behind any running delivery of the
//! lane.

use tower::Service;

use super::Dispatcher;
use crate::consumer::control::Command;
use crate::consumer::slots::{SlotId, SlotState};
use crate::error::HandlerError;
use crate::message::Message;

impl<H> Dispatcher<H>
where
    H: Service<Message, Response = ()> + Send + 'static,
    H::Error: Into<HandlerError> + Send + 'static,
    H::Future: Send + 'static,
{
    /// Takes the control's commands: pauses are marked (the source hears of
    /// them before it is asked again), resumes put the held deliveries back.
    #[cold]
    #[inline(never)]
    pub(super) fn apply_control(&mut self) {
        let mut commands = Vec::new();
        self.settings.control.take(&mut commands);
        let mut resumed = false;
        for command in commands {
            match command {
                Command::Partition(key, pause) => {
                    tracing::info!(partition = %key, pause, "the control pauses or resumes a partition");
                    self.partitions.user_pause(&key, pause);
                    resumed |= !pause;
                }
                Command::All(pause) => {
                    tracing::info!(pause, "the control pauses or resumes every partition");
                    self.partitions.user_pause_all(pause);
                    resumed |= !pause;
                }
            }
        }
        if resumed {
            self.release_held();
        }
    }

    /// Holds `slot`, at the front of `ready`, if its partition is paused;
    /// `true` if it did (it left `ready`).
    #[cold]
    #[inline(never)]
    pub(super) fn hold_if_paused(&mut self, slot: SlotId) -> bool {
        let paused = self
            .slots
            .get(slot)
            .ticket
            .is_some_and(|ticket| self.partitions.is_user_paused(ticket.partition()));
        if paused {
            self.ready.pop_front();
            self.held.push((slot, true));
        }
        paused
    }

    /// Puts back the held deliveries of partitions no longer paused, in the
    /// order they were held, and starts what may start.
    fn release_held(&mut self) {
        let held = std::mem::take(&mut self.held);
        for &(slot, joined) in &held {
            let Some(partition) = self.slots.get(slot).ticket.map(|ticket| ticket.partition())
            else {
                self.held.push((slot, joined));
                continue;
            };
            if self.partitions.is_user_paused(partition) {
                self.held.push((slot, joined));
                continue;
            }
            if joined {
                self.ready.push_back(slot);
                continue;
            }
            let lane = match self.slots.get_mut(slot).message.take() {
                Some(message) => {
                    let lane = self.lane_for(partition, &message);
                    self.slots.get_mut(slot).message = Some(message);
                    lane
                }
                None => None,
            };
            self.lanes.join(slot, lane);
            if self.lanes.acquire(slot) {
                self.slots.get_mut(slot).state = SlotState::Ready;
                self.ready.push_back(slot);
            }
        }
        self.pump();
    }
}
