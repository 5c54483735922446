//! The running consumer's shutdown, as seen from inside a handler.
//!
//! While the runtime polls handler futures it makes its shutdown token the
//! current one for the thread, so middleware can notice a shutdown without
//! being wired to it: the retry layer stops a backoff sleep at once and
//! leaves the message unacknowledged. Reading the token costs nothing on the
//! success path; only code about to wait asks for it.

use std::cell::RefCell;

use tokio_util::sync::CancellationToken;

thread_local! {
    static CURRENT_SHUTDOWN: RefCell<Option<CancellationToken>> = const { RefCell::new(None) };
}

/// The shutdown token of the consumer whose handler is being polled on this
/// thread, if any. Cancelled when that consumer starts to shut down.
///
/// Call it while being polled (inside `Future::poll` or an `async` block the
/// runtime drives), not from a task spawned elsewhere.
pub fn current_shutdown() -> Option<CancellationToken> {
    CURRENT_SHUTDOWN.with(|current| current.borrow().clone())
}

/// Makes `token` current for the duration of `poll`.
pub(crate) fn with_shutdown<R>(token: &CancellationToken, poll: impl FnOnce() -> R) -> R {
    struct Restore(Option<CancellationToken>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            CURRENT_SHUTDOWN.with(|current| *current.borrow_mut() = previous);
        }
    }
    let previous = CURRENT_SHUTDOWN.with(|current| current.borrow_mut().replace(token.clone()));
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
}
