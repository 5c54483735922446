//! The running consumer's shutdown, as seen from inside a handler.
//!
//! While the runtime polls handler futures it makes its shutdown token the
//! current one for the thread, so middleware can notice a shutdown without
//! being wired to it: the retry layer stops a backoff sleep at once and
//! leaves the message unacknowledged. Reading the token costs nothing on the
//! success path; only code about to wait asks for it.

use std::cell::Cell;
use std::ptr;

use tokio_util::sync::CancellationToken;

thread_local! {
    /// The token of the scope being run on this thread, borrowed for the
    /// scope only: making a token current costs two thread-local writes
    /// and no clone (a `CancellationToken` clone and drop each take the
    /// token tree's mutex, and the runtime makes its token current on
    /// every pass).
    static CURRENT_SHUTDOWN: Cell<*const CancellationToken> = const { Cell::new(ptr::null()) };
}

/// The shutdown token of the consumer whose handler is being polled on this
/// thread, if any. Cancelled when that consumer starts to shut down.
///
/// Call it while being polled (inside `Future::poll` or an `async` block the
/// runtime drives), not from a task spawned elsewhere.
pub fn current_shutdown() -> Option<CancellationToken> {
    let current = CURRENT_SHUTDOWN.with(Cell::get);
    // SAFETY: a non-null pointer was set by `with_shutdown` from a reference
    // that outlives its scope, and the scope's guard puts the previous value
    // back when the scope ends, unwinding included; so a non-null pointer
    // read here points to a live token.
    unsafe { current.as_ref() }.cloned()
}

/// Makes `token` current for the duration of `poll`.
pub(crate) fn with_shutdown<R>(token: &CancellationToken, poll: impl FnOnce() -> R) -> R {
    struct Restore(*const CancellationToken);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT_SHUTDOWN.with(|current| current.set(self.0));
        }
    }
    let previous = CURRENT_SHUTDOWN.with(|current| current.replace(ptr::from_ref(token)));
    let _restore = Restore(previous);
    poll()
}

/// Runs `poll` with `token` current: for tests of middleware that reads
/// [`current_shutdown`].
pub fn scope_shutdown<R>(token: &CancellationToken, poll: impl FnOnce() -> R) -> R {
    with_shutdown(token, poll)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_current_only_inside_the_scope() {
        let token = CancellationToken::new();
        assert!(current_shutdown().is_none());
        let inside = with_shutdown(&token, current_shutdown);
        assert!(inside.is_some());
        assert!(current_shutdown().is_none());
    }

    #[test]
    fn a_nested_scope_puts_the_outer_token_back_even_when_it_panics() {
        let outer = CancellationToken::new();
        let inner = CancellationToken::new();
        inner.cancel();
        with_shutdown(&outer, || {
            let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                with_shutdown(&inner, || {
                    assert!(current_shutdown().is_some_and(|token| token.is_cancelled()));
                    panic!("a handler's panic");
                })
            }));
            assert!(unwound.is_err());
            let current = current_shutdown();
            assert!(
                current.is_some_and(|token| !token.is_cancelled()),
                "the outer token"
            );
        });
        assert!(current_shutdown().is_none());
    }
}
