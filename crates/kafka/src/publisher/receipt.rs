//! [`KafkaReceipt`]: an output's delivery report, left by the delivery
//! callback in the output's slot.

use super::*;

/// Resolves with an output's delivery report: see [`KafkaPublisher`].
#[must_use = "a receipt does nothing unless awaited; dropping it does not cancel the output"]
pub struct KafkaReceipt {
    pub(super) slot: Arc<Slot>,
}

impl fmt::Debug for KafkaReceipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaReceipt").finish_non_exhaustive()
    }
}

impl Future for KafkaReceipt {
    type Output = Result<Confirmation, PublishError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self
            .slot
            .state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        match &mut *state {
            SlotState::Pending(waker) => {
                match waker {
                    Some(waker) if waker.will_wake(cx.waker()) => {}
                    _ => *waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            SlotState::Done(_) => match std::mem::replace(&mut *state, SlotState::Taken) {
                SlotState::Done(outcome) => Poll::Ready(outcome),
                _ => Poll::Pending,
            },
            SlotState::Taken => Poll::Ready(Err(PublishError::new(
                PublishErrorKind::Closed,
                "",
                "the receipt was awaited again after it resolved",
            ))),
        }
    }
}

/// Where the delivery callback leaves an output's outcome for its receipt.
#[derive(Default)]
pub(super) struct Slot {
    pub(super) state: Mutex<SlotState>,
}

pub(super) enum SlotState {
    Pending(Option<Waker>),
    Done(Result<Confirmation, PublishError>),
    Taken,
}

impl Default for SlotState {
    fn default() -> Self {
        SlotState::Pending(None)
    }
}

impl Slot {
    pub(super) fn complete(&self, outcome: Result<Confirmation, PublishError>) {
        let waker = {
            let mut state = self
                .state
                .lock()
                .unwrap_or_else(|poison| poison.into_inner());
            match std::mem::replace(&mut *state, SlotState::Done(outcome)) {
                SlotState::Pending(waker) => waker,
                // librdkafka reports each message once; keep the first.
                earlier => {
                    *state = earlier;
                    None
                }
            }
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}
