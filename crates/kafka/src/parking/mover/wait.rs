//! The mover's waits on its own thread, each bounded: a delivery report
//! polled without a runtime, until a deadline.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::DeliveryFuture;

/// `wait` from now; a wait beyond what the clock holds is a year.
pub(super) fn later(wait: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(wait)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 86_400)))
        .unwrap_or(now)
}

/// Waits on this thread for a delivery report, until `deadline`.
pub(super) fn delivered(delivery: DeliveryFuture, deadline: Instant) -> Result<(), KafkaError> {
    match block_on(delivery, deadline) {
        Some(Ok(Ok(_))) => Ok(()),
        Some(Ok(Err((error, _)))) => Err(error),
        // The producer was dropped with the record unconfirmed.
        Some(Err(_canceled)) => Err(KafkaError::Canceled),
        None => Err(KafkaError::MessageProduction(
            RDKafkaErrorCode::MessageTimedOut,
        )),
    }
}

/// Wakes the thread that waits in [`block_on`].
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `future` on this thread until it resolves or `deadline` passes.
/// The delivery report comes from the producer's own thread, so no runtime
/// is needed here, and the mover does not depend on one staying alive.
fn block_on<F: Future + Unpin>(mut future: F, deadline: Instant) -> Option<F::Output> {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(output) = Pin::new(&mut future).poll(&mut cx) {
            return Some(output);
        }
        let left = deadline.checked_duration_since(Instant::now())?;
        if left.is_zero() {
            return None;
        }
        std::thread::park_timeout(left);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_for_a_report_that_never_comes_ends_at_the_deadline() {
        let pending = std::future::pending::<()>();
        let started = Instant::now();
        assert!(block_on(pending, started + Duration::from_millis(50)).is_none());
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert_eq!(block_on(std::future::ready(7), started), Some(7));
    }
}
