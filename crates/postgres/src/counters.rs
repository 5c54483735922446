//! [`ExactlyOnceCounters`]: how many messages committed, were skipped as
//! duplicates, or rolled back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounterVec, Opts, Registry};

/// Counters of one exactly-once handler, shared by its clones. Reading them
/// is a relaxed atomic load; [`register`](Self::register) exposes them to
/// prometheus.
#[derive(Debug, Default)]
pub struct ExactlyOnceCounters {
    processed: AtomicU64,
    duplicates: AtomicU64,
    rolled_back: AtomicU64,
}

impl ExactlyOnceCounters {
    /// Messages whose transaction (effects and marker) committed.
    pub fn processed(&self) -> u64 {
        self.processed.load(Ordering::Relaxed)
    }

    /// Messages skipped because their marker already existed: redeliveries
    /// of messages whose effects had committed. Each was acknowledged
    /// without running the handler.
    pub fn duplicates(&self) -> u64 {
        self.duplicates.load(Ordering::Relaxed)
    }

    /// Messages whose transaction rolled back: the handler failed, or a
    /// step of the transaction did (the message's error says which).
    pub fn rolled_back(&self) -> u64 {
        self.rolled_back.load(Ordering::Relaxed)
    }

    pub(crate) fn add_processed(&self, count: usize) {
        self.processed.fetch_add(count as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_duplicates(&self, count: usize) {
        self.duplicates.fetch_add(count as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_rolled_back(&self, count: usize) {
        self.rolled_back.fetch_add(count as u64, Ordering::Relaxed);
    }

    /// Registers the counters in `registry` as
    /// `intake_exactly_once_messages_total{group, outcome}`, where `outcome`
    /// is `processed`, `duplicate` or `rolled_back`. The values are read at
    /// scrape time, so counting costs nothing more.
    ///
    /// # Errors
    ///
    /// The registry already holds this metric for `group`.
    pub fn register(
        self: &Arc<Self>,
        registry: &Registry,
        group: &str,
    ) -> Result<(), prometheus::Error> {
        let family = IntCounterVec::new(
            Opts::new(
                "intake_exactly_once_messages_total",
                "Messages of an exactly-once handler by outcome: processed (committed), \
                 duplicate (already processed, skipped) or rolled_back.",
            )
            .const_label("group", group),
            &["outcome"],
        )?;
        registry.register(Box::new(StatsCollector {
            counters: Arc::clone(self),
            descs: family.desc().into_iter().cloned().collect(),
            family: Mutex::new(family),
        }))
    }
}

/// Reads [`ExactlyOnceCounters`] into a counter family at each scrape.
struct StatsCollector {
    counters: Arc<ExactlyOnceCounters>,
    descs: Vec<Desc>,
    // Behind a mutex so that concurrent scrapes do not interleave the
    // reset and the refill.
    family: Mutex<IntCounterVec>,
}

impl Collector for StatsCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let family = self.family.lock().unwrap_or_else(PoisonError::into_inner);
        family.reset();
        for (outcome, value) in [
            ("processed", self.counters.processed()),
            ("duplicate", self.counters.duplicates()),
            ("rolled_back", self.counters.rolled_back()),
        ] {
            family.with_label_values(&[outcome]).inc_by(value);
        }
        family.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handlers_of_several_groups_share_one_registry() {
        let registry = Registry::new();
        let billing = Arc::new(ExactlyOnceCounters::default());
        let shipping = Arc::new(ExactlyOnceCounters::default());
        billing.register(&registry, "billing").unwrap();
        shipping.register(&registry, "shipping").unwrap();
        billing.add_duplicates(2);
        shipping.add_processed(1);

        let families = registry.gather();
        let counters: Vec<(String, String, f64)> = families
            .iter()
            .flat_map(|family| family.get_metric())
            .map(|metric| {
                let label = |name: &str| {
                    metric
                        .get_label()
                        .iter()
                        .find(|label| label.name() == name)
                        .map(|label| label.value().to_owned())
                        .unwrap_or_default()
                };
                (
                    label("group"),
                    label("outcome"),
                    metric.get_counter().get_value(),
                )
            })
            .filter(|(_, _, value)| *value > 0.0)
            .collect();
        assert_eq!(
            counters,
            vec![
                ("billing".to_owned(), "duplicate".to_owned(), 2.0),
                ("shipping".to_owned(), "processed".to_owned(), 1.0),
            ]
        );
        assert!(shipping.register(&registry, "shipping").is_err());
    }
}
