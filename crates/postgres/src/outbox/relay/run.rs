//! The relay's task: batch after batch until cancelled, a full batch
//! followed at once, an idle one after the poll interval, a failed one after
//! the backoff.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use intake_core::publish::Publisher;
use intake_core::{BackoffPolicy, ErrorChain};
use tokio_util::sync::CancellationToken;

use super::OutboxRelay;
use super::handle::Counters;

pub(super) async fn run<P: Publisher>(
    relay: OutboxRelay<P>,
    cancel: CancellationToken,
    counters: Arc<Counters>,
) {
    let settings = relay.settings;
    let backoff = settings.backoff;
    let mut failures: u32 = 0;
    while !cancel.is_cancelled() {
        // A batch is not interrupted by a stop: it ends on its own within
        // its statements and confirm timeout, and one dropped half-way
        // would publish its confirmed rows again for nothing.
        let (full, failure) = match relay.pass().await {
            Ok(pass) => {
                counters
                    .published
                    .fetch_add(pass.done.published, Ordering::Relaxed);
                counters
                    .failed_rows
                    .fetch_add(pass.done.failed, Ordering::Relaxed);
                (pass.full, pass.failure)
            }
            Err(error) => (false, Some(error)),
        };
        let pause = match failure {
            None => {
                failures = 0;
                counters.failing.store(0, Ordering::Relaxed);
                if full {
                    continue;
                }
                settings.poll_interval
            }
            Some(error) => {
                failures = failures.saturating_add(1);
                counters.failing.store(failures, Ordering::Relaxed);
                counters.failed_batches.fetch_add(1, Ordering::Relaxed);
                let pause = backoff
                    .delay(failures)
                    .unwrap_or_else(|| backoff.base_delay(failures));
                tracing::warn!(
                    table = relay.table.name(),
                    error = %ErrorChain::new(&error),
                    retry_in = ?pause,
                    "publishing outbox rows failed; the rows not confirmed stay and are \
                     published again"
                );
                pause
            }
        };
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
    }
}
