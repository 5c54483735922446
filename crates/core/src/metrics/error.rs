//! [`RegisterError`]: the metrics could not be registered.

/// The metrics could not be registered in the registry passed in.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot register intake's metrics in this registry; build one `Metrics` per registry and \
     clone it for each handler and consumer, or give a second one its own prefix"
)]
pub struct RegisterError {
    #[source]
    pub(super) source: prometheus::Error,
}

impl From<prometheus::Error> for RegisterError {
    fn from(source: prometheus::Error) -> Self {
        Self { source }
    }
}
