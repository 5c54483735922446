//! Dead-letter depth and age as prometheus gauges: [`DeadLetterMetrics`]
//! and the [`DeadLetterExporter`] task that refreshes them from a
//! [`DeadLetterStore`]'s [`summary`](DeadLetterStore::summary).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use tokio_util::sync::CancellationToken;

use super::RegisterError;
use crate::dead_letter::store::{DeadLetterStore, Filter, StoreError, Summary};

/// The class label of entries that cannot be read as dead letters.
const UNREADABLE: &str = "unreadable";

/// The dead-letter gauges in a registry. Register once per registry and
/// share it (a reference count) between the exporters of several stores.
#[derive(Clone)]
pub struct DeadLetterMetrics {
    families: Arc<DeadLetterFamilies>,
}

struct DeadLetterFamilies {
    letters: IntGaugeVec,
    oldest: GaugeVec,
    errors: IntCounterVec,
}

impl std::fmt::Debug for DeadLetterMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetterMetrics").finish_non_exhaustive()
    }
}

impl DeadLetterMetrics {
    /// Registers `intake_dead_letters{destination,class}`,
    /// `intake_dead_letter_oldest_age_seconds{destination}` and
    /// `intake_dead_letter_errors_total{destination}` in `registry`.
    ///
    /// # Errors
    ///
    /// The registry already holds them (register once, clone the result).
    pub fn register(registry: &Registry) -> Result<Self, RegisterError> {
        Self::register_with_prefix(registry, "intake")
    }

    /// Like [`register`](Self::register), naming the metrics
    /// `<prefix>_dead_letter*`.
    ///
    /// # Errors
    ///
    /// A prefix prometheus refuses, or the metrics already registered.
    pub fn register_with_prefix(registry: &Registry, prefix: &str) -> Result<Self, RegisterError> {
        let families = DeadLetterFamilies {
            letters: IntGaugeVec::new(
                Opts::new(
                    format!("{prefix}_dead_letters"),
                    "Letters waiting in the dead-letter destination, by the class of their \
                     last failure (unreadable: entries that are no intake dead letter).",
                ),
                &["destination", "class"],
            )?,
            oldest: GaugeVec::new(
                Opts::new(
                    format!("{prefix}_dead_letter_oldest_age_seconds"),
                    "How long the oldest letter of the dead-letter destination has waited \
                     since it was given up (0 when there is none).",
                ),
                &["destination"],
            )?,
            errors: IntCounterVec::new(
                Opts::new(
                    format!("{prefix}_dead_letter_errors_total"),
                    "Dead-letter store reads for the gauges that failed.",
                ),
                &["destination"],
            )?,
        };
        registry.register(Box::new(families.letters.clone()))?;
        registry.register(Box::new(families.oldest.clone()))?;
        registry.register(Box::new(families.errors.clone()))?;
        Ok(Self {
            families: Arc::new(families),
        })
    }

    /// The exported count of letters of `class` (an
    /// [`ErrorClass::as_str`](crate::ErrorClass::as_str), or
    /// `unreadable`) in `destination`, if there is one.
    pub fn letters(&self, destination: &str, class: &str) -> Option<i64> {
        use prometheus::core::Collector;
        self.families.letters.collect().iter().find_map(|family| {
            family.get_metric().iter().find_map(|metric| {
                let labels = metric.get_label();
                let value = |name: &str| {
                    labels
                        .iter()
                        .find(|label| label.name() == name)
                        .map(|label| label.value())
                };
                (value("destination") == Some(destination) && value("class") == Some(class))
                    .then(|| metric.get_gauge().get_value() as i64)
            })
        })
    }

    /// The exported age of `destination`'s oldest letter, in seconds.
    pub fn oldest_age_seconds(&self, destination: &str) -> Option<f64> {
        use prometheus::core::Collector;
        self.families.oldest.collect().iter().find_map(|family| {
            family.get_metric().iter().find_map(|metric| {
                metric
                    .get_label()
                    .iter()
                    .any(|label| label.name() == "destination" && label.value() == destination)
                    .then(|| metric.get_gauge().get_value())
            })
        })
    }

