//! The in-flight budget as a fixed arena of slots, one per delivery held.
//!
//! Each slot holds a delivery from admission to completion, and its handler
//! future while it runs. The arena is allocated once, at `max_in_flight`
//! slots, and never grows or moves, so:
//! - the budget is the arena: a free slot is a free unit of budget;
//! - a handler future is pinned in place in its slot, with no `Box` per
//!   message;
//! - each slot has its own preallocated waker, which marks the slot in a
//!   bitset and wakes the runtime task, so only woken futures are polled.
//!
//! This is what `FuturesUnordered` does, minus its allocation per future.

use std::any::Any;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

use super::turns::set_current_slot;
use crate::commit_engine::Ticket;
use crate::message::{Message, Position};

/// Index of a slot in the arena.
pub(crate) type SlotId = u32;

/// What a panic carried, once caught.
pub(crate) type PanicPayload = Box<dyn Any + Send>;

/// A future's output, or the panic that took its place.
pub(crate) type Caught<T> = Result<T, PanicPayload>;

/// Marks slots whose futures were woken, and wakes the runtime task.
///
/// Two levels of bits: a bit per slot in `words`, and a bit per word in
/// `summary` saying the word may have bits set. A pass reads the summary
/// and only the words it names, so its cost follows the woken slots, not
/// `max_in_flight` (a pass over every word cost 19,195 instructions per
/// message at 65,536 in flight, against 2,993 at 16).
pub(crate) struct ReadySet {
    words: Box<[AtomicU64]>,
    summary: Box<[AtomicU64]>,
    runtime: AtomicWaker,
}

impl ReadySet {
    fn new(slots: usize) -> Self {
        let words = slots.div_ceil(64);
        Self {
            words: (0..words).map(|_| AtomicU64::new(0)).collect(),
            summary: (0..words.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            runtime: AtomicWaker::new(),
        }
    }

    fn mark(&self, slot: SlotId) {
        let word = (slot / 64) as usize;
        if let Some(bits) = self.words.get(word) {
            bits.fetch_or(1 << (slot % 64), Ordering::AcqRel);
            // After the slot's bit: a pass that takes the summary bit before
            // this sets it takes the word's bits now or on the next pass
            // (the bit stays set), so no wake-up is lost.
            if let Some(summary) = self.summary.get(word / 64) {
                summary.fetch_or(1 << (word % 64), Ordering::AcqRel);
            }
        }
        self.runtime.wake();
    }

    /// Registers the runtime task to be woken by any slot (or by
    /// [`RuntimeWaker`]).
    pub(crate) fn register(&self, waker: &Waker) {
        self.runtime.register(waker);
    }

    /// Takes the marks of one summary word: which 64-slot words may hold
    /// woken slots.
    fn take_summary(&self, index: usize) -> u64 {
        self.summary[index].swap(0, Ordering::AcqRel)
    }

    /// Takes the woken slots of one 64-slot word.
    fn take_word(&self, word: usize) -> u64 {
        self.words[word].swap(0, Ordering::AcqRel)
    }
}

struct SlotWaker {
    slot: SlotId,
    ready: Arc<ReadySet>,
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.ready.mark(self.slot);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.ready.mark(self.slot);
    }
}

/// Wakes the runtime task without marking a slot: for `poll_ready` of the
/// handler service, which the runtime polls outside its own `poll`.
struct RuntimeWaker {
    ready: Arc<ReadySet>,
}

impl Wake for RuntimeWaker {
    fn wake(self: Arc<Self>) {
        self.ready.runtime.wake();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.ready.runtime.wake();
    }
}

/// Wakes the runtime task and remembers that it did: for a future the
/// runtime polls only once it was woken, not on every pass (the shutdown
/// signal: a `CancellationToken`'s future takes a mutex when polled).
pub(crate) struct WakeFlag {
    woken: AtomicBool,
    ready: Arc<ReadySet>,
}

impl WakeFlag {
    /// Whether the future was woken since the last call (or never polled).
    pub(crate) fn take(&self) -> bool {
        self.woken.swap(false, Ordering::AcqRel)
    }
}

impl Wake for WakeFlag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.ready.runtime.wake();
    }
}

/// Where a held delivery is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlotState {
    /// Not holding a delivery.
    Free,
    /// Waiting behind another delivery of its lane.
    Queued,
    /// Holds its lane; waiting to start (backoff gate, handler not ready,
    /// or a retry about to be dispatched again).
    Ready,
    /// Its handler future is running.
    Running,
}

