//! What the handlers' outcomes add to the history: messages handled,
//! failures, dead letters and parks per route, read at each sample from the counters the metrics
//! layer keeps already (feature `metrics`).
//!
//! The runtime tells its observers nothing per message, and the console
//! must not count per message itself: the [`MetricsLayer`](crate::metrics::MetricsLayer)
//! counts each outcome anyway, so the console reads its counters from the
//! registry, one gather per sample interval. A route's counters are the
//! ones labelled `handler` with the route's name: name the layer after the
//! route (`metrics.layer("orders")` for the route `orders`).

/// A route's outcome counters, summed over sources, at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Outcomes {
    /// Messages handed to the handler.
    pub(super) handled: u64,
    pub(super) failed: u64,
    pub(super) dead_lettered: u64,
    pub(super) parked: u64,
}

/// Where the outcome counters come from.
#[derive(Clone, Debug, Default)]
pub(super) struct OutcomeSource {
    #[cfg(feature = "metrics")]
    registry: Option<(prometheus::Registry, String)>,
}

impl OutcomeSource {
    /// Reads the counters of the metrics registered in `registry` under
    /// `prefix` (`intake` unless the metrics were built with another).
    #[cfg(feature = "metrics")]
    pub(super) fn metrics(registry: prometheus::Registry, prefix: String) -> Self {
        Self {
            registry: Some((registry, prefix)),
        }
    }

    /// Every route's counters by name, or `None` without a registry.
    pub(super) fn read(&self, routes: &[String]) -> Option<Vec<Outcomes>> {
        #[cfg(feature = "metrics")]
        if let Some((registry, prefix)) = &self.registry {
            return Some(read_registry(registry, prefix, routes));
        }
        let _ = routes;
        None
    }
}

#[cfg(feature = "metrics")]
fn read_registry(
    registry: &prometheus::Registry,
    prefix: &str,
    routes: &[String],
) -> Vec<Outcomes> {
    let mut outcomes = vec![Outcomes::default(); routes.len()];
    let handled = format!("{prefix}_messages_consumed_total");
    let failed = format!("{prefix}_messages_failed_total");
    let dead_lettered = format!("{prefix}_messages_dead_lettered_total");
    let parked = format!("{prefix}_messages_parked_total");
    for family in registry.gather() {
        let name = family.name();
        let field: fn(&mut Outcomes) -> &mut u64 = if name == handled {
            |outcomes| &mut outcomes.handled
        } else if name == failed {
            |outcomes| &mut outcomes.failed
        } else if name == dead_lettered {
            |outcomes| &mut outcomes.dead_lettered
        } else if name == parked {
            |outcomes| &mut outcomes.parked
        } else {
            continue;
        };
        for metric in family.get_metric() {
            let Some(handler) = metric
                .get_label()
                .iter()
                .find(|label| label.name() == "handler")
            else {
                continue;
            };
            let Some(index) = routes.iter().position(|route| route == handler.value()) else {
                continue;
            };
            // A counter's value is a whole count held as a float.
            let value = metric.get_counter().get_value();
            let count = if value.is_finite() && value > 0.0 {
                value as u64
            } else {
                0
            };
            let total = field(&mut outcomes[index]);
            *total = total.saturating_add(count);
        }
    }
    outcomes
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use super::*;

    #[test]
    fn the_counters_of_the_route_named_handler_are_summed_over_sources() {
        let registry = prometheus::Registry::new();
        let failed = prometheus::IntCounterVec::new(
            prometheus::Opts::new("intake_messages_failed_total", "failed"),
            &["source", "handler", "class"],
        )
        .unwrap();
        registry.register(Box::new(failed.clone())).unwrap();
        failed
            .with_label_values(&["a", "orders", "permanent"])
            .inc_by(2);
        failed
            .with_label_values(&["b", "orders", "transient"])
            .inc_by(3);
        failed
            .with_label_values(&["a", "other", "permanent"])
            .inc_by(7);
        let source = OutcomeSource::metrics(registry, "intake".to_owned());
        let read = source
            .read(&["orders".to_owned(), "missing".to_owned()])
            .unwrap();
        assert_eq!(read[0].failed, 5);
        assert_eq!(read[0].dead_lettered, 0);
        assert_eq!(read[1], Outcomes::default());
        assert!(OutcomeSource::default().read(&[]).is_none());
    }
}
