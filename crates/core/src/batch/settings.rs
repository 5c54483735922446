//! [`BatchSettings`]: how batches form and how many run at once.

use std::time::Duration;

use crate::error::ConfigError;

/// How batches form and how many run at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchSettings {
    /// A batch is handed to the handler as soon as it holds this many
    /// messages.
    pub max_size: usize,
    /// ... or once its first message has waited this long.
    pub max_wait: Duration,
    /// Batches the handler runs at once. While all are busy, the next batch
    /// keeps filling (up to `max_size`).
    pub parallelism: usize,
}

impl Default for BatchSettings {
    /// Up to 100 messages, 10 ms, one batch at a time.
    fn default() -> Self {
        Self {
            max_size: 100,
            max_wait: Duration::from_millis(10),
            parallelism: 1,
        }
    }
}

impl BatchSettings {
    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// A `max_size` or `parallelism` of 0.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_size == 0 {
            return Err(ConfigError::new(
                "batch.max_size",
                "must be at least 1 (1 hands over every message alone)",
            ));
        }
        if self.parallelism == 0 {
            return Err(ConfigError::new(
                "batch.parallelism",
                "must be at least 1, or no batch would ever run",
            ));
        }
        Ok(())
    }
}
