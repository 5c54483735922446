//! The metric families and the per-(source, handler) handles resolved from
//! them once, so that a message touches only atomics.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

use super::RegisterError;
use crate::error::ErrorClass;
use crate::message::{PartitionKey, SourceName};

/// Every metric family, registered once per registry.
pub(super) struct Families {
    pub(super) consumed: IntCounterVec,
    pub(super) succeeded: IntCounterVec,
    pub(super) failed: IntCounterVec,
    pub(super) retried: IntCounterVec,
    pub(super) dead_lettered: IntCounterVec,
    pub(super) discarded: IntCounterVec,
    pub(super) parked: IntCounterVec,
    pub(super) dead_letter_fallbacks: IntCounterVec,
    pub(super) panicked: IntCounterVec,
    pub(super) duration: HistogramVec,
    pub(super) in_flight: IntGaugeVec,
    pub(super) commit_lag: IntGaugeVec,
    pub(super) oldest_unfinished_age: GaugeVec,
    pub(super) partition_in_flight: IntGaugeVec,
    pub(super) consumer_in_flight: IntGauge,
    pub(super) acks: IntCounterVec,
    pub(super) ack_duration: Histogram,
    pub(super) consumer_panics: IntCounterVec,
    pub(super) probe_timeouts: IntCounter,
    pub(super) source_errors: IntCounterVec,
    /// Partition gauges resolved at the first commit tick that reports the
    /// partition, removed when it is revoked.
    pub(super) partitions: Mutex<HashMap<PartitionKey, PartitionSeries>>,
}

/// Settings of [`Families::register`].
pub(super) struct FamilyOptions {
    pub(super) prefix: String,
    pub(super) const_labels: HashMap<String, String>,
    pub(super) latency_buckets: Vec<f64>,
}

const MESSAGE_LABELS: &[&str] = &["source", "handler"];
const PARTITION_LABELS: &[&str] = &["source", "partition"];

