//! [`ResponseFuture`]: a handler call being measured.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use pin_project_lite::pin_project;

use super::series::SourceSeries;
use crate::catch_panic::Panicked;
use crate::dead_letter::{DeadLetterWriteFailed, DeadLettered, Discarded};
use crate::error::HandlerError;
use crate::parking::ParkedMessage;

pin_project! {
    /// The future of [`MetricsService`](super::MetricsService).
    pub struct ResponseFuture<F> {
        #[pin]
        future: F,
        started: Instant,
        // Taken when the outcome is recorded; a future dropped before that
        // (a consumer that stops waiting) still leaves the gauge.
        in_flight: Option<InFlight>,
    }
}

/// Holds a message in the in-flight gauge.
pub(super) struct InFlight(Arc<SourceSeries>);

impl InFlight {
    pub(super) fn enter(series: Arc<SourceSeries>) -> Self {
        series.in_flight.inc();
        Self(series)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.dec();
    }
}

impl<F> ResponseFuture<F> {
    pub(super) fn new(future: F, in_flight: InFlight) -> Self {
        Self {
            future,
            started: Instant::now(),
            in_flight: Some(in_flight),
        }
    }
}

impl<F, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<(), E>>,
    E: Into<HandlerError>,
{
    type Output = Result<(), HandlerError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let outcome = ready!(this.future.poll(cx)).map_err(Into::into);
        if let Some(InFlight(series)) = this.in_flight.as_ref() {
            series
                .duration
                .observe(this.started.elapsed().as_secs_f64());
            record(series, &outcome);
        }
        *this.in_flight = None;
        Poll::Ready(outcome)
    }
}

/// Counts an outcome. The dead-letter layer's verdicts count as failures of
/// the original class, plus dead-lettered or discarded; a panic counts
/// wherever it is found.
fn record(series: &SourceSeries, outcome: &Result<(), HandlerError>) {
    let error = match outcome {
        Ok(()) => {
            series.succeeded.inc();
            return;
        }
        Err(error) => error,
    };
    let cause = error.cause();
    // Parked: it comes back later, so it is no final failure.
    if cause.is::<ParkedMessage>() {
        series.parked.inc();
        return;
    }
    let failure = if let Some(dead_lettered) = cause.downcast_ref::<DeadLettered>() {
        series.dead_lettered.inc();
        if dead_lettered.is_reference() {
            series.fallbacks[0].inc();
        }
        dead_lettered.error()
    } else if let Some(discarded) = cause.downcast_ref::<Discarded>() {
        series.discarded.inc();
        if discarded.undeliverable().is_some() {
            series.fallbacks[1].inc();
        }
        discarded.error()
    } else {
        error
    };
    series.failed(failure).inc();
    let root = match failure.cause().downcast_ref::<DeadLetterWriteFailed>() {
        Some(write_failed) => {
            series.fallbacks[2].inc();
            write_failed.error()
        }
        None => failure,
    };
    if root.cause().is::<Panicked>() {
        series.panicked.inc();
    }
}
