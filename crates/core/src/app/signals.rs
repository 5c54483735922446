//! SIGTERM and SIGINT as the app's stop requests, and handing them back
//! once the app no longer listens.
//!
//! Tokio installs a process-wide handler for a signal the first time it is
//! listened to, and keeps it for the life of the process: once no one
//! listens, the signal is swallowed. So a process whose run is over, but
//! which hangs in a step after it (a shutdown of its own, a relay that does
//! not stop), could be ended with SIGKILL only. A [`Signals`] that is
//! dropped therefore keeps its listener, which from then on ends the
//! process at the next signal, as the default action would have, unless a
//! newer `Signals` listens by then.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;

/// `Signals` alive now: a dropped one's listener ends the process only when
/// none is, so a signal meant for a later run drains that run.
static LISTENING: AtomicUsize = AtomicUsize::new(0);

/// The listeners of dropped `Signals`, stood down (aborted) by the next
/// [`Signals::install`] so they do not pile up over many runs.
static RELEASED: Mutex<Vec<AbortHandle>> = Mutex::new(Vec::new());

/// The process's stop signals, SIGTERM and SIGINT (Ctrl-C; only Ctrl-C off
/// Unix), listened to from [`install`](Self::install) on: the first one asks
/// for a drain, the second for a stop at once, and a third ends the process
/// at once (a shutdown hook that hangs after the stop, say), with status
/// 128 + the signal's number as its default action would.
///
/// Once it is dropped (when [`App::run`](super::App::run) or
/// [`App::run_with`](super::App::run_with) returns), the signals get their
/// default effect back: the next SIGTERM or SIGINT ends the process at once,
/// with status 143 or 130 (128 + the signal's number, what a shell reports
/// for a process the signal killed), unless another `Signals` is installed
/// by then (a later run), which then handles it. Tokio cannot take its
/// handler back, so it is a task that does this, and it needs the runtime to
/// keep running (a step after the run that blocks the runtime's threads is
/// not interrupted). A service that handles these signals itself after the
/// run should stop its app with
/// [`App::run_until_or_abort`](super::App::run_until_or_abort) instead.
///
/// [`App::run`](super::App::run) installs them itself; install them earlier
/// with [`App::run_with`](super::App::run_with) to catch a signal that
/// arrives while the app is being built.
#[derive(Debug)]
pub struct Signals {
    first: CancellationToken,
    second: CancellationToken,
    /// Set when this is dropped: the listener then ends the process at the
    /// next signal.
    released: Arc<AtomicBool>,
    listener: AbortHandle,
}

impl Signals {
    /// Starts listening (one small task, for the life of the process once
    /// this is dropped: see the [type docs](Self)).
    ///
    /// Fails if the runtime cannot register a signal handler (no tokio
    /// runtime with signals enabled, or the OS refused).
    pub fn install() -> std::io::Result<Self> {
        let first = CancellationToken::new();
        let second = CancellationToken::new();
        let released = Arc::new(AtomicBool::new(false));
        let mut next = listen()?;
        LISTENING.fetch_add(1, Ordering::SeqCst);
        // This one handles the signals from now on.
        for listener in lock(&RELEASED).drain(..) {
            listener.abort();
        }
        let listener = {
            let (first, second, released) = (first.clone(), second.clone(), released.clone());
            tokio::spawn(async move {
                let mut received = 0u32;
                loop {
                    let signal = next.recv().await;
                    if released.load(Ordering::SeqCst) {
                        if LISTENING.load(Ordering::SeqCst) == 0 {
                            tracing::warn!(signal, "stop signal after the run: ending the process");
                            std::process::exit(128 + signal);
                        }
                        // A newer listener handles it (and stands this one
                        // down).
                        continue;
                    }
                    received += 1;
                    match received {
                        1 => {
                            tracing::info!(
                                "stop signal received: draining (a second one stops at once)"
                            );
                            first.cancel();
                        }
                        2 => {
                            tracing::warn!(
                                "second stop signal received: stopping at once (a third one \
                                 ends the process)"
                            );
                            second.cancel();
                        }
                        _ => {
                            tracing::error!(signal, "third stop signal: ending the process");
                            std::process::exit(128 + signal);
                        }
                    }
                }
            })
            .abort_handle()
        };
        Ok(Self {
            first,
            second,
            released,
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
        // The listener stays, to end the process at the next signal: see
        // the type docs.
        self.released.store(true, Ordering::SeqCst);
        LISTENING.fetch_sub(1, Ordering::SeqCst);
        let mut released = lock(&RELEASED);
        released.retain(|listener| !listener.is_finished());
        released.push(self.listener.clone());
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
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
    /// Waits for the next signal; returns its number.
    async fn recv(&mut self) -> i32 {
        use tokio::signal::unix::SignalKind;
        tokio::select! {
            _ = self.term.recv() => SignalKind::terminate().as_raw_value(),
            _ = self.interrupt.recv() => SignalKind::interrupt().as_raw_value(),
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
    /// Waits for the next Ctrl-C; returns SIGINT's number (2), for the exit
    /// status.
    async fn recv(&mut self) -> i32 {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
        2
    }
}
