//! What a handler's failure means, and the errors of the runtime itself.

use std::fmt;

use crate::outcome::{Marks, Outcome};
use crate::redact::Capped;

/// A boxed error, as tower middleware returns them.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What a handler failure means for the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorClass {
    /// Try again after a backoff (a downstream service was unavailable, a
    /// lock timed out). Retried by the retry layer; if it still fails, the
    /// message goes back to the broker or is re-dispatched in process.
    Retryable,
    /// Never retry (the payload is malformed, a constraint is violated). Goes
    /// to the dead-letter destination, or is discarded, per policy.
    Permanent,
    /// Count the message as done although the handler did nothing with it.
    Ignore,
    /// The handler gave up because the consumer is shutting down. The message
    /// is left unacknowledged so that the broker delivers it again. Returned
    /// while the consumer is not stopping (and its partition is not being
    /// revoked), it is treated as [`Retryable`](ErrorClass::Retryable): left
    /// unfinished, it would hold its partition's commits back for good.
    Interrupted,
}

impl ErrorClass {
    /// A short lowercase name, as used in metric labels and span fields.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Retryable => "retryable",
            ErrorClass::Permanent => "permanent",
            ErrorClass::Ignore => "ignore",
            ErrorClass::Interrupted => "interrupted",
        }
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A handler's failure: its class, its cause, and the attempts made.
///
/// Build one with [`HandlerError::retryable`], [`HandlerError::permanent`] or
/// [`HandlerError::ignore`]; a layer that finished a failed message itself
/// (dead-lettered, parked, dropped it) returns
/// [`HandlerError::settled`] with the [`Outcome`] it gave. Any error from a tower layer converts into one
/// (`From<BoxError>`): a `HandlerError` inside is recovered as it was, a
/// timeout (`tower::timeout::error::Elapsed`) is retryable, and anything else
/// is retryable too, because a failure of unknown cause is most often
/// transient and the retry layer caps it.
///
/// Its `Display` and `Debug` show at most
/// [`TEXT_LIMIT`](Self::TEXT_LIMIT) bytes of the cause's text, so an error
/// that quotes a whole payload cannot flood a log line, a span or a dead
/// letter; [`cause`](Self::cause) is the whole cause.
///
/// A `HandlerError` classifies its cause rather than wrapping it in a level
/// of its own: `Display` is the class, the attempts and the cause's own text
/// (`permanent error after 3 attempt(s): no such customer`), and
/// [`source`](std::error::Error::source) continues with the cause's source,
/// as hyper's rule asks, so a report that prints the chain prints the
/// cause's text once. An error made from a message
/// (`HandlerError::retryable("timeout")`) has no source. To downcast the
/// cause itself, use [`cause`](Self::cause).
pub struct HandlerError {
    class: ErrorClass,
    source: BoxError,
    // Narrow fields, so that the error stays three words: every handler's
    // result carries its size, success or not.
    attempts: u16,
    /// The settled outcome, the settled failure's class, a panic, a
    /// fallback, no backoff.
    marks: Marks,
    /// Milliseconds; 0 for none.
    retry_after_ms: u32,
}

impl HandlerError {
    /// Most bytes of the cause's text that `Display` and `Debug` show (cut
    /// at a character boundary, then `… (N more bytes)`): the same bound as
    /// a dead letter's error text.
    pub const TEXT_LIMIT: usize = 4096;

    fn with_class(class: ErrorClass, source: impl Into<BoxError>) -> Self {
        Self {
            class,
            source: source.into(),
            attempts: 0,
            marks: Marks::default(),
            retry_after_ms: 0,
        }
    }

    /// A failure worth retrying after a backoff.
    pub fn retryable(source: impl Into<BoxError>) -> Self {
        Self::with_class(ErrorClass::Retryable, source)
    }

    /// A failure no retry can fix.
    pub fn permanent(source: impl Into<BoxError>) -> Self {
        Self::with_class(ErrorClass::Permanent, source)
    }

    /// A failure to retry later, not now (`delay` in whole milliseconds, at
    /// most 49 days): a dependency is down for
    /// minutes, a rate limit resets at a known time. Under a
    /// [`ParkingLayer`](crate::parking::ParkingLayer) the message is parked
    /// for `delay` through the broker's own mechanism, the original is
    /// acknowledged, and neither its partition nor the consumer waits
    /// (later messages of its key are parked behind it). The retry layer
    /// passes it through without retrying in process. Without a parking
    /// layer it is an ordinary retryable failure.
    pub fn retry_later(source: impl Into<BoxError>, delay: std::time::Duration) -> Self {
        // It says when to try again, not that the consumer's dependencies
        // are failing; the runtime backs off for it only when it cannot
        // wait that long any other way.
        Self::retryable(source)
            .with_retry_after(delay)
            .without_backoff()
    }