    /// Failed reads counted for `destination`.
    pub fn errors(&self, destination: &str) -> u64 {
        self.families
            .errors
            .get_metric_with_label_values(&[destination])
            .map_or(0, |counter| counter.get())
    }
}

/// Refreshes the dead-letter gauges of one store.
///
/// | metric | says |
/// |---|---|
/// | `intake_dead_letters{destination,class}` | letters waiting, per class of their last failure (`permanent`, `retryable`, …, `unreadable`) |
/// | `intake_dead_letter_oldest_age_seconds{destination}` | how long the oldest has waited since it was given up (0 when none) |
/// | `intake_dead_letter_errors_total{destination}` | reads for the gauges that failed |
///
/// Each refresh reads the whole store (a summary counts by class), so
/// refresh a large destination every minute or so rather than every
/// scrape. When a read fails, the destination's gauges are removed (a stale
/// number would look like a healthy one), the error logged and counted; the
/// next successful read restores them.
///
/// ```
/// use intake_core::backend::DeadLetterSink;
/// use intake_core::metrics::{DeadLetterExporter, DeadLetterMetrics};
/// use intake_core::memory::MemoryBroker;
/// use intake_core::{DeadLetter, Message, Metadata, Position};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let broker = MemoryBroker::new();
/// broker.create_topic("orders", 1)?;
/// let poison = Message::new("{", Metadata::new("orders".into(), 0, Position::Offset(0)));
/// broker.dead_letter_sink("orders", "billing")?.write(&DeadLetter::new(poison, "bad", 1)).await?;
///
/// let registry = prometheus::Registry::new();
/// let metrics = DeadLetterMetrics::register(&registry)?;
/// let exporter = DeadLetterExporter::new(broker.dead_letter_store("orders", "billing")?, &metrics);
/// exporter.refresh().await;
/// assert_eq!(metrics.letters("orders.billing.dlq", "permanent"), Some(1));
/// # Ok(())
/// # }
/// ```
pub struct DeadLetterExporter<S> {
    store: S,
    metrics: DeadLetterMetrics,
    // The class labels exported last time, to zero those that emptied.
    exported: Mutex<HashSet<&'static str>>,
}

impl<S> std::fmt::Debug for DeadLetterExporter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetterExporter").finish_non_exhaustive()
    }
}

impl<S: DeadLetterStore> DeadLetterExporter<S> {
    /// An exporter of `store`'s summary into `metrics`.
    pub fn new(store: S, metrics: &DeadLetterMetrics) -> Self {
        Self {
            store,
            metrics: metrics.clone(),
            exported: Mutex::default(),
        }
    }

