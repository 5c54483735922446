//! Key turns: what lets a key's next input run once the outputs of the one
//! before are *sent*, not confirmed, and keeps the rule that each key's
//! outputs reach the broker in input order across failures.
//!
//! The runtime's lanes run a key's deliveries one at a time. A handler
//! under [`PublishLayer`](crate::publish::PublishLayer) would hold its lane
//! for a whole confirmation round trip; instead, its `PublishService` takes
//! a *turn* here, in the chain of its key's turns (dispatch order), and:
//!
//! - runs the handler and sends only once every earlier turn of the key
//!   has sent its current attempt (the *gate*);
//! - marks its turn sent, which hands the runtime lane to the key's next
//!   delivery (the runtime reads the `released` list after each poll);
//! - answers `Ok` only once its own outputs and those of every earlier turn
//!   of the key are confirmed, so the input is acknowledged after them.
//!
//! When an attempt that had begun to publish fails (or is dropped), every
//! later turn of the key that had begun to publish fails its attempt too
//! (*overtaken*), and none sends again until the failed one has sent its
//! next attempt or finished: retries re-send in input order, so the last
//! copy of each key's outputs is in input order. A rejected output (not
//! stored) settles its own turn and leaves the others alone. A turn whose
//! delivery ends unfinished (handed back, released at a revocation or a
//! stop, cancelled) before its outputs were confirmed *poisons* the later
//! turns of its key: their attempts fail as interrupted, so that none is
//! acknowledged ahead of it.
//!
//! The runtime makes its registry current for the thread for each pass
//! (`scope`), and names the slot before each call of the handler and each
//! poll of a slot's future (`set_current_slot`: one thread-local write). A
//! turn exists only for a delivery whose handler publishes through
//! `PublishService`; a delivery without one costs the runtime an atomic
//! load when its slot is freed.

mod chain;

use std::cell::Cell;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use foldhash::fast::FixedState;

use self::chain::{Chains, Change, State, Turn, Wait};
use super::slots::SlotId;
use super::{DeliveryOrder, KeyFn};
use crate::message::Message;

/// Why a turn's attempt may not go on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TurnError {
    /// An earlier output of its key failed after this attempt had begun to
    /// publish: it publishes again after that one.
    EarlierFailed,
    /// An earlier delivery of its key was left unfinished (delivered
    /// again): this one must not be acknowledged ahead of it.
    EarlierUnfinished,
}

/// The key turns of one run: see the [module docs](self).
pub(crate) struct KeyTurns {
    ordering: DeliveryOrder,
    key_with: Option<KeyFn>,
    hasher: FixedState,
    /// Per slot: whether it has a live turn, read by the runtime without
    /// the lock when it frees the slot.
    live: Box<[AtomicBool]>,
    /// How many slots have a live turn (changed under the lock).
    live_count: AtomicUsize,
    /// Whether `released` may hold turns, read without the lock.
    any_released: AtomicBool,
    /// Wakes the runtime for a turn released outside its own poll.
    runtime: Waker,
    chains: Mutex<Chains>,
}

impl std::fmt::Debug for KeyTurns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyTurns")
            .field("ordering", &self.ordering)
            .finish_non_exhaustive()
    }
}

thread_local! {
    /// The registry of the run whose pass is under way on this thread.
    static CURRENT_TURNS: Cell<*const KeyTurns> = const { Cell::new(ptr::null()) };
    /// The slot whose handler the run calls or polls (valid while the
    /// runtime calls or polls one; set before each, never cleared: nothing
    /// else in a pass calls a handler).
    static CURRENT_SLOT: Cell<SlotId> = const { Cell::new(0) };
}

/// Makes `slot` the one whose handler is called or polled now (see
/// [`KeyTurns::scope`]): one thread-local write per call or poll.
#[inline]
pub(crate) fn set_current_slot(slot: SlotId) {
    CURRENT_SLOT.with(|current| current.set(slot));
}