    /// The message is done although it was not processed (a filter, a
    /// message for another tenant). It is acknowledged, and counted as
    /// [`Outcome::Ignored`].
    pub fn ignore(reason: impl Into<BoxError>) -> Self {
        Self::with_class(ErrorClass::Ignore, reason)
    }

    /// A layer finished the message itself, as `outcome` says (it wrote it
    /// to a dead-letter destination, parked a copy of it, dropped it by
    /// policy): the runtime acknowledges it (class
    /// [`Ignore`](ErrorClass::Ignore)), and the consumer's
    /// [`RunReport`](crate::consumer::RunReport) and the metrics layer count
    /// it as `outcome`, whatever layer settled it.
    ///
    /// When the `cause`'s [`source`](std::error::Error::source) is the
    /// failure the layer settled (a `HandlerError`), the error keeps that
    /// failure's [class](Self::failure_class) and whether it was a
    /// [panic](Self::is_panic), so that the metrics count the failure behind
    /// the outcome: intake's own outcomes
    /// ([`DeadLettered`](crate::dead_letter::DeadLettered),
    /// [`ParkedMessage`](crate::parking::ParkedMessage)) do so.
    pub fn settled(outcome: Outcome, cause: impl Into<BoxError>) -> Self {
        Self::with_class(ErrorClass::Ignore, cause).settle(outcome)
    }

    /// Marks this error as settled as `outcome`, keeping the class and panic
    /// of the failure its cause's source is (see [`settled`](Self::settled)).
    /// The class is left as it is: a parked message handed back to the
    /// broker stays retryable, for the runtime to hand it back.
    pub(crate) fn settle(mut self, outcome: Outcome) -> Self {
        let settled = self
            .source
            .source()
            .and_then(|source| source.downcast_ref::<HandlerError>());
        let (class, panic) = match settled {
            Some(failure) => (failure.failure_class(), failure.is_panic()),
            None => (self.class, self.is_panic()),
        };
        self.marks = self
            .marks
            .with_outcome(outcome)
            .with_failure_class(class)
            .with_panic(panic);
        self
    }

    /// A handler panicked (`cause` says how; a
    /// [`CatchPanicLayer`](crate::catch_panic::CatchPanicLayer) makes it a
    /// [`Panicked`](crate::catch_panic::Panicked)): a retryable failure that
    /// the metrics layer counts as a panic, also once a layer has settled it.
    pub fn panicked(cause: impl Into<BoxError>) -> Self {
        let mut error = Self::retryable(cause);
        error.marks = error.marks.with_panic(true);
        error
    }

    /// Marks the outcome as its layer's fallback: its first way to settle
    /// the message failed (a dead letter written only as a reference, a
    /// message discarded because the destination took nothing, or left for
    /// redelivery because the write failed). Counted apart by the metrics
    /// layer (`intake_dead_letter_fallbacks_total`).
    pub fn with_fallback(mut self) -> Self {
        self.marks = self.marks.with_fallback();
        self
    }

    /// How a layer settled the message: the outcome given to
    /// [`settled`](Self::settled), [`Outcome::Ignored`] for any other error
    /// of class [`Ignore`](ErrorClass::Ignore), and `None` for a failure no
    /// layer settled, which the runtime handles by its [class](Self::class).
    pub fn outcome(&self) -> Option<Outcome> {
        match self.marks.outcome() {
            Some(outcome) => Some(outcome),
            None if self.class == ErrorClass::Ignore => Some(Outcome::Ignored),
            None => None,
        }
    }

    /// The class of the failure behind this error: for a [settled](Self::settled)
    /// message, the failure the layer settled (a dead-lettered permanent
    /// failure is [`Permanent`](ErrorClass::Permanent), although the error
    /// itself is [`Ignore`](ErrorClass::Ignore)); otherwise its own class.
    pub fn failure_class(&self) -> ErrorClass {
        match self.marks.outcome() {
            Some(_) => self.marks.failure_class(),
            None => self.class,
        }
    }