/// One unit of the in-flight budget.
pub(crate) struct Slot<F> {
    pub(crate) state: SlotState,
    /// The delivery, while it waits to start; and a copy kept for in-process
    /// redelivery when the broker cannot take a message back.
    pub(crate) message: Option<Message>,
    pub(crate) ticket: Option<Ticket>,
    /// The broker position of the delivery.
    pub(crate) position: Option<Position>,
    /// Whether this delivery is the backoff probe.
    pub(crate) probe: bool,
    /// Whether the handler ever started (for the shutdown report).
    pub(crate) started: bool,
    /// The delivery's bytes, counted in the byte budget while it is held.
    pub(crate) bytes: usize,
    future: Option<F>,
}

/// The arena. See the [module docs](self).
pub(crate) struct Slots<F> {
    slots: Box<[Slot<F>]>,
    wakers: Box<[Waker]>,
    runtime_waker: Waker,
    ready: Arc<ReadySet>,
    free: Vec<SlotId>,
    running: usize,
}

impl<F: Future> Slots<F> {
    pub(crate) fn new(capacity: usize) -> Self {
        let ready = Arc::new(ReadySet::new(capacity));
        let slots = (0..capacity)
            .map(|_| Slot {
                state: SlotState::Free,
                message: None,
                ticket: None,
                position: None,
                probe: false,
                started: false,
                bytes: 0,
                future: None,
            })
            .collect();
        let wakers = (0..capacity as SlotId)
            .map(|slot| {
                Waker::from(Arc::new(SlotWaker {
                    slot,
                    ready: ready.clone(),
                }))
            })
            .collect();
        let runtime_waker = Waker::from(Arc::new(RuntimeWaker {
            ready: ready.clone(),
        }));
        Self {
            slots,
            wakers,
            runtime_waker,
            ready,
            // Popped from the back: hand out low indices first, so a small
            // working set stays in few cache lines and few ready words.
            free: (0..capacity as SlotId).rev().collect(),
            running: 0,
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn free_count(&self) -> usize {
        self.free.len()
    }

    pub(crate) fn held(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    pub(crate) fn running(&self) -> usize {
        self.running
    }

    pub(crate) fn ready_set(&self) -> &ReadySet {
        &self.ready
    }

    /// A waker that wakes the runtime task.
    pub(crate) fn runtime_waker(&self) -> &Waker {
        &self.runtime_waker
    }

    /// A waker that wakes the runtime task and sets its flag, which starts
    /// set (a future must be polled once to be woken at all).
    pub(crate) fn flag_waker(&self) -> (Arc<WakeFlag>, Waker) {
        let flag = Arc::new(WakeFlag {
            woken: AtomicBool::new(true),
            ready: self.ready.clone(),
        });
        (flag.clone(), Waker::from(flag))
    }

    /// Takes a free slot for a new delivery.
    pub(crate) fn acquire(&mut self) -> Option<SlotId> {
        self.free.pop()
    }

    /// Gives back a slot just [acquired](Self::acquire) and never filled.
    #[cold]
    #[inline(never)]
    pub(crate) fn unacquire(&mut self, slot: SlotId) {
        if self.slots[slot as usize].state == SlotState::Free && !self.free.contains(&slot) {
            self.free.push(slot);
        }
    }

    pub(crate) fn get(&self, slot: SlotId) -> &Slot<F> {
        &self.slots[slot as usize]
    }

    pub(crate) fn get_mut(&mut self, slot: SlotId) -> &mut Slot<F> {
        &mut self.slots[slot as usize]
    }

    /// Returns a slot to the budget, dropping whatever it still holds.
    pub(crate) fn release(&mut self, slot: SlotId) {
        if self.slots[slot as usize].state == SlotState::Running {
            self.cancel(slot);
        }
        let entry = &mut self.slots[slot as usize];
        if entry.state == SlotState::Free {
            return;
        }
        entry.state = SlotState::Free;
        entry.message = None;
        entry.ticket = None;
        entry.position = None;
        entry.probe = false;
        entry.started = false;
        self.free.push(slot);
    }

    /// Drops a running future (the message stays held).
    // Inlined into `release` (the per-message path): when LLVM stopped
    // inlining it there, `pipeline_bytes` cost 3 more instructions per
    // message (an extra bounds check and reload; benches/callgrind.sh).
    #[inline]
    pub(crate) fn cancel(&mut self, slot: SlotId) {
        let entry = &mut self.slots[slot as usize];
        if entry.future.is_some() {
            // SAFETY: the future is pinned in place inside the arena, which
            // never moves or reallocates; it is dropped in place here.
            unsafe { Pin::new_unchecked(&mut entry.future) }.set(None);
            self.running -= 1;
        }
    }

    /// Installs a handler future in `slot` and polls it once. Returns its
    /// output if it finished on that first poll (the common case for
    /// handlers that do not wait on I/O). A panic of that poll unwinds to
    /// the caller, who catches it and calls [`recover`](Self::recover).
    ///
    /// The slot counts as running only once that first poll is pending:
    /// most handlers finish on it, and their slot then goes back to `Ready`
    /// without having been `Running` (a count written twice on every
    /// message, and a state, for nothing to read them in between). A panic
    /// in that poll leaves the slot in the state it was started in (`Ready`,
    /// as the dispatcher starts a delivery) for [`recover`](Self::recover).
    pub(crate) fn start(&mut self, slot: SlotId, future: F) -> Poll<F::Output> {
        let (entry, waker) = (&mut self.slots[slot as usize], &self.wakers[slot as usize]);
        debug_assert!(entry.future.is_none());
        entry.started = true;
        // SAFETY: the slot's storage never moves (see `cancel`); the previous
        // future, if any, was dropped in place.
        let mut pinned = unsafe { Pin::new_unchecked(&mut entry.future) };
        pinned.set(Some(future));
        let Some(future) = pinned.as_mut().as_pin_mut() else {
            return Poll::Pending;
        };
        match future.poll(&mut Context::from_waker(waker)) {
            Poll::Ready(output) => {
                pinned.set(None);
                entry.state = SlotState::Ready;
                Poll::Ready(output)
            }
            Poll::Pending => {
                entry.state = SlotState::Running;
                self.running += 1;
                Poll::Pending
            }
        }
    }

    /// Polls the future in `slot`; on completion the future is dropped and
    /// the slot is left holding its delivery (state `Ready`) for the caller
    /// to complete or retry.
    ///
    /// Always inlined: left to the compiler, an unrelated change once made
    /// it a call where `start` used it (the path of every delivery, which
    /// now polls on its own), and `pipeline_bytes` cost 24 instructions more
    /// per message (733 against 709); `#[inline]` alone did not bring it
    /// back.
    #[inline(always)]
    fn poll_slot(&mut self, slot: SlotId) -> Poll<F::Output> {
        let entry = &mut self.slots[slot as usize];
        // SAFETY: see `cancel`.
        let mut pinned = unsafe { Pin::new_unchecked(&mut entry.future) };
        let Some(future) = pinned.as_mut().as_pin_mut() else {
            return Poll::Pending;
        };
        let mut cx = Context::from_waker(&self.wakers[slot as usize]);
        match future.poll(&mut cx) {
            Poll::Ready(output) => {
                pinned.set(None);
                entry.state = SlotState::Ready;
                self.running -= 1;
                Poll::Ready(output)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// After a panic while `slot`'s future was created or polled: drops what
    /// is left of the future and leaves the slot holding its delivery, as a
    /// finished poll does. A future that panicked in its first poll (in
    /// [`start`](Self::start)) was never counted as running.
    pub(crate) fn recover(&mut self, slot: SlotId) {
        let entry = &mut self.slots[slot as usize];
        if entry.future.is_some() {
            // SAFETY: see `cancel`.
            let mut pinned = unsafe { Pin::new_unchecked(&mut entry.future) };
            // A future whose drop panics too: the assignment leaves `None`
            // in place even when the old value's drop unwinds.
            let _ = catch_unwind(AssertUnwindSafe(|| pinned.set(None)));
        }
        if entry.state == SlotState::Running {
            entry.state = SlotState::Ready;
            self.running -= 1;
        }
    }

    /// Polls every woken running future and appends the outputs of those that
    /// finished (or panicked: the slot is recovered) to `finished`. Each is
    /// polled with its slot current (see `turns.rs`).
    pub(crate) fn poll_woken(&mut self, finished: &mut Vec<(SlotId, Caught<F::Output>)>) {
        for index in 0..self.ready.summary.len() {
            let mut words = self.ready.take_summary(index);
            while words != 0 {
                let word = index * 64 + words.trailing_zeros() as usize;
                words &= words - 1;
                self.poll_word(word, finished);
            }
        }
    }

    /// Polls the woken running futures of one 64-slot word.
    fn poll_word(&mut self, word: usize, finished: &mut Vec<(SlotId, Caught<F::Output>)>) {
        let mut bits = self.ready.take_word(word);
        while bits != 0 {
            let bit = bits.trailing_zeros();
            bits &= bits - 1;
            let slot = (word * 64) as SlotId + bit;
            if self.slots[slot as usize].state != SlotState::Running {
                continue;
            }
            // Named for a `PublishService` that takes its key's turn.
            set_current_slot(slot);
            match catch_unwind(AssertUnwindSafe(|| self.poll_slot(slot))) {
                Ok(Poll::Ready(output)) => finished.push((slot, Ok(output))),
                Ok(Poll::Pending) => {}
                Err(panic) => {
                    self.recover(slot);
                    finished.push((slot, Err(panic)));
                }
            }
        }
    }

    /// Slots currently holding a delivery.
    pub(crate) fn held_slots(&self) -> impl Iterator<Item = (SlotId, &Slot<F>)> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.state != SlotState::Free)
            .map(|(index, slot)| (index as SlotId, slot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::{Ready, ready};

    #[test]
    fn a_ready_future_completes_on_start_and_frees_its_slot() {
        let mut slots: Slots<Ready<u32>> = Slots::new(2);
        let slot = slots.acquire().unwrap_or_default();
        assert_eq!(slots.free_count(), 1);
        assert_eq!(slots.start(slot, ready(7)), Poll::Ready(7));
        assert_eq!(slots.running(), 0);
        slots.release(slot);
        assert_eq!(slots.free_count(), 2);
    }

    /// A slot counts as running only while its future is pending, whether
    /// the future panics in its first poll or in a later one.
    #[tokio::test]
    async fn a_panicking_future_leaves_the_running_count_as_it_found_it() {
        let mut slots = Slots::new(2);
        // The dispatcher starts a delivery in a `Ready` slot.
        let first = slots.acquire().unwrap_or_default();
        slots.get_mut(first).state = SlotState::Ready;
        let panics_at_once = Box::pin(async { panic!("first poll") as u32 })
            as Pin<Box<dyn Future<Output = u32> + Send>>;
        let started = catch_unwind(AssertUnwindSafe(|| slots.start(first, panics_at_once)));
        assert!(started.is_err());
        slots.recover(first);
        assert_eq!(slots.running(), 0);
        assert_eq!(slots.get(first).state, SlotState::Ready);

        let second = slots.acquire().unwrap_or_default();
        let (sender, receiver) = tokio::sync::oneshot::channel::<u32>();
        let panics_later = Box::pin(async move {
            let _ = receiver.await;
            panic!("second poll") as u32
        }) as Pin<Box<dyn Future<Output = u32> + Send>>;
        assert!(slots.start(second, panics_later).is_pending());
        assert_eq!(slots.running(), 1);
        assert_eq!(slots.get(second).state, SlotState::Running);
        let _ = sender.send(1);
        let mut outputs = Vec::new();
        slots.poll_woken(&mut outputs);
        assert!(matches!(outputs.as_slice(), [(slot, Err(_))] if *slot == second));
        assert_eq!(slots.running(), 0);
        assert_eq!(slots.get(second).state, SlotState::Ready);
    }

    #[tokio::test]
    async fn a_woken_future_is_polled_and_others_are_not() {
        let (sender, receiver) = tokio::sync::oneshot::channel::<u32>();
        let mut slots = Slots::new(3);
        let first = slots.acquire().unwrap_or_default();
        let waiting = Box::pin(async move { receiver.await.unwrap_or_default() })
            as Pin<Box<dyn Future<Output = u32> + Send>>;
        assert!(slots.start(first, waiting).is_pending());
        let mut outputs = Vec::new();
        slots.poll_woken(&mut outputs);
        assert!(outputs.is_empty());
        let _ = sender.send(5);
        slots.poll_woken(&mut outputs);
        let outputs: Vec<(SlotId, u32)> = outputs
            .into_iter()
            .filter_map(|(slot, output)| Some((slot, output.ok()?)))
            .collect();
        assert_eq!(outputs, vec![(first, 5)]);
    }

    #[tokio::test]
    async fn a_slot_far_from_the_first_word_is_polled_when_woken() {
        let capacity = 64 * 64 * 2 + 5;
        let mut slots = Slots::new(capacity);
        let mut senders = Vec::new();
        let mut started = Vec::new();
        for _ in 0..capacity {
            let slot = slots.acquire().unwrap_or_default();
            let (sender, receiver) = tokio::sync::oneshot::channel::<u32>();
            let waiting = Box::pin(async move { receiver.await.unwrap_or_default() })
                as Pin<Box<dyn Future<Output = u32> + Send>>;
            assert!(slots.start(slot, waiting).is_pending());
            senders.push(sender);
            started.push(slot);
        }
        let mut outputs = Vec::new();
        slots.poll_woken(&mut outputs);
        assert!(outputs.is_empty());
        // The last slot lives in the second summary word.
        let last = senders.len() - 1;
        let _ = senders.swap_remove(last).send(9);
        let _ = senders.swap_remove(70).send(3);
        slots.poll_woken(&mut outputs);
        let mut finished: Vec<(SlotId, u32)> = outputs
            .into_iter()
            .filter_map(|(slot, output)| Some((slot, output.ok()?)))
            .collect();
        finished.sort_unstable();
        assert_eq!(finished, vec![(started[70], 3), (started[last], 9)]);
        assert_eq!(slots.running(), capacity - 2);
    }
}
