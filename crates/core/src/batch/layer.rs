//! [`BatchLayer`]: turns a batch handler into a per-message service.

use tower::Layer;

use super::{Batch, BatchSettings};
use crate::error::ConfigError;

/// Turns a handler of batches into a handler of messages. See [`Batch`].
#[derive(Clone, Copy, Debug)]
pub struct BatchLayer {
    settings: BatchSettings,
}

impl BatchLayer {
    /// Batches as `settings` say.
    ///
    /// # Errors
    ///
    /// Settings that [`BatchSettings::validate`] refuses.
    pub fn new(settings: BatchSettings) -> Result<Self, ConfigError> {
        settings.validate()?;
        Ok(Self { settings })
    }
}

impl<S> Layer<S> for BatchLayer {
    type Service = Batch<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Batch::from_valid(inner, self.settings)
    }
}
