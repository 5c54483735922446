//! The task that hands batches to the batch handler: when a batch is full
//! or old enough, and when a parallelism permit is free.

use std::future::poll_fn;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use tokio::sync::{Semaphore, mpsc};
use tower::Service;
use tracing::field::Empty;
use tracing::{Instrument, Span};

use super::BatchSettings;
use super::state::{Completion, OpenBatch};
use crate::catch_panic::Panicked;
use crate::error::HandlerError;
use crate::message::Message;

/// Runs until every handle of the batch service is gone and the last opened
/// batch was handed over. Batches are taken in the order they opened.
pub(super) async fn run<S>(
    mut service: S,
    mut opened: mpsc::UnboundedReceiver<Arc<OpenBatch>>,
    settings: BatchSettings,
) where
    S: Service<Vec<Message>, Response = Vec<Result<(), HandlerError>>> + Send + 'static,
    S::Error: Into<HandlerError>,
    S::Future: Send + 'static,
{
    let permits = Arc::new(Semaphore::new(settings.parallelism));
    while let Some(batch) = opened.recv().await {
        tokio::select! {
            () = batch.full.notified() => {}
            () = tokio::time::sleep_until(crate::deadline::after(batch.opened_at, settings.max_wait)) => {}
        }
        // While every permit is busy the batch keeps filling, so a slow
        // handler gets bigger batches rather than a longer queue.
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            // The semaphore is never closed; should it be, fail the batch
            // rather than leave its messages waiting.
            Completion::new(batch).failed(HandlerError::retryable("batch permits closed"));
            continue;
        };
        let messages = batch.seal();
        let completion = Completion::new(batch);
        if let Err(error) = poll_fn(|cx| service.poll_ready(cx)).await {
            completion.failed(error.into());
            continue;
        }
        let span = batch_span(&messages);
        let call = {
            let _entered = span.enter();
            AssertUnwindSafe(service.call(messages)).catch_unwind()
        };
        tokio::spawn(
            async move {
                let _permit = permit;
                match call.await {
                    Ok(answer) => completion.outcomes(answer.map_err(Into::into)),
                    Err(payload) => completion.panicked(&Panicked::from_payload(&*payload)),
                }
            }
            .instrument(span),
        );
    }
}

/// The span a batch is handled in: its size, and with the `opentelemetry`
/// feature a link to each message's remote context (a batch has many
/// parents, so it links them instead of choosing one).
fn batch_span(messages: &[Message]) -> Span {
    let span = tracing::info_span!("batch", size = messages.len(), otel.kind = Empty);
    #[cfg(feature = "opentelemetry")]
    if !span.is_disabled() {
        span.record("otel.kind", "consumer");
        for message in messages {
            crate::trace::otel::link_to_remote(&span, message.headers());
        }
    }
    span
}
