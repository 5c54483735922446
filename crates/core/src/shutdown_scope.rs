//! The running consumer's shutdown, as seen from inside a handler.
//!
//! While the runtime polls handler futures it makes its shutdown scope the
//! current one for the thread, so middleware can notice a shutdown without
//! being wired to it: the retry layer ends a backoff sleep that would outlast
//! the drain and leaves the message unacknowledged, and lets one that ends
//! within the drain run its attempt there. Reading the scope costs nothing on
//! the success path; only code about to wait asks for it.

use std::cell::Cell;
use std::ptr;
use std::sync::OnceLock;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A consumer's shutdown as its handlers see it: the token cancelled when
/// a stop begins, and until when the drain runs.
#[derive(Debug, Default)]
pub(crate) struct ShutdownScope {
    token: CancellationToken,
    /// Set once, when a graceful stop begins, before the token is cancelled.
    drain_deadline: OnceLock<Instant>,
}

impl ShutdownScope {
    /// A scope of `token`, with no drain deadline known.
    pub(crate) fn new(token: CancellationToken) -> Self {
        Self {
            token,
            drain_deadline: OnceLock::new(),
        }
    }

    /// Begins the stop: handlers get until `deadline` (the first deadline
    /// given stays), then the token is cancelled.
    pub(crate) fn begin_drain(&self, deadline: Instant) {
        let _ = self.drain_deadline.set(deadline);
        self.token.cancel();
    }
}

thread_local! {
    /// The scope being run on this thread, borrowed for the scope only:
    /// making a scope current costs two thread-local writes and no clone (a
    /// `CancellationToken` clone and drop each take the token tree's mutex,
    /// and the runtime makes its scope current on every pass).
    static CURRENT_SHUTDOWN: Cell<*const ShutdownScope> = const { Cell::new(ptr::null()) };
}

/// Calls `read` with the current scope, if any.
fn read_current<R>(read: impl FnOnce(Option<&ShutdownScope>) -> R) -> R {
    let current = CURRENT_SHUTDOWN.with(Cell::get);
    // SAFETY: a non-null pointer was set by `with_shutdown` from a reference
    // that outlives its scope, and the scope's guard puts the previous value
    // back when the scope ends, unwinding included; so a non-null pointer
    // read here points to a live scope, and the reference does not leave
    // `read`.
    read(unsafe { current.as_ref() })
}

/// The shutdown token of the consumer whose handler is being polled on this
/// thread, if any. Cancelled when that consumer starts to shut down.
///
/// Call it while being polled (inside `Future::poll` or an `async` block the
/// runtime drives), not from a task spawned elsewhere.
pub fn current_shutdown() -> Option<CancellationToken> {
    read_current(|scope| scope.map(|scope| scope.token.clone()))
}

/// Until when the stopping consumer whose handler is being polled drains
/// its running handlers; `None` while it is not stopping (or outside a
/// consumer).
pub(crate) fn current_drain_deadline() -> Option<Instant> {
    read_current(|scope| scope.and_then(|scope| scope.drain_deadline.get().copied()))
}

/// Makes `scope` current for the duration of `poll`.
pub(crate) fn with_shutdown<R>(scope: &ShutdownScope, poll: impl FnOnce() -> R) -> R {
    struct Restore(*const ShutdownScope);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT_SHUTDOWN.with(|current| current.set(self.0));
        }
    }
    let previous = CURRENT_SHUTDOWN.with(|current| current.replace(ptr::from_ref(scope)));
    let _restore = Restore(previous);
    poll()
}

/// Runs `poll` with `token` current: for tests of middleware that reads
/// [`current_shutdown`]. No drain deadline is known in such a scope, so a
/// cancelled token ends every backoff at once.
pub fn scope_shutdown<R>(token: &CancellationToken, poll: impl FnOnce() -> R) -> R {
    with_shutdown(&ShutdownScope::new(token.clone()), poll)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_current_only_inside_the_scope() {
        let scope = ShutdownScope::default();
        assert!(current_shutdown().is_none());
        let inside = with_shutdown(&scope, current_shutdown);
        assert!(inside.is_some());
        assert!(current_shutdown().is_none());
    }

    #[test]
    fn a_nested_scope_puts_the_outer_token_back_even_when_it_panics() {
        let outer = ShutdownScope::default();
        let inner = ShutdownScope::default();
        inner.begin_drain(Instant::now());
        with_shutdown(&outer, || {
            let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                with_shutdown(&inner, || {
                    assert!(current_shutdown().is_some_and(|token| token.is_cancelled()));
                    panic!("a handler's panic");
                })
            }));
            assert!(unwound.is_err());
            assert_eq!(current_drain_deadline(), None, "the outer scope's");
            let current = current_shutdown();
            assert!(
                current.is_some_and(|token| !token.is_cancelled()),
                "the outer token"
            );
        });
        assert!(current_shutdown().is_none());
    }
}