impl KeyTurns {
    /// The turns of a run of `capacity` slots in `ordering`.
    pub(crate) fn new(
        capacity: usize,
        ordering: DeliveryOrder,
        key_with: Option<KeyFn>,
        runtime: Waker,
    ) -> Self {
        Self {
            ordering,
            key_with,
            hasher: FixedState::with_seed(rand::random()),
            live: (0..capacity).map(|_| AtomicBool::new(false)).collect(),
            live_count: AtomicUsize::new(0),
            any_released: AtomicBool::new(false),
            runtime,
            chains: Mutex::new(Chains {
                turns: (0..capacity).map(|_| Turn::new()).collect(),
                lanes: HashMap::with_hasher(FixedState::default()),
                released: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Chains> {
        // Nothing under the lock leaves the chains half changed on a
        // panic (a waker's): go on with them.
        self.chains.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `run` (a pass of the run: its calls and polls of handlers) with
    /// this registry current for the thread; the runtime names the slot
    /// of each call or poll with [`set_current_slot`].
    #[inline]
    pub(crate) fn scope<R>(self: &Arc<Self>, run: impl FnOnce() -> R) -> R {
        struct Restore(*const KeyTurns);
        impl Drop for Restore {
            #[inline]
            fn drop(&mut self) {
                CURRENT_TURNS.with(|current| current.set(self.0));
            }
        }
        let previous = CURRENT_TURNS.with(|current| current.replace(Arc::as_ptr(self)));
        let _restore = Restore(previous);
        run()
    }

    /// Runs `run` with this registry and `slot` current (for tests).
    #[cfg(test)]
    pub(crate) fn enter<R>(self: &Arc<Self>, slot: SlotId, run: impl FnOnce() -> R) -> R {
        self.scope(|| {
            set_current_slot(slot);
            run()
        })
    }

    /// Whether any slot has a live turn (cheap: no lock, no index).
    #[inline]
    pub(crate) fn any_live(&self) -> bool {
        self.live_count.load(Ordering::Acquire) > 0
    }

    /// Whether `slot` has a live turn (cheap: no lock).
    #[inline]
    pub(crate) fn is_live(&self, slot: SlotId) -> bool {
        self.live
            .get(slot as usize)
            .is_some_and(|live| live.load(Ordering::Acquire))
    }

    /// Whether turns were released since the last
    /// [`take_released`](Self::take_released) (cheap: no lock).
    #[inline]
    pub(crate) fn any_released(&self) -> bool {
        self.any_released.load(Ordering::Acquire)
    }

    /// Moves the slots whose turns sent for the first time into `into`: the
    /// runtime hands their lanes on.
    pub(crate) fn take_released(&self, into: &mut Vec<SlotId>) {
        let mut chains = self.lock();
        self.any_released.store(false, Ordering::Release);
        into.append(&mut chains.released);
    }

    /// Ends `slot`'s turn: its delivery is over, `completed` (acknowledged:
    /// succeeded, dead-lettered, discarded) or not (handed back, released,
    /// cancelled). One left unfinished before its outputs were confirmed
    /// poisons the later turns of its key.
    pub(crate) fn end(&self, slot: SlotId, completed: bool) {
        let mut chains = self.lock();
        let Some(turn) = chains.turns.get_mut(slot as usize).filter(|turn| turn.live) else {
            return;
        };
        let poison = !completed && !turn.state.settled();
        let released = turn.released;
        turn.live = false;
        turn.generation = turn.generation.wrapping_add(1);
        turn.poisoned = false;
        turn.overtaken = false;
        let waker = turn.waker.take();
        let next = chains.unlink(slot);
        if released && !chains.released.is_empty() {
            chains.released.retain(|&other| other != slot);
        }
        if poison {
            chains.poison_from(next);
        } else if let Some(next) = next {
            chains.wake_forward(Some(next), Change::Gate);
            chains.settle_forward(next);
        }
        self.live[slot as usize].store(false, Ordering::Release);
        self.live_count.fetch_sub(1, Ordering::AcqRel);
        drop(chains);
        drop(waker);
    }

    /// The live turns after `slot`'s in its key's chain, in order (for the
    /// runtime to dispatch `slot` again before them).
    pub(crate) fn later(&self, slot: SlotId, into: &mut Vec<SlotId>) {
        let chains = self.lock();
        let Some(turn) = chains.turns.get(slot as usize).filter(|turn| turn.live) else {
            return;
        };
        let mut next = turn.next;
        while let Some(later) = next {
            into.push(later);
            next = chains.turns[later as usize].next;
        }
    }

    /// The chain a message's turns join: its key's within its partition in
    /// `Key` order (none without a key: it runs unordered), its
    /// partition's in `Partition` order.
    fn lane_of(&self, message: &Message) -> Option<u64> {
        let metadata = message.metadata();
        let mut hasher = self.hasher.build_hasher();
        hasher.write(metadata.source().as_bytes());
        hasher.write_u32(metadata.partition());
        match self.ordering {
            DeliveryOrder::Unordered => return None,
            DeliveryOrder::Partition => {}
            DeliveryOrder::Key => {
                let key = match &self.key_with {
                    Some(key_with) => key_with(message)?,
                    None => message.key().map(|key| &key[..])?,
                };
                hasher.write_u8(1);
                hasher.write(key);
            }
        }
        Some(hasher.finish())
    }

    /// The generation of `slot`'s turn, taken now if it has none.
    fn begin(&self, slot: SlotId, lane: u64) -> Option<u32> {
        let mut chains = self.lock();
        let turn = chains.turns.get_mut(slot as usize)?;
        let generation = turn.generation;
        if !turn.live {
            turn.live = true;
            turn.state = State::Unsent;
            turn.overtaken = false;
            turn.poisoned = false;
            turn.released = false;
            turn.clear = false;
            turn.waker = None;
            chains.link(slot, lane);
            self.live[slot as usize].store(true, Ordering::Release);
            self.live_count.fetch_add(1, Ordering::AcqRel);
        }
        Some(generation)
    }
}

/// The turn of the delivery whose handler the runtime is calling or
/// polling on this thread, taken if it has none yet: `None` outside a
/// consumer's poll, in `Unordered` order, and for a message without a key
/// in `Key` order.
pub(crate) fn current_turn(message: &Message) -> Option<TurnHandle> {
    let pointer = CURRENT_TURNS.with(Cell::get);
    // SAFETY: a non-null pointer was set by `scope` from a live `Arc`
    // borrowed for the scope, and the scope's guard puts the previous value
    // back when it ends, unwinding included: the registry is alive.
    let turns = unsafe { pointer.as_ref() }?;
    let slot = CURRENT_SLOT.with(Cell::get);
    let lane = turns.lane_of(message)?;
    let generation = turns.begin(slot, lane)?;
    // SAFETY: as above; the pointer is that of an `Arc`, which has a count
    // to add to.
    let turns = unsafe {
        Arc::increment_strong_count(pointer);
        Arc::from_raw(pointer)
    };
    Some(TurnHandle {
        turns,
        slot,
        generation,
    })
}

/// A delivery's turn, held by its `PublishService` attempts. A handle of a
/// delivery that is over (its slot holds another) is stale: it waits for
/// nothing and changes nothing.
pub(crate) struct TurnHandle {
    turns: Arc<KeyTurns>,
    slot: SlotId,
    generation: u32,
}

impl std::fmt::Debug for TurnHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnHandle")
            .field("slot", &self.slot)
            .field("generation", &self.generation)
            .finish()
    }
}

impl TurnHandle {
    /// Ready once every earlier turn of the key has sent its current
    /// attempt: the attempt may run its handler and publish.
    pub(crate) fn poll_gate(&self, cx: &mut Context<'_>) -> Poll<Result<(), TurnError>> {
        let mut chains = self.turns.lock();
        let Some(turn) = chains.own(self.slot, self.generation) else {
            return Poll::Ready(Ok(()));
        };
        if turn.poisoned {
            return Poll::Ready(Err(TurnError::EarlierUnfinished));
        }
        if chains.may_publish(self.slot) {
            let turn = &mut chains.turns[self.slot as usize];
            turn.state = State::Active;
            turn.overtaken = false;
            if turn.clear {
                // Rejected before, publishing again.
                chains.unclear_from(Some(self.slot));
            }
            return Poll::Ready(Ok(()));
        }
        chains.turns[self.slot as usize].register(cx.waker(), Wait::Gate);
        Poll::Pending
    }

    /// Every output of the attempt is sent: the key's next delivery may
    /// run. Fails if an earlier output of the key failed meanwhile.
    pub(crate) fn sent(&self) -> Result<(), TurnError> {
        let mut chains = self.turns.lock();
        let Some(turn) = chains.own(self.slot, self.generation) else {
            return Ok(());
        };
        if turn.poisoned {
            return Err(TurnError::EarlierUnfinished);
        }
        if turn.state != State::Active {
            return Err(TurnError::EarlierFailed);
        }
        turn.state = State::Sent;
        let release = !std::mem::replace(&mut turn.released, true);
        let next = turn.next;
        if release {
            chains.released.push(self.slot);
            self.turns.any_released.store(true, Ordering::Release);
        }
        chains.wake_forward(next, Change::Gate);
        drop(chains);
        if release && !self.in_own_poll() {
            // Polled elsewhere than in its slot: the runtime would not look
            // at the released turns before its next wake-up.
            self.turns.runtime.wake_by_ref();
        }
        Ok(())
    }

    /// While the attempt waits for its own confirmations: ready with the
    /// reason if it may not go on (an earlier output failed, an earlier
    /// delivery was left unfinished).
    pub(crate) fn poll_stopped(&self, cx: &mut Context<'_>) -> Poll<TurnError> {
        let mut chains = self.turns.lock();
        let Some(turn) = chains.own(self.slot, self.generation) else {
            return Poll::Pending;
        };
        if turn.poisoned {
            return Poll::Ready(TurnError::EarlierUnfinished);
        }
        if turn.overtaken && turn.state == State::Unsent {
            return Poll::Ready(TurnError::EarlierFailed);
        }
        turn.register(cx.waker(), Wait::Receipts);
        Poll::Pending
    }

    /// The attempt's own outputs are confirmed: ready once every earlier
    /// turn of the key is confirmed too (or with why not).
    pub(crate) fn poll_confirmed(&self, cx: &mut Context<'_>) -> Poll<Result<(), TurnError>> {
        let mut chains = self.turns.lock();
        let Some(turn) = chains.own(self.slot, self.generation) else {
            return Poll::Ready(Ok(()));
        };
        if turn.poisoned {
            return Poll::Ready(Err(TurnError::EarlierUnfinished));
        }
        match turn.state {
            State::Sent => {
                turn.state = State::Confirmed;
                chains.settle_forward(self.slot);
            }
            State::Unsent => return Poll::Ready(Err(TurnError::EarlierFailed)),
            State::Active | State::Confirmed | State::Rejected => {}
        }
        if chains.earlier_confirmed(self.slot) {
            return Poll::Ready(Ok(()));
        }
        chains.turns[self.slot as usize].register(cx.waker(), Wait::Earlier);
        Poll::Pending
    }

    /// The attempt failed: `rejected` if an output was refused (the turn is
    /// settled and leaves the others alone); otherwise, if it had begun to
    /// publish, every later turn of the key that had too is overtaken.
    pub(crate) fn failed(&self, rejected: bool) {
        let mut chains = self.turns.lock();
        let Some(turn) = chains.own(self.slot, self.generation) else {
            return;
        };
        if rejected {
            turn.state = State::Rejected;
            let next = turn.next;
            chains.wake_forward(next, Change::Gate);
            chains.settle_forward(self.slot);
            return;
        }
        if !turn.state.publishing() {
            return;
        }
        turn.state = State::Unsent;
        turn.clear = false;
        chains.overtake_after(self.slot);
    }

    fn in_own_poll(&self) -> bool {
        ptr::eq(CURRENT_TURNS.with(Cell::get), Arc::as_ptr(&self.turns))
            && CURRENT_SLOT.with(Cell::get) == self.slot
    }
}

#[cfg(test)]
mod tests;
