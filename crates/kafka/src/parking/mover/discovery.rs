//! Which retry topics the mover reads, and where their records go back
//! to: the [`Route`] of each known retry topic, the [`RetryPattern`] that
//! tells a retry topic of any tier by its name, and the following of the
//! topics this process creates and of those the cluster lists (created
//! elsewhere, or of tiers no longer configured).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;

use super::Mover;
use super::wait::later;
use crate::parking::tiers::label_duration;

/// How long the discovery's listing of the cluster's topics may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the records of one retry topic go back to.
#[derive(Debug, Clone)]
pub(in crate::parking) struct Route {
    /// The return topic of the origin (the origin itself when configured
    /// so), partitioned like the origin.
    pub(in crate::parking) back_to: Arc<str>,
    pub(in crate::parking) tier: usize,
}

/// The retry topics of one served topic, whatever their tier: the names
/// its template gives, `prefix` + a tier's label + `suffix`. The mover
/// drains every existing topic of that form, so records parked under tiers
/// no longer configured still come back.
#[derive(Debug, Clone)]
pub(in crate::parking) struct RetryPattern {
    pub(in crate::parking) prefix: String,
    pub(in crate::parking) suffix: String,
    pub(in crate::parking) back_to: Arc<str>,
}

impl RetryPattern {
    /// The delay of the tier `topic` is named after, if it is a retry topic
    /// of this pattern: its label is a tier's (`7s`, `1500ms`, `2h`).
    pub(in crate::parking) fn tier_of(&self, topic: &str) -> Option<Duration> {
        let label = topic
            .strip_prefix(self.prefix.as_str())?
            .strip_suffix(self.suffix.as_str())?;
        label_duration(label)
    }
}

impl Mover {
    /// Looks for retry topics created elsewhere, now and then, and
    /// subscribes again when the known set grew.
    pub(super) fn follow_topics(&mut self) {
        if Instant::now() >= self.next_discovery {
            self.discover();
            self.next_discovery = later(self.discovery_interval);
        }
        let generation = (self.registry.generation(), self.found.len());
        if self.subscribed == Some(generation) {
            return;
        }
        let mut topics: BTreeSet<String> = self.registry.topics().into_iter().collect();
        topics.extend(self.found.iter().cloned());
        if topics.is_empty() {
            self.subscribed = Some(generation);
            return;
        }
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        match self.consumer.subscribe(&names) {
            Ok(()) => {
                tracing::debug!(group = %self.group, topics = ?topics, "kafka parking mover subscribed");
                self.subscribed = Some(generation);
            }
            Err(error) => {
                // Tried again on the next round.
                self.log_error("subscribing to the retry topics failed", &error);
            }
        }
    }

    /// Lists the cluster's topics and takes every retry topic of the served
    /// topics: those of the configured tiers that another instance, or an
    /// earlier run, created, and those of tiers no longer configured (a
    /// deploy changed the tiers), whose records would otherwise wait there
    /// until the retention deletes them.
    fn discover(&mut self) {
        let metadata = match self.consumer.fetch_metadata(None, LOOKUP_TIMEOUT) {
            Ok(metadata) => metadata,
            Err(error) => {
                // The brokers do not answer: the next discovery asks again.
                self.log_error("listing the topics for retry topics failed", &error);
                return;
            }
        };
        for topic in metadata.topics() {
            let name = topic.name();
            let partitions = i32::try_from(topic.partitions().len()).unwrap_or(i32::MAX);
            if topic.error().is_some() || partitions == 0 {
                continue;
            }
            if self.routes.contains_key(name) {
                if self.registry.partitions(name).is_none() && !self.found.contains(name) {
                    self.registry.insert(name, partitions);
                }
                continue;
            }
            let Some((pattern, delay)) = self
                .patterns
                .iter()
                .filter_map(|pattern| Some((pattern, pattern.tier_of(name)?)))
                // The most specific: a served topic's name may begin with
                // another's.
                .max_by_key(|(pattern, _)| pattern.prefix.len() + pattern.suffix.len())
            else {
                continue;
            };
            let route = Route {
                back_to: Arc::clone(&pattern.back_to),
                tier: self.tiers.index_for(delay),
            };
            tracing::info!(
                group = %self.group,
                retry_topic = name,
                return_topic = %route.back_to,
                "found a retry topic of a tier not configured (the tiers changed); its records are moved back when due"
            );
            self.routes.insert(name.to_owned(), route);
            self.found.insert(name.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_retry_pattern_takes_any_tier_label_and_nothing_else() {
        let pattern = RetryPattern {
            prefix: "orders.billing.retry.".into(),
            suffix: String::new(),
            back_to: "orders.billing.returned".into(),
        };
        assert_eq!(
            pattern.tier_of("orders.billing.retry.7s"),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            pattern.tier_of("orders.billing.retry.1500ms"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            pattern.tier_of("orders.billing.retry.2h"),
            Some(Duration::from_secs(7200))
        );
        for other in [
            "orders.billing.retry.",
            "orders.billing.retry.7s.billing.dlq",
            "orders.billing.retry.s",
            "orders.billing.retry.0s",
            "orders.billing.returned",
            "orders",
            "orders.billing.retry.7x",
        ] {
            assert_eq!(pattern.tier_of(other), None, "{other}");
        }
        let infix = RetryPattern {
            prefix: "retry-".into(),
            suffix: "-orders".into(),
            back_to: "orders".into(),
        };
        assert_eq!(
            infix.tier_of("retry-10m-orders"),
            Some(Duration::from_secs(600))
        );
        assert_eq!(infix.tier_of("retry-10m-orders2"), None);
    }
}
