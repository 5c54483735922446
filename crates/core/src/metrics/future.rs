//! [`ResponseFuture`]: a handler call being measured.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use pin_project_lite::pin_project;

use super::series::SourceSeries;
use crate::error::HandlerError;
use crate::outcome::Outcome;

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

/// Counts an outcome by what the layer that settled it says, whichever
/// layer it was. A settled failure counts as a failure of the class it had
/// before it was settled (a dead-lettered permanent failure as
/// `permanent`), plus dead-lettered or discarded; a parked message is no
/// final failure; a panic counts wherever it is found.
fn record(series: &SourceSeries, outcome: &Result<(), HandlerError>) {
    let error = match outcome {
        Ok(()) => {
            series.succeeded.inc();
            return;
        }
        Err(error) => error,
    };
    match error.outcome() {
        Some(Outcome::Succeeded) => {
            series.succeeded.inc();
            return;
        }
        // It comes back later.
        Some(Outcome::Parked) => {
            series.parked.inc();
            return;
        }
        Some(Outcome::DeadLettered) => {
            series.dead_lettered.inc();
            count_fallback(series, error, Fallback::Reference);
        }
        Some(Outcome::Discarded) => {
            series.discarded.inc();
            count_fallback(series, error, Fallback::Discarded);
        }
        Some(Outcome::Ignored) => {}
        // A failure no layer settled: a layer that could not settle it
        // (its dead letter could not be written) left it for redelivery.
        None => count_fallback(series, error, Fallback::Redelivered),
    }
    series.failed(error.failure_class()).inc();
    if error.is_panic() {
        series.panicked.inc();
    }
}

/// The `fallback` label of each outcome, in the order of
/// [`SourceSeries::fallbacks`].
#[derive(Clone, Copy)]
enum Fallback {
    Reference = 0,
    Discarded = 1,
    Redelivered = 2,
}

fn count_fallback(series: &SourceSeries, error: &HandlerError, fallback: Fallback) {
    if error.is_fallback() {
        series.fallbacks[fallback as usize].inc();
    }
}
