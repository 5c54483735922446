//! [`Outcome`]: how a message's handling ended, as the layer that settled it
//! says, so that the runtime and the metrics count it without knowing the
//! layer.

use std::fmt;

use crate::error::HandlerError;

/// How the handling of a message ended: what the consumer's
/// [`RunReport`](crate::consumer::RunReport) and the metrics layer count it
/// as.
///
/// A handler's success is [`Succeeded`](Outcome::Succeeded), and its
/// [`HandlerError::ignore`] is [`Ignored`](Outcome::Ignored). A layer that
/// finishes a failed message itself (writes it to a dead-letter destination,
/// parks it, drops it) says so with
/// [`HandlerError::settled`]: the message is acknowledged and counted as the
/// outcome given, whichever layer settled it, intake's own or one of yours.
/// A failure no layer settled has no outcome
/// ([`HandlerError::outcome`] is `None`): the runtime handles it by its
/// [class](crate::ErrorClass) (retried, handed back, or discarded).
///
/// # Example
///
/// A layer of your own that writes a failed message to an archive and
/// settles it as dead-lettered:
///
/// ```
/// use intake_core::{HandlerError, Outcome};
///
/// fn archived(failure: HandlerError) -> HandlerError {
///     // Keeping the failure as the cause's source lets the metrics count
///     // it by its class (`intake_messages_failed_total{class="permanent"}`).
///     #[derive(Debug, thiserror::Error)]
///     #[error("archived")]
///     struct Archived(#[source] HandlerError);
///     HandlerError::settled(Outcome::DeadLettered, Archived(failure))
/// }
///
/// let settled = archived(HandlerError::permanent("no such customer"));
/// assert_eq!(settled.outcome(), Some(Outcome::DeadLettered));
/// assert_eq!(settled.failure_class(), intake_core::ErrorClass::Permanent);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler finished the message.
    Succeeded,
    /// The message is done although nothing handled it (a filter, a message
    /// for another tenant). Acknowledged.
    Ignored,
    /// The message failed for good and is in a dead-letter destination (or
    /// a reference to it is). Acknowledged.
    DeadLettered,
    /// The message is parked to be handled again later: a copy parked at
    /// the broker and the original acknowledged, or the original handed
    /// back for redelivery after a delay.
    Parked,
    /// The message failed for good and was dropped on purpose (a discard
    /// policy). Acknowledged.
    Discarded,
}

