//! Broker-side lag as prometheus gauges: [`LagMetrics`] and the
//! [`LagExporter`] task that refreshes them from a
//! [`LagProbe`](crate::lag::LagProbe).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};
use tokio_util::sync::CancellationToken;

use super::RegisterError;
use crate::lag::{LagError, LagProbe, PartitionLag};

const LAG_LABELS: &[&str] = &["source", "partition", "group"];

/// The broker-lag gauges in a registry. Register once per registry and
/// share it (a reference count) between the exporters of several probes.
#[derive(Clone)]
pub struct LagMetrics {
    families: Arc<LagFamilies>,
}

struct LagFamilies {
    messages: IntGaugeVec,
    seconds: GaugeVec,
    errors: IntCounterVec,
    parked: IntGaugeVec,
}

impl std::fmt::Debug for LagMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LagMetrics").finish_non_exhaustive()
    }
}

impl LagMetrics {
    /// Registers `intake_broker_lag_messages`, `intake_broker_lag_seconds`
    /// and `intake_broker_lag_errors_total` in `registry`.
    ///
    /// # Errors
    ///
    /// The registry already holds them (register once, clone the result).
    pub fn register(registry: &Registry) -> Result<Self, RegisterError> {
        Self::register_with_prefix(registry, "intake")
    }

    /// Like [`register`](Self::register), naming the metrics
    /// `<prefix>_broker_lag_*` (the prefix given to
    /// [`MetricsBuilder::prefix`](super::MetricsBuilder::prefix)).
    ///
    /// # Errors
    ///
    /// A prefix prometheus refuses, or the metrics already registered.
    pub fn register_with_prefix(registry: &Registry, prefix: &str) -> Result<Self, RegisterError> {
        let families = LagFamilies {
            messages: IntGaugeVec::new(
                Opts::new(
                    format!("{prefix}_broker_lag_messages"),
                    "Messages of the partition the consumer group has not committed or \
                     acknowledged on the broker, as the broker reports it.",
                ),
                LAG_LABELS,
            )?,
            seconds: GaugeVec::new(
                Opts::new(
                    format!("{prefix}_broker_lag_seconds"),
                    "Age of the oldest message of the partition the group has not committed \
                     (0 when none); only for brokers that report it.",
                ),
                LAG_LABELS,
            )?,
            errors: IntCounterVec::new(
                Opts::new(
                    format!("{prefix}_broker_lag_errors_total"),
                    "Broker lag queries that failed, by kind (transient, permanent).",
                ),
                &["group", "kind"],
            )?,
            parked: IntGaugeVec::new(
                Opts::new(
                    format!("{prefix}_parked_messages"),
                    "Messages of the group parked to be retried later and not back yet (in \
                     retry topics, wait queues, due indexes): a backlog broker lag does not \
                     show, since their originals are acknowledged. Absent where the backend \
                     cannot count them.",
                ),
                &["group"],
            )?,
        };
        registry.register(Box::new(families.messages.clone()))?;
        registry.register(Box::new(families.seconds.clone()))?;
        registry.register(Box::new(families.errors.clone()))?;
        registry.register(Box::new(families.parked.clone()))?;
        Ok(Self {
            families: Arc::new(families),
        })
    }

    /// The exported lag in messages of `partition` of `source` for `group`,
    /// if there is one.
    pub fn messages(&self, source: &str, partition: u32, group: &str) -> Option<i64> {
        let partition = partition.to_string();
        if !self.is_exported(source, &partition, group) {
            return None;
        }
        self.families
            .messages
            .get_metric_with_label_values(&[source, &partition, group])
            .ok()
            .map(|gauge| gauge.get())
    }

    /// The exported parked backlog of `group`, if there is one.
    pub fn parked(&self, group: &str) -> Option<i64> {
        use prometheus::core::Collector;
        let exported = self.families.parked.collect().iter().any(|family| {
            family.get_metric().iter().any(|metric| {
                metric
                    .get_label()
                    .iter()
                    .any(|label| label.name() == "group" && label.value() == group)
            })
        });
        if !exported {
            return None;
        }
        self.families
            .parked
            .get_metric_with_label_values(&[group])
            .ok()
            .map(|gauge| gauge.get())
    }

