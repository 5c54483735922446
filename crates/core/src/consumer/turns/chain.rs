//! The chains of key turns: each key's turns in dispatch order, and the
//! rules by which a turn waits for, fails with, or lets through the turns
//! of its key (see the [parent module](super)).

use std::collections::HashMap;
use std::task::Waker;

use foldhash::fast::FixedState;

use crate::consumer::slots::SlotId;

/// Where a turn's current attempt is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    /// Not publishing: before its gate, or failed and owed another attempt.
    Unsent,
    /// Past its gate: the handler runs, or the outputs are being sent.
    Active,
    /// Every output of the attempt handed to the publisher.
    Sent,
    /// Every output of the attempt confirmed.
    Confirmed,
    /// An output was refused (not stored): the input is settled on its own.
    Rejected,
}

impl State {
    /// Whether the attempt has begun to publish, so an earlier failure
    /// overtakes it.
    pub(super) fn publishing(self) -> bool {
        matches!(self, State::Active | State::Sent | State::Confirmed)
    }

    /// Whether later turns may wait past it for confirmations.
    pub(super) fn settled(self) -> bool {
        matches!(self, State::Confirmed | State::Rejected)
    }
}

/// What a turn's attempt waits for, so that a change wakes only the turns
/// it may let on (an earlier turn's confirmation does nothing for a turn
/// still waiting for its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Wait {
    /// Every earlier turn to have sent (its gate).
    Gate,
    /// Its own confirmations; only a failure or poison wakes it here.
    Receipts,
    /// Every earlier turn to be confirmed.
    Earlier,
}

/// What changed before a turn, for the turn to look again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Change {
    /// An earlier turn sent, left the chain or was rejected: turns at their
    /// gate may pass.
    Gate,
    /// Every earlier turn is confirmed now: a turn waiting for them may
    /// answer.
    Confirmed,
}

/// One delivery's place in its key's chain (one per slot).
#[derive(Debug)]
pub(super) struct Turn {
    /// Counts the deliveries the slot held: a handle of an earlier one is
    /// stale.
    pub(super) generation: u32,
    pub(super) live: bool,
    pub(super) lane: u64,
    pub(super) prev: Option<SlotId>,
    pub(super) next: Option<SlotId>,
    pub(super) state: State,
    /// Failed because an earlier turn failed after this one had begun to
    /// publish.
    pub(super) overtaken: bool,
    /// An earlier turn was left unfinished: every attempt fails.
    pub(super) poisoned: bool,
    /// Handed its runtime lane on (once per delivery).
    pub(super) released: bool,
    /// It and every turn before it are confirmed (or rejected): kept as
    /// turns change, so that a turn asks only the one before it whether
    /// it may answer (a key's chain holds up to a budget of turns).
    pub(super) clear: bool,
    pub(super) waker: Option<(Waker, Wait)>,
}

impl Turn {
    pub(super) fn new() -> Self {
        Self {
            generation: 0,
            live: false,
            lane: 0,
            prev: None,
            next: None,
            state: State::Unsent,
            overtaken: false,
            poisoned: false,
            released: false,
            clear: false,
            waker: None,
        }
    }

    pub(super) fn register(&mut self, waker: &Waker, wait: Wait) {
        match &mut self.waker {
            Some((current, waiting)) if current.will_wake(waker) => *waiting = wait,
            slot => *slot = Some((waker.clone(), wait)),
        }
    }

    pub(super) fn wake(&mut self) {
        if let Some((waker, _)) = self.waker.take() {
            waker.wake();
        }
    }

    /// Wakes it if it waits for what `change` may give it.
    fn wake_for(&mut self, change: Change) {
        let wanted = match self.waker {
            Some((_, Wait::Gate)) => change == Change::Gate,
            Some((_, Wait::Earlier)) => change == Change::Confirmed,
            Some((_, Wait::Receipts)) | None => false,
        };
        if wanted {
            self.wake();
        }
    }
}

/// The first and last turn of a key's chain.
#[derive(Clone, Copy, Debug)]
pub(super) struct Chain {
    head: SlotId,
    tail: SlotId,
}

/// The turns and their chains, behind the registry's lock.
pub(super) struct Chains {
    pub(super) turns: Box<[Turn]>,
    pub(super) lanes: HashMap<u64, Chain, FixedState>,
    /// Turns that sent for the first time: the runtime hands their lane on.
    pub(super) released: Vec<SlotId>,
}

impl Chains {
    /// The live turn of `slot` in `generation`.
    pub(super) fn own(&mut self, slot: SlotId, generation: u32) -> Option<&mut Turn> {
        self.turns
            .get_mut(slot as usize)
            .filter(|turn| turn.live && turn.generation == generation)
    }

