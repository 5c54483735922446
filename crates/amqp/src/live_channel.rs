//! The channel a source currently consumes on, shared with its acker and its
//! broker-side dead-letter sink.
//!
//! Delivery tags mean something only on the channel that issued them. Each
//! channel the source opens gets a new epoch, which is the partition number
//! of its deliveries; the acker and the sink act only on deliveries of the
//! current epoch, so a tag of a lost channel is never sent on its successor
//! (where it would name another message, or close the channel).

use std::sync::Mutex;

use lapin::Channel;

use crate::tag_ledger::TagLedger;

/// The delivery belongs to a channel that is gone (or not yet open).
#[derive(Debug)]
pub(crate) struct NotCurrent;

struct LiveChannel {
    epoch: u32,
    channel: Channel,
    ledger: TagLedger,
}

/// What to send for one partition's acknowledgement work.
pub(crate) struct AckPlan {
    /// The channel to send on.
    pub(crate) channel: Channel,
    /// The tag for `basic.ack(multiple=true)`, if any.
    pub(crate) ack_through: Option<u64>,
}

/// The current channel and its epoch; see the [module docs](self).
#[derive(Default)]
pub(crate) struct ChannelSlot {
    live: Mutex<Option<LiveChannel>>,
}

impl ChannelSlot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<LiveChannel>> {
        // A panic elsewhere while holding the lock leaves consistent data:
        // every critical section is a few field updates.
        self.live
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Makes `channel` the current one, under `epoch`.
    pub(crate) fn install(&self, epoch: u32, channel: Channel) {
        *self.lock() = Some(LiveChannel {
            epoch,
            channel,
            ledger: TagLedger::default(),
        });
    }

    /// Forgets the current channel; acknowledgements for it fail from now on.
    pub(crate) fn clear(&self) -> Option<Channel> {
        self.lock().take().map(|live| live.channel)
    }

    /// How many deliveries of `epoch` up to tag `last` were settled, if
    /// `epoch` is the current channel.
    pub(crate) fn settled_through(&self, epoch: u32, last: u64) -> Option<u64> {
        self.lock()
            .as_ref()
            .filter(|live| live.epoch == epoch)
            .map(|live| live.ledger.settled_through(last))
    }

    /// The current epoch, if a channel is open.
    pub(crate) fn epoch(&self) -> Option<u32> {
        self.lock().as_ref().map(|live| live.epoch)
    }

    /// Plans one partition's acknowledgement for `epoch`: records the
    /// `requeue` tags (rejected before anything else is sent), pushes onto
    /// `individual` the `completed` tags above the watermark, and turns
    /// `watermark` into the tag for `basic.ack(multiple=true)`.
    pub(crate) fn plan(
        &self,
        epoch: u32,
        requeue: impl IntoIterator<Item = u64>,
        completed: impl IntoIterator<Item = u64>,
        watermark: Option<u64>,
        individual: &mut Vec<u64>,
    ) -> Result<AckPlan, NotCurrent> {
        let mut guard = self.lock();
        let live = guard
            .as_mut()
            .filter(|live| live.epoch == epoch)
            .ok_or(NotCurrent)?;
        for tag in requeue {
            live.ledger.settle(tag);
        }
        let ack_through = live.ledger.acknowledge(completed, watermark, individual);
        Ok(AckPlan {
            channel: live.channel.clone(),
            ack_through,
        })
    }

    /// Records that `tag` of `epoch` is about to be settled on its own and
    /// returns the channel to settle it on.
    pub(crate) fn settle_one(&self, epoch: u32, tag: u64) -> Result<Channel, NotCurrent> {
        let mut guard = self.lock();
        let live = guard
            .as_mut()
            .filter(|live| live.epoch == epoch)
            .ok_or(NotCurrent)?;
        live.ledger.settle(tag);
        Ok(live.channel.clone())
    }
}

impl std::fmt::Debug for ChannelSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelSlot")
            .field("epoch", &self.epoch())
            .finish()
    }
}
