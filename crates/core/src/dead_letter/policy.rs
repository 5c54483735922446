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
    /// 5 retries; see [`FailurePolicy::write_backoff`]); if it still fails,
    /// the message is left unacknowledged with a retryable error, so it is
    /// delivered again and never lost.
    pub fn dead_letter(sink: impl DeadLetterSink) -> Self {
        Self {
            action: Action::DeadLetter {
                sink: Arc::new(sink),
                write_backoff: Arc::new(
                    Exponential::new(Duration::from_millis(100), Duration::from_secs(5))
                        .max_retries(5),
                ),
            },
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
        f.debug_tuple("FailurePolicy").field(&self.name()).finish()
    }
}