    /// Whether the failure behind this error was a handler panic (see
    /// [`panicked`](Self::panicked)).
    pub fn is_panic(&self) -> bool {
        self.marks.panic()
    }

    /// Whether the outcome was its layer's fallback (see
    /// [`with_fallback`](Self::with_fallback)).
    pub fn is_fallback(&self) -> bool {
        self.marks.fallback()
    }

    /// The handler stopped because the consumer is shutting down; the message
    /// stays unacknowledged for redelivery. Outside a shutdown the runtime
    /// retries it (see [`ErrorClass::Interrupted`]).
    pub fn interrupted() -> Self {
        Self::with_class(ErrorClass::Interrupted, "interrupted by consumer shutdown")
    }

    /// Marks a retryable failure as one that says nothing about the health of
    /// the consumer's dependencies ("requeue without backoff"): it does not
    /// push the consumer into backoff, and a probe that ends this way still
    /// lets the next delivery through.
    pub fn without_backoff(mut self) -> Self {
        self.marks = self.marks.with_no_backoff();
        self
    }

    /// Records how many attempts were made before this error was final.
    pub fn with_attempts(mut self, attempts: u32) -> Self {
        self.attempts = u16::try_from(attempts).unwrap_or(u16::MAX);
        self
    }

    /// How long to wait before the next attempt, when the failure asked
    /// to be [retried later](Self::retry_later).
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        (self.retry_after_ms > 0 && self.class == ErrorClass::Retryable)
            .then(|| std::time::Duration::from_millis(u64::from(self.retry_after_ms)))
    }

    /// Asks a retryable failure to be retried after `delay` rather than now
    /// (the retry layer's [`then_retry_later`](crate::retry::RetryLayer::then_retry_later)
    /// sets it once its attempts are used up).
    pub fn with_retry_after(mut self, delay: std::time::Duration) -> Self {
        self.retry_after_ms = millis_of(delay);
        self
    }

    /// The class of the failure.
    pub fn class(&self) -> ErrorClass {
        self.class
    }

    /// Whether this is [`ErrorClass::Retryable`].
    pub fn is_retryable(&self) -> bool {
        self.class == ErrorClass::Retryable
    }

    /// Whether this is [`ErrorClass::Permanent`].
    pub fn is_permanent(&self) -> bool {
        self.class == ErrorClass::Permanent
    }

    /// Attempts made before the error was final (0 = not recorded; at
    /// most 65,535).
    pub fn attempts(&self) -> u32 {
        u32::from(self.attempts)
    }

    /// Whether the failure should count toward consumer-level backoff.
    pub fn affects_backoff(&self) -> bool {
        !self.marks.no_backoff() && self.class == ErrorClass::Retryable
    }

    /// The underlying cause.
    pub fn cause(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.source
    }

    /// Reclassifies the error (the dead-letter layer turns a failed sink write
    /// into a retryable error, for instance). A [settled](Self::settled)
    /// error reclassified is settled no more: the runtime handles it by its
    /// new class.
    pub fn reclassify(mut self, class: ErrorClass) -> Self {
        self.marks = self.marks.without_outcome();
        self.class = class;
        self
    }
}

/// A delay in whole milliseconds, at least 1 (0 means none), at most
/// `u32::MAX` (49 days).
fn millis_of(delay: std::time::Duration) -> u32 {
    u32::try_from(delay.as_millis().max(1)).unwrap_or(u32::MAX)
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("class", &self.class)
            .field("source", &Capped::new(&self.source, Self::TEXT_LIMIT))
            .field("attempts", &self.attempts)
            .field("retry_after", &self.retry_after())
            .field("outcome", &self.outcome())
            .finish()
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} error", self.class)?;
        if self.attempts > 0 {
            write!(f, " after {} attempt(s)", self.attempts)?;
        }
        write!(f, ": {}", Capped::new(&self.source, Self::TEXT_LIMIT))
    }
}

impl std::error::Error for HandlerError {
    /// The cause's source: the cause's own text is this error's level.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.source()
    }
}

impl From<BoxError> for HandlerError {
    fn from(error: BoxError) -> Self {
        match error.downcast::<HandlerError>() {
            Ok(handler_error) => *handler_error,
            Err(error) => HandlerError::retryable(error),
        }
    }
}

impl From<std::convert::Infallible> for HandlerError {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}

