//! [`ServiceError`]: why a service did not start or did not end well.

use crate::app::{AppError, AppReport};
use crate::error::{BoxError, ConfigError};

/// Why a [`Service`](super::Service) did not start, or did not end well.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The broker refused to give a route one of its parts (the source,
    /// its dead-letter destination, parking, the publisher): the broker is
    /// down, a name is wrong, or credentials lack a permission. Nothing was
    /// consumed.
    #[error("route `{route}`: the {broker} broker did not give its {part}")]
    Derive {
        /// The route.
        route: String,
        /// The broker's kind.
        broker: &'static str,
        /// The part: "parts", "publisher", "lag probe".
        part: &'static str,
        /// The broker's error.
        #[source]
        source: BoxError,
    },
    /// A route's settings are inconsistent; nothing was consumed.
    #[error("route `{route}` is misconfigured")]
    Config {
        /// The route.
        route: String,
        /// What is wrong.
        #[source]
        source: ConfigError,
    },
    /// The service's metrics could not be registered (a name taken in the
    /// registry given to it).
    #[error("the service's metrics could not be registered")]
    Metrics(#[source] BoxError),
    /// The HTTP address for health and metrics could not be bound.
    #[error("health and metrics could not listen on `{address}`")]
    Http {
        /// The address.
        address: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The service ran and ended badly: a route failed, a hook failed, or a
    /// second signal stopped it at once. [`report`](Self::report) has what
    /// each route did.
    #[error("the service did not end well")]
    Run(#[source] AppError),
}

impl ServiceError {
    /// What each route did, when the service ran.
    pub fn report(&self) -> Option<&AppReport> {
        match self {
            Self::Run(error) => error.report(),
            _ => None,
        }
    }
}
