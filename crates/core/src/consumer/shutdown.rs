//! What tells a consumer to stop.

use std::future::Future;
use std::pin::Pin;

use tokio_util::sync::CancellationToken;

/// The signal that starts a graceful shutdown: a [`CancellationToken`] or any
/// future.
///
/// ```
/// # use intake_core::consumer::Shutdown;
/// # use tokio_util::sync::CancellationToken;
/// let token = CancellationToken::new();
/// let _from_token: Shutdown = token.clone().into();
/// let _from_future = Shutdown::on(async { let _ = tokio::signal::ctrl_c().await; });
/// ```
pub struct Shutdown {
    signal: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl Shutdown {
    /// Shuts down when `future` completes.
    pub fn on(future: impl Future<Output = ()> + Send + 'static) -> Self {
        Self {
            signal: Box::pin(future),
        }
    }

    /// Never shuts down (the run ends only if the source is exhausted or
    /// fails).
    pub fn never() -> Self {
        Self::on(std::future::pending())
    }

    pub(crate) fn into_future(self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        self.signal
    }
}

impl std::fmt::Debug for Shutdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Shutdown")
    }
}

impl From<CancellationToken> for Shutdown {
    fn from(token: CancellationToken) -> Self {
        Self::on(token.cancelled_owned())
    }
}

impl From<&CancellationToken> for Shutdown {
    fn from(token: &CancellationToken) -> Self {
        Self::on(token.clone().cancelled_owned())
    }
}