impl Families {
    pub(super) fn register(
        registry: &Registry,
        options: FamilyOptions,
    ) -> Result<Self, RegisterError> {
        let FamilyOptions {
            prefix,
            const_labels,
            latency_buckets,
        } = options;
        let opts = |name: &str, help: &str| {
            Opts::new(format!("{prefix}_{name}"), help).const_labels(const_labels.clone())
        };
        let histogram = |name: &str, help: &str, buckets: Vec<f64>| {
            HistogramOpts::new(format!("{prefix}_{name}"), help)
                .const_labels(const_labels.clone())
                .buckets(buckets)
        };
        let families = Self {
            consumed: IntCounterVec::new(
                opts("messages_consumed_total", "Messages handed to the handler."),
                MESSAGE_LABELS,
            )?,
            succeeded: IntCounterVec::new(
                opts(
                    "messages_succeeded_total",
                    "Messages the handler finished without error.",
                ),
                MESSAGE_LABELS,
            )?,
            failed: IntCounterVec::new(
                opts(
                    "messages_failed_total",
                    "Messages whose final outcome was a failure, by class (retryable, permanent, \
                     ignore, interrupted); dead-lettered and discarded ones by their original class.",
                ),
                &["source", "handler", "class"],
            )?,
            retried: IntCounterVec::new(
                opts("messages_retried_total", "Retries made by the retry layer."),
                MESSAGE_LABELS,
            )?,
            dead_lettered: IntCounterVec::new(
                opts(
                    "messages_dead_lettered_total",
                    "Messages written to the dead-letter destination.",
                ),
                MESSAGE_LABELS,
            )?,
            discarded: IntCounterVec::new(
                opts(
                    "messages_discarded_total",
                    "Messages dropped after a final failure by a discard policy.",
                ),
                MESSAGE_LABELS,
            )?,
            parked: IntCounterVec::new(
                opts(
                    "messages_parked_total",
                    "Messages parked to be handled again later (retry after a delay).",
                ),
                MESSAGE_LABELS,
            )?,
            dead_letter_fallbacks: IntCounterVec::new(
                opts(
                    "dead_letter_fallbacks_total",
                    "Messages whose dead letter could not be written, by what happened instead: \
                     reference (a letter with the origin and sizes only), discarded or \
                     redelivered (the policy's fallback).",
                ),
                &["source", "handler", "fallback"],
            )?,
            panicked: IntCounterVec::new(
                opts("handler_panics_total", "Handler panics caught."),
                MESSAGE_LABELS,
            )?,
            duration: HistogramVec::new(
                histogram(
                    "handler_duration_seconds",
                    "Time from handing a message to the handler stack to its outcome.",
                    latency_buckets,
                ),
                MESSAGE_LABELS,
            )?,
            in_flight: IntGaugeVec::new(
                opts("handler_in_flight", "Messages inside the handler now."),
                MESSAGE_LABELS,
            )?,
            commit_lag: IntGaugeVec::new(
                opts(
                    "partition_commit_lag_messages",
                    "Admitted messages of the partition not yet covered by its committable \
                     position.",
                ),
                PARTITION_LABELS,
            )?,
            oldest_unfinished_age: GaugeVec::new(
                opts(
                    "partition_oldest_unfinished_age_seconds",
                    "Age of the partition's oldest unfinished message (0 when none).",
                ),
                PARTITION_LABELS,
            )?,
            partition_in_flight: IntGaugeVec::new(
                opts(
                    "partition_in_flight_messages",
                    "Messages of the partition whose handler has not finished.",
                ),
                PARTITION_LABELS,
            )?,
            consumer_in_flight: IntGauge::with_opts(opts(
                "consumer_in_flight_messages",
                "Deliveries the consumer holds (queued or running).",
            ))?,
            acks: IntCounterVec::new(
                opts(
                    "ack_round_trips_total",
                    "Acknowledgement round trips to the broker, by result (ok, error).",
                ),
                &["result"],
            )?,
            ack_duration: Histogram::with_opts(histogram(
                "ack_duration_seconds",
                "Duration of acknowledgement round trips to the broker.",
                prometheus::DEFAULT_BUCKETS.to_vec(),
            ))?,
            consumer_panics: IntCounterVec::new(
                opts(
                    "consumer_panics_total",
                    "Handler panics the consumer runtime caught itself (no CatchPanicLayer \
                     inside the stack caught them first); each message was retried.",
                ),
                &["source"],
            )?,
            probe_timeouts: IntCounter::with_opts(opts(
                "consumer_probe_timeouts_total",
                "Backoff probes still running after the probe timeout; the consumer backed \
                 off again without their outcome.",
            ))?,
            source_errors: IntCounterVec::new(
                opts(
                    "source_errors_total",
                    "Errors of the source, by what the consumer did: retried (after the \
                     reconnect backoff) or stopped (the run ended with the error).",
                ),
                &["outcome"],
            )?,
            partitions: Mutex::default(),
        };
        families.register_into(registry)?;
        Ok(families)
    }

    fn register_into(&self, registry: &Registry) -> Result<(), RegisterError> {
        let collectors: [Box<dyn prometheus::core::Collector>; 20] = [
            Box::new(self.consumed.clone()),
            Box::new(self.succeeded.clone()),
            Box::new(self.failed.clone()),
            Box::new(self.retried.clone()),
            Box::new(self.dead_lettered.clone()),
            Box::new(self.discarded.clone()),
            Box::new(self.parked.clone()),
            Box::new(self.dead_letter_fallbacks.clone()),
            Box::new(self.panicked.clone()),
            Box::new(self.duration.clone()),
            Box::new(self.in_flight.clone()),
            Box::new(self.commit_lag.clone()),
            Box::new(self.oldest_unfinished_age.clone()),
            Box::new(self.partition_in_flight.clone()),
            Box::new(self.consumer_in_flight.clone()),
            Box::new(self.acks.clone()),
            Box::new(self.ack_duration.clone()),
            Box::new(self.consumer_panics.clone()),
            Box::new(self.probe_timeouts.clone()),
            Box::new(self.source_errors.clone()),
        ];
        for collector in collectors {
            registry.register(collector)?;
        }
        Ok(())
    }