    /// Failed queries counted for `group`, transient and permanent.
    pub fn errors(&self, group: &str) -> u64 {
        ["transient", "permanent"]
            .iter()
            .filter_map(|kind| {
                self.families
                    .errors
                    .get_metric_with_label_values(&[group, kind])
                    .ok()
            })
            .map(|counter| counter.get())
            .sum()
    }

    // `get_metric_with_label_values` creates the series it is asked for;
    // this looks without creating, through what the registry would gather.
    fn is_exported(&self, source: &str, partition: &str, group: &str) -> bool {
        use prometheus::core::Collector;
        self.families.messages.collect().iter().any(|family| {
            family.get_metric().iter().any(|metric| {
                let labels = metric.get_label();
                let value = |name: &str| {
                    labels
                        .iter()
                        .find(|label| label.name() == name)
                        .map(|label| label.value())
                };
                value("source") == Some(source)
                    && value("partition") == Some(partition)
                    && value("group") == Some(group)
            })
        })
    }
}

/// Refreshes the broker-lag gauges of one probe's group.
///
/// Two lags, side by side:
///
/// | metric | counts | measured by |
/// |---|---|---|
/// | `intake_partition_commit_lag_messages{source,partition}` | messages this consumer admitted and has not committed yet | the runtime, at each commit tick ([`Metrics`](super::Metrics) as the observer) |
/// | `intake_broker_lag_messages{source,partition,group}` | messages the group has not committed on the broker, fetched or not | a [`LagProbe`] asking the broker, every `interval` |
/// | `intake_broker_lag_seconds{source,partition,group}` | age of the oldest of those, where the broker tells | the same probe |
/// | `intake_broker_lag_errors_total{group,kind}` | lag queries that failed (`transient` or `permanent`) | the exporter |
/// | `intake_parked_messages{group}` | messages the group parked (retry later) that are not back yet: acknowledged, so not in broker lag | the same probe ([`LagProbe::parked`]) |
///
/// A growing broker lag with a flat commit lag means the consumer keeps up
/// with what it takes but takes too little (too few consumers, a budget too
/// small); a growing commit lag means its handlers or commits are slow.
///
/// When a query fails, the exporter removes the group's gauges (a stale
/// number would look like a healthy one), logs the error and counts it; the
/// next successful query restores them. A partition the broker no longer
/// reports loses its gauges.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use intake_core::backend::{Broker, RouteAddress};
/// use intake_core::memory::{MemoryBroker, Record};
/// use intake_core::metrics::{LagExporter, LagMetrics};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let broker = MemoryBroker::new();
/// broker.create_topic("orders", 1)?;
/// broker.send("orders", Record::new("a"))?;
///
/// let registry = prometheus::Registry::new();
/// let lag_metrics = LagMetrics::register(&registry)?;
/// let probe = broker.lag_probe(&RouteAddress::new("orders", "billing")).await?;
/// let exporter = LagExporter::new(probe, &lag_metrics);
/// exporter.refresh().await;
/// assert_eq!(lag_metrics.messages("orders", 0, "billing"), Some(1));
///
/// // In a service: refresh every 15 s until shutdown.
/// let shutdown = CancellationToken::new();
/// let task = tokio::spawn(exporter.run(Duration::from_secs(15), shutdown.clone()));
/// shutdown.cancel();
/// task.await?;
/// # Ok(())
/// # }
/// ```
pub struct LagExporter<P> {
    probe: P,
    metrics: LagMetrics,
    // The (source, partition) label pairs exported last time, to remove
    // those the broker stops reporting.
    exported: Mutex<HashSet<(String, String)>>,
}

impl<P> std::fmt::Debug for LagExporter<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LagExporter").finish_non_exhaustive()
    }
}

impl<P: LagProbe> LagExporter<P> {
    /// An exporter of `probe`'s answers into `metrics`.
    pub fn new(probe: P, metrics: &LagMetrics) -> Self {
        Self {
            probe,
            metrics: metrics.clone(),
            exported: Mutex::default(),
        }
    }

    /// Queries the probe every `interval` (the first time at once) until
    /// `shutdown` is cancelled. A query still running after `interval` is
    /// abandoned and counted as a transient error, so a broker that hangs
    /// never holds the exporter longer than one interval (each backend's
    /// probe also has a timeout of its own).
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

