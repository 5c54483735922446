//! [`Metrics`]: intake's metrics in a prometheus registry.

use std::collections::HashMap;
use std::sync::Arc;

use prometheus::Registry;

use super::series::{Families, FamilyOptions};
use super::{MetricsLayer, RegisterError};

/// Intake's metrics, registered in a [`Registry`] the application owns.
///
/// One `Metrics` per registry: clone it (a reference count) for each
/// handler's [`layer`](Metrics::layer), and hand it to the consumer as its
/// [`ConsumerObserver`](crate::observer::ConsumerObserver) for partition
/// gauges.
///
/// | metric | labels | |
/// |---|---|---|
/// | `intake_messages_consumed_total` | source, handler | handed to the handler |
/// | `intake_messages_succeeded_total` | source, handler | |
/// | `intake_messages_failed_total` | source, handler, class | final failures |
/// | `intake_messages_retried_total` | source, handler | retries (see [`MetricsLayer`]) |
/// | `intake_messages_dead_lettered_total` | source, handler | |
/// | `intake_messages_discarded_total` | source, handler | |
/// | `intake_messages_parked_total` | source, handler | parked to be handled again later; not a final failure |
/// | `intake_dead_letter_fallbacks_total` | source, handler, fallback | letters not written: `reference`, `discarded`, `redelivered` |
/// | `intake_handler_panics_total` | source, handler | |
/// | `intake_handler_duration_seconds` | source, handler | histogram |
/// | `intake_handler_in_flight` | source, handler | gauge |
/// | `intake_partition_commit_lag_messages` | source, partition | gauge |
/// | `intake_partition_oldest_unfinished_age_seconds` | source, partition | gauge |
/// | `intake_partition_in_flight_messages` | source, partition | gauge |
/// | `intake_consumer_in_flight_messages` | | gauge |
/// | `intake_ack_round_trips_total` | result | |
/// | `intake_ack_duration_seconds` | | histogram |
/// | `intake_consumer_panics_total` | source | panics the runtime caught (no [`CatchPanicLayer`](crate::catch_panic::CatchPanicLayer) inside) |
/// | `intake_consumer_probe_timeouts_total` | | backoff probes past [`probe_timeout`](crate::consumer::ConsumerBuilder::probe_timeout) |
/// | `intake_source_errors_total` | outcome | source errors: `retried` after the reconnect backoff, or `stopped` the run |
#[derive(Clone)]
pub struct Metrics {
    pub(super) families: Arc<Families>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Registers the metrics, named `intake_*`, in `registry`.
    ///
    /// # Errors
    ///
    /// The registry already holds metrics of these names (a second
    /// `Metrics` for the same registry: clone the first one instead).
    pub fn register(registry: &Registry) -> Result<Self, RegisterError> {
        Self::builder().register(registry)
    }

    /// Settings for metric names, constant labels and latency buckets.
    pub fn builder() -> MetricsBuilder {
        MetricsBuilder {
            prefix: "intake".to_owned(),
            const_labels: HashMap::new(),
            latency_buckets: MetricsBuilder::DEFAULT_LATENCY_BUCKETS.to_vec(),
        }
    }

    /// A layer that measures the handler it wraps, labelled `handler`.
    pub fn layer(&self, handler: impl Into<Arc<str>>) -> MetricsLayer {
        MetricsLayer::new(Arc::clone(&self.families), handler.into())
    }
}

/// Builds [`Metrics`] with non-default names, labels or buckets.
#[derive(Clone, Debug)]
pub struct MetricsBuilder {
    prefix: String,
    const_labels: HashMap<String, String>,
    latency_buckets: Vec<f64>,
}

impl MetricsBuilder {
    /// Handler latency buckets, in seconds: from half a millisecond (an
    /// in-memory handler) to a minute.
    pub const DEFAULT_LATENCY_BUCKETS: [f64; 16] = [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
        60.0,
    ];

    /// Names metrics `<prefix>_*` instead of `intake_*`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Adds a label with a fixed value to every metric (for example the
    /// consumer group, when two consumers share a registry).
    pub fn const_label(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.const_labels.insert(name.into(), value.into());
        self
    }

    /// Upper bounds of the handler latency histogram, in seconds.
    pub fn latency_buckets(mut self, buckets: impl Into<Vec<f64>>) -> Self {
        self.latency_buckets = buckets.into();
        self
    }

    /// Registers the metrics in `registry`.
    ///
    /// # Errors
    ///
    /// A name, label or bucket list that prometheus refuses, or metrics of
    /// the same names already in `registry`.
    pub fn register(self, registry: &Registry) -> Result<Metrics, RegisterError> {
        let families = Families::register(
            registry,
            FamilyOptions {
                prefix: self.prefix,
                const_labels: self.const_labels,
                latency_buckets: self.latency_buckets,
            },
        )?;
        Ok(Metrics {
            families: Arc::new(families),
        })
    }
}