/// An error and its causes on one line: each level's `Display`, outermost
/// first, joined by `: ` (`the source failed: broker error: connection
/// refused`).
///
/// intake's errors follow hyper's rule: `Display` describes one level, and
/// the cause is reached through [`source`](std::error::Error::source). Log
/// the chain, not the outer error alone, wherever the cause matters:
/// `tracing::warn!(error = %ErrorChain::new(&error))`. The chain stops after
/// [`MAX_LEVELS`](Self::MAX_LEVELS) levels. It formats without allocating;
/// wrap it in [`Capped`] where a level may quote outside input at length.
#[derive(Clone, Copy)]
pub struct ErrorChain<'a> {
    error: &'a (dyn std::error::Error + 'static),
}

impl<'a> ErrorChain<'a> {
    /// Most levels shown: a longer chain ends with `: …`.
    pub const MAX_LEVELS: usize = 16;

    /// The chain of `error`.
    pub fn new(error: &'a (dyn std::error::Error + 'static)) -> Self {
        Self { error }
    }
}

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.error)?;
        let mut level = self.error.source();
        let mut shown = 1;
        while let Some(cause) = level {
            if shown == Self::MAX_LEVELS {
                return f.write_str(": …");
            }
            write!(f, ": {cause}")?;
            shown += 1;
            level = cause.source();
        }
        Ok(())
    }
}

/// `error` and its causes, bounded for a log line or a span field: room
/// for one handler error's capped text and the levels around it.
pub(crate) fn chain_for_log<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Capped<ErrorChain<'a>> {
    Capped::new(ErrorChain::new(error), 2 * HandlerError::TEXT_LIMIT)
}

impl fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A consumer setting that cannot work, found when the consumer is built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid consumer configuration: `{setting}` {problem}")]
#[non_exhaustive]
pub struct ConfigError {
    /// The setting at fault.
    pub setting: &'static str,
    /// What is wrong with it and what to do instead.
    pub problem: String,
}

impl ConfigError {
    /// A configuration error for `setting`.
    pub fn new(setting: &'static str, problem: impl Into<String>) -> Self {
        Self {
            setting,
            problem: problem.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_handler_error_stays_three_words_and_keeps_its_delay_to_the_millisecond() {
        // Every handler's result carries this size, success or not.
        assert_eq!(
            std::mem::size_of::<HandlerError>(),
            3 * std::mem::size_of::<usize>()
        );
        let later = HandlerError::retry_later("rate limited", Duration::from_micros(1_500));
        assert_eq!(later.retry_after(), Some(Duration::from_millis(1)));
        let tiny = HandlerError::retry_later("now-ish", Duration::ZERO);
        assert_eq!(tiny.retry_after(), Some(Duration::from_millis(1)));
        let huge = HandlerError::retry_later("far", Duration::from_secs(u64::MAX));
        assert_eq!(
            huge.retry_after(),
            Some(Duration::from_millis(u64::from(u32::MAX)))
        );
        assert_eq!(HandlerError::retryable("x").retry_after(), None);
        let many = HandlerError::retryable("x").with_attempts(1_000_000);
        assert_eq!(many.attempts(), u32::from(u16::MAX));
    }

    #[test]
    fn a_handler_error_survives_boxing_through_tower_layers() {
        let boxed: BoxError = Box::new(HandlerError::permanent("bad").with_attempts(3));
        let recovered = HandlerError::from(boxed);
        assert_eq!(recovered.class(), ErrorClass::Permanent);
        assert_eq!(recovered.attempts(), 3);
    }

    #[test]
    fn an_unknown_error_is_retryable() {
        let boxed: BoxError = "socket closed".into();
        assert!(HandlerError::from(boxed).is_retryable());
    }

    #[test]
    fn display_names_class_attempts_and_cause() {
        let error = HandlerError::retryable("timeout").with_attempts(2);
        assert_eq!(
            error.to_string(),
            "retryable error after 2 attempt(s): timeout"
        );
    }

    #[test]
    fn display_and_debug_cap_the_cause_text() {
        let quoted = "x".repeat(1 << 20);
        let error = HandlerError::permanent(quoted.clone());
        let shown = error.to_string();
        assert!(shown.len() <= 4096 + 64, "{} bytes", shown.len());
        assert!(shown.ends_with(&format!("… ({} more bytes)", (1 << 20) - 4096)));
        let debugged = format!("{error:?}");
        assert!(debugged.len() <= 4096 + 128, "{} bytes", debugged.len());
        // The cause itself is whole.
        assert_eq!(error.cause().to_string(), quoted);
    }
}