impl Outcome {
    /// A short lowercase name (`dead_lettered`), as used in metric names and
    /// span fields.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Ignored => "ignored",
            Outcome::DeadLettered => "dead_lettered",
            Outcome::Parked => "parked",
            Outcome::Discarded => "discarded",
        }
    }

    /// The outcome of a handler stack's result: `Succeeded` for `Ok`, the
    /// error's [`outcome`](HandlerError::outcome) otherwise (`None` for a
    /// failure no layer settled).
    pub fn of(result: &Result<(), HandlerError>) -> Option<Outcome> {
        match result {
            Ok(()) => Some(Outcome::Succeeded),
            Err(error) => error.outcome(),
        }
    }

    /// The outcome's code in [`Marks`]; 0 is none.
    const fn code(self) -> u8 {
        match self {
            Outcome::Succeeded => 1,
            Outcome::Ignored => 2,
            Outcome::DeadLettered => 3,
            Outcome::Parked => 4,
            Outcome::Discarded => 5,
        }
    }

    const fn from_code(code: u8) -> Option<Outcome> {
        match code {
            1 => Some(Outcome::Succeeded),
            2 => Some(Outcome::Ignored),
            3 => Some(Outcome::DeadLettered),
            4 => Some(Outcome::Parked),
            5 => Some(Outcome::Discarded),
            _ => None,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a [`HandlerError`] says beside its class, in one byte, so that the
/// error stays three words: every handler's result carries its size.
///
/// Bits 0-2 the settled outcome (0: none), 3-4 the class of the failure a
/// layer settled, 5 a panic, 6 a fallback, 7 no backoff.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Marks(u8);

impl Marks {
    const OUTCOME: u8 = 0b0000_0111;
    const FAILURE_CLASS_SHIFT: u8 = 3;
    const FAILURE_CLASS: u8 = 0b0001_1000;
    const PANIC: u8 = 1 << 5;
    const FALLBACK: u8 = 1 << 6;
    const NO_BACKOFF: u8 = 1 << 7;

    pub(crate) const fn outcome(self) -> Option<Outcome> {
        Outcome::from_code(self.0 & Self::OUTCOME)
    }

    pub(crate) const fn with_outcome(self, outcome: Outcome) -> Self {
        Self((self.0 & !Self::OUTCOME) | outcome.code())
    }

    pub(crate) const fn without_outcome(self) -> Self {
        Self(self.0 & !Self::OUTCOME)
    }

    /// The class of the failure a layer settled; meaningful with an outcome.
    pub(crate) const fn failure_class(self) -> crate::ErrorClass {
        class_from_code((self.0 & Self::FAILURE_CLASS) >> Self::FAILURE_CLASS_SHIFT)
    }

    pub(crate) const fn with_failure_class(self, class: crate::ErrorClass) -> Self {
        Self((self.0 & !Self::FAILURE_CLASS) | (class_code(class) << Self::FAILURE_CLASS_SHIFT))
    }

    pub(crate) const fn panic(self) -> bool {
        self.0 & Self::PANIC != 0
    }

    pub(crate) const fn fallback(self) -> bool {
        self.0 & Self::FALLBACK != 0
    }

    pub(crate) const fn no_backoff(self) -> bool {
        self.0 & Self::NO_BACKOFF != 0
    }

    pub(crate) const fn with_panic(self, panic: bool) -> Self {
        self.with(Self::PANIC, panic)
    }

    pub(crate) const fn with_fallback(self) -> Self {
        self.with(Self::FALLBACK, true)
    }

    pub(crate) const fn with_no_backoff(self) -> Self {
        self.with(Self::NO_BACKOFF, true)
    }

    const fn with(self, bit: u8, on: bool) -> Self {
        match on {
            true => Self(self.0 | bit),
            false => Self(self.0 & !bit),
        }
    }
}

/// Two bits per class: a class added to [`ErrorClass`](crate::ErrorClass)
/// needs a wider field in [`Marks`] (the match below says so at compile
/// time).
const fn class_code(class: crate::ErrorClass) -> u8 {
    match class {
        crate::ErrorClass::Retryable => 0,
        crate::ErrorClass::Permanent => 1,
        crate::ErrorClass::Ignore => 2,
        crate::ErrorClass::Interrupted => 3,
    }
}

const fn class_from_code(code: u8) -> crate::ErrorClass {
    match code {
        1 => crate::ErrorClass::Permanent,
        2 => crate::ErrorClass::Ignore,
        3 => crate::ErrorClass::Interrupted,
        _ => crate::ErrorClass::Retryable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorClass;

    #[test]
    fn every_mark_reads_back_as_set_and_leaves_the_others_alone() {
        let outcomes = [
            Outcome::Succeeded,
            Outcome::Ignored,
            Outcome::DeadLettered,
            Outcome::Parked,
            Outcome::Discarded,
        ];
        let classes = [
            ErrorClass::Retryable,
            ErrorClass::Permanent,
            ErrorClass::Ignore,
            ErrorClass::Interrupted,
        ];
        for outcome in outcomes {
            for class in classes {
                let marks = Marks::default()
                    .with_no_backoff()
                    .with_outcome(outcome)
                    .with_failure_class(class)
                    .with_panic(true)
                    .with_fallback();
                assert_eq!(marks.outcome(), Some(outcome));
                assert_eq!(marks.failure_class(), class);
                assert!(marks.panic() && marks.fallback() && marks.no_backoff());
                let plain = Marks::default()
                    .with_outcome(outcome)
                    .with_failure_class(class);
                assert!(!plain.panic() && !plain.fallback() && !plain.no_backoff());
            }
        }
        assert_eq!(Marks::default().outcome(), None);
    }
}