    /// Whether every earlier turn of `slot`'s key has sent its current
    /// attempt. Earlier turns that have sent have every turn before them
    /// sent too (an earlier failure overtakes them), so the nearest one
    /// that is not rejected decides.
    pub(super) fn may_publish(&self, slot: SlotId) -> bool {
        let mut prev = self.turns[slot as usize].prev;
        while let Some(earlier) = prev {
            let turn = &self.turns[earlier as usize];
            match turn.state {
                State::Rejected => prev = turn.prev,
                State::Sent | State::Confirmed => return true,
                State::Unsent | State::Active => return false,
            }
        }
        true
    }

    /// Whether every earlier turn of `slot`'s key is confirmed (or
    /// rejected).
    pub(super) fn earlier_confirmed(&self, slot: SlotId) -> bool {
        self.turns[slot as usize]
            .prev
            .is_none_or(|prev| self.turns[prev as usize].clear)
    }

    /// Brings `clear` up to date from `from` on, after `from`'s state or
    /// the turn before it changed, and wakes the turns that may answer now.
    pub(super) fn settle_forward(&mut self, from: SlotId) {
        let mut at = Some(from);
        while let Some(slot) = at {
            let clear = self.earlier_confirmed(slot) && self.turns[slot as usize].state.settled();
            let turn = &mut self.turns[slot as usize];
            if clear == turn.clear {
                return;
            }
            turn.clear = clear;
            if !clear {
                let next = turn.next;
                self.unclear_from(next);
                return;
            }
            turn.wake_for(Change::Confirmed);
            at = turn.next;
        }
    }

    /// `from` and every turn after it are no longer clear: a turn before
    /// them (or `from` itself) is not confirmed any more.
    pub(super) fn unclear_from(&mut self, from: Option<SlotId>) {
        let mut next = from;
        while let Some(slot) = next {
            let turn = &mut self.turns[slot as usize];
            turn.clear = false;
            next = turn.next;
        }
    }

    /// Wakes the turns a `change` of the turn before `from` may let go on:
    /// `from` and, past it, those a settled turn lets through.
    pub(super) fn wake_forward(&mut self, from: Option<SlotId>, change: Change) {
        let mut next = from;
        while let Some(slot) = next {
            let turn = &mut self.turns[slot as usize];
            turn.wake_for(change);
            if !turn.state.settled() {
                return;
            }
            next = turn.next;
        }
    }

    /// Fails the attempts of the turns after `slot` that had begun to
    /// publish: an earlier output of their key failed.
    pub(super) fn overtake_after(&mut self, slot: SlotId) {
        let mut next = self.turns[slot as usize].next;
        while let Some(later) = next {
            let turn = &mut self.turns[later as usize];
            turn.clear = false;
            if turn.state.publishing() {
                turn.state = State::Unsent;
                turn.overtaken = true;
                turn.wake();
            }
            next = turn.next;
        }
    }

    /// Poisons every turn after `from` (inclusive): an earlier delivery of
    /// their key was left unfinished.
    pub(super) fn poison_from(&mut self, from: Option<SlotId>) {
        let mut next = from;
        while let Some(later) = next {
            let turn = &mut self.turns[later as usize];
            turn.poisoned = true;
            turn.state = State::Unsent;
            turn.clear = false;
            turn.wake();
            next = turn.next;
        }
    }

    /// Appends `slot`'s turn to the chain of `lane`.
    pub(super) fn link(&mut self, slot: SlotId, lane: u64) {
        let prev = match self.lanes.get_mut(&lane) {
            Some(chain) => {
                let tail = chain.tail;
                chain.tail = slot;
                self.turns[tail as usize].next = Some(slot);
                Some(tail)
            }
            None => {
                self.lanes.insert(
                    lane,
                    Chain {
                        head: slot,
                        tail: slot,
                    },
                );
                None
            }
        };
        let turn = &mut self.turns[slot as usize];
        turn.lane = lane;
        turn.prev = prev;
        turn.next = None;
        turn.clear = false;
    }

    /// Takes `slot`'s turn out of its chain; returns the turn after it.
    pub(super) fn unlink(&mut self, slot: SlotId) -> Option<SlotId> {
        let turn = &mut self.turns[slot as usize];
        let (lane, prev, next) = (turn.lane, turn.prev.take(), turn.next.take());
        match prev {
            Some(prev) => self.turns[prev as usize].next = next,
            None => {
                if let Some(chain) = self.lanes.get_mut(&lane) {
                    match next {
                        Some(next) => chain.head = next,
                        None => {
                            self.lanes.remove(&lane);
                        }
                    }
                }
            }
        }
        match next {
            Some(next) => self.turns[next as usize].prev = prev,
            None => {
                if let (Some(prev), Some(chain)) = (prev, self.lanes.get_mut(&lane)) {
                    chain.tail = prev;
                }
            }
        }
        next
    }
}