    /// Queries the probe once and updates the gauges (or, on an error,
    /// removes them, logs and counts the error). Waits at most as long as
    /// the probe's own timeout.
    pub async fn refresh(&self) {
        let answer = self.probe.lag().await;
        self.apply(answer);
        let parked = self.probe.parked().await;
        self.apply_parked(parked);
    }

    async fn refresh_within(&self, limit: Duration) {
        let answer = tokio::time::timeout(limit, self.probe.lag())
            .await
            .unwrap_or(Err(LagError::TimedOut(limit)));
        self.apply(answer);
        let parked = tokio::time::timeout(limit, self.probe.parked())
            .await
            .unwrap_or(Err(LagError::TimedOut(limit)));
        self.apply_parked(parked);
    }

    fn apply_parked(&self, answer: Result<Option<u64>, LagError>) {
        let group = self.probe.group();
        let families = &self.metrics.families;
        match answer {
            Ok(Some(parked)) => families
                .parked
                .with_label_values(&[group])
                .set(i64::try_from(parked).unwrap_or(i64::MAX)),
            Ok(None) => {
                let _ = families.parked.remove_label_values(&[group]);
            }
            Err(error) => {
                let kind = if error.is_transient() {
                    "transient"
                } else {
                    "permanent"
                };
                families.errors.with_label_values(&[group, kind]).inc();
                tracing::warn!(
                    group,
                    error = %crate::ErrorChain::new(&error),
                    "parked backlog query failed; its gauge is removed until one succeeds"
                );
                let _ = families.parked.remove_label_values(&[group]);
            }
        }
    }

    fn apply(&self, answer: Result<Vec<PartitionLag>, LagError>) {
        let group = self.probe.group();
        let families = &self.metrics.families;
        let mut exported = self.exported.lock().unwrap_or_else(PoisonError::into_inner);
        let partitions = match answer {
            Ok(partitions) => partitions,
            Err(error) => {
                let kind = if error.is_transient() {
                    "transient"
                } else {
                    "permanent"
                };
                families.errors.with_label_values(&[group, kind]).inc();
                tracing::warn!(
                    group,
                    error = %crate::ErrorChain::new(&error),
                    "broker lag query failed; its gauges are removed until one succeeds"
                );
                for (source, partition) in exported.drain() {
                    self.remove(&source, &partition, group);
                }
                return;
            }
        };
        let mut current = HashSet::with_capacity(partitions.len());
        for lag in partitions {
            let source = lag.partition.source.to_string();
            let partition = lag.partition.partition.to_string();
            let labels = [source.as_str(), partition.as_str(), group];
            match lag.messages {
                Some(messages) => families
                    .messages
                    .with_label_values(&labels)
                    .set(i64::try_from(messages).unwrap_or(i64::MAX)),
                None => {
                    let _ = families.messages.remove_label_values(&labels);
                }
            }
            match lag.oldest_age {
                Some(age) => families
                    .seconds
                    .with_label_values(&labels)
                    .set(age.as_secs_f64()),
                None => {
                    let _ = families.seconds.remove_label_values(&labels);
                }
            }
            current.insert((source, partition));
        }
        for (source, partition) in exported.difference(&current) {
            self.remove(source, partition, group);
        }
        *exported = current;
    }

