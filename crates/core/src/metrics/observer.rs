//! [`Metrics`] as the runtime's [`ConsumerObserver`]: partition gauges,
//! in-flight deliveries, acknowledgement round trips, and the panics, probe
//! timeouts and source errors of the runtime.

use std::time::Duration;

use super::Metrics;
use super::series::PartitionSeries;
use crate::acker::{AckBatch, AckError};
use crate::message::PartitionKey;
use crate::observer::{ConsumerObserver, PartitionSnapshot};
use crate::source::SourceError;

impl ConsumerObserver for Metrics {
    fn on_partitions(&self, partitions: &[PartitionSnapshot]) {
        let families = &*self.families;
        let mut known = families.partitions();
        for snapshot in partitions {
            let key = &snapshot.stats.partition;
            if !known.contains_key(key) {
                known.insert(key.clone(), PartitionSeries::resolve(families, key));
            }
            let Some(series) = known.get(key) else {
                continue;
            };
            series
                .commit_lag
                .set(i64::try_from(snapshot.stats.uncommitted).unwrap_or(i64::MAX));
            series
                .in_flight
                .set(i64::try_from(snapshot.stats.in_flight).unwrap_or(i64::MAX));
            series.oldest_unfinished_age.set(
                snapshot
                    .oldest_unfinished_age
                    .map_or(0.0, |age| age.as_secs_f64()),
            );
        }
    }

    fn on_in_flight(&self, in_flight: usize) {
        self.families
            .consumer_in_flight
            .set(i64::try_from(in_flight).unwrap_or(i64::MAX));
    }

    fn on_ack(&self, _batch: &AckBatch, result: Result<(), &AckError>, elapsed: Duration) {
        let outcome = if result.is_ok() { "ok" } else { "error" };
        self.families.acks.with_label_values(&[outcome]).inc();
        self.families.ack_duration.observe(elapsed.as_secs_f64());
    }

    fn on_panic(&self, partition: &PartitionKey) {
        self.families
            .consumer_panics
            .with_label_values(&[&*partition.source])
            .inc();
    }

    fn on_probe_timeout(&self) {
        self.families.probe_timeouts.inc();
    }

    fn on_source_error(&self, _error: &SourceError, retry_in: Option<Duration>) {
        let outcome = match retry_in {
            Some(_) => "retried",
            None => "stopped",
        };
        self.families
            .source_errors
            .with_label_values(&[outcome])
            .inc();
    }

    fn on_revoked(&self, partition: &PartitionKey) {
        let families = &*self.families;
        families.partitions().remove(partition);
        PartitionSeries::remove(families, partition);
    }
}
