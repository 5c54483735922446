//! A backoff sleep that ends early when the consumer shuts down.
//!
//! The retry and dead-letter layers sleep between attempts. A consumer that
//! is shutting down must not wait for those sleeps (or worse, run the handler
//! once more when they end): the message is left unacknowledged and the
//! broker delivers it again. The sleep reads the shutdown token of the
//! consumer that polls it ([`current_shutdown`]) when it is created, which is
//! only ever on a failure path.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tokio_util::sync::WaitForCancellationFutureOwned;

use crate::shutdown_scope::current_shutdown;

/// How an [`InterruptibleSleep`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// The delay passed: try again.
    Elapsed,
    /// The consumer is shutting down: give up and leave the message
    /// unacknowledged.
    ShuttingDown,
}

pin_project! {
    /// Sleeps for a delay unless the current consumer shuts down first.
    pub(crate) struct InterruptibleSleep {
        #[pin]
        sleep: Sleep,
        #[pin]
        shutdown: Option<WaitForCancellationFutureOwned>,
    }
}

impl InterruptibleSleep {
    /// A sleep of `delay` that watches the shutdown token current on this
    /// thread (none outside a consumer: then it is a plain sleep).
    pub(crate) fn new(delay: Duration) -> Self {
        Self {
            sleep: tokio::time::sleep(delay),
            shutdown: current_shutdown().map(|token| token.cancelled_owned()),
        }
    }
}

impl Future for InterruptibleSleep {
    type Output = Wake;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Wake> {
        let this = self.project();
        // Shutdown first: a sleep that ends at the same moment as the
        // consumer must not start another attempt.
        if let Some(shutdown) = this.shutdown.as_pin_mut()
            && shutdown.poll(cx).is_ready()
        {
            return Poll::Ready(Wake::ShuttingDown);
        }
        this.sleep.poll(cx).map(|()| Wake::Elapsed)
    }
}

/// Whether the consumer polling the caller is shutting down.
pub(crate) fn shutting_down() -> bool {
    current_shutdown().is_some_and(|token| token.is_cancelled())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shutdown_scope::scope_shutdown;
    use std::pin::pin;
    use tokio_util::sync::CancellationToken;

    #[tokio::test(start_paused = true)]
    async fn a_sleep_outside_a_consumer_runs_to_its_end() {
        assert_eq!(
            InterruptibleSleep::new(Duration::from_secs(5)).await,
            Wake::Elapsed
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_shutdown_ends_the_sleep_at_once() {
        let token = CancellationToken::new();
        let mut sleep = pin!(scope_shutdown(&token, || InterruptibleSleep::new(
            Duration::from_secs(3600)
        )));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(sleep.as_mut().poll(&mut cx).is_pending());
        token.cancel();
        assert_eq!(sleep.poll(&mut cx), Poll::Ready(Wake::ShuttingDown));
    }

    #[test]
    fn shutting_down_reads_the_current_token() {
        let token = CancellationToken::new();
        assert!(!shutting_down());
        assert!(!scope_shutdown(&token, shutting_down));
        token.cancel();
        assert!(scope_shutdown(&token, shutting_down));
    }
}