    fn remove(&self, source: &str, partition: &str, group: &str) {
        let labels = [source, partition, group];
        // Absent series are fine: a partition may have had no age.
        let _ = self.metrics.families.messages.remove_label_values(&labels);
        let _ = self.metrics.families.seconds.remove_label_values(&labels);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{MemoryBroker, Record};
    use crate::message::PartitionKey;

    struct Scripted {
        answers: Mutex<Vec<Result<Vec<PartitionLag>, LagError>>>,
    }

    impl LagProbe for Scripted {
        fn group(&self) -> &str {
            "billing"
        }

        async fn lag(&self) -> Result<Vec<PartitionLag>, LagError> {
            self.answers
                .lock()
                .unwrap()
                .pop()
                .unwrap_or(Err(LagError::TimedOut(Duration::ZERO)))
        }
    }

    fn scripted(mut answers: Vec<Result<Vec<PartitionLag>, LagError>>) -> Scripted {
        answers.reverse();
        Scripted {
            answers: Mutex::new(answers),
        }
    }

    #[tokio::test]
    async fn exports_what_a_group_parked_beside_its_lag() {
        let broker = MemoryBroker::new();
        broker.create_topic("orders", 1).unwrap();
        let registry = Registry::new();
        let metrics = LagMetrics::register(&registry).unwrap();
        let exporter = LagExporter::new(broker.topic_lag_probe("orders", "billing"), &metrics);
        exporter.refresh().await;
        assert_eq!(metrics.parked("billing"), Some(0));

        let parking = broker.parking("orders", "billing").unwrap();
        let message = crate::message::Message::new(
            "a",
            crate::message::Metadata::new("orders".into(), 0, crate::Position::Offset(0)),
        );
        use crate::parking::Parking;
        parking
            .park(&message, Duration::from_secs(60))
            .await
            .unwrap();
        exporter.refresh().await;
        assert_eq!(metrics.parked("billing"), Some(1));
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        assert!(
            text.contains(r#"intake_parked_messages{group="billing"} 1"#),
            "{text}"
        );
        assert_eq!(metrics.messages("orders", 0, "billing"), Some(0));
    }

    fn lag(partition: u32, messages: u64) -> PartitionLag {
        PartitionLag::new(PartitionKey::new("orders", partition), Some(messages))
    }

    #[tokio::test]
    async fn exports_each_partition_and_its_age() {
        let broker = MemoryBroker::new();
        broker.create_topic("orders", 2).unwrap();
        broker
            .send("orders", Record::new("a").to_partition(1))
            .unwrap();
        let registry = Registry::new();
        let metrics = LagMetrics::register(&registry).unwrap();
        LagExporter::new(broker.topic_lag_probe("orders", "billing"), &metrics)
            .refresh()
            .await;
        assert_eq!(metrics.messages("orders", 0, "billing"), Some(0));
        assert_eq!(metrics.messages("orders", 1, "billing"), Some(1));
        let text = prometheus::TextEncoder::new()
            .encode_to_string(&registry.gather())
            .unwrap();
        assert!(text.contains(
            r#"intake_broker_lag_messages{group="billing",partition="1",source="orders"} 1"#
        ));
        assert!(text.contains("intake_broker_lag_seconds{"));
    }

    #[tokio::test]
    async fn an_error_removes_the_gauges_and_is_counted() {
        let registry = Registry::new();
        let metrics = LagMetrics::register(&registry).unwrap();
        let exporter = LagExporter::new(
            scripted(vec![
                Ok(vec![lag(0, 4), lag(1, 2)]),
                Err(LagError::Unavailable("connection refused".into())),
                Ok(vec![lag(0, 3)]),
            ]),
            &metrics,
        );
        exporter.refresh().await;
        assert_eq!(metrics.messages("orders", 1, "billing"), Some(2));
        exporter.refresh().await;
        assert_eq!(metrics.messages("orders", 0, "billing"), None);
        assert_eq!(metrics.messages("orders", 1, "billing"), None);
        assert_eq!(metrics.errors("billing"), 1);
        exporter.refresh().await;
        assert_eq!(metrics.messages("orders", 0, "billing"), Some(3));
        assert_eq!(metrics.messages("orders", 1, "billing"), None);
    }

    #[tokio::test]
    async fn an_unknown_count_has_no_gauge() {
        let registry = Registry::new();
        let metrics = LagMetrics::register(&registry).unwrap();
        let unknown = PartitionLag::new(PartitionKey::new("orders", 0), None);
        let exporter = LagExporter::new(
            scripted(vec![Ok(vec![lag(0, 1)]), Ok(vec![unknown])]),
            &metrics,
        );
        exporter.refresh().await;
        assert_eq!(metrics.messages("orders", 0, "billing"), Some(1));
        exporter.refresh().await;
        assert_eq!(metrics.messages("orders", 0, "billing"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn run_stops_on_shutdown_and_abandons_a_hung_query() {
        struct Hangs;
        impl LagProbe for Hangs {
            fn group(&self) -> &str {
                "billing"
            }
            async fn lag(&self) -> Result<Vec<PartitionLag>, LagError> {
                std::future::pending().await
            }
        }
        let registry = Registry::new();
        let metrics = LagMetrics::register(&registry).unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(
            LagExporter::new(Hangs, &metrics).run(Duration::from_secs(15), shutdown.clone()),
        );
        tokio::time::sleep(Duration::from_secs(31)).await;
        assert_eq!(metrics.errors("billing"), 2);
        shutdown.cancel();
        task.await.unwrap();
    }
}
