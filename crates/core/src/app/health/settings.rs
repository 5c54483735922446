//! [`HealthSettings`]: the windows and graces by which [`Health`](super::Health)
//! judges readiness and liveness.

use std::time::Duration;

/// How health is judged: see [`Health`](super::Health).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthSettings {
    /// How long a partition with uncommitted work may go without its
    /// watermark moving (and its oldest unfinished message waiting) before
    /// it fails liveness; also how long acknowledgements (commits) may all
    /// fail before the route fails liveness. Default 5 minutes: longer than
    /// the slowest legitimate handler, and than a broker's failover.
    pub stall_window: Duration,
    /// How long after a route's assignment changes its partitions count as
    /// live whatever they do. Default 60 s.
    pub rebalance_grace: Duration,
    /// How long a route may wait for its first assignment before it counts
    /// as ready without one. Default 60 s.
    pub assignment_grace: Duration,
    /// How long a route may stay in consumer-level backoff before it stops
    /// counting as ready. Default 60 s.
    pub backoff_grace: Duration,
}

#[cfg(all(test, feature = "serde"))]
mod settings_tests {
    use super::*;

    #[test]
    fn health_settings_load_with_units_and_name_the_field_in_errors() {
        let settings: HealthSettings = serde_json::from_str(r#"{"stall_window": "90s"}"#).unwrap();
        assert_eq!(settings.stall_window, Duration::from_secs(90));
        assert_eq!(
            settings.rebalance_grace,
            HealthSettings::default().rebalance_grace
        );
        let error = serde_json::from_str::<HealthSettings>(r#"{"rebalance_grace": 5}"#)
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("`rebalance_grace`:"), "{error}");
    }
}

impl Default for HealthSettings {
    fn default() -> Self {
        Self {
            stall_window: Duration::from_secs(300),
            rebalance_grace: Duration::from_secs(60),
            assignment_grace: Duration::from_secs(60),
            backoff_grace: Duration::from_secs(60),
        }
    }
}

/// Every field optional (absent keeps the default), durations with a unit
/// (`"90s"`, `"5m"`), errors naming the field (feature `serde`).
#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for HealthSettings {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use crate::consumer::settings::duration;

        fn stall_window<'de, D: serde::Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Duration>, D::Error> {
            duration(d, "stall_window")
        }
        fn rebalance_grace<'de, D: serde::Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Duration>, D::Error> {
            duration(d, "rebalance_grace")
        }
        fn assignment_grace<'de, D: serde::Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Duration>, D::Error> {
            duration(d, "assignment_grace")
        }
        fn backoff_grace<'de, D: serde::Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Duration>, D::Error> {
            duration(d, "backoff_grace")
        }

        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            #[serde(default, deserialize_with = "stall_window")]
            stall_window: Option<Duration>,
            #[serde(default, deserialize_with = "rebalance_grace")]
            rebalance_grace: Option<Duration>,
            #[serde(default, deserialize_with = "assignment_grace")]
            assignment_grace: Option<Duration>,
            #[serde(default, deserialize_with = "backoff_grace")]
            backoff_grace: Option<Duration>,
        }

        let raw = Raw::deserialize(deserializer)?;
        let defaults = HealthSettings::default();
        Ok(HealthSettings {
            stall_window: raw.stall_window.unwrap_or(defaults.stall_window),
            rebalance_grace: raw.rebalance_grace.unwrap_or(defaults.rebalance_grace),
            assignment_grace: raw.assignment_grace.unwrap_or(defaults.assignment_grace),
            backoff_grace: raw.backoff_grace.unwrap_or(defaults.backoff_grace),
        })
    }
}
