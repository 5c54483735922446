//! SIGTERM and SIGINT as the app's stop requests.

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The process's stop signals, SIGTERM and SIGINT (Ctrl-C; only Ctrl-C off
/// Unix), listened to from [`install`](Self::install) on: the first one asks
/// for a drain, the second for a stop at once.
///
/// [`App::run`](super::App::run) installs them itself; install them earlier
/// with [`App::run_with`](super::App::run_with) to catch a signal that
/// arrives while the app is being built.
#[derive(Debug)]
pub struct Signals {
    first: CancellationToken,
    second: CancellationToken,
    listener: JoinHandle<()>,
}

impl Signals {
    /// Starts listening (one small task, until the second signal or until
    /// this is dropped).
    ///
    /// Fails if the runtime cannot register a signal handler (no tokio
    /// runtime with signals enabled, or the OS refused).
    pub fn install() -> std::io::Result<Self> {
        let first = CancellationToken::new();
        let second = CancellationToken::new();
        let mut next = listen()?;
        let listener = {
            let (first, second) = (first.clone(), second.clone());
            tokio::spawn(async move {
                next.recv().await;
                tracing::info!("stop signal received: draining (a second one stops at once)");
                first.cancel();
                next.recv().await;
                tracing::warn!("second stop signal received: stopping at once");
                second.cancel();
            })
        };
        Ok(Self {
            first,
            second,
            listener,
        })
    }

    /// The token cancelled by the first signal.
    pub fn drain_token(&self) -> CancellationToken {
        self.first.clone()
    }

    /// The token cancelled by the second signal.
    pub fn stop_now_token(&self) -> CancellationToken {
        self.second.clone()
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

#[cfg(unix)]
struct Listener {
    term: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

#[cfg(unix)]
fn listen() -> std::io::Result<Listener> {
    use tokio::signal::unix::{SignalKind, signal};
    Ok(Listener {
        term: signal(SignalKind::terminate())?,
        interrupt: signal(SignalKind::interrupt())?,
    })
}

#[cfg(unix)]
impl Listener {
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.interrupt.recv() => {}
        }
    }
}

#[cfg(not(unix))]
struct Listener;

#[cfg(not(unix))]
fn listen() -> std::io::Result<Listener> {
    Ok(Listener)
}

#[cfg(not(unix))]
impl Listener {
    async fn recv(&mut self) {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
