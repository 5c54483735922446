//! The delay tiers of [`KafkaParking`](super::KafkaParking): which retry
//! topic a delay goes to, and how long a record may hold its partition.

use std::time::Duration;

/// The default tiers: 1 s, 10 s, 1 min, 10 min, 1 h.
pub const DEFAULT_TIERS: [Duration; 5] = [
    Duration::from_secs(1),
    Duration::from_secs(10),
    Duration::from_secs(60),
    Duration::from_secs(600),
    Duration::from_secs(3600),
];

/// Tiers, ascending and distinct, none zero; at least one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Tiers(Vec<Duration>);

impl Tiers {
    /// `tiers` sorted, without duplicates; `None` when empty or one is zero
    /// or not a whole number of milliseconds (its topic name would lie).
    pub(crate) fn new(mut tiers: Vec<Duration>) -> Option<Self> {
        tiers.sort_unstable();
        tiers.dedup();
        let valid = !tiers.is_empty()
            && tiers
                .iter()
                .all(|tier| !tier.is_zero() && tier.subsec_nanos() % 1_000_000 == 0);
        valid.then_some(Self(tiers))
    }

    pub(crate) fn as_slice(&self) -> &[Duration] {
        &self.0
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The tier a delay goes to: the largest tier not above it, so that a
    /// record never holds up the ones behind it by more than the gap to the
    /// next tier; the smallest tier for a delay below all.
    pub(crate) fn index_for(&self, delay: Duration) -> usize {
        self.0.iter().rposition(|tier| *tier <= delay).unwrap_or(0)
    }

    /// How long the head record of tier `index` may hold its partition
    /// before it is written to the tail again: a delay of this tier is
    /// below the next tier, so a well-formed record never waits that long;
    /// the largest tier holds for its own length (delays above it hop
    /// along, one write per that length).
    pub(crate) fn hold(&self, index: usize) -> Duration {
        self.0
            .get(index + 1)
            .or_else(|| self.0.get(index))
            .copied()
            .unwrap_or(Duration::ZERO)
    }

    /// The tier's name in topic names: `1s`, `10s`, `1m`, `2h`, `1500ms`.
    pub(crate) fn label(&self, index: usize) -> String {
        let Some(tier) = self.0.get(index) else {
            return String::new();
        };
        let millis = tier.as_millis();
        match millis {
            m if m % 3_600_000 == 0 => format!("{}h", m / 3_600_000),
            m if m % 60_000 == 0 => format!("{}m", m / 60_000),
            m if m % 1_000 == 0 => format!("{}s", m / 1_000),
            m => format!("{m}ms"),
        }
    }
}

/// The delay a tier's label names (`7s`, `1500ms`, `10m`, `2h`: digits,
/// then `ms`, `s`, `m` or `h`), `None` for any other text or zero.
pub(crate) fn label_duration(label: &str) -> Option<Duration> {
    let digits = label.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = label.split_at(digits);
    let number: u64 = number.parse().ok()?;
    let millis = match unit {
        "ms" => number,
        "s" => number.checked_mul(1_000)?,
        "m" => number.checked_mul(60_000)?,
        "h" => number.checked_mul(3_600_000)?,
        _ => return None,
    };
    (millis > 0).then(|| Duration::from_millis(millis))
}

/// The retry topic `template` names for `topic`, `group` and the tier
/// `label`.
pub(crate) fn resolve(template: &str, topic: &str, group: &str, label: &str) -> String {
    template
        .replace("{topic}", topic)
        .replace("{group}", group)
        .replace("{tier}", label)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Tiers {
        Tiers::new(DEFAULT_TIERS.to_vec()).expect("valid")
    }

    #[test]
    fn a_delay_goes_to_the_largest_tier_not_above_it() {
        let tiers = defaults();
        let secs = Duration::from_secs;
        assert_eq!(tiers.index_for(Duration::from_millis(10)), 0);
        assert_eq!(tiers.index_for(secs(1)), 0);
        assert_eq!(tiers.index_for(secs(9)), 0);
        assert_eq!(tiers.index_for(secs(10)), 1);
        assert_eq!(tiers.index_for(secs(599)), 2);
        assert_eq!(tiers.index_for(secs(86_400)), 4);
    }

    #[test]
    fn a_tier_holds_its_head_until_the_next_tier_and_the_largest_for_itself() {
        let tiers = defaults();
        assert_eq!(tiers.hold(0), Duration::from_secs(10));
        assert_eq!(tiers.hold(3), Duration::from_secs(3600));
        assert_eq!(tiers.hold(4), Duration::from_secs(3600));
    }

    #[test]
    fn labels_name_the_tier_in_its_largest_whole_unit() {
        let tiers = Tiers::new(vec![
            Duration::from_millis(1500),
            Duration::from_secs(30),
            Duration::from_secs(120),
            Duration::from_secs(7200),
        ])
        .expect("valid");
        let labels: Vec<String> = (0..tiers.len()).map(|index| tiers.label(index)).collect();
        assert_eq!(labels, ["1500ms", "30s", "2m", "2h"]);
    }

    #[test]
    fn tiers_are_sorted_and_an_empty_zero_or_sub_millisecond_tier_is_refused() {
        let tiers =
            Tiers::new(vec![Duration::from_secs(60), Duration::from_secs(1)]).expect("valid");
        assert_eq!(
            tiers.as_slice(),
            [Duration::from_secs(1), Duration::from_secs(60)]
        );
        assert!(Tiers::new(Vec::new()).is_none());
        assert!(Tiers::new(vec![Duration::ZERO]).is_none());
        assert!(Tiers::new(vec![Duration::from_micros(1500)]).is_none());
    }

    #[test]
    fn a_label_reads_back_as_its_tier() {
        let tiers = Tiers::new(vec![
            Duration::from_millis(1500),
            Duration::from_secs(30),
            Duration::from_secs(120),
            Duration::from_secs(7200),
        ])
        .expect("valid");
        for index in 0..tiers.len() {
            assert_eq!(
                label_duration(&tiers.label(index)),
                tiers.as_slice().get(index).copied()
            );
        }
        for other in [
            "",
            "s",
            "0s",
            "-1s",
            "1 s",
            "1sec",
            "1d",
            "+1s",
            "99999999999999999999h",
        ] {
            assert_eq!(label_duration(other), None, "{other}");
        }
    }

    #[test]
    fn the_template_names_topic_group_and_tier() {
        assert_eq!(
            resolve("{topic}.{group}.retry.{tier}", "orders", "billing", "10s"),
            "orders.billing.retry.10s"
        );
    }
}
