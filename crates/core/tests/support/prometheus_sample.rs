//! Reads one series back from a prometheus registry, for tests that assert
//! metric values after a run. Include it with
//! `#[path = "…/support/prometheus_sample.rs"] mod prometheus_sample;`.

use prometheus::Registry;
use prometheus::proto::MetricType;

/// The value of the series `name{labels}` (a histogram's sample count), or
/// `None` if there is no such series. `labels` may name a subset of the
/// series' labels.
pub fn sample(registry: &Registry, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let families = registry.gather();
    let family = families.iter().find(|family| family.name() == name)?;
    let metric = family.get_metric().iter().find(|metric| {
        labels.iter().all(|(label, value)| {
            metric
                .get_label()
                .iter()
                .any(|pair| pair.name() == *label && pair.value() == *value)
        })
    })?;
    Some(match family.get_field_type() {
        MetricType::COUNTER => metric.get_counter().get_value(),
        MetricType::GAUGE => metric.get_gauge().get_value(),
        MetricType::HISTOGRAM => metric.get_histogram().get_sample_count() as f64,
        _ => return None,
    })
}