    pub(super) fn partitions(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<PartitionKey, PartitionSeries>> {
        self.partitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The handles of one (source, handler) pair.
pub(super) struct SourceSeries {
    pub(super) source: SourceName,
    pub(super) consumed: IntCounter,
    pub(super) succeeded: IntCounter,
    failed: [IntCounter; 4],
    pub(super) retried: IntCounter,
    pub(super) dead_lettered: IntCounter,
    pub(super) discarded: IntCounter,
    pub(super) parked: IntCounter,
    /// Dead letters written as a reference, discarded, or left for
    /// redelivery because their destination took neither letter.
    pub(super) fallbacks: [IntCounter; 3],
    pub(super) panicked: IntCounter,
    pub(super) duration: Histogram,
    pub(super) in_flight: IntGauge,
}

/// The `fallback` label values, in the order of [`SourceSeries::fallbacks`].
pub(super) const FALLBACKS: [&str; 3] = ["reference", "discarded", "redelivered"];

const CLASSES: [ErrorClass; 4] = [
    ErrorClass::Retryable,
    ErrorClass::Permanent,
    ErrorClass::Ignore,
    ErrorClass::Interrupted,
];

fn class_index(class: ErrorClass) -> usize {
    match class {
        ErrorClass::Retryable => 0,
        ErrorClass::Permanent => 1,
        ErrorClass::Ignore => 2,
        ErrorClass::Interrupted => 3,
    }
}

impl SourceSeries {
    fn resolve(families: &Families, source: &SourceName, handler: &str) -> Self {
        let labels = [&**source, handler];
        Self {
            source: source.clone(),
            consumed: families.consumed.with_label_values(&labels),
            succeeded: families.succeeded.with_label_values(&labels),
            failed: CLASSES.map(|class| {
                families
                    .failed
                    .with_label_values(&[&**source, handler, class.as_str()])
            }),
            retried: families.retried.with_label_values(&labels),
            dead_lettered: families.dead_lettered.with_label_values(&labels),
            discarded: families.discarded.with_label_values(&labels),
            parked: families.parked.with_label_values(&labels),
            fallbacks: FALLBACKS.map(|fallback| {
                families
                    .dead_letter_fallbacks
                    .with_label_values(&[&**source, handler, fallback])
            }),
            panicked: families.panicked.with_label_values(&labels),
            duration: families.duration.with_label_values(&labels),
            in_flight: families.in_flight.with_label_values(&labels),
        }
    }

    pub(super) fn failed(&self, class: ErrorClass) -> &IntCounter {
        &self.failed[class_index(class)]
    }

    pub(super) fn is_for(&self, source: &SourceName) -> bool {
        Arc::ptr_eq(&self.source, source) || self.source == *source
    }
}

/// One handler's series, one per source it has seen.
pub(super) struct HandlerSeries {
    pub(super) name: Arc<str>,
    pub(super) families: Arc<Families>,
    // Few sources per handler: a scan beats hashing, and the lock is taken
    // only when a service meets a source it has not cached.
    by_source: RwLock<Vec<Arc<SourceSeries>>>,
}

impl HandlerSeries {
    pub(super) fn new(name: Arc<str>, families: Arc<Families>) -> Self {
        Self {
            name,
            families,
            by_source: RwLock::default(),
        }
    }

    /// The series of `source`, resolved on first use.
    pub(super) fn for_source(&self, source: &SourceName) -> Arc<SourceSeries> {
        {
            let known = self
                .by_source
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(series) = known.iter().find(|series| series.is_for(source)) {
                return Arc::clone(series);
            }
        }
        let mut known = self
            .by_source
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(series) = known.iter().find(|series| series.is_for(source)) {
            return Arc::clone(series);
        }
        let series = Arc::new(SourceSeries::resolve(&self.families, source, &self.name));
        known.push(Arc::clone(&series));
        series
    }
}

/// The gauges of one partition.
pub(super) struct PartitionSeries {
    pub(super) commit_lag: IntGauge,
    pub(super) oldest_unfinished_age: Gauge,
    pub(super) in_flight: IntGauge,
}

impl PartitionSeries {
    pub(super) fn resolve(families: &Families, partition: &PartitionKey) -> Self {
        let number = partition.partition.to_string();
        let labels = [&*partition.source, number.as_str()];
        Self {
            commit_lag: families.commit_lag.with_label_values(&labels),
            oldest_unfinished_age: families.oldest_unfinished_age.with_label_values(&labels),
            in_flight: families.partition_in_flight.with_label_values(&labels),
        }
    }

    pub(super) fn remove(families: &Families, partition: &PartitionKey) {
        let number = partition.partition.to_string();
        let labels = [&*partition.source, number.as_str()];
        // A partition never reported has no series: nothing to remove.
        let _ = families.commit_lag.remove_label_values(&labels);
        let _ = families.oldest_unfinished_age.remove_label_values(&labels);
        let _ = families.partition_in_flight.remove_label_values(&labels);
    }
}