    /// Reads the store every `interval` (the first time at once) until
    /// `shutdown` is cancelled. A read still running after `interval` is
    /// abandoned and counted as an error, so a broker that hangs never
    /// holds the exporter longer than one interval.
    pub async fn run(self, interval: Duration, shutdown: CancellationToken) {
        let interval = interval.max(Duration::from_millis(10));
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticks.tick() => {}
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.refresh_within(interval) => {}
            }
        }
    }

    /// Reads the store once and updates the gauges (or, on an error,
    /// removes them, logs and counts the error).
    pub async fn refresh(&self) {
        let summary = self.store.summary(&Filter::all()).await;
        self.apply(summary.map_err(Failure::Store));
    }

    async fn refresh_within(&self, limit: Duration) {
        let summary = tokio::time::timeout(limit, self.store.summary(&Filter::all())).await;
        self.apply(match summary {
            Ok(summary) => summary.map_err(Failure::Store),
            Err(_) => Err(Failure::TimedOut(limit)),
        });
    }

    fn apply(&self, summary: Result<Summary, Failure>) {
        let destination = self.store.destination();
        let families = &self.metrics.families;
        let mut exported = self.exported.lock().unwrap_or_else(PoisonError::into_inner);
        let summary = match summary {
            Ok(summary) => summary,
            Err(failure) => {
                families.errors.with_label_values(&[destination]).inc();
                match failure {
                    Failure::Store(error) => tracing::warn!(
                        destination,
                        error = %crate::ErrorChain::new(&error),
                        "dead-letter store read failed; its gauges are removed until one succeeds"
                    ),
                    Failure::TimedOut(limit) => tracing::warn!(
                        destination,
                        ?limit,
                        "dead-letter store read timed out; its gauges are removed until one succeeds"
                    ),
                }
                for class in exported.drain() {
                    let _ = families.letters.remove_label_values(&[destination, class]);
                }
                let _ = families.oldest.remove_label_values(&[destination]);
                return;
            }
        };
        let mut current: HashSet<&'static str> = summary.by_class.keys().copied().collect();
        current.insert(UNREADABLE);
        for class in exported.difference(&current) {
            families
                .letters
                .with_label_values(&[destination, class])
                .set(0);
        }
        for (class, count) in &summary.by_class {
            families
                .letters
                .with_label_values(&[destination, class])
                .set(i64::try_from(*count).unwrap_or(i64::MAX));
        }
        families
            .letters
            .with_label_values(&[destination, UNREADABLE])
            .set(i64::try_from(summary.unreadable).unwrap_or(i64::MAX));
        let age = summary.oldest_age(SystemTime::now()).unwrap_or_default();
        families
            .oldest
            .with_label_values(&[destination])
            .set(age.as_secs_f64());
        // Classes that emptied stay exported (at 0) so that a graph shows
        // the drop rather than a gap.
        exported.extend(current);
    }
}

enum Failure {
    Store(StoreError),
    TimedOut(Duration),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dead_letter::store::Selection;
    use crate::dead_letter::{DeadLetter, DeadLetterSink};
    use crate::error::ErrorClass;
    use crate::memory::MemoryBroker;
    use crate::message::{Message, Metadata, Position};

    #[tokio::test]
    async fn gauges_follow_the_store_and_an_emptied_class_drops_to_zero() {
        let broker = MemoryBroker::new();
        broker.create_topic("orders", 1).expect("topic");
        let sink = broker.dead_letter_sink("orders", "billing").expect("sink");
        for (offset, class) in [
            ErrorClass::Permanent,
            ErrorClass::Retryable,
            ErrorClass::Permanent,
        ]
        .into_iter()
        .enumerate()
        {
            let metadata = Metadata::new("orders".into(), 0, Position::Offset(offset as i64));
            let mut letter =
                DeadLetter::new(Message::new("x", metadata), "bad", 1).with_class(class);
            letter.failed_at = SystemTime::now() - Duration::from_secs(60);
            sink.write(&letter).await.expect("write");
        }
        let registry = Registry::new();
        let metrics = DeadLetterMetrics::register(&registry).expect("register");
        let store = broker
            .dead_letter_store("orders", "billing")
            .expect("store");
        let exporter = DeadLetterExporter::new(store, &metrics);
        exporter.refresh().await;
        let destination = "orders.billing.dlq";
        assert_eq!(metrics.letters(destination, "permanent"), Some(2));
        assert_eq!(metrics.letters(destination, "retryable"), Some(1));
        assert_eq!(metrics.letters(destination, "unreadable"), Some(0));
        let age = metrics.oldest_age_seconds(destination).expect("an age");
        assert!((59.0..120.0).contains(&age), "{age}");

        let retryable = Filter::all().with_class(ErrorClass::Retryable);
        exporter
            .store
            .purge(&Selection::Matching(retryable))
            .await
            .expect("purge");
        exporter.refresh().await;
        assert_eq!(metrics.letters(destination, "retryable"), Some(0));
        assert_eq!(metrics.letters(destination, "permanent"), Some(2));
        exporter
            .store
            .purge(&Selection::Matching(Filter::all()))
            .await
            .expect("purge");
        exporter.refresh().await;
        assert_eq!(metrics.letters(destination, "permanent"), Some(0));
        assert_eq!(metrics.oldest_age_seconds(destination), Some(0.0));
        assert_eq!(metrics.errors(destination), 0);
    }
}
