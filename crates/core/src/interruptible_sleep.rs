//! A backoff sleep that ends early when the consumer shuts down, unless it
//! ends within the drain.
//!
//! The retry and dead-letter layers sleep between attempts. When the
//! consumer starts to shut down, a sleep that would outlast the drain (the
//! `shutdown_deadline`) ends at once: the message is left unacknowledged
//! and the broker delivers it again. A sleep that ends within the drain goes
//! on, and its attempt runs there: interrupting it would leave a hole that
//! holds back the commit of everything after it (on Kafka the next owner
//! would repeat all of that), for a wait the drain has time for. The sleep
//! reads the shutdown token of the consumer that polls it
//! ([`current_shutdown`]) when it is created, which is only ever on a
//! failure path, and the drain's deadline when the token fires.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tokio_util::sync::WaitForCancellationFutureOwned;

use crate::shutdown_scope::{current_drain_deadline, current_shutdown};

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
        // Shutdown first: a sleep that ends after the drain must not start
        // another attempt.
        let mut shutdown = this.shutdown;
        if let Some(stopping) = shutdown.as_mut().as_pin_mut()
            && stopping.poll(cx).is_ready()
        {
            if current_drain_deadline().is_none_or(|until| this.sleep.deadline() > until) {
                return Poll::Ready(Wake::ShuttingDown);
            }
            // It ends within the drain: sleep on, and try once more there.
            shutdown.set(None);
        }
        this.sleep.poll(cx).map(|()| Wake::Elapsed)
    }
}

/// Whether the consumer polling the caller is shutting down.
pub(crate) fn shutting_down() -> bool {
    current_shutdown().is_some_and(|token| token.is_cancelled())
}

/// Whether a wait of `delay` from now must be given up: the consumer
/// polling the caller is shutting down, and the wait would end after its
/// drain (or the drain's end is unknown).
pub(crate) fn outlasts_the_drain(delay: Duration) -> bool {
    shutting_down()
        && current_drain_deadline().is_none_or(|until| tokio::time::Instant::now() + delay > until)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shutdown_scope::{ShutdownScope, scope_shutdown, with_shutdown};
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

    #[tokio::test(start_paused = true)]
    async fn a_sleep_that_ends_within_the_drain_goes_on_and_one_after_it_ends() {
        let scope = ShutdownScope::default();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut short = pin!(with_shutdown(&scope, || InterruptibleSleep::new(
            Duration::from_secs(1)
        )));
        let mut long = pin!(with_shutdown(&scope, || InterruptibleSleep::new(
            Duration::from_secs(60)
        )));
        assert!(with_shutdown(&scope, || short.as_mut().poll(&mut cx)).is_pending());
        assert!(with_shutdown(&scope, || long.as_mut().poll(&mut cx)).is_pending());
        scope.begin_drain(tokio::time::Instant::now() + Duration::from_secs(10));
        assert!(with_shutdown(&scope, || outlasts_the_drain(
            Duration::from_secs(60)
        )));
        assert!(!with_shutdown(&scope, || outlasts_the_drain(
            Duration::from_secs(1)
        )));
        assert_eq!(
            with_shutdown(&scope, || long.as_mut().poll(&mut cx)),
            Poll::Ready(Wake::ShuttingDown)
        );
        assert!(with_shutdown(&scope, || short.as_mut().poll(&mut cx)).is_pending());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            with_shutdown(&scope, || short.as_mut().poll(&mut cx)),
            Poll::Ready(Wake::Elapsed)
        );
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
