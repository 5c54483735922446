//! [`FailurePolicy`]: what happens to a message whose handler failed for good.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::DeadLetterSink;
use crate::backoff::{BackoffPolicy, Exponential};
use crate::error::ConfigError;

/// What the [dead-letter layer](super::DeadLetterLayer) does with a message
/// that failed for good: a permanent failure, or a retryable one whose
/// retries are used up.
#[derive(Clone)]
pub struct FailurePolicy {
    pub(super) action: Action,
}

#[derive(Clone)]
pub(super) enum Action {
    Discard,
    DeadLetter {
        sink: Arc<dyn DeadLetterSink>,
        write_backoff: Arc<dyn BackoffPolicy>,
        /// What decides when neither the letter nor its reference could be
        /// written; `None`: leave the message for redelivery.
        fallback: Option<Arc<FailurePolicy>>,
    },
    Block {
        backoff: Arc<dyn BackoffPolicy>,
    },
}

impl FailurePolicy {
    /// Log the failure and acknowledge the message: it is gone. For messages
    /// nobody will miss (metrics samples, cache invalidations).
    pub fn discard() -> Self {
        Self {
            action: Action::Discard,
        }
    }

    /// Write the message to `sink` with its origin, the error and the
    /// attempt count, and acknowledge it once the sink confirmed the write.
    ///
    /// A failed write is retried on a short schedule (100 ms doubling to 5 s,
    /// 5 retries; see [`FailurePolicy::write_backoff`]), a letter the sink
    /// [rejects](super::DeadLetterError::rejected) not at all. Then a letter
    /// that carries only a [reference](super::PayloadReference) to the
    /// message (its origin and sizes, no payload) is written instead, once:
    /// so no letter can hold its partition back for what it contains. If
    /// that fails too, the [fallback](FailurePolicy::or_else) decides; by
    /// default the message is left unacknowledged with a retryable error
    /// ([`DeadLetterWriteFailed`](super::DeadLetterWriteFailed)), so it is
    /// delivered again, and dead-lettered once the destination takes
    /// letters again: never lost.
    pub fn dead_letter(sink: impl DeadLetterSink) -> Self {
        Self {
            action: Action::DeadLetter {
                sink: Arc::new(sink),
                write_backoff: Arc::new(
                    Exponential::new(Duration::from_millis(100), Duration::from_secs(5))
                        .max_retries(5),
                ),
                fallback: None,
            },
        }
    }

    /// For [`FailurePolicy::dead_letter`]: what to do with a message whose
    /// letter and reference could not be written. [`discard`](Self::discard)
    /// acknowledges it (logged at error level, counted); another
    /// [`dead_letter`](Self::dead_letter) tries a second destination the
    /// same way; [`block`](Self::block) calls the handler again until it
    /// succeeds. Without a fallback the message is left for redelivery. No
    /// effect on the other policies.
    pub fn or_else(mut self, fallback: FailurePolicy) -> Self {
        if let Action::DeadLetter { fallback: slot, .. } = &mut self.action {
            *slot = Some(Arc::new(fallback));
        }
        self
    }

    /// Whether this policy, or a fallback of it, calls the handler again.
    pub(super) fn calls_again(&self) -> bool {
        match &self.action {
            Action::Block { .. } => true,
            Action::Discard => false,
            Action::DeadLetter { fallback, .. } => fallback
                .as_ref()
                .is_some_and(|fallback| fallback.calls_again()),
        }
    }

    /// Never give up: stop at the message and call the handler again after
    /// each of `backoff`'s delays, for as long as it takes (the partition's
    /// commit stays behind the message, and in partition order nothing
    /// behind it runs). For streams where skipping a message is worse than
    /// stopping: an operator fixes the cause, or the consumer is stopped.
    ///
    /// Permanent failures block too: the policy's promise is that no message
    /// is ever skipped. Past `backoff`'s retry cap its last delay repeats. A
    /// consumer shutdown ends the wait and leaves the message unacknowledged.
    ///
    /// Made for brokers that keep order by offset (Kafka, the memory broker).
    /// A broker that hands unacknowledged messages to another consumer after
    /// a timeout (the Redis claim idle time) does so with a blocked one too.
    ///
    /// # Errors
    ///
    /// A [`Disabled`](crate::backoff::Disabled) backoff (or one that gives up
    /// at once) would call the handler in a busy loop and is refused, and so
    /// is one whose own [`validate`](BackoffPolicy::validate) fails.
    pub fn block(backoff: impl BackoffPolicy) -> Result<Self, ConfigError> {
        backoff.validate().map_err(|error| {
            ConfigError::new(
                "failure_policy.block",
                format!(
                    "has an invalid backoff: `{}` {}",
                    error.setting, error.problem
                ),
            )
        })?;
        if backoff.is_disabled() || backoff.delay(1).is_none() {
            return Err(ConfigError::new(
                "failure_policy.block",
                "needs a backoff that waits between attempts, not a disabled one; \
                 use for example `Exponential::default()`",
            ));
        }
        Ok(Self {
            action: Action::Block {
                backoff: Arc::new(backoff),
            },
        })
    }

    /// For [`FailurePolicy::dead_letter`]: the schedule of retries of a
    /// failed dead-letter write before the message is left for redelivery.
    /// No effect on the other policies.
    pub fn write_backoff(mut self, backoff: impl BackoffPolicy) -> Self {
        if let Action::DeadLetter { write_backoff, .. } = &mut self.action {
            *write_backoff = Arc::new(backoff);
        }
        self
    }

    /// The policy's name, as used in logs: `discard`, `dead-letter` or
    /// `block`.
    pub fn name(&self) -> &'static str {
        match self.action {
            Action::Discard => "discard",
            Action::DeadLetter { .. } => "dead-letter",
            Action::Block { .. } => "block",
        }
    }
}

impl fmt::Debug for FailurePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut tuple = f.debug_tuple("FailurePolicy");
        tuple.field(&self.name());
        if let Action::DeadLetter {
            fallback: Some(fallback),
            ..
        } = &self.action
        {
            tuple.field(&**fallback);
        }
        tuple.finish()
    }
}
