//! Whether the partition assignment keeps partition `p` of a topic and of
//! its return topic with one member, as the order per key needs.

use super::*;

/// Why the return partition `p` may go to another member than the origin
/// partition `p` under `settings`, `None` when the assignment keeps them
/// together: the classic protocol's `range` assignor (librdkafka's first
/// by default) gives partition `p` of every topic of as many partitions,
/// subscribed by every member, to one member; `roundrobin` and
/// `cooperative-sticky` do not, nor does the consumer protocol of KIP-848
/// unless the broker assigns with `range` (`group.remote.assignor`).
pub(crate) fn co_location_problem(settings: &KafkaSettings) -> Option<String> {
    if settings
        .get("group.protocol")
        .is_some_and(|protocol| protocol.trim().eq_ignore_ascii_case("consumer"))
    {
        return match settings.get("group.remote.assignor").map(str::trim) {
            Some(assignor) if assignor.eq_ignore_ascii_case("range") => None,
            assignor => Some(format!(
                "group.protocol=consumer with group.remote.assignor={} (the broker's `uniform` when unset)",
                assignor.unwrap_or("unset")
            )),
        };
    }
    let strategy = settings
        .get("partition.assignment.strategy")
        .unwrap_or("range,roundrobin");
    let first = strategy.split(',').next().unwrap_or("").trim();
    (!first.eq_ignore_ascii_case("range"))
        .then(|| format!("partition.assignment.strategy={strategy}"))
}

/// Logs, loudly, settings under which a parked key's copies may come back
/// to another member than the one that holds its later messages.
pub(crate) fn warn_unless_co_located(settings: &KafkaSettings, group: &str) {
    if let Some(problem) = co_location_problem(settings) {
        tracing::warn!(
            group,
            settings = %problem,
            "kafka parking: with these settings partition p of a topic and of its return topic may go to different members, so the order per key of parked messages is not kept and followers of a parked key are parked again and again until overdue; use the `range` assignor (librdkafka's default, partition.assignment.strategy=range) or, with group.protocol=consumer, group.remote.assignor=range"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn co_location_holds_under_range_only() {
        let settings = KafkaSettings::new("127.0.0.1:9");
        assert_eq!(co_location_problem(&settings), None, "librdkafka's default");
        for strategy in ["range", "range,roundrobin", " Range , cooperative-sticky"] {
            let chosen = settings
                .clone()
                .set("partition.assignment.strategy", strategy);
            assert_eq!(co_location_problem(&chosen), None, "{strategy}");
        }
        for strategy in ["cooperative-sticky", "roundrobin,range", "roundrobin"] {
            let chosen = settings
                .clone()
                .set("partition.assignment.strategy", strategy);
            assert!(co_location_problem(&chosen).is_some(), "{strategy}");
        }
        let kip_848 = settings.clone().set("group.protocol", "consumer");
        assert!(
            co_location_problem(&kip_848).is_some(),
            "the broker's uniform"
        );
        let range = kip_848.clone().set("group.remote.assignor", "range");
        assert_eq!(co_location_problem(&range), None);
        let uniform = kip_848.set("group.remote.assignor", "uniform");
        assert!(co_location_problem(&uniform).is_some());
    }
}
